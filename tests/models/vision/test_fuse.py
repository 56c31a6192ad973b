"""Channels-last kernels against their numpy references, and fused layers against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import nn
from ember.kernels.cpu import conv_nhwc as K
from ember.models.fuse import FusedConv2d, fuse_conv_bn, nhwc, optimize_for_inference

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "n,h,w,c,k,s,pt,pl",
    [
        (1, 7, 9, 3, 7, 2, 3, 3),
        (2, 6, 5, 16, 3, 1, 1, 1),
        (1, 8, 8, 5, 3, 2, 0, 0),
        (1, 9, 4, 8, 5, 2, 1, 2),
    ],
)
def test_im2col_and_depthwise_match_references(n, h, w, c, k, s, pt, pl):
    x = _r(n, h, w, c)
    oh, ow = (h + 2 * pt - k) // s + 1, (w + 2 * pl - k) // s + 1
    a, b = (
        np.full((n * oh * ow, k * k * c), np.nan, np.float32),
        np.empty((n * oh * ow, k * k * c), np.float32),
    )
    K.im2col(x, a, k, k, s, s, pt, pl, oh, ow)
    K.im2col_reference(x, b, k, k, s, s, pt, pl, oh, ow)
    np.testing.assert_array_equal(a, b)
    wt, bias = _r(k, k, c), _r(c)
    for act in (0, 1, 2):
        o1, o2 = np.empty((n, oh, ow, c), np.float32), np.empty((n, oh, ow, c), np.float32)
        K.depthwise(x, wt, bias, o1, s, s, pt, pl, act)
        K.depthwise_reference(x, wt, bias, o2, s, s, pt, pl, act)
        np.testing.assert_allclose(o1, o2, atol=1e-5)
    m1, m2 = np.empty((n, oh, ow, c), np.float32), np.empty((n, oh, ow, c), np.float32)
    K.maxpool(x, m1, k, k, s, s, min(pt, k // 2), min(pl, k // 2))
    K.maxpool_reference(x, m2, k, k, s, s, min(pt, k // 2), min(pl, k // 2))
    np.testing.assert_array_equal(m1, m2)
    st = x.strides  # overlapping windows (the stem's window rows) into a strided destination
    src = np.lib.stride_tricks.as_strided(x, (n, h, w - k + 1, k * c), (*st[:2], st[2], st[3]))
    dst = np.zeros((n, h + 1, w - k + 3, k * c), np.float32)
    K.copy4d(src, dst[:, 1:, 2:])
    np.testing.assert_array_equal(dst[:, 1:, 2:], src)
    assert not dst[:, 0].any() and not dst[:, :, :2].any()


@pytest.mark.parametrize("act", [0, 1, 2])
def test_epilogue_matches_reference(act):
    y, b, r = _r(67, 13) * 5, _r(13), _r(67, 13)
    for res in (None, r):
        a1, a2 = y.copy(), y.copy()
        K.epilogue(a1, b, res, act)
        K.epilogue_reference(a2, b, res, act)
        np.testing.assert_allclose(a1, a2, atol=1e-6)


CASES = [  # cin, cout, k, stride, padding, groups, input hw
    (3, 8, 7, 2, 3, 1, (17, 14)), (8, 16, 1, 1, 0, 1, (5, 6)), (8, 16, 1, 2, 0, 1, (7, 9)),
    (6, 6, 3, 1, 1, 6, (9, 8)), (6, 6, 5, 2, 2, 6, (11, 10)), (4, 5, 3, 2, 1, 1, (8, 8)),
    (4, 5, 3, 1, 0, 1, (6, 7)), (4, 5, (3, 1), 1, (1, 0), 1, (6, 7)),
]  # fmt: skip


@pytest.mark.parametrize("cin,cout,k,s,p,g,hw", CASES)
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_fused_conv_bn_act_matches_torch(cin, cout, k, s, p, g, hw, act):
    tconv = torch.nn.Conv2d(cin, cout, k, s, p, groups=g, bias=True)
    tbn = torch.nn.BatchNorm2d(cout)
    with torch.no_grad():
        tbn.weight.uniform_(0.5, 1.5), tbn.bias.normal_(), tbn.running_mean.normal_()
        tbn.running_var.uniform_(0.5, 2)
    tact = {None: torch.nn.Identity(), "relu": torch.nn.ReLU(), "relu6": torch.nn.ReLU6()}[act]
    tseq = torch.nn.Sequential(tconv, tbn, tact).eval()
    x = _r(2, cin, *hw) * 3
    res = None
    with torch.no_grad():
        ref = tseq(torch.from_numpy(x)).numpy()
    conv = nn.Conv2d(cin, cout, k, s, p, groups=g, bias=True)
    bn = nn.BatchNorm2d(cout)
    conv.load_state_dict({k_: v.numpy() for k_, v in tconv.state_dict().items()})
    bn.load_state_dict({k_: v.numpy() for k_, v in tbn.state_dict().items()})
    fused = fuse_conv_bn(conv, bn.eval(), act)
    y = fused(ember.from_numpy(x))
    assert tuple(y.shape) == ref.shape
    np.testing.assert_allclose(y.numpy(), ref, atol=1e-4, rtol=1e-4)
    # residual add (before the activation), with a channels-last residual
    res = _r(*ref.shape)
    with torch.no_grad():
        pre = torch.nn.Sequential(tconv, tbn)(torch.from_numpy(x))
        ref2 = tact(pre + torch.from_numpy(res)).numpy()
    y2 = fused(ember.from_numpy(x), residual=ember.from_numpy(np.ascontiguousarray(res)))
    np.testing.assert_allclose(y2.numpy(), ref2, atol=1e-4, rtol=1e-4)


def test_outputs_are_channels_last_views_with_nchw_shape():
    conv = FusedConv2d(_r(4, 3, 3, 3), _r(4), (1, 1), (1, 1, 1, 1))
    y = conv(ember.randn(2, 3, 5, 6))
    assert tuple(y.shape) == (2, 4, 5, 6)
    assert nhwc(y).base is not None or nhwc(y).flags.c_contiguous  # no copy needed downstream
    assert np.shares_memory(nhwc(y), y._data)


def test_optimize_generic_sequential_and_leave_original_alone():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, groups=8, padding=1), torch.nn.ReLU6(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3),
    ).eval()  # fmt: skip
    with torch.no_grad():
        tm[1].running_mean.normal_(), tm[1].running_var.uniform_(0.5, 2)
    em = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 3),
    )  # fmt: skip
    em.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    keys = list(em.state_dict())
    x = _r(2, 3, 10, 12)
    fast = optimize_for_inference(em)
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(fast(ember.from_numpy(x)).numpy(), ref, atol=1e-5)
    assert type(fast[0]).__name__ == "FusedConv2d" and fast[0].act == "relu"
    assert list(em.state_dict()) == keys and type(em[0]) is nn.Conv2d  # untouched
    assert em.training  # the original keeps its mode too


def test_fold_refuses_batchnorm_without_statistics():
    conv, bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)
    with pytest.raises(ember.errors.UnsupportedError):
        fuse_conv_bn(conv, bn)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("microkernels", [True, False])
def test_fused_conv_paths_match_torch_for_any_thread_count(threads, microkernels, monkeypatch):
    import ember.models.fuse as fz

    if not microkernels:  # the fallback (no numba or no AVX2): im2col + BLAS
        monkeypatch.setattr(fz.G, "panel_width", lambda: None)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:  # in place (1x1), padded, im2col'd (few channels), tf-same padding
        for cin, k, s, p in (
            (20, 3, 1, 1),
            (20, 1, 2, 0),
            (20, 1, 1, 0),
            (6, 3, 2, 1),
            (17, 3, 2, 0),
        ):
            tconv = torch.nn.Conv2d(cin, 40, k, s, p)
            x = _r(2, cin, 9, 7)
            res = _r(*tconv(torch.from_numpy(x)).shape)
            with torch.no_grad():
                ref = torch.relu(tconv(torch.from_numpy(x)) + torch.from_numpy(res)).numpy()
            w, b = tconv.weight.detach().numpy(), tconv.bias.detach().numpy()
            fused = FusedConv2d(w, b, (s, s), (p, p, p, p), act="relu")
            assert (fused.packed is not None) == (microkernels and fz.G.panel_width() is not None)
            for _ in range(2):  # the second call reuses cached offsets and padded buffers
                y = fused(ember.from_numpy(x), residual=ember.from_numpy(res))
                np.testing.assert_allclose(y.numpy(), ref, atol=1e-5)
    finally:
        ember.set_num_threads(old)


def test_empty_batch_flows_through_a_fused_net():
    from ember.models.vision import mobilenet_v2

    fast = optimize_for_inference(mobilenet_v2(num_classes=4))
    assert tuple(fast(ember.zeros(0, 3, 32, 32)).shape) == (0, 4)
