"""The cached_attention op: its kernels (kernels.cpu.cached_attention: numba rows, parallel rows,
BLAS blocks) against their numpy reference and torch, and the op's autograd path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import cached_attention as ca
from ember.nn import CausalMask, KVCache
from ember.nn import functional as F
from tests.helpers import check_kernel, gradcheck


def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _pad(rng, b, s, empty_row=True):
    pad = rng.random((b, s)) > 0.3
    pad[:, -1] = True
    if empty_row:
        pad[-1, :-1] = False  # earlier queries of the last row see no key at all
    return pad


# (t, past, window, padded, hq, hk, softcap, cached)
SETUPS = [(1, 0, None, False, 4, 4, None, True), (1, 9, None, False, 6, 2, None, True),
          (7, 0, None, False, 6, 3, None, False), (5, 6, 4, False, 6, 2, 0.7, True),
          (6, 3, None, True, 4, 2, None, True), (1, 10, 3, True, 3, 1, 2.0, True),
          (4, 0, 2, True, 2, 2, None, False), (3, 2, None, False, 5, 5, 50.0, True)]  # fmt: skip


def _case(setup, seed=0, d=8, b=2, max_len=20):
    t, past, window, padded, hq, hk, softcap, cached = setup
    rng = np.random.default_rng(seed + 100 * t + past)
    s = past + t if cached else t
    q = _f32(rng, b, t, hq + 1, d)[:, :, :hq]  # a strided view
    k, v = _f32(rng, b, t, hk, d), _f32(rng, b, t, hk, d)
    kc = vc = None
    if cached:
        kc, vc = _f32(rng, b, hk, max_len, d), _f32(rng, b, hk, max_len, d)
        kc[:, :, past:s], vc[:, :, past:s] = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    pad = _pad(rng, b, s) if padded else None
    kw = dict(kc=kc, vc=vc, past=past if cached else 0, window=window, pad=pad,
              scale=0.3, softcap=softcap)  # fmt: skip
    return (q, k, v), kw


@pytest.mark.parametrize("path", ["rows", "parallel", "blocked"])
def test_cached_attention_kernel(path, monkeypatch):
    monkeypatch.setattr(ca, "PARALLEL_WORK", 0 if path == "parallel" else 1 << 60)
    if path == "blocked":  # BLAS blocks of a few query rows: ragged last blocks
        monkeypatch.setattr(ca, "BLOCKED_MIN_QUERIES", 1)
        monkeypatch.setattr(ca, "BLOCK_SCORES", 2 * 3 * 16)
    (k,) = registry.kernels("cached_attention")
    check_kernel(k, cases=[_case(s) for s in SETUPS], rtol=1e-5, atol=1e-5)


def _rows_case(t, pasts, rows, window=None, padded=False, seed=3, d=8, hq=6, hk=2, max_len=24):
    """A batched step: batch row b is cache row rows[b], with its own past length pasts[b]."""
    rng = np.random.default_rng(seed)
    b = len(pasts)
    q = _f32(rng, b, t, hq, d)
    k, v = _f32(rng, b, t, hk, d), _f32(rng, b, t, hk, d)
    slots = max(rows) + 2
    kc, vc = _f32(rng, slots, hk, max_len, d), _f32(rng, slots, hk, max_len, d)
    for i, (r, p) in enumerate(zip(rows, pasts)):
        kc[r, :, p : p + t], vc[r, :, p : p + t] = k[i].swapaxes(0, 1), v[i].swapaxes(0, 1)
    n = max(pasts) + t
    pad = _pad(rng, b, n, empty_row=False) if padded else None
    kw = dict(kc=kc, vc=vc, past=np.array(pasts), window=window, pad=pad, scale=0.3,
              softcap=None, rows=np.array(rows))  # fmt: skip
    return (q, k, v), kw


ROW_SETUPS = [(1, [5, 0, 11], [2, 0, 4]), (2, [3, 7], [1, 0]), (4, [0, 9], [0, 3])]


@pytest.mark.parametrize("path", ["rows", "parallel", "blocked"])
def test_per_row_positions_equal_each_row_alone(path, monkeypatch):
    """A batched step over cache rows (one past length each) is, row by row, bitwise the step
    that row would take alone; kernel and reference agree, with windows and padding too."""
    monkeypatch.setattr(ca, "PARALLEL_WORK", 0 if path == "parallel" else 1 << 60)
    if path == "blocked":
        monkeypatch.setattr(ca, "BLOCKED_MIN_QUERIES", 1)
    (kern,) = registry.kernels("cached_attention")
    cases = [_rows_case(t, p, r, w, pd) for t, p, r in ROW_SETUPS for w in (None, 3)
             for pd in (False, True)]  # fmt: skip
    check_kernel(kern, cases=cases, rtol=1e-5, atol=1e-5)
    for (q, k, v), kw in cases:
        got = kern(q, k, v, **kw)
        for b, (r, p) in enumerate(zip(kw["rows"], kw["past"])):
            one = dict(kw, kc=kw["kc"][r : r + 1], vc=kw["vc"][r : r + 1], rows=None,
                       past=int(p),
                       pad=None if kw["pad"] is None else kw["pad"][b : b + 1])  # fmt: skip
            alone = kern(q[b : b + 1], k[b : b + 1], v[b : b + 1], **one)
            if path != "blocked":  # BLAS blocks may sum the longer key range in another order
                np.testing.assert_array_equal(got[b], alone[0])
            np.testing.assert_allclose(got[b], alone[0], rtol=1e-6, atol=1e-6)


def test_per_row_positions_through_the_op_and_its_numpy_path(monkeypatch):
    """F.cached_attention over BatchKVCache rows: the kernel and the op's own numpy forward
    (EMBER_KERNELS=reference, with a graph recorded) agree; there is no gradient through such a
    step, whichever ran forward."""
    from ember import config
    from ember.errors import UnsupportedError
    from ember.nn import BatchKVCache

    rng = np.random.default_rng(5)
    cache = BatchKVCache(1, 4, 2, 16, 8)
    cache.lengths[:] = [3, 0, 6, 1]
    for a in (cache.k[0], cache.v[0]):
        a[...] = _f32(rng, *a.shape)
    q = _f32(rng, 3, 2, 4, 8)
    k, v = _f32(rng, 3, 2, 2, 8), _f32(rng, 3, 2, 2, 8)
    outs = []
    for grad, kernels in ((False, "all"), (True, "reference"), (True, "all")):
        monkeypatch.setattr(config, "KERNELS", kernels)
        c = BatchKVCache(1, 4, 2, 16, 8)
        c.lengths[:], c.k[0][...], c.v[0][...] = cache.lengths, cache.k[0], cache.v[0]
        rows = c.rows([2, 0, 3])
        qt = ember.from_numpy(q).requires_grad_(grad)
        mask = CausalMask(2, rows.pos, None, None)
        out = F.cached_attention(qt, ember.from_numpy(k), ember.from_numpy(v), mask, rows, 0)
        outs.append(out.detach().numpy())
        if grad:
            with pytest.raises(UnsupportedError):
                out.sum().backward()
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(outs[0], outs[2])


def test_kernel_hostile_operands():
    """A NaN query row stays NaN in that row only; huge scores stay finite after the softmax."""
    (args, kw) = _case((3, 2, None, False, 4, 2, None, True))
    q = args[0].copy()
    q[0, 1, 2] = np.nan
    q[1] *= 1e4
    (k,) = registry.kernels("cached_attention")
    got = k(q, *args[1:], **kw)
    want = k.reference(q, *args[1:], **kw)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert np.isnan(got[0, 1, 16:24]).all() and np.isfinite(np.delete(got[0], 1, 0)).all()
    assert np.isfinite(got[1]).all()


@pytest.mark.parametrize("setup", SETUPS)
def test_reference_matches_torch(setup):
    (q, k, v), kw = _case(setup)
    b, t, hq, d = q.shape
    kc = kw["kc"] if kw["kc"] is not None else np.ascontiguousarray(k.transpose(0, 2, 1, 3))
    vc = kw["vc"] if kw["vc"] is not None else np.ascontiguousarray(v.transpose(0, 2, 1, 3))
    s, rep = (kw["past"] if kw["kc"] is not None else 0) + t, hq // k.shape[2]
    ok = ca.allowed_keys(b, t, s, kw["past"], kw["window"] or 0, kw["pad"])
    tq = torch.from_numpy(np.ascontiguousarray(q)).transpose(1, 2)
    tk = torch.from_numpy(kc[:, :, :s]).repeat_interleave(rep, 1)
    tv = torch.from_numpy(vc[:, :, :s]).repeat_interleave(rep, 1)
    scores = tq @ tk.transpose(-1, -2) * 0.3
    if kw["softcap"]:
        scores = kw["softcap"] * torch.tanh(scores / kw["softcap"])
    scores = scores.masked_fill(~torch.from_numpy(ok)[:, None], -torch.inf)
    want = (scores.softmax(-1) @ tv).transpose(1, 2).reshape(b, t, -1).numpy()
    (kern,) = registry.kernels("cached_attention")
    np.testing.assert_allclose(kern.reference(q, k, v, **kw), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kern(q, k, v, **kw), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("softcap", [None, 1.5])
def test_op_kernel_path_equals_autograd_path(padded, softcap, monkeypatch):
    """Prefill then two decode steps over a KVCache, once through the kernel (no graph) and once
    through the op's numpy forward (q requires grad, EMBER_KERNELS=reference)."""
    from ember import config

    rng = np.random.default_rng(6)
    b, hq, hk, d, window = 2, 4, 2, 8, 5
    steps = [7, 1, 1]
    pad = _pad(rng, b, sum(steps), empty_row=False) if padded else None
    caches = [KVCache(1, b, hk, 12, d), KVCache(1, b, hk, 12, d)]
    for t in steps:
        q, k, v = (_f32(rng, b, t, h, d) for h in (hq, hk, hk))
        outs = []
        for cache, grad in zip(caches, (False, True)):
            monkeypatch.setattr(config, "KERNELS", "reference" if grad else "all")
            p = None if pad is None else pad[:, : cache.pos + t]
            mask = CausalMask(t, cache.pos, p, window)
            with ember.set_grad_enabled(grad):
                qt = ember.from_numpy(q).requires_grad_(grad)
                kt, vt = ember.from_numpy(k), ember.from_numpy(v)
                outs.append(F.cached_attention(qt, kt, vt, mask, cache, softcap=softcap))
            cache.advance(t)
        assert outs[0]._ctx is None and outs[1]._ctx is not None
        np.testing.assert_allclose(outs[0].numpy(), outs[1].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(caches[0].k[0], caches[1].k[0])


@pytest.mark.parametrize("softcap", [None, 0.8])
@pytest.mark.parametrize("cached", [False, True])
def test_op_gradient(softcap, cached):
    """Gradients reach q and the new k, v (the cached past is a constant), GQA, window, pad."""
    rng = np.random.default_rng(7)
    b, t, hq, hk, d, past = 2, 3, 4, 2, 5, 2 if cached else 0
    pad = np.ones((b, past + t), bool)
    pad[1, 0] = False
    kp, vp = rng.standard_normal((2, b, hk, 8, d))  # the cached past, the same on every call

    def fn(q, k, v):
        cache = None
        if cached:
            cache = KVCache(1, b, hk, 8, d, np.float64)
            cache.k[0][:], cache.v[0][:] = kp, vp
            cache.pos = past
        return F.cached_attention(q, k, v, CausalMask(t, past, pad, 3), cache, softcap=softcap)

    gradcheck(fn, [(b, t, hq, d), (b, t, hk, d), (b, t, hk, d)])


def test_op_errors():
    q = ember.zeros(1, 2, 4, 8)
    with pytest.raises(ember.errors.ShapeError, match="token-major"):
        F.cached_attention(q, ember.zeros(1, 2, 8), ember.zeros(1, 2, 8))
    with pytest.raises(ember.errors.ShapeError, match="multiple"):
        F.cached_attention(q, ember.zeros(1, 2, 3, 8), ember.zeros(1, 2, 3, 8))
    cache = KVCache(1, 1, 2, 3, 8)
    with pytest.raises(ember.errors.ShapeError, match="overflow"):
        F.cached_attention(ember.zeros(1, 4, 4, 8), *(ember.zeros(1, 4, 2, 8),) * 2, None, cache)


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


# (t, past, window, padded, hq, hk, softcap): training steps, no cache (the keys are k and v)
GRAD_SETUPS = [(1, 0, None, False, 2, 2, None), (7, 0, None, False, 6, 3, None),
               (13, 0, 4, False, 6, 2, 0.7), (10, 3, None, True, 4, 2, None),
               (9, 0, 3, True, 3, 1, 2.0), (11, 2, None, False, 5, 5, 50.0)]  # fmt: skip


def _grad_case(setup, seed=0, d=8, b=2):
    t, past, window, padded, hq, hk, softcap = setup
    rng = np.random.default_rng(seed + 10 * t + past)
    q = _f32(rng, b, t, hq + 1, d)[:, :, :hq]  # a strided view, as the projections give
    k, v = _f32(rng, b, t, hk, d), _f32(rng, b, t, hk, d)
    g = _f32(rng, b, t, hq * d)
    pad = _pad(rng, b, t) if padded else None
    kw = dict(kc=None, vc=None, n_keys=t, past=past, window=window, pad=pad, scale=0.3,
              softcap=softcap)  # fmt: skip
    return (g, q, k, v), kw


def _torch_grads(args, kw):
    """(dq, dk, dv) by torch's autograd in float64 through the same masked attention."""
    g, q, k, v = (torch.from_numpy(np.ascontiguousarray(a, np.float64)) for a in args)
    b, t, hq, d = q.shape
    rep = hq // k.shape[2]
    q, k, v = (a.requires_grad_() for a in (q, k, v))
    ok = ca.allowed_keys(b, t, t, kw["past"], kw["window"] or 0, kw["pad"])
    kr, vr = (a.transpose(1, 2).repeat_interleave(rep, 1) for a in (k, v))
    s = q.transpose(1, 2) @ kr.transpose(-1, -2) * kw["scale"]
    if kw["softcap"]:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    s = s.masked_fill(~torch.from_numpy(ok)[:, None], -torch.inf)
    out = (s.softmax(-1) @ vr).transpose(1, 2).reshape(b, t, -1)
    out.backward(g)
    return tuple(a.grad.numpy() for a in (q, k, v))


@pytest.mark.parametrize("setup", GRAD_SETUPS)
def test_grad_reference_matches_torch(setup):
    args, kw = _grad_case(setup)
    want = _torch_grads(args, kw)
    got = ca.cached_attention_grad_reference(*args, **kw)
    for a, w in zip(got, want):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block_rows", [4, 64])
def test_grad_kernel(block_rows, monkeypatch):
    """The gradient kernel (tasks per batch row and key head, blocks of query rows seeing only
    their keys) against its numpy reference: GQA, windows, padding, soft-capping, ragged blocks."""
    monkeypatch.setattr(ca, "BLOCK_ROWS", block_rows)
    (k,) = registry.kernels("cached_attention_grad")
    check_kernel(k, cases=[_grad_case(s) for s in GRAD_SETUPS], rtol=1e-5, atol=1e-5)


def test_training_runs_the_kernels_both_ways(monkeypatch):
    """A float32 training step takes the forward kernel and the gradient kernel (no probabilities
    kept); its gradients are those of the op's numpy path in float64."""
    (grad_kernel,) = registry.kernels("cached_attention_grad")
    calls = []
    real = grad_kernel.fn
    monkeypatch.setattr(grad_kernel, "fn", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rng = np.random.default_rng(8)
    b, t, hq, hk, d = 2, 70, 6, 2, 8  # 70 query rows: two blocks
    arrays = [_f32(rng, b, t, h, d) for h in (hq, hk, hk)]
    go = _f32(rng, b, t, hq * d)
    grads = []
    for dt in (np.float32, np.float64):
        ts = [ember.from_numpy(a.astype(dt)).requires_grad_() for a in arrays]
        out = F.cached_attention(*ts, CausalMask(t, 0, None, 20), None, softcap=1.5)
        assert not hasattr(out._ctx, "p") if dt == np.float32 else hasattr(out._ctx, "p")
        out.backward(ember.from_numpy(go.astype(dt)))
        grads.append([x.grad.numpy() for x in ts])
    assert calls == [1]
    for a, w in zip(*grads):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)
