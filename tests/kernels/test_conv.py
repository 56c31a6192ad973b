"""Convolution kernels (kernels.cpu.conv) against their numpy references, through check_kernel."""

from __future__ import annotations

import numpy as np
import pytest

from ember.errors import ShapeError
from ember.kernels import registry
from ember.kernels.cpu import conv as K
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu.gemm import PackedWeight
from ember.ops.conv import Geom
from tests.helpers import check_kernel

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _kernel(op: str, name: str):
    return next(k for k in registry.kernels(op) if k.name == name)


def _cl(x: np.ndarray) -> np.ndarray:
    """The same (N, C, H, W) values stored channels-last."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize(
    "n,h,w,c,k,s,pt,pl",
    [(1, 7, 9, 3, 7, 2, 3, 3), (2, 6, 5, 16, 3, 1, 1, 1), (1, 8, 8, 5, 3, 2, 0, 0),
     (1, 9, 4, 8, 5, 2, 1, 2)],
)  # fmt: skip
def test_nhwc_primitives_match_references(n, h, w, c, k, s, pt, pl):
    x = _r(n, h, w, c)
    oh, ow = (h + 2 * pt - k) // s + 1, (w + 2 * pl - k) // s + 1
    a = np.full((n * oh * ow, k * k * c), np.nan, np.float32)
    b = np.empty((n * oh * ow, k * k * c), np.float32)
    K.im2col(x, a, k, k, s, s, pt, pl, oh, ow)
    K.im2col_reference(x, b, k, k, s, s, pt, pl, oh, ow)
    np.testing.assert_array_equal(a, b)
    wt, bias = _r(k, k, c), _r(c)
    old = K.DEPTHWISE_SERIAL_BELOW
    for act, serial_below in ((0, old), (1, old), (2, old), (0, 0), (2, 0)):  # 0: parallel
        o1, o2 = np.empty((n, oh, ow, c), np.float32), np.empty((n, oh, ow, c), np.float32)
        K.DEPTHWISE_SERIAL_BELOW = serial_below
        try:
            K.depthwise_nhwc(x, wt, bias, o1, s, s, pt, pl, act)
        finally:
            K.DEPTHWISE_SERIAL_BELOW = old
        K.depthwise_nhwc_reference(x, wt, bias, o2, s, s, pt, pl, act)
        np.testing.assert_allclose(o1, o2, atol=1e-5)
    x[0, 0, 0, 0], x[-1, -1, -1, -1] = np.nan, np.inf  # NaN wins its windows, as in torch
    m2 = np.empty((n, oh, ow, c), np.float32)
    K.maxpool_nhwc_reference(x, m2, k, k, s, s, min(pt, k // 2), min(pl, k // 2))
    old = K.MAXPOOL_SERIAL_BELOW, G.USE_POOL
    for serial_below, use_pool in ((old[0], True), (0, True), (0, False)):  # serial, pool, prange
        m1 = np.full((n, oh, ow, c), 7.0, np.float32)
        K.MAXPOOL_SERIAL_BELOW, G.USE_POOL = serial_below, use_pool
        try:
            K.maxpool_nhwc(x, m1, k, k, s, s, min(pt, k // 2), min(pl, k // 2))
        finally:
            K.MAXPOOL_SERIAL_BELOW, G.USE_POOL = old
        np.testing.assert_array_equal(m1, m2)
    st = x.strides  # overlapping windows into a strided destination
    src = np.lib.stride_tricks.as_strided(x, (n, h, w - k + 1, k * c), (*st[:2], st[2], st[3]))
    dst = np.zeros((n, h + 1, w - k + 3, k * c), np.float32)
    K.copy4d(src, dst[:, 1:, 2:])
    np.testing.assert_array_equal(dst[:, 1:, 2:], src)
    assert not dst[:, 0].any() and not dst[:, :, :2].any()


CONV_CASES = [  # n, cin, cout, (kh, kw), stride, pads (t, b, l, r), hw
    (2, 3, 8, (7, 7), (2, 2), (3, 3, 3, 3), (17, 14)),  # the stem: kw*C-deep taps (few channels)
    (2, 3, 16, (3, 3), (2, 2), (1, 1, 1, 1), (9, 10)),  # PP-OCR's stem: 3x3 s2, 3 taps of 9
    (1, 5, 8, (3, 3), (2, 2), (0, 1, 0, 1), (8, 7)),  # few channels, uneven padding
    (1, 2, 5, (2, 3), (1, 2), (0, 0, 0, 0), (6, 9)),  # few channels, no padding (NCHW in)
    (1, 8, 16, (1, 1), (1, 1), (0, 0, 0, 0), (5, 6)),  # 1x1 read in place
    (1, 20, 40, (1, 1), (2, 2), (0, 0, 0, 0), (7, 9)),  # strided 1x1 in place
    (2, 20, 33, (3, 3), (1, 1), (1, 1, 1, 1), (6, 7)),  # padded, partial panel
    (1, 17, 40, (3, 3), (2, 2), (0, 1, 0, 1), (9, 7)),  # TF-same-like uneven padding
    (1, 16, 5, (3, 1), (1, 1), (1, 1, 0, 0), (6, 7)),  # non-square kernel
    (0, 16, 8, (3, 3), (1, 1), (1, 1, 1, 1), (4, 4)),  # empty batch
]


def _conv_cases(with_res: bool):
    cases = []
    for n, c, o, k, s, pads, hw in CONV_CASES:
        x, w, b = _r(n, c, *hw), _r(o, c, *k), _r(o)
        ref = K.conv2d_nchw_reference(x, w, s, pads, 1)
        res = _r(*ref.shape) if with_res else None
        for act in (None, "relu", "relu6", "hardswish", "silu"):
            kw = dict(stride=s, pads=pads, groups=1, act=act)
            args = (x, PackedWeight(w), b) + ((res,) if with_res else ())
            cases.append((args, kw))
            cases.append(((_cl(x), *args[1:]), kw))  # channels-last input, read in place
            cases.append((args, {**kw, "scale": 0.7, "shift": -0.25}))  # then a scale/shift
    return cases


@pytest.mark.parametrize("with_res", [False, True])
def test_fused_conv_gemm_matches_reference(with_res):
    k = _kernel("fused_conv2d", "fused_conv2d_gemm")
    check_kernel(k, cases=_conv_cases(with_res), rtol=1e-4, atol=1e-4)


def test_fused_conv_gemm_returns_channels_last_and_reuses_it():
    w = PackedWeight(_r(8, 6, 3, 3))
    kw = dict(stride=(1, 1), pads=(1, 1, 1, 1), groups=1, act="relu")
    y = K.fused_conv2d_gemm(_r(2, 6, 5, 7), w, _r(8), **kw)
    assert y.shape == (2, 8, 5, 7) and K.is_channels_last(y)
    assert np.shares_memory(K.nhwc(y), y)  # the next layer reads it without a copy


@pytest.mark.parametrize("threads", [2, 1])
def test_conv_gemm_pool_plan_reused_across_calls(threads, monkeypatch):
    """conv_gemm keeps a layer's pool job (_gemm_plan) and rewrites only its input, output and
    residual addresses: new inputs, residuals and outputs every call stay right."""
    import ember

    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    monkeypatch.setattr(K, "_PLANS", {})
    try:
        for c, o, k, s, hw in ((37, 70, 3, 1, (13, 11)), (64, 256, 1, 2, (15, 14))):
            w, b = PackedWeight(_r(o, c, k, k)), _r(o)
            pads = (k // 2,) * 4
            for i in range(4):
                if i == 3:  # numba's driver instead of the pool: a kept plan is not used
                    monkeypatch.setattr(G, "USE_POOL", False)
                x = _r(2, c, *hw) if i != 1 else _cl(_r(2, c, *hw))
                ref = K.conv2d_nchw_reference(x, w, (s, s), pads, 1) + b[:, None, None]
                res = _r(*ref.shape) if i else None
                want = np.maximum(ref + (0 if res is None else res), 0)
                y = K.fused_conv2d_gemm(
                    x, w, b, res, stride=(s, s), pads=pads, groups=1, act="relu"
                )
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
            monkeypatch.setattr(G, "USE_POOL", True)
        assert bool(K._PLANS) == (threads > 1)
    finally:
        ember.set_num_threads(old)


@pytest.mark.parametrize(
    "n,c,o,k,s,pads,hw",
    [(1, 64, 96, 1, 1, (0, 0, 0, 0), (15, 13)), (2, 40, 72, 3, 2, (1, 0, 2, 1), (17, 12)),
     (1, 3, 64, 7, 2, (3, 3, 3, 3), (40, 37)), (1, 48, 80, 3, 1, (1, 1, 1, 1), (6, 5))],
)  # fmt: skip
def test_kept_conv_reruns_the_job_on_new_inputs(n, c, o, k, s, pads, hw, monkeypatch):
    """keep_conv keeps the one pooled conv_gemm call of its function (padded, strided, the
    few-channel stem's taps); the KeptConv then computes new inputs of any layout and new
    residuals (written over, or not) like the conv (float64 reference)."""
    import ember
    from ember.kernels.cpu import pool_tasks as PT

    old = ember.get_num_threads()
    ember.set_num_threads(2)
    monkeypatch.setattr(K, "_PLANS", {})
    monkeypatch.setattr(G, "SERIAL_BELOW", 0)
    try:
        w, b = PackedWeight(_r(o, c, k, k)), _r(o)

        def want(x, r):
            y = K.conv2d_nchw_reference(x.astype(np.float64), w.astype(np.float64), (s, s),
                                        pads, 1) + b[:, None, None]  # fmt: skip
            return np.clip(y + (0 if r is None else r), 0, 6)

        x0 = _r(n, c, *hw)
        shape = want(x0, None).shape
        r0 = _cl(_r(*shape))
        args = dict(stride=(s, s), pads=pads, groups=1, act="relu6")
        y, kept = K.keep_conv(lambda: K.fused_conv2d_gemm(x0, w, b, r0, **args))
        np.testing.assert_allclose(y, want(x0, r0), rtol=1e-4, atol=1e-4)
        if PT.state() is None:
            assert kept is None
            return
        assert kept is not None and not kept.over_res
        assert K.keep_conv(lambda: None)[1] is None  # nothing ran: nothing kept
        with pytest.raises(ValueError):
            kept(x0, None)  # kept with a residual
        for i in range(3):  # channels-last, NCHW and strided inputs
            x = [_cl(_r(n, c, *hw)), _r(n, c, *hw), _r(n, c, hw[0], 2 * hw[1])[..., ::2]][i]
            r = _r(*shape) if i == 1 else _cl(_r(*shape))  # NCHW residual: read, not written
            r_in = r.copy()
            got = kept(x, r)
            assert got.shape == shape and K.is_channels_last(got)
            np.testing.assert_allclose(got, want(x, r), rtol=1e-4, atol=1e-4)
            np.testing.assert_array_equal(r, r_in)
        _, plain = K.keep_conv(lambda: K.fused_conv2d_gemm(x0, w, b, **args))
        for x in (x0, _cl(_r(n, c, *hw))):
            np.testing.assert_allclose(plain(x, None), want(x, None), rtol=1e-4, atol=1e-4)
        if k == 1 and s == 1:  # written over a channels-last residual the caller gives up
            _, over = K.keep_conv(
                lambda: K.fused_conv2d_over_residual(x0, w, b, _cl(_r(*shape)), **args)
            )
            assert over is not None and over.over_res
            x, r = _cl(_r(n, c, *hw)), _cl(_r(*shape))
            expect = want(x, r)
            got = over(x, r)
            assert np.shares_memory(got, r)
            np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)
    finally:
        ember.set_num_threads(old)


@pytest.mark.parametrize(
    "n,c,o,k,hw",
    [(1, 40, 260, 1, (7, 7)), (1, 19, 300, 3, (5, 3)), (1, 64, 256, 1, (1, 1)),
     (3, 24, 270, 1, (9, 9)), (1, 16, 280, 3, (16, 16)), (1, 48, 520, 1, (7, 7)),
     (1, 33, 600, 3, (5, 5)), (1, 20, 256, 3, (14, 14)), (1, 16, 300, 1, (1, 13))],
)  # fmt: skip
def test_conv_gemm_few_pixels_run_all_rows_per_task(n, c, o, k, hw, monkeypatch):
    """Convs of at most ONE_BLOCK_ROWS pixels with enough panels: each pool task takes all
    the pixels by a group of panels (the plan's rows word), or half of them, a panel's halves
    in a row (PANEL_MAJOR), with fewer than ONE_BLOCK_SPLIT_PANELS panels a thread; results
    match float64."""
    import ember
    from ember.kernels.cpu import pool_tasks as PT

    old = ember.get_num_threads()
    ember.set_num_threads(2)
    monkeypatch.setattr(K, "_PLANS", {})
    try:
        w, b = PackedWeight(_r(o, c, k, k)), _r(o)
        pads = (k // 2,) * 4
        x = _r(n, c, *hw)
        ref = K.conv2d_nchw_reference(x.astype(np.float64), w.astype(np.float64), (1, 1), pads, 1)
        res = _r(*ref.shape)
        for r in (None, res):
            want = np.maximum(ref + b[:, None, None] + (0 if r is None else r), 0)
            y = K.fused_conv2d_gemm(x, w, b, r, stride=(1, 1), pads=pads, groups=1, act="relu")
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        m = n * hw[0] * hw[1]
        if PT.state() is not None and m * o * c * k * k >= G.SERIAL_BELOW:
            mr, split = G._state()["mr"], -(-o // G.panel_width()) < K.ONE_BLOCK_SPLIT_PANELS * 2
            rows = {int(p[0][0][PT.P_ROWS]) for p in K._PLANS.values()}
            assert rows == {-(-m // ((2 if split else 1) * mr)) * mr}
            flags = {int(p[0][0][PT.P_HAS_RES]) & PT.PANEL_MAJOR for p in K._PLANS.values()}
            assert flags == {PT.PANEL_MAJOR if split else 0}
    finally:
        ember.set_num_threads(old)


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize(
    "n,c,o,k,s,hw",
    [(1, 3, 64, 7, 2, (64, 50)), (2, 3, 69, 3, 2, (40, 41)), (1, 5, 40, 3, 1, (29, 28)),
     (1, 24, 96, 1, 1, (29, 28))],
)  # fmt: skip
def test_conv_gemm_rows_first_matches_reference(n, c, o, k, s, hw, threads, monkeypatch):
    """Convs in the rows-first order (ROWS_FIRST_BYTES 0: ResNet-50's 3.2 MB stem output is
    in it), few-channel stems' kw*C-deep taps included, on the pool and on one thread."""
    import ember
    from ember.kernels.cpu import pool_tasks as PT

    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    monkeypatch.setattr(K, "_PLANS", {})
    monkeypatch.setattr(G, "ROWS_FIRST_BYTES", 0)
    monkeypatch.setattr(G, "SERIAL_BELOW", 0)
    try:
        w, b = PackedWeight(_r(o, c, k, k)), _r(o)
        pads = (k // 2,) * 4
        x = _r(n, c, *hw)
        ref = K.conv2d_nchw_reference(x.astype(np.float64), w.astype(np.float64), (s, s), pads, 1)
        res = _r(*ref.shape)
        for r in (None, res, None):  # the third call reruns the kept pool job
            want = np.maximum(ref + b[:, None, None] + (0 if r is None else r), 0)
            y = K.fused_conv2d_gemm(x, w, b, r, stride=(s, s), pads=pads, groups=1, act="relu")
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
        if threads > 1 and PT.state() is not None:  # one task over all panels: rows-first
            words = [p[0][0] for p in K._PLANS.values()]
            assert words and all(int(p[PT.P_HAS_RES]) & G.ROWS_FIRST for p in words)
            assert all(int(p[PT.P_TASKS_P]) == 1 for p in words)
    finally:
        ember.set_num_threads(old)


def test_fused_depthwise_matches_reference():
    k = _kernel("fused_conv2d", "fused_conv2d_depthwise")
    cases = []
    for n, c, kk, s, pads, hw in [
        (2, 6, 3, (1, 1), (1, 1, 1, 1), (9, 8)),
        (1, 6, 5, (2, 2), (2, 2, 2, 2), (11, 10)),
        (1, 24, 5, (2, 2), (1, 2, 1, 2), (12, 9)),  # TF-same padding
    ]:
        x, w, b = _r(n, c, *hw), _r(c, 1, kk, kk), _r(c)
        for act in (None, "relu6", "hardswish", "silu"):
            kw = dict(stride=s, pads=pads, groups=c, act=act)
            cases += [((x, w, b), kw), ((_cl(x), w, b), kw)]
            cases.append(((x, w, b), {**kw, "scale": -1.5, "shift": 0.5}))
    check_kernel(k, cases=cases, rtol=1e-5, atol=1e-5)
    # a residual is not its case (the GEMM's epilogue has it): the op's forward runs then
    x, w, b = _r(1, 4, 5, 5), _r(4, 1, 3, 3), _r(4)
    kw = dict(stride=(1, 1), pads=(1, 1, 1, 1), groups=4, act=None)
    assert not k.applies([x, w, b, _r(1, 4, 5, 5)], kw)


def test_conv2d_with_a_packed_weight_matches_reference():
    k = _kernel("conv2d", "conv2d_packed")
    cases = []
    for n, c, o, kk, s, pads, hw in CONV_CASES[:5]:
        x, w, b = _r(n, c, *hw), PackedWeight(_r(o, c, *kk)), _r(o)
        geom = Geom(s, (1, 1), pads, 1, 2, True)
        cases += [((x, w, b), dict(geom=geom)), ((_cl(x), w), dict(geom=geom))]
    check_kernel(k, cases=cases, rtol=1e-4, atol=1e-4)
    dilated = Geom((1, 1), (2, 2), (0, 0, 0, 0), 1, 2, True)
    assert not k.applies([_r(1, 3, 8, 8), PackedWeight(_r(4, 3, 3, 3))], dict(geom=dilated))


@pytest.mark.parametrize("act", [0, 3, 4])
@pytest.mark.parametrize("rows", [5, 5000])  # the serial and the parallel pass
def test_post_pass_matches_reference(act, rows):
    y = _r(rows, 19) * 4
    y[0, :3] = (-np.inf, np.inf, 50.0)
    a, b = y.copy(), y.copy()
    K.post(a, act, 0.75, -0.125)
    K.post_reference(b, act, 0.75, -0.125)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_max_pool_nhwc_matches_reference():
    k = _kernel("max_pool2d", "max_pool2d_nhwc")
    cases = []
    for n, c, hw, kk, s, p in [(1, 8, (9, 9), 3, 2, 1), (2, 5, (8, 7), 2, 2, 0),
                               (1, 3, (6, 6), 3, 1, 1)]:  # fmt: skip
        x = _cl(_r(n, c, *hw))
        oh, ow = (hw[0] + 2 * p - kk) // s + 1, (hw[1] + 2 * p - kk) // s + 1
        kw = dict(k=(kk, kk), s=(s, s), p=(p, p), d=(1, 1), out=(oh, ow), nd=2, batched=True,
                  track=False)  # fmt: skip
        cases.append(((x,), kw))
    hostile = _r(1, 4, 6, 6)
    hostile[0, 1, 2, 3], hostile[0, 2, 0, 0], hostile[0, 3, 4, 4] = np.nan, np.inf, -np.inf
    cases.append(((_cl(hostile),), dict(cases[-1][1])))  # NaN wins its windows, as in torch
    check_kernel(k, cases=cases)
    plain = _r(1, 8, 9, 9)  # NCHW data keeps the op's own path
    assert not k.applies([plain], cases[0][1])


@pytest.mark.parametrize(
    "n,h,w,c,s,pt,pl,extra",
    [(1, 112, 112, 64, 2, 1, 1, 0), (2, 9, 7, 19, 2, 1, 0, 0), (1, 8, 8, 5, 2, 1, 1, 1),
     (1, 5, 6, 17, 1, 1, 1, 0), (1, 7, 7, 3, 3, 0, 2, 1), (2, 3, 3, 33, 2, 2, 2, 0),
     (1, 1, 4, 16, 2, 1, 1, 0)],
)  # fmt: skip
def test_maxpool_3x3_fast_path_matches_reference(n, h, w, c, s, pt, pl, extra):
    """The 3x3 rows (edge taps clamped into the window) against the -inf padded reference, with
    NaN, +-inf on the borders and corners; ``extra`` adds a ceil-mode output row and column
    whose windows stick out past the bottom/right edge."""
    x = _r(n, h, w, c)
    x[0, 0, 0, 0] = x[-1, -1, -1, -1] = np.nan
    x[0, -1, 0, min(1, c - 1)], x[-1, 0, -1, c - 1] = np.inf, -np.inf
    x[0, h // 2, w // 2, c // 2] = np.nan
    oh, ow = (h + 2 * pt - 3) // s + 1, (w + 2 * pl - 3) // s + 1
    oh, ow = oh + (extra if (oh * s - pt) < h else 0), ow + (extra if (ow * s - pl) < w else 0)
    ref = np.empty((n, oh, ow, c), np.float32)
    K.maxpool_nhwc_reference(x, ref, 3, 3, s, s, pt, pl)
    old = K.MAXPOOL_SERIAL_BELOW, G.USE_POOL
    for serial_below, use_pool in ((1 << 40, True), (0, True), (0, False)):  # serial, pool, prange
        out = np.full((n, oh, ow, c), 7.0, np.float32)
        K.MAXPOOL_SERIAL_BELOW, G.USE_POOL = serial_below, use_pool
        try:
            K.maxpool_nhwc(x, out, 3, 3, s, s, pt, pl)
        finally:
            K.MAXPOOL_SERIAL_BELOW, G.USE_POOL = old
        np.testing.assert_array_equal(out, ref)


CONV1D_CASES = [  # n, cin, cout, k, stride, pad, length
    (1, 80, 40, 3, 1, 1, 37),  # Whisper's conv1 (fewer frames), a partial panel
    (2, 24, 17, 3, 2, 1, 30),  # its conv2: strided
    (1, 64, 16, 1, 1, 0, 9),  # 1 tap, no padding
    (3, 13, 33, 5, 3, 2, 11),  # odd sizes, partial last window
    (0, 64, 8, 3, 1, 1, 6),  # empty batch
    (1, 1, 258, 256, 128, 0, 576),  # one channel (Silero VAD's STFT conv): one 256-deep tap
    (2, 1, 8, 64, 1, 3, 100),  # one channel, padded
]


def test_conv1d_gemm_matches_reference():
    import torch

    k = _kernel("conv2d", "conv1d_gemm")
    cases = []
    for n, c, o, kk, s, p, length in CONV1D_CASES:
        x, w, b = _r(n, c, length), _r(o, c, kk), _r(o)
        geom = Geom((1, s), (1, 1), (0, 0, p, p), 1, 1, True)
        x_cl = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)
        cases += [((x, w, b), dict(geom=geom)), ((x_cl, w), dict(geom=geom))]
        want = torch.nn.functional.conv1d(*map(torch.from_numpy, (x, w, b)), stride=s, padding=p)
        np.testing.assert_allclose(k.fn(x, w, b, geom=geom), want.numpy(), rtol=1e-4, atol=1e-4)
    x, w = _r(24, 10), _r(7, 24, 3)  # unbatched (C, L)
    x[3, 4] = np.nan
    cases.append(((x, w, _r(7)), dict(geom=Geom((1, 1), (1, 1), (0, 0, 1, 1), 1, 1, False))))
    check_kernel(k, cases=cases, rtol=1e-4, atol=1e-4)
    # its result is channels-last: a (N, L', O) array seen as (N, O, L')
    g = Geom((1, 1), (1, 1), (0, 0, 1, 1), 1, 1, True)
    y = k.fn(_r(2, 80, 9), _r(40, 80, 3), _r(40), geom=g)
    assert y.shape == (2, 40, 9) and y.transpose(0, 2, 1).flags.c_contiguous
    # what it leaves to the op's forward: dilation, groups, shallow products, a wrong shape
    x, w = _r(1, 80, 20), _r(8, 80, 3)
    dil = Geom((1, 1), (1, 2), (0, 0, 0, 0), 1, 1, True)
    grp = Geom((1, 1), (1, 1), (0, 0, 0, 0), 2, 1, True)
    assert not k.applies([x, w], dict(geom=dil))
    assert not k.applies([x, _r(8, 40, 3)], dict(geom=grp))
    assert not k.applies([_r(1, 4, 20), _r(8, 4, 3)], dict(geom=g))
    with pytest.raises(ShapeError):
        k.fn(_r(1, 64, 20), w, geom=g)


def test_conv1d_op_uses_the_kernel_and_matches_torch():
    import torch

    import ember
    import ember.nn.functional as F

    x, w, b = _r(2, 80, 50), _r(64, 80, 3), _r(64)
    got = F.conv1d(ember.from_numpy(x), ember.from_numpy(w), ember.from_numpy(b), stride=2,
                   padding=1)  # fmt: skip
    want = torch.nn.functional.conv1d(*map(torch.from_numpy, (x, w, b)), stride=2, padding=1)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_depthwise_nchw_matches_reference():
    k = _kernel("conv2d", "depthwise_nchw")
    rng = np.random.default_rng(5)
    cases = []
    for dt in (np.float32, np.float64):
        for xs, ws, geom in [
            ((2, 3, 9, 8), (3, 1, 3, 3), Geom((1, 1), (1, 1), (1, 1, 1, 1), 3, 2, True)),
            ((1, 4, 9, 8), (8, 1, 3, 2), Geom((2, 3), (2, 1), (2, 1, 0, 2), 4, 2, True)),
            ((5, 7, 6), (5, 1, 3, 3), Geom((1, 2), (1, 1), (0, 2, 1, 0), 5, 2, False)),
            ((2, 6, 17), (12, 1, 5), Geom((1, 2), (1, 3), (0, 0, 4, 4), 6, 1, True)),
            ((0, 3, 5, 5), (3, 1, 3, 3), Geom((1, 1), (1, 1), (1, 1, 1, 1), 3, 2, True)),
        ]:
            x, w = rng.standard_normal(xs).astype(dt), rng.standard_normal(ws).astype(dt)
            b = rng.standard_normal(ws[0]).astype(dt)
            cases += [((x, w, b), dict(geom=geom)), ((x, w), dict(geom=geom))]
    check_kernel(k, cases=cases, rtol=1e-5, atol=1e-5)
    g = Geom((1, 1), (1, 1), (0, 0, 0, 0), 1, 2, True)  # groups 1: the op's other paths
    assert not k.applies([_r(1, 4, 5, 5), _r(4, 4, 3, 3)], dict(geom=g))
    x16 = np.ones((1, 2, 4, 4), np.float16)
    assert not k.applies([x16, x16[:, :1]], dict(geom=g._replace(groups=2)))


def test_depthwise_conv_trains_on_the_kernel_and_matches_torch(monkeypatch):
    import torch

    import ember
    import ember.nn.functional as F

    k = _kernel("conv2d", "depthwise_nchw")
    calls = []
    fn = k.fn
    monkeypatch.setattr(k, "fn", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    x, w, b = _r(2, 6, 11, 9), _r(12, 1, 3, 3), _r(12)
    ex, ew, eb = (ember.from_numpy(a.copy()).requires_grad_() for a in (x, w, b))
    y = F.conv2d(ex, ew, eb, stride=2, padding=1, groups=6)
    assert len(calls) == (1 if k.applies([x, w, b], {"geom": y._ctx.geom}) else 0)
    (y * y).sum().backward()
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=2, padding=1, groups=6)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    for e, t in ((ex, tx), (ew, tw), (eb, tb)):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "n,h,w,c,kh,kw,o", [(1, 5, 7, 24, 2, 2, 1), (2, 3, 4, 5, 3, 2, 2), (1, 1, 9, 1, 2, 3, 1)]
)
def test_conv_transpose_direct_matches_reference(n, h, w, c, kh, kw, o):
    x, wt, bias = _r(n, h, w, c), _r(kh, kw * o, c), _r(kh * kw * o)
    for act in (0, 1, 2):
        got = np.full((n, h * kh, w * kw, o), np.nan, np.float32)
        want = np.empty_like(got)
        K.conv_transpose(x, wt, bias, got, act)
        K.conv_transpose_reference(x, wt, bias, want, act)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the reference against the definition: out[i*kh + a, j*kw + b, q] = sum_c x[i, j, c] w[...]
    K.conv_transpose_reference(x, wt, bias, want, 0)
    ref = (
        np.einsum("nijc,abqc->niajbq", x, wt.reshape(kh, kw, o, c))
        + bias.reshape(kh, kw, o)[:, None]
    )
    np.testing.assert_allclose(want, ref.reshape(want.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,m,c", [(1, 25600, 96), (3, 49, 2048), (2, 1, 5), (1, 63, 7), (2, 0, 3)])
def test_channel_mean_matches_float64(n, m, c):
    x = _r(n, m, c) + 3.0  # an offset: float32 running sums would drift
    got = K.channel_mean(x)
    assert got.dtype == np.float32 and got.shape == (n, c)
    if m:
        np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=1), rtol=1e-6, atol=1e-6)


DW_CASES = [  # n, h, w, c, k, stride, pt, pl: full and partial channel blocks, every border
    (1, 1, 1, 40, 3, 1, 1, 1),  # one pixel: every column an edge
    (2, 14, 14, 37, 3, 2, 1, 1),
    (1, 3, 20, 17, 5, 1, 2, 2),  # rows with missing taps above and below
    (1, 12, 23, 64, 3, 1, 1, 1),  # interior runs of P_MAX pixels and a remainder
    (1, 7, 9, 3, 7, 2, 3, 3),
    (1, 6, 5, 16, 3, 2, 0, 0),  # no padding: no edge columns
    (2, 9, 18, 33, 5, 1, 2, 2),  # stride 1, runs of P_MAX and a remainder, masked channels
    (1, 5, 7, 20, 3, 1, 1, 1),
]


def test_depthwise_vector_kernel_matches_reference():
    from ember.kernels.cpu import dwconv

    st = dwconv.state()
    if st is None:
        pytest.skip("no microkernels here")
    for n, h, w, c, k, s, pt, pl in DW_CASES:
        x, wt, bias = _r(n, h, w, c), _r(k, k, c), _r(c)
        oh, ow = (h + 2 * pt - k) // s + 1, (w + 2 * pl - k) // s + 1
        for act in (0, 1, 2):
            ref = K.depthwise_nhwc_reference(
                x, wt, bias, np.empty((n, oh, ow, c), np.float32), s, s, pt, pl, act
            )
            for name in ("serial", "parallel"):
                got = np.full((n, oh, ow, c), np.nan, np.float32)
                st[name](x, wt, bias, got, s, s, pt, pl, act)
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    x = _r(1, 4, 4, 20)
    x[0, 1, 1, 3] = np.nan  # NaN passes through the ReLU6 clamp, as in the reference
    got = np.empty((1, 4, 4, 20), np.float32)
    st["serial"](x, _r(3, 3, 20), _r(20), got, 1, 1, 1, 1, 2)
    assert np.isnan(got[0, :3, :3, 3]).all() and not np.isnan(np.delete(got, 3, axis=3)).any()


DW_RECT_CASES = [  # n, h, w, c, kh, kw, sh, sw, pt, pl: whole-row kernels, slices, edges
    (1, 6, 40, 37, 3, 3, 1, 1, 1, 1),  # channel slices of 16, 16 and 5 (a masked tail)
    (1, 7, 41, 37, 3, 3, 2, 2, 1, 1),  # stride 2, slices, runs of P_MAX and a remainder
    (2, 5, 6, 133, 3, 3, 1, 1, 1, 1),  # a border pixel's kernel on 8 vectors and the rest
    (1, 4, 23, 133, 3, 3, 2, 2, 0, 1),  # stride 2 from the left border, wide channels
    (1, 9, 13, 21, 5, 3, 1, 1, 2, 1),  # 5 kernel rows of 3 taps: whole rows, rows cut above/below
    (1, 8, 11, 19, 3, 5, 1, 1, 1, 2),  # 5 taps a row: the per-tap kernel
    (1, 8, 19, 24, 3, 3, 1, 2, 1, 1),  # row stride 1, column stride 2
    (1, 10, 9, 300, 3, 3, 1, 1, 1, 1),  # one slice of many channel blocks
]


def test_depthwise_vector_kernel_rows_slices_and_borders():
    """The whole-row kernels (3 taps a kernel row, column stride 1 or 2) over channel slices,
    and the border pixels' kernel, against the float64 reference."""
    from ember.kernels.cpu import dwconv

    st = dwconv.state()
    if st is None:
        pytest.skip("no microkernels here")
    for n, h, w, c, kh, kw, sh, sw, pt, pl in DW_RECT_CASES:
        x, wt, bias = _r(n, h, w, c), _r(kh, kw, c), _r(c)
        oh, ow = (h + 2 * pt - kh) // sh + 1, (w + 2 * pl - kw) // sw + 1
        for act in (0, 2):
            ref = K.depthwise_nhwc_reference(
                x.astype(np.float64), wt.astype(np.float64), bias.astype(np.float64),
                np.empty((n, oh, ow, c)), sh, sw, pt, pl, act,
            )  # fmt: skip
            got = np.full((n, oh, ow, c), np.nan, np.float32)
            st["serial"](x, wt, bias, got, sh, sw, pt, pl, act)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_depthwise_vector_kernel_avx2_in_a_fresh_process():
    """8-lane kernels (what an AVX2-only CPU runs), forced by EMBER_SGEMM_ISA."""
    from ember.kernels.cpu import gemm
    from tests.helpers import run_fresh

    if gemm.isa() is None:
        pytest.skip("no AVX2 here")
    code = (
        "from ember.kernels.cpu import gemm\n"
        "from tests.kernels import test_conv as t\n"
        "assert gemm.isa() == 'avx2'\n"
        "t.test_depthwise_vector_kernel_matches_reference()\n"
        "t.test_depthwise_vector_kernel_rows_slices_and_borders()\n"
        "t.test_fused_depthwise_matches_reference()\n"
        "print('ok')\n"
    )
    assert run_fresh(code, {"EMBER_SGEMM_ISA": "avx2"})[-1] == "ok"


@pytest.mark.parametrize(
    "c,o,k,hw",
    [(40, 260, 1, (7, 7)), (300, 8 * 32 + 5, 1, (14, 14)), (19, 300, 3, (5, 3)),
     (24, 270, 1, (11, 9)), (520, 256, 1, (13, 1))],
)  # fmt: skip
def test_conv_gemm_one_thread_sweeps_all_few_pixels_per_pass(c, o, k, hw, serial_rows):
    """On one thread a conv of at most ONE_BLOCK_ROWS pixels with enough panels sweeps all its
    pixels per pass over the panels (the serial driver's chunk: every row, in whole tiles), K in
    one block or several, with and without a residual; results match float64."""
    w, b = PackedWeight(_r(o, c, k, k)), _r(o)
    pads = (k // 2,) * 4
    x = _r(1, c, *hw)
    ref = K.conv2d_nchw_reference(x.astype(np.float64), w.astype(np.float64), (1, 1), pads, 1)
    res = _r(*ref.shape)
    for r in (None, res, _cl(res)):
        want = np.maximum(ref + b[:, None, None] + (0 if r is None else r), 0)
        y = K.fused_conv2d_gemm(x, w, b, r, stride=(1, 1), pads=pads, groups=1, act="relu")
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    mr, m = G._state()["mr"], hw[0] * hw[1]
    if G.packed_panels(w).shape[2] == G.panel_width():  # (narrow weights: gemm_narrow's rows)
        assert serial_rows and set(serial_rows) == {-(-m // mr) * mr}
