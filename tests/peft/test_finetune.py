"""Fine-tuning data (labels on assistant tokens, bad lines, long records) and `ember finetune`."""

import argparse
import json
import warnings

import numpy as np
import pytest

from ember.errors import ShapeError
from ember.peft.data import IGNORE, DataError, batches, encode_file, encode_record, read_jsonl


@pytest.fixture(scope="module")
def tok():
    from ember.generation.tokenizer import Tokenizer
    from ember.io import open_gguf
    from ember.models.hub import default_model_path

    with open_gguf(default_model_path()) as f:
        return Tokenizer.from_gguf_metadata(dict(f.metadata))


def _labelled_text(tok, ex):
    return tok.decode([t for t in ex.labels if t != IGNORE])


def test_only_assistant_tokens_are_labelled(tok):
    ex = encode_record(tok, {"prompt": "Capital of Peru?", "completion": "Lima."})
    assert len(ex.ids) == len(ex.labels)
    text = _labelled_text(tok, ex)
    assert text.startswith("Lima.") and "<|im_end|>" in text and "Peru" not in text
    full = tok.decode(ex.ids)
    assert "Capital of Peru?" in full and full.count("Lima.") == 1
    labelled = [i for i, t in enumerate(ex.labels) if t != IGNORE]
    assert all(ex.labels[i] == ex.ids[i] for i in labelled)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    ex = encode_record(tok, {"messages": msgs})
    text = _labelled_text(tok, ex)
    assert text.replace("<|im_end|>", "").split() == ["4", "6"]


def test_bad_lines_name_their_line(tok, tmp_path):
    p = tmp_path / "d.jsonl"
    good = json.dumps({"prompt": "a", "completion": "b"})
    p.write_text(
        "\n".join(
            [
                good,
                "{not json",
                good,
                json.dumps({"messages": []}),
                "",
                json.dumps({"messages": [{"role": "user", "content": "x"}]}),
                json.dumps([1]),
            ]
        )
        + "\n"
    )
    with pytest.raises(DataError, match=r"d.jsonl:2: "):
        read_jsonl(p)
    with pytest.warns(UserWarning) as w:
        recs = read_jsonl(p, on_error="skip")
    assert [n for n, _ in recs] == [1, 3]
    msgs = " ".join(str(x.message) for x in w)
    assert ":2:" in msgs and ":4: 'messages' must be a non-empty list" in msgs
    assert ":6: no assistant message" in msgs and ":7: expected a JSON object" in msgs
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="no usable records"):
        read_jsonl(tmp_path / "e.jsonl")


def test_long_records_truncate_skip_or_fail(tok, tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        json.dumps({"prompt": "hi", "completion": "word " * 80})
        + "\n"
        + json.dumps({"prompt": "a", "completion": "b"})
        + "\n"
    )
    with pytest.warns(
        UserWarning, match=r"truncated .*d.jsonl:1: \d+ tokens, more than --max-length 40"
    ):
        exs = encode_file(tok, p, 40)
    assert [len(e.ids) for e in exs][0] == 40 and len(exs) == 2
    with pytest.raises(ShapeError, match="d.jsonl:1"):
        encode_file(tok, p, 40, on_long="error")
    with pytest.warns(UserWarning, match="skipped"):
        assert [e.line for e in encode_file(tok, p, 40, on_long="skip")] == [2]
    ids, labels = batches(exs, 2, pad_id=0)[0]
    assert ids.shape == labels.shape == (2, 40)
    assert (labels.numpy()[1, len(exs[1].ids) :] == IGNORE).all()


def _args(tmp_path, **kw):
    from ember.cli import finetune

    p = argparse.ArgumentParser()
    finetune.add_arguments(p)
    argv = ["--data", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / kw.pop("out", "out"))]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return p.parse_args(argv)


def test_finetune_command_trains_saves_and_resumes_exactly(tmp_path):
    from ember.cli import finetune
    from ember.peft import PeftModel

    rows = [{"prompt": f"Code for item {i}?", "completion": f"ITEM-{i:03d}"} for i in range(6)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = dict(epochs=2, batch_size=3, rank=2, targets="q_proj,v_proj", lr=1e-3, max_length=48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            finetune.run(_args(tmp_path, out="straight", gguf=tmp_path / "a.gguf", **common)) == 0
        )
        assert finetune.run(_args(tmp_path, out="resumed", **{**common, "epochs": 1})) == 0
        assert finetune.run(_args(tmp_path, out="resumed", resume=True, **common)) == 0
    for d in ("straight", "resumed"):
        assert (tmp_path / d / "adapter" / "adapter_config.json").is_file()
        assert (tmp_path / d / "last.safetensors").is_file()
    assert (tmp_path / "a.gguf").is_file()
    import safetensors.numpy

    a = safetensors.numpy.load_file(tmp_path / "straight" / "adapter" / "adapter_model.safetensors")
    b = safetensors.numpy.load_file(tmp_path / "resumed" / "adapter" / "adapter_model.safetensors")
    assert sorted(a) == sorted(b) and len(a) == 2 * 2 * 30
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert any(np.abs(v).max() > 0 for k, v in a.items() if "lora_B" in k)  # it trained
    from ember.models import AutoModelForCausalLM
    from ember.models.hub import default_model_path

    pm = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(default_model_path()),
        tmp_path / "straight" / "adapter",
    )
    assert pm.active_adapter == "default"
