"""llama.cpp LoRA GGUF adapters: the layout convert_lora_to_gguf.py writes, applied by ember."""

import gguf
import numpy as np
import pytest
import torch

import peft
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.io import save_gguf
from ember.models import AutoModelForCausalLM
from ember.peft import LoraConfig, get_peft_model, load_gguf_adapter, save_gguf_adapter
from ember.peft.files import hf_to_interleaved
from tests.peft.test_files import (  # noqa: F401  (tiny is a fixture)
    TINY,
    _interleaved_twin,
    _logits,
    _ref,
    _ref_logits,
    tiny,
)

CFG = dict(
    r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
    rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 3.0}, init_lora_weights=False,
)  # fmt: skip


@pytest.fixture
def peft_dir(tiny, tmp_path):  # noqa: F811
    torch.manual_seed(2)
    pm_ref = peft.get_peft_model(_ref(tiny), peft.LoraConfig(**CFG))
    pm_ref.save_pretrained(tmp_path / "ad")
    return pm_ref, tmp_path / "ad"


def test_layout_is_llama_cpps(tiny, peft_dir, tmp_path):  # noqa: F811
    pm_ref, d = peft_dir
    n = save_gguf_adapter(d, tmp_path / "a.gguf", base=tiny)
    r = gguf.GGUFReader(tmp_path / "a.gguf")
    field = lambda k: r.fields[k].contents()  # noqa: E731
    assert field("general.type") == "adapter" and field("adapter.type") == "lora"
    assert field("general.architecture") == "llama"
    assert r.fields["adapter.lora.alpha"].types == [gguf.GGUFValueType.FLOAT32]
    assert field("adapter.lora.alpha") == 8.0
    tensors = {t.name: t for t in r.tensors}
    assert n == len(tensors) == 2 * 5 * TINY["num_hidden_layers"]
    a = tensors["blk.1.attn_q.weight.lora_a"]
    b = tensors["blk.1.attn_q.weight.lora_b"]
    # ggml's ne order: lora_a is [in, r], lora_b is [r, out]
    assert list(a.shape) == [64, 4] and list(b.shape) == [4, 64]
    assert a.tensor_type == gguf.GGMLQuantizationType.F32
    assert list(tensors["blk.0.ffn_down.weight.lora_a"].shape) == [96, 2]
    sd = {k: v.detach().numpy() for k, v in pm_ref.named_parameters()}
    pre = "base_model.model.model.layers.1."
    np.testing.assert_array_equal(
        np.asarray(a.data), sd[pre + "self_attn.q_proj.lora_A.default.weight"]
    )
    # q and k: B's rows permuted as convert_hf_to_gguf permutes the llama weights
    want_b = hf_to_interleaved(sd[pre + "self_attn.q_proj.lora_B.default.weight"], 4)
    np.testing.assert_array_equal(np.asarray(b.data), want_b)
    kb = np.asarray(tensors["blk.1.attn_k.weight.lora_b"].data)
    np.testing.assert_array_equal(
        kb, hf_to_interleaved(sd[pre + "self_attn.k_proj.lora_B.default.weight"], 2)
    )
    # v: alpha 3 with r 4 where the file says alpha 8: llama.cpp's alpha / r folded into B
    vb = np.asarray(tensors["blk.1.attn_v.weight.lora_b"].data)
    want_v = sd[pre + "self_attn.v_proj.lora_B.default.weight"] * np.float32(3 / 8)
    np.testing.assert_allclose(vb, want_v, rtol=1e-6)


@pytest.mark.parametrize("order", ["hf", "gguf"])
def test_gguf_adapter_applies_with_peft_logits(tiny, peft_dir, tmp_path, order):  # noqa: F811
    pm_ref, d = peft_dir
    save_gguf_adapter(d, tmp_path / "a.gguf", base=tiny / "config.json")
    model = AutoModelForCausalLM.from_pretrained(tiny) if order == "hf" else _interleaved_twin(tiny)
    pm = load_gguf_adapter(model, tmp_path / "a.gguf")
    np.testing.assert_allclose(_logits(pm), _ref_logits(pm_ref), atol=1e-5, rtol=1e-5)
    # and written back from the model, the same file contents
    save_gguf_adapter(pm, tmp_path / "b.gguf")
    ta = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(tmp_path / "a.gguf").tensors}
    tb = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(tmp_path / "b.gguf").tensors}
    assert sorted(ta) == sorted(tb)
    for k in ta:
        np.testing.assert_allclose(tb[k], ta[k], rtol=1e-6, atol=1e-9, err_msg=k)


def test_scale_is_llama_cpps_lora_scale(tiny, peft_dir, tmp_path):  # noqa: F811
    pm_ref, d = peft_dir
    save_gguf_adapter(d, tmp_path / "a.gguf", base=tiny)
    with torch.no_grad():  # --lora FILE:0.5 is every update B @ A at half strength
        for k, p in pm_ref.named_parameters():
            if "lora_B" in k:
                p.mul_(0.5)
    half = load_gguf_adapter(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "a.gguf", 0.5)
    np.testing.assert_allclose(_logits(half), _ref_logits(pm_ref), atol=1e-5, rtol=1e-5)
    base = _logits(AutoModelForCausalLM.from_pretrained(tiny))
    zero = load_gguf_adapter(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "a.gguf", 0.0)
    np.testing.assert_allclose(_logits(zero), base, atol=1e-6)


def test_ember_trained_adapter_round_trips_through_gguf(tiny, tmp_path):  # noqa: F811
    pm = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny),
        LoraConfig(
            r=3, lora_alpha=6, target_modules="all-linear", use_rslora=True, init_lora_weights=False
        ),
    )
    want = _logits(pm)
    save_gguf_adapter(pm, tmp_path / "a.gguf")
    alpha = gguf.GGUFReader(tmp_path / "a.gguf").fields["adapter.lora.alpha"].contents()
    assert alpha == pytest.approx(6 * np.sqrt(3), rel=1e-6)  # rsLoRA: alpha / sqrt(r) as alpha' / r
    got = _logits(
        load_gguf_adapter(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "a.gguf")
    )
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_bad_gguf_adapters(tiny, peft_dir, tmp_path):  # noqa: F811
    _, d = peft_dir
    model = AutoModelForCausalLM.from_pretrained(tiny)
    save_gguf(
        tmp_path / "model.gguf", {"general.architecture": "llama"}, {"x": np.zeros(4, np.float32)}
    )
    with pytest.raises(FormatError, match="not a LoRA adapter"):
        load_gguf_adapter(model, tmp_path / "model.gguf")
    meta = {
        "general.architecture": "qwen2",
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": 8.0,
    }
    save_gguf(
        tmp_path / "qwen.gguf",
        meta,
        {
            "blk.0.attn_q.weight.lora_a": np.zeros((4, 64), np.float32),
            "blk.0.attn_q.weight.lora_b": np.zeros((64, 4), np.float32),
        },
    )
    with pytest.raises(FormatError, match="'qwen2'.*'llama'"):
        load_gguf_adapter(model, tmp_path / "qwen.gguf")
    meta["general.architecture"] = "llama"
    save_gguf(
        tmp_path / "shape.gguf",
        meta,
        {
            "blk.1.ffn_up.weight.lora_a": np.zeros((4, 32), np.float32),
            "blk.1.ffn_up.weight.lora_b": np.zeros((96, 4), np.float32),
        },
    )
    with pytest.raises(ShapeError, match=r"model.layers.1.mlp.up_proj.*\(4, 32\)"):
        load_gguf_adapter(model, tmp_path / "shape.gguf")
    save_gguf(
        tmp_path / "deep.gguf",
        meta,
        {
            "blk.9.ffn_up.weight.lora_a": np.zeros((4, 64), np.float32),
            "blk.9.ffn_up.weight.lora_b": np.zeros((96, 4), np.float32),
        },
    )
    with pytest.raises(ShapeError, match="model.layers.9.mlp.up_proj"):
        load_gguf_adapter(model, tmp_path / "deep.gguf")
    torch.manual_seed(0)
    saved = peft.get_peft_model(
        _ref(tiny), peft.LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"])
    )
    saved.save_pretrained(tmp_path / "mts")
    with pytest.raises(UnsupportedError, match="modules_to_save"):
        save_gguf_adapter(tmp_path / "mts", tmp_path / "x.gguf", base=tiny)
    assert not any("lora" in k for k, _ in model.named_modules())
