"""The blocked attention kernel against its numpy reference and torch's scaled_dot_product_attention."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import ember
from ember.kernels.cpu import attention as A

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
]


@pytest.mark.parametrize("b,lq,s,h,d,fused", CASES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_matches_torch(b, lq, s, h, d, fused, threads):
    q, k, v = _qkv(b, lq, s, h, d, fused)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        out = A.attention(q, k, v, h, 0.3)
    finally:
        ember.set_num_threads(old)
    ref = _torch(q, k, v, h, 0.3, None)
    _close(out, ref)
    _close(A.attention_reference(q, k, v, h, 0.3), ref)


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


def test_large_scores_do_not_overflow():
    q, k, v = _qkv(1, 30, 40, 2, 16, False)
    q *= 40.0  # scores in the thousands: exp must see (s - max)
    _close(A.attention(q, k, v, 2, 1.0), _torch(q, k, v, 2, 1.0, None))


def test_expf_against_numpy():
    x = np.concatenate([np.linspace(-87, 88, 20001), [-1e-8, 0.0, 1e-8]]).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    got = np.array([A.expf(np.float32(t)) for t in x[::7]])
    np.testing.assert_allclose(got, ref[::7], rtol=3e-7)


def test_avx2_microkernels_in_a_fresh_process():
    """NR = 16, MR = 6 (what an AVX2-only CPU runs), forced by EMBER_SGEMM_ISA."""
    code = (
        "from tests.kernels import test_attention_kernel as t\n"
        "from ember.kernels.cpu import attention as A\n"
        "assert A._kernels()['nr'] == 16, A._kernels()\n"
        "for case in t.CASES:\n"
        "    t.test_attention_matches_torch(*case, 2)\n"
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
        "from tests.kernels import test_attention_kernel as t\n"
        "t.test_attention_matches_torch(*t.CASES[1], 1)\n"
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
