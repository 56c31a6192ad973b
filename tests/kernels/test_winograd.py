"""Winograd F(4x4, 3x3) (kernels.cpu.winograd) against the float64 direct convolution."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.kernels.cpu import conv as K
from ember.kernels.cpu import winograd as W
from ember.kernels.cpu.gemm import PackedWeight

pytestmark = pytest.mark.skipif(W.state() is None, reason="no numba / microkernels here")


def _direct(x, w, b, res, act):
    """float64 NHWC conv3x3, pad 1, + bias [+ res], ReLU/ReLU6."""
    y = K.conv2d_nchw_reference(
        x.transpose(0, 3, 1, 2).astype(np.float64), w.astype(np.float64), (1, 1), (1, 1, 1, 1), 1
    ).transpose(0, 2, 3, 1)
    y = y + b
    if res is not None:
        y = y + res
    return K._act_reference(y, act)


def test_matrices_are_a_convolution():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((2, 7, 10, 5)), rng.standard_normal((6, 5, 3, 3)), np.zeros(6)
    want = _direct(x, w, b, None, 0)
    for m in (2, 4):
        np.testing.assert_allclose(W.reference(x, w, b, None, 0, m), want, rtol=1e-5, atol=1e-5)
    bt, g, at = W.matrices(4)  # Lavin and Gray's F(4x4, 3x3), which the kernel writes out
    assert np.array_equal(bt[0], [4, 0, -5, 0, 1, 0]) and np.array_equal(
        at[3], [0, 1, -1, 8, -8, 1]
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n,h,w,c,o,act,with_res",
    [(1, 7, 9, 5, 6, 0, False), (2, 8, 8, 16, 40, 1, True), (1, 13, 6, 33, 70, 2, False),
     (3, 5, 11, 48, 33, 1, True), (1, 1, 1, 8, 8, 0, True),
     # tiles not a multiple of the block (49: 12 + 12 + 12 + 13, a 13-row block as 7 + 6 rows),
     # blocks across images, and (2 threads) panel groups where there are few blocks
     (1, 28, 28, 40, 70, 1, True), (2, 13, 17, 33, 40, 2, False), (3, 9, 30, 16, 33, 1, True),
     (1, 20, 19, 8, 100, 2, True)],
)  # fmt: skip
def test_kernel_matches_direct(n, h, w, c, o, act, with_res, threads):
    rng = np.random.default_rng(h * w + c)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    res = rng.standard_normal((n, h, w, o)).astype(np.float32) if with_res else None
    want = _direct(x, wt, b, res, act)
    out = np.full((n, h, w, o), np.nan, np.float32)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        W.conv(x, W.pack(wt, 4, W.state()["nr"]), b, res, act, out)
    finally:
        ember.set_num_threads(old)
    scale = np.abs(_direct(x, wt, b, res, 0)).max()  # before the activation clips it
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("ntiles", [1, 11, 12, 23, 24, 49, 196, 392])
@pytest.mark.parametrize("threads", [1, 2])
def test_plan_covers_the_work(ntiles, threads):
    """Blocks of TILE_BLOCK to 2 TILE_BLOCK - 1 tiles (fewer only when there are fewer), and
    panel groups only at several threads with few blocks."""
    nblocks, groups = W._plan(ntiles, 4, threads)
    sizes = [ntiles * (k + 1) // nblocks - ntiles * k // nblocks for k in range(nblocks)]
    assert sum(sizes) == ntiles and min(sizes) >= min(ntiles, W.TILE_BLOCK)
    assert max(sizes) < max(ntiles + 1, 2 * W.TILE_BLOCK)
    assert 1 <= groups <= 4 and (groups == 1 or (threads > 1 and nblocks < 2 * threads))


@pytest.mark.parametrize("h,c", [(56, 64), (28, 128), (14, 256)])
def test_real_size_error(h, c):
    """ResNet-50's stride-1 3x3 layers (He-initialised weights): within 1e-5 of the largest
    output of the float64 result (float32 direct convs: ~1e-6)."""
    rng = np.random.default_rng(c)
    x = np.maximum(rng.standard_normal((1, h, h, c)), 0).astype(np.float32)
    wt = (rng.standard_normal((c, c, 3, 3)) * np.sqrt(2 / (9 * c))).astype(np.float32)
    b = np.zeros(c, np.float32)
    out = np.empty((1, h, h, c), np.float32)
    W.conv(x, W.pack(wt, 4, W.state()["nr"]), b, None, 0, out)
    want = _direct(x, wt, b, None, 0)
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()


def test_fused_conv_takes_winograd_and_matches_reference(monkeypatch):
    monkeypatch.setattr(K, "WINOGRAD_MIN_TILES", 1)
    monkeypatch.setattr(K, "WINOGRAD_MIN_CHANNELS", 1)
    calls = []
    real = W.conv
    monkeypatch.setattr(W, "conv", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 12, 9, 10)).astype(np.float32)
    wt = rng.standard_normal((20, 12, 3, 3)).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    res = rng.standard_normal((2, 20, 9, 10)).astype(np.float32)
    pw = PackedWeight(wt)
    for act in (None, "relu", "hardswish"):
        kw = dict(stride=(1, 1), pads=(1, 1, 1, 1), groups=1, act=act, scale=0.5, shift=0.25)
        got = K.fused_conv2d_gemm(K.channels_last(x.transpose(0, 2, 3, 1).copy()), pw, b, res, **kw)
        want = K.fused_conv2d_reference(x, wt, b, res, **kw)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert K.is_channels_last(got)
    assert len(calls) == 3
    # other geometries keep the direct GEMM
    kw = dict(stride=(2, 2), pads=(1, 1, 1, 1), groups=1, act=None)
    np.testing.assert_allclose(
        K.fused_conv2d_gemm(x, pw, b, **kw), K.fused_conv2d_reference(x, wt, b, **kw), atol=1e-4
    )
    assert len(calls) == 3


def test_transformed_weight_is_kept_and_remade_with_new_panels():
    wt = np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32)
    pw = PackedWeight(wt)
    u = W.weights(pw)
    assert W.weights(pw) is u
    pw[...] = wt * 2  # written in place: its panels are dropped ...
    pw.panels = PackedWeight(wt * 2).panels  # ... and made again
    u2 = W.weights(pw)
    assert u2 is not u
    np.testing.assert_allclose(u2, 2 * u, rtol=1e-6)
