"""ember.peft.load_adapter: either adapter file, scaled, several at once, against peft's logits."""

import numpy as np
import pytest
import torch

import peft
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models import AutoModelForCausalLM
from ember.peft import LoraConfig, PeftConfigError, PeftModel, load_adapter, save_gguf_adapter
from ember.peft.adapters import active_adapters, locate_adapter
from tests.peft.test_files import _logits, _ref, _ref_logits, tiny  # noqa: F401  (a fixture)

A = dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"])
B = dict(r=2, lora_alpha=3, target_modules="all-linear", use_rslora=True)  # over A's layers too


def _random_b(pm_ref, seed):
    """peft starts B at zero: give it values so that the adapter changes the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, p in pm_ref.named_parameters():
            if "lora_B" in k:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):  # noqa: F811
    """Two adapters saved by peft (folders) and as llama.cpp GGUFs; {name: (folder, gguf)}."""
    d = tmp_path_factory.mktemp("adapters")
    out = {}
    for name, cfg, seed in (("a", A, 1), ("b", B, 2)):
        torch.manual_seed(seed)
        pm_ref = peft.get_peft_model(_ref(tiny), peft.LoraConfig(**cfg))
        _random_b(pm_ref, seed)
        pm_ref.save_pretrained(d / name)
        if cfg["target_modules"] == "all-linear":  # peft saved the names; ember saves this
            ember_cfg = LoraConfig.from_pretrained(d / name)
            ember_cfg.target_modules = "all-linear"
            ember_cfg.save_pretrained(d / name)
        save_gguf_adapter(d / name, d / f"{name}.gguf", base=tiny)
        out[name] = (d / name, d / f"{name}.gguf")
    return out


def _peft_reference(tiny, saved, scales: dict[str, float]):  # noqa: F811
    """peft with the adapters loaded and all active, each B times its scale."""
    names = list(scales)
    ref = peft.PeftModel.from_pretrained(_ref(tiny), saved[names[0]][0], adapter_name=names[0])
    for n in names[1:]:
        ref.load_adapter(saved[n][0], adapter_name=n)
    ref.base_model.set_adapter(names)
    with torch.no_grad():
        for k, p in ref.named_parameters():
            for n, s in scales.items():
                if f"lora_B.{n}." in k:
                    p.mul_(s)
    return _ref_logits(ref)


@pytest.mark.parametrize("kind", [0, 1], ids=["peft-folder", "gguf"])
@pytest.mark.parametrize("scale", [1.0, 0.5, -1.5])
def test_one_adapter_scaled_is_pefts(tiny, saved, kind, scale):  # noqa: F811
    pm = load_adapter(AutoModelForCausalLM.from_pretrained(tiny), saved["a"][kind], scale)
    assert isinstance(pm, PeftModel)
    want = _peft_reference(tiny, saved, {"a": scale})
    np.testing.assert_allclose(_logits(pm), want, atol=2e-5, rtol=1e-5)


def test_scale_zero_is_the_base(tiny, saved):  # noqa: F811
    base = _logits(AutoModelForCausalLM.from_pretrained(tiny))
    for path in saved["a"]:
        pm = load_adapter(AutoModelForCausalLM.from_pretrained(tiny), path, 0.0)
        np.testing.assert_allclose(_logits(pm), base, atol=1e-6)


@pytest.mark.parametrize("kinds", [(0, 1), (1, 0), (1, 1)])
def test_two_adapters_add_up_as_in_peft(tiny, saved, kinds):  # noqa: F811
    pm = load_adapter(AutoModelForCausalLM.from_pretrained(tiny), saved["a"][kinds[0]], 0.7)
    pm = load_adapter(pm, saved["b"][kinds[1]], -1.0)
    assert active_adapters(pm) == ["default", "adapter1"]
    want = _peft_reference(tiny, saved, {"a": 0.7, "b": -1.0})
    np.testing.assert_allclose(_logits(pm), want, atol=2e-5, rtol=1e-5)


def test_a_file_in_the_peft_folder_names_it(saved):
    folder, gguf = saved["a"]
    assert locate_adapter(folder) == ("peft", folder)
    assert locate_adapter(folder / "adapter_config.json") == ("peft", folder)
    assert locate_adapter(folder / "adapter_model.safetensors") == ("peft", folder)
    assert locate_adapter(gguf) == ("gguf", gguf)


def test_errors_leave_the_model_as_it_was(tiny, saved, tmp_path):  # noqa: F811
    model = AutoModelForCausalLM.from_pretrained(tiny)
    base = _logits(model)
    with pytest.raises(FileNotFoundError):
        load_adapter(model, tmp_path / "nope")
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(FormatError, match="not an adapter"):
        load_adapter(model, tmp_path / "x.txt")
    with pytest.raises(PeftConfigError, match="finite"):
        load_adapter(model, saved["a"][1], float("nan"))
    # a folder whose tensors do not fit: shapes checked after the layers were wrapped
    bad = tmp_path / "bad"
    torch.manual_seed(0)
    small = peft.get_peft_model(_ref(tiny), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    small.save_pretrained(bad)
    cfg = LoraConfig.from_pretrained(bad)
    cfg.r = 3  # the config says r=3, the tensors are r=2
    cfg.save_pretrained(bad)
    with pytest.raises(ShapeError, match="model.layers.0.self_attn.q_proj"):
        load_adapter(model, bad)
    assert not any("lora" in k for k, _ in model.named_modules())
    np.testing.assert_array_equal(_logits(model), base)
    # and on a PeftModel: the adapters it had stay, active
    pm = load_adapter(model, saved["a"][0])
    want = _logits(pm)
    with pytest.raises(ShapeError):
        load_adapter(pm, bad)
    assert active_adapters(pm) == ["default"] and list(pm.peft_config) == ["default"]
    np.testing.assert_array_equal(_logits(pm), want)


def test_scaling_what_is_not_a_lora_pair_is_refused(tiny, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    ref = peft.get_peft_model(
        _ref(tiny), peft.LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head"])
    )
    ref.save_pretrained(tmp_path / "mts")
    with pytest.raises(UnsupportedError, match="modules_to_save"):
        load_adapter(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "mts", 0.5)
    pm = load_adapter(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "mts")  # scale 1
    np.testing.assert_allclose(_logits(pm), _ref_logits(ref), atol=2e-5, rtol=1e-5)
    with pytest.raises(UnsupportedError, match="lm_head"):  # two copies of one module
        load_adapter(pm, tmp_path / "mts")
    assert active_adapters(pm) == ["default"]


def test_all_linear_second_adapter_covers_layers_an_earlier_one_wrapped():
    """peft's "all-linear" rule picks a linear that already carries an adapter."""
    from ember.models.hub import default_model_path
    from ember.peft import get_peft_model
    from ember.peft.model import target_module_names

    model = AutoModelForCausalLM.from_pretrained(default_model_path())
    pm = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    every = target_module_names(pm.base_model.model, LoraConfig(target_modules="all-linear"))
    assert any(k.endswith("self_attn.q_proj") for k in every)
    assert any(k.endswith("mlp.down_proj") for k in every)
