"""`ember list`, `--json` on info/inspect/embed/classify, stdin ('-'), progress bars, and the
silent-audio warning of `ember transcribe`."""

from __future__ import annotations

import io
import json
import os
import sys
import wave
from pathlib import Path

import numpy as np

from ember.cli.main import main
from ember.models.hub import default_model_path


def bytes_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_list_shows_the_bundled_models(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "Whisper tiny.en", "EfficientNet"):
        assert name in out
    assert str(default_model_path()) in out
    assert main(["list", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4 and all(r["installed"] and Path(r["path"]).exists() for r in rows)
    assert rows[0]["path"] == str(default_model_path()) and rows[0]["bytes"] > 50 * 2**20


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["architecture"] == "LlamaForCausalLM" and d["parameters"] == 134515008
    assert d["layers"] == 30 and d["context"] == 8192 and "Q4_1" in d["by_type"]


def test_inspect_json_on_the_bundled_gguf(capsys):
    assert main(["inspect", str(default_model_path()), "--json", "--limit", "2"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format"].startswith("GGUF v3") and d["tensor_count"] == 272
    assert len(d["tensors"]) == 2 and d["tensors"][0]["name"] == "token_embd.weight"
    tokens = d["metadata"]["tokenizer.ggml.tokens"]
    assert tokens["length"] == 49152 and tokens["head"][:3] == ["<|endoftext|>", "<|im_start|>",
                                                                "<|im_end|>"]  # fmt: skip
    assert d["metadata"]["general.architecture"] == "llama"


def test_embed_json_progress_and_stdin(capsys, monkeypatch):
    assert main(["embed", "A cat sits.", "A dog runs.", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dimension"] == 384 and doc["texts"] == ["A cat sits.", "A dog runs."]
    emb = np.array(doc["embeddings"])
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)

    bytes_stdin(monkeypatch, b"A cat sits.\n\nA dog runs.\r\nBirds fly.\n")
    assert main(["embed", "-", "--json", "--batch-size", "1", "--progress"]) == 0
    out, err = capsys.readouterr()
    doc2 = json.loads(out)
    assert doc2["texts"] == ["A cat sits.", "A dog runs.", "Birds fly."]
    np.testing.assert_allclose(doc2["embeddings"][:2], emb, atol=1e-5)  # batches of 1 agree
    assert "embed:" in err and "0/3" in err  # tqdm's bar, forced on (stderr is no terminal)

    assert main(["embed", "A cat sits.", "--batch-size", "1", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def _write_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, "<i2").tobytes())


def test_transcribe_warns_on_silence_and_shows_progress(capsys, tmp_path):
    silent = tmp_path / "silent.wav"
    _write_wav(silent, np.zeros(16000 * 31, np.int16))  # two 30 s windows
    assert main(["transcribe", str(silent), "--progress"]) == 0
    err = capsys.readouterr().err
    assert "ember transcribe: warning:" in err and "is silent" in err
    assert "transcribe:" in err and "0/2" in err and "window" in err


def test_transcribe_reads_stdin_and_does_not_warn_on_speech(capsys, monkeypatch):
    clip = Path(__file__).resolve().parents[1] / "models" / "whisper" / "hello.wav"
    bytes_stdin(monkeypatch, clip.read_bytes())
    assert main(["transcribe", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "warning" not in err


def test_transcribe_names_the_flag_the_model_refuses(capsys):
    clip = Path(__file__).resolve().parents[1] / "models" / "whisper" / "hello.wav"
    assert main(["transcribe", str(clip), "--language", "fr"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ember transcribe: error: --language fr: ") and "English" in err
    assert len(err.splitlines()) == 1


def test_classify_reads_an_image_from_stdin(capsys, monkeypatch):
    import skimage

    img = Path(skimage.__file__).parent / "data" / "coffee.png"
    bytes_stdin(monkeypatch, img.read_bytes())
    assert main(["classify", "-", "--json", "--top", "1"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["image"] == "-" and row["top"][0]["index"] == 967  # espresso


def test_classify_reports_each_bad_image_on_one_line(capsys, tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"nope")
    rc = main(["classify", str(bad), str(bad)])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 2 and all(ln.startswith("ember classify: error: ") for ln in lines)
    assert all(os.fspath(bad) in ln for ln in lines)
