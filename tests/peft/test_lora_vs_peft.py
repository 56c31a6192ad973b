"""ember.peft against transformers + peft on a tiny random Llama, float64 on both sides."""

import numpy as np
import pytest
import torch
import transformers

import ember
import peft
from ember.models import AutoModelForCausalLM
from ember.nn import functional as F
from ember.peft import LoraConfig, get_peft_model

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
)  # fmt: skip

CONFIGS = {
    "qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "all_linear_rslora": dict(r=4, lora_alpha=16, target_modules="all-linear", use_rslora=True),
    "regex_patterns": dict(
        r=2, lora_alpha=4, target_modules=r".*\.(k_proj|o_proj|down_proj)",
        rank_pattern={"down_proj": 6}, alpha_pattern={r"layers\.1\.self_attn\.o_proj": 3.0},
    ),
    "layers_exclude_save": dict(
        r=3, lora_alpha=5, target_modules=["q_proj", "k_proj", "up_proj", "gate_proj"],
        layers_to_transform=[1], layers_pattern="layers", exclude_modules=["gate_proj"],
        modules_to_save=["lm_head"],
    ),
    "bias_all": dict(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], bias="all"),
}  # fmt: skip


def _tiny(path, **extra):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**{**TINY, **extra})
    cfg._attn_implementation = "eager"
    ref = transformers.LlamaForCausalLM(cfg).double().eval()
    ref.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tiny")
    return {
        "plain": _tiny(base / "plain"),
        "bias": _tiny(base / "bias", attention_bias=True, mlp_bias=True),
    }


def _pair(tiny_dirs, name, **overrides):
    """(peft model, ember model) with the same random (non-zero B) initial adapters."""
    kw = {**CONFIGS[name], **overrides}
    d = tiny_dirs["bias" if kw.get("bias") == "all" else "plain"]
    ref = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float64).eval()
    ref.config._attn_implementation = "eager"
    torch.manual_seed(1)
    pm_ref = peft.get_peft_model(ref, peft.LoraConfig(init_lora_weights=False, **kw))
    model = AutoModelForCausalLM.from_pretrained(d, dtype="float64")
    pm = get_peft_model(model, LoraConfig(init_lora_weights=False, **kw))
    theirs = dict(pm_ref.named_parameters())
    ours = dict(pm.named_parameters())
    trainable_ref = sorted(k for k, p in theirs.items() if p.requires_grad)
    assert sorted(k for k, p in ours.items() if p.requires_grad) == trainable_ref
    for k in trainable_ref:  # the same initial adapter (and modules_to_save) weights
        ours[k]._data = theirs[k].detach().numpy().copy()
    return pm_ref, pm


def _batch():
    rng = np.random.default_rng(3)
    return rng.integers(0, TINY["vocab_size"], (2, 11))


def _loss_ref(pm_ref, ids):
    logits = pm_ref(torch.tensor(ids)).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), torch.tensor(ids[:, 1:]).reshape(-1)
    )


def _loss(pm, ids):
    logits = pm(ember.tensor(ids))
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ember.tensor(ids[:, 1:]).reshape(-1)
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_and_gradients_match_peft(tiny_dirs, name):
    pm_ref, pm = _pair(tiny_dirs, name)
    ids = _batch()
    with torch.no_grad():
        want = pm_ref(torch.tensor(ids)).logits.numpy()
    got = pm(ember.tensor(ids)).detach().numpy()
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    with pm.disable_adapter():
        plain = pm(ember.tensor(ids)).detach().numpy()
    assert np.abs(got - plain).max() > 1e-4  # the adapters do change the output
    _loss_ref(pm_ref, ids).backward()
    _loss(pm, ids).backward()
    ours = dict(pm.named_parameters())
    n = 0
    for k, p in pm_ref.named_parameters():
        if p.requires_grad:
            np.testing.assert_allclose(ours[k].grad.numpy(), p.grad.numpy(), atol=1e-6, rtol=0)
            n += 1
        else:
            assert ours[k].grad is None, k
    assert n > 0
    assert pm.get_nb_trainable_parameters() == pm_ref.get_nb_trainable_parameters()


@pytest.mark.parametrize("name", ["qv", "layers_exclude_save", "bias_all"])
def test_twenty_adamw_steps_match_peft(tiny_dirs, name):
    pm_ref, pm = _pair(tiny_dirs, name)
    opt_ref = torch.optim.AdamW([p for p in pm_ref.parameters() if p.requires_grad], lr=1e-2)
    opt = ember.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-2)
    rng = np.random.default_rng(5)
    for _ in range(20):
        ids = rng.integers(0, TINY["vocab_size"], (2, 9))
        opt_ref.zero_grad()
        loss_ref = _loss_ref(pm_ref, ids)
        loss_ref.backward()
        opt_ref.step()
        opt.zero_grad()
        loss = _loss(pm, ids)
        loss.backward()
        opt.step()
        assert abs(loss.item() - loss_ref.item()) < 1e-6
    ours = dict(pm.named_parameters())
    for k, p in pm_ref.named_parameters():
        # k_proj's bias: RoPE's slow pairs barely rotate it, so those entries' gradients are
        # tiny and each side's float32 cos/sin tables (torch's and numpy's differ by an ulp)
        # move them by ~1e-8 relative; AdamW divides by sqrt(v) and steps them by lr anyway
        tol = 2e-4 if k.endswith("k_proj.bias") else 1e-6
        np.testing.assert_allclose(ours[k].detach().numpy(), p.detach().numpy(), atol=tol, rtol=0)


@pytest.mark.parametrize("name", ["qv", "all_linear_rslora", "regex_patterns"])
def test_merge_and_unload_equals_peft(tiny_dirs, name):
    pm_ref, pm = _pair(tiny_dirs, name)
    ids = _batch()
    with torch.no_grad():
        before = pm_ref(torch.tensor(ids)).logits.numpy()
    merged_ref = pm_ref.merge_and_unload()
    merged = pm.merge_and_unload()
    want = {k: v.detach().numpy() for k, v in merged_ref.state_dict().items()}
    got = {k: v.detach().numpy() for k, v in merged.state_dict().items()}
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-12, rtol=0, err_msg=k)
    assert not any("lora" in k for k, _ in merged.named_modules())
    np.testing.assert_allclose(
        merged(ember.tensor(ids)).detach().numpy(), before, atol=1e-6, rtol=0
    )


def test_merge_unmerge_and_disable_adapter(tiny_dirs):
    pm_ref, pm = _pair(tiny_dirs, "qv")
    ids = ember.tensor(_batch())
    adapted = pm(ids).detach().numpy()
    with pm.disable_adapter():
        plain = pm(ids).detach().numpy()
    with torch.no_grad(), pm_ref.disable_adapter():
        np.testing.assert_allclose(plain, pm_ref(torch.tensor(_batch())).logits.numpy(), atol=1e-6)
    assert np.abs(adapted - plain).max() > 1e-3
    np.testing.assert_allclose(
        pm(ids).detach().numpy(), adapted, atol=0
    )  # re-enabled after the block
    q = pm.base_model.model.model.layers[0].self_attn.q_proj
    w0 = q.base_layer.weight.detach().numpy().copy()
    pm.merge_adapter()
    assert q.merged and np.abs(q.base_layer.weight.detach().numpy() - w0).max() > 0
    np.testing.assert_allclose(pm(ids).detach().numpy(), adapted, atol=1e-10)
    pm.unmerge_adapter()
    np.testing.assert_allclose(q.base_layer.weight.detach().numpy(), w0, atol=1e-14)
    np.testing.assert_allclose(pm(ids).detach().numpy(), adapted, atol=1e-10)
