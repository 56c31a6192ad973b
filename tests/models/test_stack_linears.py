"""ember.inference.stack_linears on the decoder, and the decoder's kernel paths (no graph) against
its autograd paths (every op recorded) for each family."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.inference.stack import stack_linears, unstack_linears


def _randomize(model, scale=0.2):
    for p in model.parameters():
        p._data[...] = np.random.default_rng(p.numel()).standard_normal(p.shape) * scale


def _tiny_llama(qtype=None, stack=True, **kw):
    from ember.models.llama import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=1000.0, **kw)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    _randomize(model)
    if qtype is not None:
        from ember.quant import quantize

        quantize(model, qtype, skip=("lm_head",))
    return stack_linears(model) if stack else model


def _tiny(family):
    if family == "gemma2":
        from ember.models.gemma import GemmaConfig, GemmaForCausalLM

        cfg = GemmaConfig.from_dict({"model_type": "gemma2", "vocab_size": 80, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 12, "sliding_window": 4,
            "attn_logit_softcapping": 1.0, "final_logit_softcapping": 3.0,
            "query_pre_attn_scalar": 10})  # fmt: skip
        return GemmaForCausalLM(cfg)
    if family == "phi3":
        from ember.models.phi3 import Phi3Config, Phi3ForCausalLM

        cfg = Phi3Config.from_dict({"vocab_size": 80, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "partial_rotary_factor": 0.5, "sliding_window": 5})  # fmt: skip
        return Phi3ForCausalLM(cfg)
    from ember.models.gpt2 import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config.from_dict({"vocab_size": 80, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                "n_positions": 32})  # fmt: skip
    return GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("qtype", [None, "q8_0", "q4_1"])
@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "rope_interleaved": True}])
def test_llama_inference_path_equals_autograd_path(qtype, extra):
    model = _tiny_llama(qtype, **extra)
    ids = ember.tensor(np.random.default_rng(7).integers(0, 96, (2, 9)))
    with ember.no_grad():
        fast = model(ids).numpy()
    slow = model(ids)  # parameters require grad: every step is a recorded op, nothing stacked
    assert slow.requires_grad
    np.testing.assert_allclose(fast, slow.detach().numpy(), rtol=1e-4, atol=1e-4)
    slow.sum().backward()
    assert model.model.layers[0].input_layernorm.weight.grad is not None
    if qtype is None:
        assert model.model.layers[0].self_attn.k_proj.weight.grad is not None


@pytest.mark.parametrize("family", ["gemma2", "phi3", "gpt2"])
def test_family_kernel_path_equals_autograd_path(family):
    model = _tiny(family)
    _randomize(model)
    ids = ember.tensor(np.random.default_rng(8).integers(0, 80, (2, 11)))
    with ember.no_grad():
        fast = model(ids).numpy()
    slow = model(ids)
    np.testing.assert_allclose(fast, slow.detach().numpy(), rtol=1e-4, atol=1e-4)
    slow.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_stacked_product_serves_each_layer_and_follows_replacements():
    from ember.quant import QTensor

    model = _tiny_llama("q4_1")
    plain = _tiny_llama("q4_1", stack=False)
    attn = model.model.layers[0].self_attn
    x = ember.from_numpy(np.random.default_rng(8).standard_normal((1, 3, 64)).astype(np.float32))
    with ember.no_grad():
        got = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)]
        stack = attn.q_proj.__dict__["forward"].stack
        assert isinstance(stack.w, QTensor) and stack.w.shape == (128, 64) and stack.enabled
        pa = plain.model.layers[0].self_attn
        for g, lin in zip(got, (pa.q_proj, pa.k_proj, pa.v_proj)):
            np.testing.assert_allclose(g.numpy(), lin(x).numpy(), rtol=1e-6, atol=1e-6)
        w = attn.k_proj.weight  # a new weight object: the stacked copy is rebuilt
        attn.k_proj.weight = QTensor.from_float(np.zeros(w.shape, np.float32), "Q4_1")
        _, k2, _ = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        assert np.abs(k2.numpy()).max() == 0
        x1 = x[:, :1]  # one token: the matrix-vector kernel
        q1 = attn.q_proj(x1)
        attn.k_proj(x1), attn.v_proj(x1)
        np.testing.assert_allclose(q1.numpy(), pa.q_proj(x1).numpy(), rtol=1e-5, atol=1e-6)
    assert stack.misses == 0


def test_float_stack_keeps_parameters_state_dict_and_in_place_updates():
    model = _tiny_llama()
    keys = list(model.state_dict())
    params = [id(p) for p in model.parameters()]
    mlp = model.model.layers[1].mlp
    x = ember.from_numpy(np.random.default_rng(9).standard_normal((2, 64)).astype(np.float32))
    with ember.no_grad():
        g, u = mlp.gate_proj(x), mlp.up_proj(x)
        np.testing.assert_allclose(
            g.numpy(), x.numpy() @ mlp.gate_proj.weight.detach().numpy().T, 1e-5, 1e-5
        )
        mlp.up_proj.weight.mul_(2.0)  # an in-place update (as an optimizer step): seen at once
        g2, u2 = mlp.gate_proj(x), mlp.up_proj(x)
    np.testing.assert_allclose(u2.numpy(), 2 * u.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g2.numpy(), g.numpy())
    assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
    assert "forward" not in repr(model)


def test_packed_weights_stack_into_one_packed_product_and_follow_in_place_writes():
    from ember.kernels.cpu import gemm as G

    model = _tiny_llama(stack=False)
    ref = [p.detach().numpy().copy() for p in model.model.layers[0].self_attn.parameters()]
    fast = model.optimize_for_inference()
    attn = fast.model.layers[0].self_attn
    lins = (attn.q_proj, attn.k_proj, attn.v_proj)
    x = ember.from_numpy(np.random.default_rng(11).standard_normal((5, 64)).astype(np.float32))
    with ember.no_grad():
        got = [lin(x).numpy() for lin in lins]
        stack = attn.q_proj.__dict__["forward"].stack
        if G.microkernels_available():  # one packed product for the three
            assert G.packed_panels(stack.w._data) is not None and stack.w.shape == (128, 64)
            assert all(G.packed_panels(lin.weight._data) is not None for lin in lins)
        for g, w in zip(got, ref):
            np.testing.assert_allclose(g, x.numpy() @ w.T, rtol=1e-5, atol=1e-5)
        attn.k_proj.weight.mul_(2.0)  # in place: that layer's panels are dropped, nothing stale
        got2 = [lin(x).numpy() for lin in lins]
    np.testing.assert_allclose(got2[1], 2 * got[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got2[0], got[0], rtol=1e-6, atol=1e-6)


def test_unshared_inputs_stop_stacking_and_grad_runs_per_layer():
    model = _tiny_llama()
    attn = model.model.layers[0].self_attn
    rng = np.random.default_rng(10)
    xs = [ember.from_numpy(rng.standard_normal((1, 64)).astype(np.float32)) for _ in range(4)]
    with ember.no_grad():
        for a, b in zip(xs, xs[1:]):  # q on one input, k/v on another (cross-attention-like)
            attn.q_proj(a)
            k = attn.k_proj(b)
            np.testing.assert_allclose(
                k.numpy(), b.numpy() @ attn.k_proj.weight.detach().numpy().T, 1e-5, 1e-5
            )
    stack = attn.q_proj.__dict__["forward"].stack
    assert not stack.enabled
    y = model.model.layers[1].self_attn.q_proj(xs[0])  # grad mode, parameters require grad
    assert y.requires_grad
    unstack_linears(model)
    assert "forward" not in attn.q_proj.__dict__


def test_auto_loading_stacks(tmp_path):
    import torch
    import transformers

    from ember.models import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2)  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, quantize="q8_0")
    assert "forward" in model.model.layers[0].mlp.up_proj.__dict__
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, quantize="q8_0", stack=False)
    ids = ember.tensor([[1, 5, 9, 2]])
    with ember.no_grad():
        np.testing.assert_allclose(model(ids).numpy(), plain(ids).numpy(), rtol=1e-5, atol=1e-5)
