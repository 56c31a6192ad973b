"""kernels.cpu.stem (direct few-channel conv + 3x3 stride-2 max pool in one pass) against the
float64 reference: awkward image sizes, batches, one-sided paddings, both column strides, ReLU
and ReLU6, pool pads 0 and 1, one thread (one band) and two (bands with shared boundaries), NaN
and infinities; ``applies`` and ``Plan`` refusing what the kernel does not run; no kernel on
AVX2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.kernels.cpu import stem as S

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.skipif(S.state() is None, reason="no stem kernel here (AVX-512 only)")

# (n, c, h, w, kh, kw, stride, pads (t, b, l, r), act, pool pad)
CASES = [
    (1, 3, 224, 224, 7, 7, (2, 2), (3, 3, 3, 3), 1, 1),  # ResNet-50's stem
    (3, 3, 37, 41, 7, 7, (2, 2), (3, 2, 1, 3), 2, 1),
    (2, 2, 30, 29, 5, 3, (1, 2), (0, 2, 2, 0), 2, 0),
    (1, 1, 20, 50, 3, 3, (2, 1), (1, 1, 1, 1), 1, 1),
    (2, 4, 19, 23, 3, 5, (1, 1), (2, 0, 0, 4), 1, 0),
    (1, 3, 9, 13, 7, 7, (2, 2), (3, 3, 3, 3), 2, 1),  # one tile a row, every tile an edge tile
    (5, 3, 64, 66, 7, 7, (2, 2), (3, 3, 3, 3), 1, 1),
]


def _pool_hw(oh: int, ow: int, q: int) -> tuple[int, int]:
    return (oh + 2 * q - 3) // 2 + 1, (ow + 2 * q - 3) // 2 + 1


def _run(x, wt, b, stride, pads, act, q, threads):
    n, c, h, w = x.shape
    _, _, kh, kw = wt.shape
    (sh, sw), (pt, pb, pl, pr) = stride, pads
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    phw = _pool_hw(oh, ow, q)
    assert S.applies(x.shape, wt.shape, stride, pads, (2, 2), (q, q), phw)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        plan = S.Plan(x.shape, wt, b, stride, pads, act, (q, q), phw, threads)
        got = [plan.run(x) for _ in range(2)]  # the counts and scratch are reused
    finally:
        ember.set_num_threads(old)
    with np.errstate(invalid="ignore"):
        want = S.conv_max_pool_reference(x, wt, b, stride, pads, act, (2, 2), (q, q), phw)
    return got, want, plan


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_stem_matches_float64_reference(case, threads):
    n, c, h, w, kh, kw, stride, pads, act, q = case
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (RNG.standard_normal((S.O, c, kh, kw)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(S.O).astype(np.float32)
    got, want, plan = _run(x, wt, b, stride, pads, act, q, threads)
    if threads == 2 and h >= 64:
        assert plan.tpi > 1  # bands that share boundary rows
    for y in got:
        assert y.shape == want.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("act", [1, 2])
def test_stem_nan_wins_and_infinities_pass(act):
    """A NaN in the image makes every pooled value whose window reaches it NaN (as torch's
    pool); infinities pass through the conv and the pool as in the float64 reference."""
    x = RNG.standard_normal((2, 3, 66, 70)).astype(np.float32)
    x[0, 1, 10, 10] = np.nan
    x[1, 0, 40, 33] = np.inf
    x[0, 2, 50, 3] = -np.inf
    wt = (RNG.standard_normal((S.O, 3, 7, 7)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(S.O).astype(np.float32)
    got, want, _ = _run(x, wt, b, (2, 2), (3, 3, 3, 3), act, 1, 2)
    finite = np.isfinite(want)
    for y in got:
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_array_equal(y[np.isinf(want)], want[np.isinf(want)])
        np.testing.assert_allclose(y[finite], want[finite], rtol=0, atol=2e-5 * 10)
    assert np.isnan(want).any()


def test_stem_applies_only_where_it_runs():
    x, w = (1, 3, 224, 224), (64, 3, 7, 7)
    ok = ((2, 2), (3, 3, 3, 3), (2, 2), (1, 1), (56, 56))
    assert S.applies(x, w, *ok)
    assert not S.applies(x, (32, 3, 7, 7), *ok)  # 64 output channels only
    assert not S.applies(x, (64, 4, 7, 7), *ok)  # the weight's channels are the image's
    assert not S.applies(x, w, (2, 3), *ok[1:])  # column strides 1 and 2
    assert not S.applies(x, w, (2, 2), (7, 3, 3, 3), *ok[2:])  # a conv row wholly in padding
    assert not S.applies(x, w, *ok[:2], (1, 1), (1, 1), (112, 112))  # stride-2 pools only
    assert not S.applies(x, w, *ok[:3], (2, 2), (56, 56))  # pool pads of at most 1
    assert not S.applies(x, w, *ok[:4], (58, 56))  # a pool window wholly past the conv's rows
    wt, b = np.zeros(w, np.float32), np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="ReLU"):  # its pool compares the ReLU'd bits as int32
        S.Plan(x, wt, b, ok[0], ok[1], 0, ok[3], ok[4], 1)


def test_tiles_cover_the_row_once():
    """Every conv pixel is in one tile; tiles marked inside read only image columns."""
    for ow, w, kw, sw, pl in ((112, 224, 7, 2, 3), (5, 12, 7, 2, 3), (50, 50, 3, 1, 1),
                              (3, 2, 5, 1, 2), (13, 29, 3, 2, 0)):  # fmt: skip
        seen = np.zeros(ow, int)
        for x0, npx, cnt, e in S._tiles(ow, w, kw, sw, pl):
            assert 1 <= npx <= S.P_MAX and (cnt == 1 or e < 0)
            for x in range(x0, x0 + npx * cnt):
                seen[x] += 1
                if e < 0:
                    assert 0 <= x * sw - pl and x * sw - pl + kw <= w
        assert (seen == 1).all()


def test_no_stem_kernel_on_avx2_in_a_fresh_process():
    """EMBER_SGEMM_ISA=avx2: no stem kernel (the node runs the conv and the pool)."""
    code = "from ember.kernels.cpu import stem\nassert stem.state() is None\n"
    env = {**os.environ, "EMBER_SGEMM_ISA": "avx2"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)
