"""Adapter files: ember writes what peft reads and reads what peft writes; bad files fail clearly."""

import json

import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

import ember
import peft
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models import AutoModelForCausalLM
from ember.models._weights import assign_weights
from ember.models.llama import LlamaConfig, LlamaForCausalLM
from ember.peft import LoraConfig, PeftConfigError, PeftModel, get_peft_model
from ember.peft.files import hf_to_interleaved, interleaved_to_hf

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
)  # fmt: skip
IDS = np.random.default_rng(7).integers(0, 128, (2, 10))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "m"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY, attention_bias=True)
    cfg._attn_implementation = "eager"
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(d, safe_serialization=True)
    return d


def _ref(d):
    ref = transformers.LlamaForCausalLM.from_pretrained(d).eval()
    ref.config._attn_implementation = "eager"
    return ref


def _ref_logits(pm_ref):
    with torch.no_grad():
        return pm_ref(torch.tensor(IDS)).logits.numpy()


def _logits(pm):
    with ember.no_grad():
        return pm(ember.tensor(IDS)).numpy()


def _randomize(pm, seed=0):
    """Non-zero adapters (a trained look) so that the files carry something."""
    rng = np.random.default_rng(seed)
    for p in pm.parameters():
        if p.requires_grad:
            p._data = (rng.standard_normal(p.shape) * 0.1).astype(p._data.dtype)


CFG = dict(
    r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"],
    modules_to_save=["lm_head"], bias="lora_only",
)  # fmt: skip


def test_ember_adapter_loads_in_peft_with_the_same_logits(tiny, tmp_path):
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(**CFG))
    _randomize(pm)
    pm.save_pretrained(tmp_path / "ad")
    names = sorted(safetensors.numpy.load_file(tmp_path / "ad" / "adapter_model.safetensors"))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in names
    assert "base_model.model.lm_head.weight" in names
    assert "base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias" in names
    pm_ref = peft.PeftModel.from_pretrained(_ref(tiny), tmp_path / "ad")
    np.testing.assert_allclose(_ref_logits(pm_ref), _logits(pm), atol=1e-5, rtol=1e-5)
    # and the exact tensor names and shapes peft itself would save
    pm_ref.save_pretrained(tmp_path / "peft")
    theirs = safetensors.numpy.load_file(tmp_path / "peft" / "adapter_model.safetensors")
    ours = safetensors.numpy.load_file(tmp_path / "ad" / "adapter_model.safetensors")
    assert sorted(theirs) == sorted(ours)
    for k in theirs:
        np.testing.assert_array_equal(theirs[k], ours[k])


def test_peft_adapter_loads_in_ember_with_the_same_logits(tiny, tmp_path):
    torch.manual_seed(3)
    pm_ref = peft.get_peft_model(_ref(tiny), peft.LoraConfig(init_lora_weights=False, **CFG))
    pm_ref.save_pretrained(tmp_path / "ad")
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "ad")
    np.testing.assert_allclose(_logits(pm), _ref_logits(pm_ref), atol=1e-5, rtol=1e-5)
    assert not any(p.requires_grad for p in pm.parameters())  # inference unless is_trainable
    pm2 = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "ad", is_trainable=True
    )
    assert pm2.get_nb_trainable_parameters() == pm_ref.get_nb_trainable_parameters()


def test_named_adapters_switch_like_peft(tiny, tmp_path):
    torch.manual_seed(4)
    ref = peft.get_peft_model(
        _ref(tiny), peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    )
    ref.add_adapter(
        "other", peft.LoraConfig(r=3, target_modules=["v_proj", "o_proj"], init_lora_weights=False)
    )
    ref.save_pretrained(tmp_path / "both")
    assert (tmp_path / "both" / "other" / "adapter_config.json").is_file()
    pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "both")
    pm.load_adapter(tmp_path / "both" / "other", "other")
    for name in ("default", "other", "default"):
        ref.set_adapter(name)
        pm.set_adapter(name)
        assert pm.active_adapter == name
        np.testing.assert_allclose(_logits(pm), _ref_logits(ref), atol=1e-5, rtol=1e-5)
    with pytest.raises(PeftConfigError, match="nope"):
        pm.set_adapter("nope")
    pm.save_pretrained(tmp_path / "again")
    back = json.loads((tmp_path / "again" / "other" / "adapter_config.json").read_text())
    assert back["r"] == 3 and sorted(back["target_modules"]) == ["o_proj", "v_proj"]
    pm.delete_adapter("other")
    assert pm.active_adapter == "default" and list(pm.peft_config) == ["default"]


def test_trainable_adapter_is_the_active_one(tiny):
    pm = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=2, target_modules=["q_proj"])
    )
    pm.add_adapter("b", LoraConfig(r=2, target_modules=["q_proj"]))
    train = lambda: sorted({k.split(".")[-2] for k, p in pm.named_parameters() if p.requires_grad})  # noqa: E731
    assert train() == ["default"]
    pm.set_adapter("b")
    assert train() == ["b"]


def _interleaved_twin(d):
    """The tiny model in GGUF row order: q/k rows permuted, interleaved RoPE (as from a GGUF)."""
    cfg = json.loads((d / "config.json").read_text())
    model = LlamaForCausalLM(LlamaConfig.from_dict({**cfg, "rope_interleaved": True}))
    w = dict(safetensors.numpy.load_file(d / "model.safetensors"))
    for k in list(w):
        if ".q_proj." in k:
            w[k] = hf_to_interleaved(w[k], TINY["num_attention_heads"])
        if ".k_proj." in k:
            w[k] = hf_to_interleaved(w[k], TINY["num_key_value_heads"])
    assign_weights(model, w)
    return model


def test_gguf_row_order_model_reads_and_writes_hf_order_adapters(tiny, tmp_path):
    x = np.arange(24.0).reshape(8, 3)
    np.testing.assert_array_equal(interleaved_to_hf(hf_to_interleaved(x, 2), 2), x)
    twin = _interleaved_twin(tiny)
    np.testing.assert_allclose(_logits(twin), _ref_logits(_ref(tiny)), atol=1e-5)  # same model
    torch.manual_seed(5)
    pm_ref = peft.get_peft_model(_ref(tiny), peft.LoraConfig(init_lora_weights=False, **CFG))
    pm_ref.save_pretrained(tmp_path / "ad")
    pm = PeftModel.from_pretrained(twin, tmp_path / "ad")
    np.testing.assert_allclose(_logits(pm), _ref_logits(pm_ref), atol=1e-5, rtol=1e-5)
    pm.save_pretrained(tmp_path / "back")
    a = safetensors.numpy.load_file(tmp_path / "ad" / "adapter_model.safetensors")
    b = safetensors.numpy.load_file(tmp_path / "back" / "adapter_model.safetensors")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_misspelled_target_is_an_error(tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny)
    with pytest.raises(PeftConfigError, match=r"\['q_prj'\].*q_proj"):
        get_peft_model(model, LoraConfig(target_modules=["q_prj", "v_proj"]))
    with pytest.raises(PeftConfigError, match="adapt no module"):
        get_peft_model(model, LoraConfig(target_modules=r".*\.nothing"))
    with pytest.raises(PeftConfigError, match="adapt no module"):
        get_peft_model(model, LoraConfig(target_modules=["q_proj"], layers_to_transform=[7]))
    with pytest.raises(PeftConfigError, match="lora_dropout"):
        LoraConfig(target_modules=["q_proj"], lora_dropout=1.5)
    with pytest.raises(UnsupportedError, match="target module 'model.norm'"):
        get_peft_model(model, LoraConfig(target_modules=["norm"]))
    assert not any("lora" in k for k, _ in model.named_modules())  # nothing was half-applied


def test_bad_adapter_files_are_clear_errors(tiny, tmp_path):
    pm = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=4, target_modules=["q_proj"])
    )
    pm.save_pretrained(tmp_path / "ok")
    cfg = json.loads((tmp_path / "ok" / "adapter_config.json").read_text())

    def variant(name, **changes):
        d = tmp_path / name
        d.mkdir()
        (d / "adapter_config.json").write_text(json.dumps({**cfg, **changes}))
        (d / "adapter_model.safetensors").write_bytes(
            (tmp_path / "ok" / "adapter_model.safetensors").read_bytes()
        )
        return d

    fresh = lambda: AutoModelForCausalLM.from_pretrained(tiny)  # noqa: E731
    with pytest.raises(FormatError, match=r"unknown fields \['lora_alfa'\]"):
        PeftModel.from_pretrained(fresh(), variant("unknown", lora_alfa=3))
    with pytest.raises(UnsupportedError, match="use_dora"):
        PeftModel.from_pretrained(fresh(), variant("dora", use_dora=True))
    with pytest.raises(ShapeError, match=r"q_proj.*\(8, 64\)"):
        PeftModel.from_pretrained(fresh(), variant("rank", r=8))
    small = tmp_path / "small"
    small.mkdir()
    torch.manual_seed(0)
    other = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY, "hidden_size": 32}))
    peft.get_peft_model(other, peft.LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(
        small
    )
    with pytest.raises(ShapeError, match="model.layers.0.self_attn.q_proj"):
        PeftModel.from_pretrained(fresh(), small)
    with pytest.raises(FormatError, match="not valid JSON"):
        d = variant("json")
        (d / "adapter_config.json").write_text("{")
        PeftModel.from_pretrained(fresh(), d)
    with pytest.raises(FileNotFoundError):
        PeftModel.from_pretrained(fresh(), tmp_path / "missing")
