"""Attention kernels (kernels/cpu/attention.py) against their references, and the ops that pick
them: ``varlen_attn`` (ember.ops.attention) and ``scaled_dot_product_attention``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ember
from ember.kernels import registry
from ember.kernels.cpu import attention as A
from ember.kernels.cpu import decode_attention as DA
from ember.nn import functional as F
from tests.helpers import check_kernel


def _kernel(op, name=None):
    ks = registry.kernels(op)
    return ks[0] if name is None else next(k for k in ks if k.name == name)


def _varlen_cases(long: bool = False):
    rng = np.random.default_rng(0)
    cases = []
    lens = [[1, 8, 0, 14], [5], [3, 3, 3], [0, 2]]
    if long:
        lens = [[130, 7, 200], [150, 150], [129]]
    for n in lens:
        cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        for nh, d in ((2, 8), (3, 5)):
            q, k, v = (rng.standard_normal((cu[-1], nh, d)).astype(np.float32) for _ in range(3))
            kw = {"cu_q": cu, "cu_k": cu, "scale": 0.4, "window": (-1, -1), "rep": 1}
            cases.append(((q, k, v), kw))
    # cross attention: other key lengths than query lengths
    cq, ck = np.array([0, 2, 9]), np.array([0, 5, 6])
    q = rng.standard_normal((9, 2, 4)).astype(np.float32)
    k, v = (rng.standard_normal((6, 2, 4)).astype(np.float32) for _ in range(2))
    cases.append(((q, k, v), {"cu_q": cq, "cu_k": ck, "scale": 0.5, "window": (-1, -1), "rep": 1}))
    return cases


def test_varlen_kernel():
    check_kernel(_kernel("varlen_attn"), cases=_varlen_cases(), rtol=2e-5, atol=2e-5)


def test_varlen_kernel_parallel_and_blocked(monkeypatch):
    k = _kernel("varlen_attn")
    check_kernel(k, cases=_varlen_cases(long=True), rtol=2e-5, atol=2e-5)
    monkeypatch.setattr(A, "PARALLEL_VARLEN_WORK", 1)
    check_kernel(k, cases=_varlen_cases(), rtol=2e-5, atol=2e-5)


def test_varlen_reference_matches_torch():
    (q, k, v), kw = _varlen_cases()[0]
    cu = kw["cu_q"]
    got = _kernel("varlen_attn").reference(q, k, v, **kw)
    for b in range(len(cu) - 1):
        s = slice(cu[b], cu[b + 1])
        t = [torch.from_numpy(a[s]).transpose(0, 1) for a in (q, k, v)]
        want = torch.nn.functional.scaled_dot_product_attention(*t, scale=0.4).transpose(0, 1)
        np.testing.assert_allclose(got[s], want.numpy(), atol=1e-5)


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 1)])
@pytest.mark.parametrize("hk", [4, 2])
def test_varlen_op_forward_backward_vs_torch(window, hk):
    rng = np.random.default_rng(1)
    cu = np.array([0, 3, 3, 10, 11])
    t, hq, d = int(cu[-1]), 4, 8
    arrays = [rng.standard_normal((t, h, d)).astype(np.float32) for h in (hq, hk, hk)]
    q, k, v = (ember.tensor(a, requires_grad=True) for a in arrays)
    out = F.varlen_attn(q, k, v, ember.tensor(cu), cu, 11, 11, scale=0.3, window_size=window,
                        enable_gqa=True)  # fmt: skip
    g = rng.standard_normal(out.shape).astype(np.float32)
    (out * ember.tensor(g)).sum().backward()
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in arrays)
    outs = []
    for b in range(len(cu) - 1):
        s = slice(cu[b], cu[b + 1])
        n = s.stop - s.start
        rel = np.arange(n)[None, :] - np.arange(n)[:, None]
        ok = np.ones((n, n), bool)
        if window[0] >= 0:
            ok &= rel >= -window[0]
        if window[1] >= 0:
            ok &= rel <= window[1]
        o = torch.nn.functional.scaled_dot_product_attention(
            *(a[s].transpose(0, 1) for a in (qt, kt, vt)), attn_mask=torch.from_numpy(ok),
            scale=0.3, enable_gqa=True,
        )  # fmt: skip
        outs.append(o.transpose(0, 1))
    want = torch.cat(outs)
    (want * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), atol=1e-5)
    for a, b in ((q, qt), (k, kt), (v, vt)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-5)


@pytest.mark.parametrize("grad", [False, True])
def test_varlen_op_picks_kernel_only_without_graph(grad, monkeypatch):
    calls = []
    k = _kernel("varlen_attn")
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    (q, kk, v), kw = _varlen_cases()[0]
    ts = [ember.tensor(a, requires_grad=grad) for a in (q, kk, v)]
    y = F.varlen_attn(*ts, kw["cu_q"], kw["cu_k"], scale=0.4)
    assert len(calls) == (0 if grad else 1)
    np.testing.assert_allclose(y.detach().numpy(), k.reference(q, kk, v, **kw), atol=2e-5)


def test_varlen_op_errors():
    q = ember.randn(5, 2, 4)
    with pytest.raises(ember.errors.ShapeError, match="cu_seq_q"):
        F.varlen_attn(q, q, q, np.array([0, 4]))
    with pytest.raises(ember.errors.ShapeError, match="exceeds"):
        F.varlen_attn(q, q, q, np.array([0, 5]), None, 4, 4)
    with pytest.raises(ember.errors.ShapeError, match="enable_gqa"):
        F.varlen_attn(q, ember.randn(5, 1, 4), ember.randn(5, 1, 4), np.array([0, 5]))


def _sdpa_cases():
    rng = np.random.default_rng(2)
    cases = []
    for b, h, lq, s, d in ((2, 3, 9, 9, 8), (1, 2, 33, 20, 16), (2, 1, 8, 1, 4)):
        q = rng.standard_normal((b, lq, h, d)).astype(np.float32).transpose(0, 2, 1, 3)
        k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(2))
        kw = {"scale": 0.35, "causal": False, "rep": 1, "dropout_p": 0.0}
        cases.append(((q, k, v), kw))
        mask = rng.random((b, 1, 1, s)) > 0.3
        mask[0, ..., 0] = False
        if b > 1:
            mask[1] = False  # a batch with no key to attend to: zeros
        cases.append(((q, k, v, mask), kw))
    return cases


def test_sdpa_blocked_kernel():
    check_kernel(
        _kernel("scaled_dot_product_attention", "sdpa_blocked"), cases=_sdpa_cases(), atol=2e-5
    )


def test_sdpa_kernel_conditions_and_op():
    k = _kernel("scaled_dot_product_attention", "sdpa_blocked")
    (q, kk, v), kw = _sdpa_cases()[0]
    assert k.applies([q, kk, v], kw)
    assert not k.applies([q, kk, v], {**kw, "causal": True})
    assert not k.applies([q, kk, v], {**kw, "dropout_p": 0.1})
    assert not k.applies([q[:, :, :4], kk, v], kw)  # few queries: the reference
    assert not k.applies([q, kk, v, np.ones((9, 9), bool)], kw)  # not a key-padding mask
    assert not k.applies([q.astype(np.float64), kk, v], kw)


def test_sdpa_op_matches_torch():
    for args, _kw in _sdpa_cases():
        ts = [ember.tensor(a) for a in args]
        got = F.scaled_dot_product_attention(*ts[:3], attn_mask=ts[3] if len(ts) > 3 else None,
                                             scale=0.35)  # fmt: skip
        tt = [torch.from_numpy(np.ascontiguousarray(a)) for a in args]
        want = torch.nn.functional.scaled_dot_product_attention(
            *tt[:3], attn_mask=tt[3] if len(tt) > 3 else None, scale=0.35
        )
        rows = np.isfinite(want.numpy())  # torch gives NaN where ember's safe softmax gives 0
        np.testing.assert_allclose(got.numpy()[rows], want.numpy()[rows], atol=2e-5)


# --- the blocked kernel itself (q, k, v as (B, L, H*D) token-major arrays) ------------------

RNG = np.random.default_rng(7)


def _qkv(b, lq, s, h, d, fused):
    """q (b, lq, h*d), k and v (b, s, h*d); with fused, column slices of one qkv matrix."""
    if fused:
        qkv = RNG.standard_normal((b, lq, 3 * h * d)).astype(np.float32)
        return qkv[..., : h * d], qkv[..., h * d : 2 * h * d], qkv[..., 2 * h * d :]
    return tuple(RNG.standard_normal((b, n, h * d)).astype(np.float32) for n in (lq, s, s))


def _torch(q, k, v, h, scale, mask):
    """torch's SDPA on the same arrays, back in (b, lq, h*d)."""
    b, lq, hd = q.shape
    split = lambda a: torch.from_numpy(np.ascontiguousarray(a)).view(b, -1, h, hd // h)  # noqa: E731
    tq, tk, tv = (split(a).transpose(1, 2) for a in (q, k, v))
    m = None if mask is None else torch.from_numpy(mask)[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=m, scale=scale)
    return out.transpose(1, 2).reshape(b, lq, hd).numpy()


def _close(out, ref):
    scale = max(np.abs(ref).max(), 1e-30)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * scale)


CASES = [  # batch, queries, keys, heads, head_dim, fused qkv (then queries == keys)
    (1, 37, 37, 3, 64, True),  # rows not a multiple of MR, keys not of NR
    (2, 50, 77, 4, 24, False),  # cross-attention, head_dim below a panel
    (3, 5, 1, 1, 8, False),  # a single key
    (1, 197, 197, 12, 64, True),  # ViT-B/16
    (2, 300, 300, 2, 40, True),  # several query blocks per head
    (1, 1, 513, 2, 80, False),  # one query, head_dim spanning a partial second panel
    (2, 29, 45, 3, 32, True),  # whole panels (AVX2): P V through the tile kernel, scaled there
    (1, 61, 61, 1, 128, False),  # several whole panels per head
]


def test_blocked_kernel_matches_reference_and_torch():
    cases = []
    for b, lq, s, h, d, fused in CASES:
        q, k, v = _qkv(b, lq, s, h, d, fused)
        cases.append(((q, k, v, h, 0.3), {}))
        _close(A.attention_reference(q, k, v, h, 0.3), _torch(q, k, v, h, 0.3, None))
    check_kernel(A.attention, A.attention_reference, cases, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("v_in_place", [True, False])
@pytest.mark.parametrize("per_head", [True, False])
def test_a_task_per_head_and_the_pack_job_agree_with_torch(per_head, v_in_place, monkeypatch):
    """Both schedules on every case and a key mask: tasks that each pack their head's K and V
    (many heads, few keys), or the pack job and then blocks of query rows; V read in place
    (heads of whole panels) or packed."""
    monkeypatch.setattr(A, "PER_HEAD_TASKS", 0 if per_head else 1 << 30)
    monkeypatch.setattr(A, "V_IN_PLACE", v_in_place)
    for b, lq, s, h, d, fused in CASES:
        q, k, v = _qkv(b, lq, s, h, d, fused)
        _close(A.attention(q, k, v, h, 0.3), _torch(q, k, v, h, 0.3, None))
    b, lq, s, h, d = 3, 40, 53, 2, 32
    q, k, v = _qkv(b, lq, s, h, d, False)
    mask = RNG.random((b, s)) > 0.4
    _close(A.attention(q, k, v, h, 0.25, key_mask=mask), _torch(q, k, v, h, 0.25, mask))


def attention_matches_torch(b, lq, s, h, d, fused, threads):
    """One case at a number of threads (the fresh-process runs below)."""
    q, k, v = _qkv(b, lq, s, h, d, fused)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        out = A.attention(q, k, v, h, 0.3)
    finally:
        ember.set_num_threads(old)
    _close(out, _torch(q, k, v, h, 0.3, None))


def test_default_scale_is_one_over_sqrt_head_dim():
    q, k, v = _qkv(2, 20, 20, 2, 16, False)
    _close(A.attention(q, k, v, 2), _torch(q, k, v, 2, None, None))


@pytest.mark.parametrize("b,lq,s,h,d", [(3, 40, 53, 2, 32), (3, 7, 200, 3, 16)])
def test_key_mask_matches_torch_and_empty_rows_give_zeros(b, lq, s, h, d):
    q, k, v = _qkv(b, lq, s, h, d, False)
    mask = RNG.random((b, s)) > 0.4
    mask[1] = False  # nobody to attend to: zeros, as ember's F.scaled_dot_product_attention
    out = A.attention(q, k, v, h, 0.25, key_mask=mask)
    ref = A.attention_reference(q, k, v, h, 0.25, key_mask=mask)
    assert np.all(out[1] == 0) and np.all(ref[1] == 0)
    keep = [0, 2]
    _close(out[keep], _torch(q[keep], k[keep], v[keep], h, 0.25, mask[keep]))
    _close(ref[keep], _torch(q[keep], k[keep], v[keep], h, 0.25, mask[keep]))


def test_views_the_tasks_cannot_read_in_place_are_copied_first():
    """Reversed batches and rows (negative strides), every other feature (a strided last axis)."""
    b, lq, s, h, d = 2, 33, 41, 3, 16
    q, k, v = _qkv(b, lq, s, h, 2 * d, False)
    q, k, v = q[::-1, ::-1, ::2], k[:, ::-1, ::2], v[::-1, :, ::2]
    ref = _torch(*(np.ascontiguousarray(a) for a in (q, k, v)), h, 0.3, None)
    _close(A.attention(q, k, v, h, 0.3), ref)


def test_a_mask_that_keeps_every_key_is_no_mask():
    q, k, v = _qkv(2, 20, 30, 2, 16, False)
    keep = np.ones((2, 30), np.bool_)
    _close(A.attention(q, k, v, 2, 0.3, key_mask=keep), _torch(q, k, v, 2, 0.3, None))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_kept_job_serves_the_next_calls_and_yields_to_other_shapes(threads):
    """A call without a mask runs the job kept from the last call with the same layouts (new q,
    k, v and a fresh output each time); a call of other shapes in between takes the workspace's
    buffers, and the next call builds its job again. Per-head tasks and the pack job."""
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        for b, lq, s, h, d, fused in [(1, 128, 128, 12, 32, True), (2, 30, 600, 2, 32, True),
                                      (1, 40, 53, 2, 16, False)]:  # fmt: skip
            first = None
            for _ in range(3):
                q, k, v = _qkv(b, lq, s, h, d, fused)
                out = A.attention(q, k, v, h, 0.3)
                _close(out, _torch(q, k, v, h, 0.3, None))
                if first is None:
                    first, kept = out, out.copy()
                q2, k2, v2 = _qkv(2, 17, 31, 3, 16, False)
                _close(A.attention(q2, k2, v2, 3, 0.5), _torch(q2, k2, v2, 3, 0.5, None))
            assert np.array_equal(first, kept)  # later calls wrote their own outputs
        assert A._plans()
    finally:
        ember.set_num_threads(old)


def test_large_scores_do_not_overflow():
    q, k, v = _qkv(1, 30, 40, 2, 16, False)
    q *= 40.0  # scores in the thousands: exp must see (s - max)
    _close(A.attention(q, k, v, 2, 1.0), _torch(q, k, v, 2, 1.0, None))


def test_expf_against_numpy():
    x = np.concatenate([np.linspace(-87, 88, 20001), [-1e-8, 0.0, 1e-8]]).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    got = np.array([A.expf(np.float32(t)) for t in x[::7]])
    np.testing.assert_allclose(got, ref[::7], rtol=3e-7)


def test_without_numba_the_references_run_in_a_fresh_process():
    code = (
        "from tests.kernels import test_attention as t\n"
        "t.test_varlen_reference_matches_torch()\n"
        "for w in [(-1, -1), (-1, 0)]:\n"
        "    t.test_varlen_op_forward_backward_vs_torch(w, 2)\n"
        "t.test_sdpa_op_matches_torch()\n"
    )
    env = {**os.environ, "EMBER_NO_NUMBA": "1"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


def test_avx2_microkernels_in_a_fresh_process():
    """NR = 16, MR = 6 (what an AVX2-only CPU runs), forced by EMBER_SGEMM_ISA."""
    code = (
        "from tests.kernels import test_attention as t\n"
        "from ember.kernels.cpu import attention as A\n"
        "assert A._kernels()['nr'] == 16, A._kernels()\n"
        "for case in t.CASES:\n"
        "    t.attention_matches_torch(*case, 2)\n"
        "t.test_varlen_kernel_parallel_and_blocked(__import__('pytest').MonkeyPatch())\n"
        "t.test_sdpa_blocked_kernel()\n"
        "t.test_key_mask_matches_torch_and_empty_rows_give_zeros(3, 40, 53, 2, 32)\n"
    )
    env = {**os.environ, "EMBER_SGEMM_ISA": "avx2"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


def test_reference_runs_without_microkernels_in_a_fresh_process():
    code = (
        "import numpy as np\n"
        "from ember.kernels.cpu import attention as A\n"
        "assert A._kernels() == {}\n"
        "from tests.kernels import test_attention as t\n"
        "t.attention_matches_torch(*t.CASES[1], 1)\n"
        "t.test_varlen_kernel_parallel_and_blocked(__import__('pytest').MonkeyPatch())\n"
        "t.test_sdpa_op_matches_torch()\n"
    )
    env = {**os.environ, "EMBER_SGEMM_ISA": "none"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 100, 1500])
def test_softmax_row_ir_matches_numpy(n):
    from ember.kernels.cpu import vecmath

    if vecmath.symbols() is None:
        raise AssertionError("no vecmath row kernels: the CI machines have AVX2+FMA")
    A._kernels()
    row = A._softmax_row  # numba wrapper around ember_softmax_row
    s = (RNG.standard_normal(n + 3) * 20).astype(np.float32)
    s[n:] = 123.0  # past n: never read or written
    ref = s.copy()
    tot_ref = vecmath.softmax_row_reference(ref, n, 0.3)
    got = s.copy()
    tot = _call_row(row, got, n, 0.3)
    # (s - max) * scale is rounded to float32 first (as torch does): ~1 ulp of the argument
    np.testing.assert_allclose(got[:n], ref[:n], rtol=3e-6, atol=1e-7)
    assert np.all(got[n:] == 123.0)
    assert abs(tot - tot_ref) <= 1e-6 * tot_ref


def _call_row(row, s, n, scale):
    import numba

    @numba.njit
    def call(s, n, scale):
        return row(s, n, scale)

    return call(s, n, np.float32(scale))


def test_softmax_row_ir_keeps_nan():
    A._kernels()
    s = np.array([1.0, np.nan, 2.0] + [0.5] * 20, np.float32)
    _call_row(A._softmax_row, s, len(s), 1.0)
    assert np.isnan(s[1])


def test_bad_shapes_and_dtypes_are_refused():
    from ember.errors import DTypeError, ShapeError

    q, k, v = _qkv(2, 5, 7, 2, 8, False)
    with pytest.raises(ShapeError):
        A.attention(q, k, v[:, :6], 2)
    with pytest.raises(ShapeError):
        A.attention(q[:1], k, v, 2)
    with pytest.raises(ShapeError):
        A.attention(q, k, v, 3)
    with pytest.raises(ShapeError):
        A.attention(q, k, v, 2, key_mask=np.ones((2, 6), bool))
    with pytest.raises(DTypeError):
        A.attention(q.astype(np.float64), k, v, 2)


# --- one query per head over fixed keys (a decoder's cross-attention step) -------------------


def _one_query_cases():
    rng = np.random.default_rng(3)
    cases = []
    for b, h, hk, s, d in ((1, 6, 6, 1500, 64), (2, 4, 2, 7, 32), (3, 2, 2, 1, 64),
                           (1, 8, 1, 300, 128)):  # fmt: skip
        q = rng.standard_normal((b, h, 1, d)).astype(np.float32)
        k, v = (rng.standard_normal((b, hk, s, d)).astype(np.float32) for _ in range(2))
        kw = {"scale": 0.3, "causal": False, "rep": h // hk, "dropout_p": 0.0}
        cases.append(((q, k, v), kw))
    return cases


def test_sdpa_one_query_kernel_matches_reference_and_torch():
    kern = _kernel("scaled_dot_product_attention", "sdpa_one_query")
    for (q, k, v), kw in _one_query_cases():
        if not kern.applies([q, k, v], kw):
            pytest.skip("the decode-attention kernel does not run here")
    check_kernel(kern, cases=_one_query_cases(), atol=2e-5)
    for (q, k, v), kw in _one_query_cases():
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        want = torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv, scale=kw["scale"], enable_gqa=kw["rep"] > 1
        ).numpy()
        got = kern.fn(q, k, v, **kw)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        with ember.no_grad():  # the op picks it (no mask, one query, contiguous keys)
            op = F.scaled_dot_product_attention(
                *(ember.from_numpy(a) for a in (q, k, v)), scale=kw["scale"],
                enable_gqa=kw["rep"] > 1,
            )  # fmt: skip
        np.testing.assert_array_equal(op.numpy(), got)


def test_sdpa_one_query_conditions_and_bound_step():
    kern = _kernel("scaled_dot_product_attention", "sdpa_one_query")
    (q, k, v), kw = _one_query_cases()[0]
    if not kern.applies([q, k, v], kw):
        pytest.skip("the decode-attention kernel does not run here")
    assert not kern.applies([np.concatenate([q, q], 2), k, v], kw)  # two queries per head
    assert not kern.applies([q, k, v, np.ones((1, 1, 1, 1500), bool)], kw)  # a mask
    assert not kern.applies([q, k.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3), v], kw)
    assert not kern.applies([q, k, v], {**kw, "causal": True})
    out = kern.fn(q, k, v, **kw)
    run = DA._prepare_one_query(out, q, k, v, **kw)  # a captured step: new q, same buffers
    for seed in range(3):
        q[...] = np.random.default_rng(seed).standard_normal(q.shape)
        run()
        np.testing.assert_array_equal(out, kern.fn(q, k, v, **kw))
