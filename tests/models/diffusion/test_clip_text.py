"""ember's CLIP text encoder and tokenizer against transformers' on a tiny random model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models.diffusion import CLIPTextModel, CLIPTokenizer
from tests.models.diffusion.tiny import MAX_TOKENS, clip_text_config, write_tokenizer

PROMPTS = [
    "a photo of a cat",
    "  A   Photo,  OF the\tdog!!  ",
    "it's 42 cats' dogs don't",
    "astronaut riding a horse on mars, red blue blurry ugly painting, a cat and a dog",
    "caf\u00e9 \u00c9t\u00e9 \u65e5\u672c \U0001f600",
    "",
    "x<|endoftext|>y <|startoftext|>",
]


def test_tokenizer_matches_transformers(sd):
    from transformers import CLIPTokenizer as Ref

    folder, _ = sd
    ref = Ref.from_pretrained(folder / "tokenizer")
    tok = CLIPTokenizer.from_pretrained(folder / "tokenizer")
    want = ref(PROMPTS, padding="max_length", max_length=MAX_TOKENS, truncation=True).input_ids
    got = tok.encode(PROMPTS)
    assert got.shape == (len(PROMPTS), MAX_TOKENS) and got.dtype == np.int64
    assert got.tolist() == want
    assert tok.decode(got[0]) == "a photo of a cat"


def test_tokenizer_pad_token_and_tokenizer_json_fallback(tmp_path):
    from transformers import CLIPTokenizer as Ref

    write_tokenizer(tmp_path / "a", pad="!")  # SD 2.x pads with "!"
    tok, ref = CLIPTokenizer.from_pretrained(tmp_path / "a"), Ref.from_pretrained(tmp_path / "a")
    want = ref(PROMPTS[:3], padding="max_length", max_length=MAX_TOKENS, truncation=True)
    assert tok.encode(PROMPTS[:3]).tolist() == want.input_ids
    assert tok.pad_token_id == ref.convert_tokens_to_ids("!")
    ref.save_pretrained(tmp_path / "b")  # writes tokenizer.json beside vocab/merges
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / "b" / name).unlink(missing_ok=True)
    assert CLIPTokenizer.from_pretrained(tmp_path / "b").encode(PROMPTS[:3]).tolist() == want.input_ids  # fmt: skip
    (tmp_path / "c").mkdir()
    with pytest.raises(FormatError, match="vocab.json and merges.txt"):
        CLIPTokenizer.from_pretrained(tmp_path / "c")


@pytest.fixture(scope="module", params=["quick_gelu", "gelu"])
def pair(request, tmp_path_factory):
    from transformers import CLIPTextConfig
    from transformers import CLIPTextModel as Ref

    from tests.models.diffusion.tiny import randomize

    torch.manual_seed(0)
    ref = Ref(CLIPTextConfig(**clip_text_config(99, request.param))).eval()
    randomize(ref, 3)
    folder = tmp_path_factory.mktemp(f"clip_{request.param}")
    ref.save_pretrained(folder)
    return CLIPTextModel.from_pretrained(folder), ref


def test_names_are_transformers_with_text_model_prefix(pair):
    model, ref = pair
    theirs = {k if k.startswith("text_model.") else f"text_model.{k}" for k in ref.state_dict()}
    assert set(model.state_dict()) == theirs - {"text_model.embeddings.position_ids"}
    assert "text_model.encoder.layers.1.self_attn.q_proj.weight" in model.state_dict()
    assert "text_model.final_layer_norm.weight" in model.state_dict()


@pytest.mark.parametrize("mask", [False, True])
def test_hidden_states_match_transformers(pair, mask):
    model, ref = pair
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 97, (2, 9))
    ids[0, 5], ids[1, 8] = 98, 98  # eos (the pooled token) at different places
    am = np.ones_like(ids)
    am[0, 6:] = 0
    kw = {"attention_mask": torch.from_numpy(am)} if mask else {}
    with torch.no_grad():
        want = ref(torch.from_numpy(ids), output_hidden_states=True, **kw)
    got = model(ids, attention_mask=am if mask else None, output_hidden_states=True)
    np.testing.assert_allclose(got.last_hidden_state.numpy(), want.last_hidden_state.numpy(), atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(got.pooler_output.numpy(), want.pooler_output.numpy(), atol=1e-5)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for a, b in zip(got.hidden_states, want.hidden_states):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    skip = model(ids, attention_mask=am if mask else None, clip_skip=1).last_hidden_state.numpy()
    with torch.no_grad():
        ln = ref.final_layer_norm if hasattr(ref, "final_layer_norm") else ref.text_model.final_layer_norm  # fmt: skip
        np.testing.assert_allclose(skip, ln(want.hidden_states[-2]).numpy(), atol=1e-5)


def test_bad_inputs_and_configs(pair, tmp_path):
    model, _ = pair
    with pytest.raises(ShapeError, match="at most 12"):
        model(np.zeros((1, 13), np.int64))
    with pytest.raises(ShapeError, match=r"token ids must be in \[0, 99\)"):
        model(np.array([[1, 99]]))
    with pytest.raises(ShapeError, match="integers"):
        model(np.zeros((1, 3), np.float32))
    folder = tmp_path / "clip"
    shutil.copytree(model.source, folder)
    cfg = json.loads((folder / "config.json").read_text())
    for change, err, match in (
        ({"hidden_act": "swish"}, UnsupportedError, "hidden_act"),
        ({"num_attention_heads": 5}, FormatError, "does not split"),
        ({"hidden_size": 10**9}, FormatError, "hidden_size"),
        ({"hidden_size": 32, "num_attention_heads": 4}, ShapeError, "does not fit"),
        ({"model_type": "bert"}, FormatError, "not a CLIP text model"),
    ):
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(err, match=match):
            CLIPTextModel.from_pretrained(folder)
    (folder / "config.json").write_text("{oops")
    with pytest.raises(FormatError, match="not valid JSON"):
        CLIPTextModel.from_pretrained(folder)
