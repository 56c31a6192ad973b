"""LLM kernels (ember.kernels.cpu.llm) against their numpy references, and the fused
inference paths built on them against the differentiable ops they stand in for."""

import numpy as np
import pytest
import torch

import ember
from ember.generation.cache import CausalMask, KVCache, cached_attention
from ember.kernels.cpu import llm
from ember.ops.rope import apply_rotary, apply_rotary_qk
from tests.helpers import gradcheck


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _rope_tables(rng, b, t, half, shared_batch=False):
    pos = rng.integers(0, 50, (1 if shared_batch else b, t))
    ang = pos[..., None] * (1.0 / 100.0 ** (np.arange(half) / half))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.fixture(params=["numba", "numpy"])
def impl(request, monkeypatch):
    """Run each test on the numba kernels and on the references (as without numba)."""
    if request.param == "numpy":
        monkeypatch.setattr(llm, "_K", {})
    else:
        assert llm._kernel("attention") is not None, "numba is a required dependency"
    return request.param


@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (3, 7, 33), (2, 576)])
@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm(impl, shape, weighted):
    rng = np.random.default_rng(0)
    x = _f32(rng, *shape, scale=3.0)
    w = _f32(rng, shape[-1]) if weighted else None
    got = llm.rms_norm(x, w, 1e-5)
    want = llm.rms_norm_reference(x, np.ones(shape[-1], np.float32) if w is None else w, 1e-5)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    tx = torch.nn.functional.rms_norm(
        torch.from_numpy(x), (shape[-1],), None if w is None else torch.from_numpy(w), 1e-5
    )
    np.testing.assert_allclose(got, tx.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("d", "half"), [(16, 8), (16, 4), (6, 3)])  # full and partial rotary
@pytest.mark.parametrize("shared_batch", [False, True])
def test_rope_qk_on_strided_views(impl, interleaved, d, half, shared_batch):
    rng = np.random.default_rng(1)
    b, t, hq, hk = 2, 5, 6, 2
    qkv = _f32(rng, b, t, (hq + 2 * hk) * d)  # q and k as views of one fused projection
    q = qkv[..., : hq * d].reshape(b, t, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].reshape(b, t, hk, d)
    cos, sin = _rope_tables(rng, b, t, half, shared_batch)
    cos, sin = np.broadcast_to(cos, (b, t, half)), np.broadcast_to(sin, (b, t, half))
    qo, ko = llm.rope_qk(q, k, cos, sin, interleaved)
    np.testing.assert_allclose(qo, llm.rope_reference(q, cos, sin, interleaved), atol=1e-6)
    np.testing.assert_allclose(ko, llm.rope_reference(k, cos, sin, interleaved), atol=1e-6)
    # and the reference against ember's differentiable rotary (float64 ground truth)
    want = apply_rotary(
        ember.from_numpy(q.astype(np.float64)),
        ember.from_numpy(cos[:, :, None].astype(np.float64)),
        ember.from_numpy(sin[:, :, None].astype(np.float64)),
        interleaved,
    )
    np.testing.assert_allclose(qo, want.numpy(), atol=1e-5)


def _pad(rng, b, s, empty_row=True):
    pad = rng.random((b, s)) > 0.3
    pad[:, -1] = True
    if empty_row:
        pad[-1, :-1] = False  # earlier queries of the last row see no key at all
    return pad


@pytest.mark.parametrize("path", ["serial", "parallel", "blocked"])
@pytest.mark.parametrize(
    ("t", "past", "window", "padded", "hq", "hk"),
    [(1, 0, None, False, 4, 4), (1, 9, None, False, 6, 2), (7, 0, None, False, 6, 3),
     (5, 6, 4, False, 6, 2), (6, 3, None, True, 4, 2), (1, 10, 3, True, 3, 1), (4, 0, 2, True, 2, 2)],
)  # fmt: skip
def test_attention_over_cache(impl, monkeypatch, path, t, past, window, padded, hq, hk):
    monkeypatch.setattr(llm, "PARALLEL_ATTENTION_WORK", 0 if path == "parallel" else 1 << 60)
    if path == "blocked":  # BLAS blocks of 2 query rows
        monkeypatch.setattr(llm, "BLOCKED_MIN_QUERIES", 1)
        monkeypatch.setattr(llm, "ATTENTION_BLOCK_SCORES", 2 * (hq // hk) * (past + t))
    rng = np.random.default_rng(t * 100 + past)
    b, d, max_len = 2, 8, 20
    s = past + t
    q = _f32(rng, b, t, hq + 1, d)[:, :, :hq]  # a strided view
    kb, vb = _f32(rng, b, hk, max_len, d), _f32(rng, b, hk, max_len, d)
    pad = _pad(rng, b, s) if padded else None
    got = llm.attention(q, kb, vb, s, past, window, pad, 0.3)
    want = llm.attention_reference(q, kb, vb, s, past, window or 0, pad, 0.3)
    assert got.shape == (b, t, hq * d)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the reference against torch's attention with the same boolean mask
    ok = llm.allowed_keys(b, t, s, past, window or 0, pad)
    rep = hq // hk
    tk = torch.from_numpy(kb[:, :, :s]).repeat_interleave(rep, 1)
    tv = torch.from_numpy(vb[:, :, :s]).repeat_interleave(rep, 1)
    tq = torch.from_numpy(np.ascontiguousarray(q)).transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, torch.from_numpy(ok)[:, None], scale=0.3
    )
    np.testing.assert_allclose(
        got, ref.transpose(1, 2).reshape(b, t, -1).numpy(), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("shape", [(0, 4), (1, 1), (3, 7, 40), (70, 300)])
def test_silu_mul(impl, shape):
    rng = np.random.default_rng(3)
    gu = _f32(rng, *shape[:-1], 2 * shape[-1], scale=30.0)  # exp(-g) overflows for g < -88
    g, u = gu[..., : shape[-1]], gu[..., shape[-1] :]
    got = llm.silu_mul(g, u)
    want = torch.nn.functional.silu(torch.from_numpy(g.copy())) * torch.from_numpy(u.copy())
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, llm.silu_mul_reference(g, u), rtol=1e-5, atol=1e-5)


# --- the Tensor-level fast paths equal the differentiable paths --------------------------------


def test_rms_norm_fast_path_equals_autograd_path():
    rng = np.random.default_rng(4)
    x, w = ember.from_numpy(_f32(rng, 2, 3, 24)), ember.from_numpy(_f32(rng, 24))
    with ember.no_grad():
        fast = ember.nn.functional.rms_norm(x, (24,), w, 1e-6)
    slow = ember.nn.functional.rms_norm(x, (24,), w.requires_grad_(), 1e-6)
    assert fast._ctx is None and slow._ctx is not None
    np.testing.assert_allclose(fast.numpy(), slow.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_qk_matches_apply_rotary(interleaved):
    rng = np.random.default_rng(5)
    q, k = ember.from_numpy(_f32(rng, 2, 4, 3, 8)), ember.from_numpy(_f32(rng, 2, 4, 1, 8))
    c, s = _rope_tables(rng, 2, 4, 4, shared_batch=True)
    cos, sin = ember.from_numpy(c[:, :, None]), ember.from_numpy(s[:, :, None])
    with ember.no_grad():
        qf, kf = apply_rotary_qk(q, k, cos, sin, interleaved)
    qs, ks = apply_rotary_qk(q.requires_grad_(), k, cos, sin, interleaved)
    assert qs._ctx is not None
    np.testing.assert_allclose(qf.numpy(), qs.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(kf.numpy(), ks.numpy(), atol=1e-6)


@pytest.mark.parametrize("padded", [False, True])
def test_cached_attention_fast_path_equals_sdpa_path(padded):
    """Prefill then two decode steps, once through the kernel and once through F.sdpa."""
    rng = np.random.default_rng(6)
    b, hq, hk, d, window = 2, 4, 2, 8, 5
    steps = [7, 1, 1]
    pad = _pad(rng, b, sum(steps), empty_row=False) if padded else None
    caches = [KVCache(1, b, hk, 12, d), KVCache(1, b, hk, 12, d)]
    for t in steps:
        q, k, v = (_f32(rng, b, t, h, d) for h in (hq, hk, hk))
        outs = []
        for cache, grad in zip(caches, (False, True)):
            mask = CausalMask(
                t, cache.pos, None if pad is None else pad[:, : cache.pos + t], window
            )
            with ember.set_grad_enabled(grad):
                qt = ember.from_numpy(q).requires_grad_(grad)
                outs.append(
                    cached_attention(qt, ember.from_numpy(k), ember.from_numpy(v), mask, cache)
                )
            cache.advance(t)
        assert outs[0]._ctx is None and outs[1]._ctx is not None
        np.testing.assert_allclose(outs[0].numpy(), outs[1].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(caches[0].k[0], caches[1].k[0])


def test_silu_mul_op_gradient():
    from ember.models.llama import silu_mul

    gradcheck(silu_mul, [(3, 5), (3, 5)])
    g = ember.from_numpy(np.linspace(-100, 100, 9, dtype=np.float32))
    np.testing.assert_allclose(
        silu_mul(g, g).numpy(), (ember.nn.functional.silu(g) * g).numpy(), rtol=1e-6, atol=1e-30
    )


# --- fused projections and the model's two paths ----------------------------------------------


def _tiny_llama(qtype=None, **kw):
    from ember.models.llama import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=1000.0, **kw)  # fmt: skip
    ember.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    for p in model.parameters():
        p._data[...] = np.random.default_rng(p.numel()).standard_normal(p.shape) * 0.2
    if qtype is not None:
        from ember.quant import quantize

        quantize(model, qtype, skip=("lm_head",))
    return model


@pytest.mark.parametrize("qtype", [None, "q8_0", "q4_1"])
@pytest.mark.parametrize("extra", [{}, {"attention_bias": True, "rope_interleaved": True}])
def test_llama_inference_path_equals_autograd_path(qtype, extra):
    model = _tiny_llama(qtype, **extra)
    ids = ember.tensor(np.random.default_rng(7).integers(0, 96, (2, 9)))
    with ember.no_grad():
        fast = model(ids).numpy()
    slow = model(ids)  # parameters require grad: every step is a recorded op
    assert slow.requires_grad
    np.testing.assert_allclose(fast, slow.detach().numpy(), rtol=1e-4, atol=1e-4)
    slow.sum().backward()
    assert model.model.layers[0].input_layernorm.weight.grad is not None


def test_linear_group_fuses_quantized_weights_and_follows_replacements():
    from ember.quant import QTensor

    model = _tiny_llama("q4_1")
    attn = model.model.layers[0].self_attn
    x = ember.from_numpy(np.random.default_rng(8).standard_normal((1, 3, 64)).astype(np.float32))
    with ember.no_grad():
        q, k, v = attn.qkv(x, attn.q_proj, attn.k_proj, attn.v_proj)
        assert isinstance(attn.qkv._weight, QTensor) and attn.qkv._weight.shape == (128, 64)
        for got, lin in zip((q, k, v), (attn.q_proj, attn.k_proj, attn.v_proj)):
            np.testing.assert_allclose(got.numpy(), lin(x).numpy(), rtol=1e-6, atol=1e-6)
        w = attn.k_proj.weight  # a new weight object: the stacked copy is rebuilt
        attn.k_proj.weight = QTensor.from_float(np.zeros(w.shape, np.float32), "Q4_1")
        _, k2, _ = attn.qkv(x, attn.q_proj, attn.k_proj, attn.v_proj)
        assert np.abs(k2.numpy()).max() == 0
        x1 = x[:, :1]  # one token: the matrix-vector kernel
        q1, _, _ = attn.qkv(x1, attn.q_proj, attn.k_proj, attn.v_proj)
        np.testing.assert_allclose(q1.numpy(), attn.q_proj(x1).numpy(), rtol=1e-5, atol=1e-6)


def test_quantized_prefill_threaded_tiles(monkeypatch):
    """The multi-threaded prefill path of ember.kernels.cpu.quant (tiles taken in turn)."""
    from ember.kernels.cpu.quant import _common
    from ember.quant import QTensor, dequantize, quantize_array

    monkeypatch.setattr(_common, "THREAD_TILE_BYTES", 16 * 64 * 4)  # 16 rows: ragged last tile
    rng = np.random.default_rng(9)
    n, k, m = 70, 64, 20
    raw = quantize_array(rng.standard_normal((n, k)).astype(np.float32), "Q4_1")
    x = _f32(rng, m, k)
    before = ember.get_num_threads()
    ember.set_num_threads(2)
    try:
        got = QTensor(raw, "Q4_1", (n, k)).matmul_t(x)
    finally:
        ember.set_num_threads(before)
    want = x @ dequantize(raw, "Q4_1", (n, k)).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_run_tiles_covers_every_tile_once_and_reraises():
    from ember.kernels.cpu.tiles import run_tiles, scratch

    count = np.zeros(37, np.int64)
    sums = np.zeros(37)

    def fn(i):
        count[i] += 1
        buf = scratch((3, i + 1))  # private to the thread, reused across its tiles
        buf[...] = i
        sums[i] = buf.sum()

    run_tiles(fn, 37, threads=2)
    np.testing.assert_array_equal(count, 1)
    np.testing.assert_array_equal(sums, [3 * i * (i + 1) for i in range(37)])

    def bad(i):
        if i == 5:
            raise ValueError("tile 5")

    with pytest.raises(ValueError, match="tile 5"):
        run_tiles(bad, 9, threads=2)
