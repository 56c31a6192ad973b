"""kernels.cpu.nhwc against its numpy references: odd channel counts, batch > 1, the calling
thread and the pool (outputs above SERIAL_BELOW), given output buffers."""

from __future__ import annotations

import numpy as np
import pytest

from ember.kernels.cpu import nhwc

RNG = np.random.default_rng(3)


def _r(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(params=["serial", "pool"])
def mode(request, monkeypatch):
    """Small maps on the calling thread, or every map on the pool (SERIAL_BELOW 0)."""
    if request.param == "pool":
        monkeypatch.setattr(nhwc, "SERIAL_BELOW", 0)
    return request.param


@pytest.mark.parametrize("n,h,w,c,iy,ix", [
    (1, 5, 7, 3, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]),
    (2, 4, 3, 17, [3, 1, 0], [2, 2, 2, 0, 1]),  # any indices, fewer outputs than inputs
    (3, 1, 1, 1, [0, 0, 0], [0, 0]),
])  # fmt: skip
def test_resize_nearest_and_add_gather(mode, n, h, w, c, iy, ix):
    x = _r(n, h, w, c)
    iy, ix = np.array(iy), np.array(ix)
    want = x[:, iy][:, :, ix]
    np.testing.assert_array_equal(nhwc.resize_nearest(x, iy, ix), want)
    a = _r(n, len(iy), len(ix), c)
    np.testing.assert_array_equal(nhwc.add_gather(a, x, iy, ix), a + want)
    out = np.full_like(a, np.nan)
    assert nhwc.add_gather(a, x, iy, ix, out) is out
    np.testing.assert_array_equal(out, a + want)


def test_out_of_range_indices_and_bad_outputs_raise():
    x = _r(1, 3, 3, 2)
    with pytest.raises(IndexError):
        nhwc.resize_nearest(x, np.array([0, 3]), np.array([0]))
    with pytest.raises(IndexError):
        nhwc.add_gather(_r(1, 1, 1, 2), x, np.array([-1]), np.array([0]))
    with pytest.raises(ValueError):
        nhwc.scale_add(_r(1, 4, 2), _r(1, 2), np.empty((1, 4, 2), np.float64))


@pytest.mark.parametrize("shapes", [[(2, 5, 6, 3), (2, 5, 6, 24), (2, 5, 6, 1)],
                                    [(1, 9, 4, 16), (1, 9, 4, 7)]])  # fmt: skip
def test_concat_channels(mode, shapes):
    xs = [_r(*s) for s in shapes]
    np.testing.assert_array_equal(nhwc.concat_channels(xs), np.concatenate(xs, axis=3))


def test_concat_channels_with_gathered_inputs(mode):
    """A nearest upsampling read in place: input 0 2x, input 2 4x, input 1 as it is."""
    xs = [_r(2, 3, 4, 5), _r(2, 6, 8, 3), _r(2, 2, 2, 2)]
    g0 = (np.repeat(np.arange(3), 2), np.repeat(np.arange(4), 2))
    g2 = (np.arange(6) // 3, np.arange(8) // 4)
    want = np.concatenate([xs[0][:, g0[0]][:, :, g0[1]], xs[1], xs[2][:, g2[0]][:, :, g2[1]]], 3)
    got = nhwc.concat_channels(xs, [g0, None, g2])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        nhwc.concat_channels([xs[0], xs[1]])  # differing H, W and no gather


@pytest.mark.parametrize("n,m,c", [(1, 37, 5), (3, 200, 24), (2, 1, 1)])
def test_scale_add_rounds_as_mul_then_add(mode, n, m, c):
    x, s = _r(n, m, c), _r(n, c)
    np.testing.assert_array_equal(nhwc.scale_add(x, s), x + x * s[:, None, :])


@pytest.mark.skipif(nhwc._kernels() is None, reason="numpy references only (no numba)")
def test_large_fresh_outputs_run_on_the_calling_thread(monkeypatch):
    """A fresh output of FRESH_SERIAL_BYTES or more is never first touched by pool tasks; one
    the caller gives (a reused buffer) is."""
    monkeypatch.setattr(nhwc, "SERIAL_BELOW", 0)
    monkeypatch.setattr(nhwc, "FRESH_SERIAL_BYTES", 1024)
    calls = []
    real = nhwc._on_pool
    monkeypatch.setattr(nhwc, "_on_pool", lambda *a: calls.append(a[-1]) or real(*a))
    x, s = _r(2, 300, 8), _r(2, 8)
    want = x + x * s[:, None, :]
    np.testing.assert_array_equal(nhwc.scale_add(x, s), want)
    np.testing.assert_array_equal(nhwc.scale_add(x, s, np.empty_like(x)), want)
    assert calls == [True, False]


@pytest.mark.parametrize("n,m,c", [(1, 700, 96), (3, 49, 5), (2, 1, 1)])
def test_channel_sums(mode, n, m, c):
    x = _r(n, m, c) + 3.0
    parts = nhwc.channel_sums(x)
    np.testing.assert_allclose(parts.sum(axis=1), x.astype(np.float64).sum(axis=1), rtol=1e-12)


def test_depth_to_space(mode):
    y = _r(6, 7, 2, 10)
    out = nhwc.depth_to_space(y, np.empty((6, 2, 7, 10), np.float32))
    np.testing.assert_array_equal(out, y.transpose(0, 2, 1, 3))


@pytest.mark.parametrize("act", [0, 1, 2])
def test_conv_transpose_direct(mode, act):
    from ember.kernels.cpu import conv as K

    n, h, w, c, kh, kw, o = 2, 5, 6, 24, 2, 2, 1
    x, wt, bias = _r(n, h, w, c), _r(kh, kw * o, c), _r(kh * kw * o)
    got = np.full((n, h * kh, w * kw, o), np.nan, np.float32)
    want = np.empty_like(got)
    assert K.conv_transpose(x, wt, bias, got, act) is got  # nhwc's, or without numba the reference
    K.conv_transpose_reference(x, wt, bias, want, act)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
