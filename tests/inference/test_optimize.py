"""optimize_for_inference: its passes (fold, layout, pack) and the fused op, against torch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import ember
from ember import config, nn
from ember.inference import optimize_for_inference
from ember.inference.fold import fold_batchnorm, fold_bn
from ember.inference.layout import FusedConv2d, Residual
from ember.inference.ops import fused_conv2d
from ember.kernels.cpu import conv as K
from ember.kernels.cpu import gemm as G

RNG = np.random.default_rng(0)


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _load(em, tm):
    em.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    return em


def _randomize_bn(tbn):
    with torch.no_grad():
        tbn.weight.uniform_(0.5, 1.5), tbn.bias.normal_(), tbn.running_mean.normal_()
        tbn.running_var.uniform_(0.5, 2)


CASES = [  # cin, cout, k, stride, padding, groups, input hw
    (3, 8, 7, 2, 3, 1, (17, 14)), (8, 16, 1, 1, 0, 1, (5, 6)), (8, 16, 1, 2, 0, 1, (7, 9)),
    (6, 6, 3, 1, 1, 6, (9, 8)), (6, 6, 5, 2, 2, 6, (11, 10)), (4, 5, 3, 2, 1, 1, (8, 8)),
    (4, 5, 3, 1, 0, 1, (6, 7)), (4, 5, (3, 1), 1, (1, 0), 1, (6, 7)),
]  # fmt: skip


@pytest.mark.parametrize("cin,cout,k,s,p,g,hw", CASES)
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_conv_bn_act_becomes_one_fused_conv_matching_torch(cin, cout, k, s, p, g, hw, act):
    tconv = torch.nn.Conv2d(cin, cout, k, s, p, groups=g, bias=True)
    tbn = torch.nn.BatchNorm2d(cout)
    _randomize_bn(tbn)
    tact = {None: torch.nn.Identity(), "relu": torch.nn.ReLU(), "relu6": torch.nn.ReLU6()}[act]
    tseq = torch.nn.Sequential(tconv, tbn, tact).eval()
    eact = {None: nn.Identity(), "relu": nn.ReLU(), "relu6": nn.ReLU6()}[act]
    em = _load(
        nn.Sequential(nn.Conv2d(cin, cout, k, s, p, groups=g), nn.BatchNorm2d(cout), eact), tseq
    )
    fast = optimize_for_inference(em)
    assert type(fast[0]) is FusedConv2d and fast[0].act == act
    assert all(type(m) is nn.Identity for m in fast[1:])  # BN folded, activation fused
    x = _r(2, cin, *hw) * 3
    with torch.no_grad():
        ref = tseq(torch.from_numpy(x)).numpy()
    y = fast(ember.from_numpy(x))
    assert tuple(y.shape) == ref.shape
    np.testing.assert_allclose(y.numpy(), ref, atol=1e-4, rtol=1e-4)
    # the residual add (before the activation) of the same fused conv
    res = _r(*ref.shape)
    with torch.no_grad():
        ref2 = tact(torch.nn.Sequential(tconv, tbn)(torch.from_numpy(x)) + torch.from_numpy(res))
    y2 = fast[0](ember.from_numpy(x), residual=ember.from_numpy(res))
    np.testing.assert_allclose(y2.numpy(), ref2.numpy(), atol=1e-4, rtol=1e-4)


def test_outputs_are_channels_last_views_with_nchw_shape():
    fast = optimize_for_inference(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()))
    y = fast(ember.randn(2, 3, 5, 6))
    assert tuple(y.shape) == (2, 4, 5, 6)
    if G.panel_width() is not None:
        assert K.is_channels_last(y._data)  # the next layer reads it without a copy


def test_state_dict_and_parameters_see_the_original_weights():
    em = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    sd = {k: v.numpy().copy() for k, v in em.state_dict().items()}
    fast = em.optimize_for_inference()  # the nn.Module method
    assert isinstance(fast[0], FusedConv2d)
    assert list(fast.state_dict()) == list(sd)
    for k, v in fast.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k])
        assert type(v._data) is np.ndarray  # no packed type leaks out of state_dict
    packed = [G.packed_panels(p._data) is not None for p in fast.parameters() if p.ndim > 1]
    assert all(packed) == (G.panel_width() is not None) and len(packed) == 2
    assert not any(p.requires_grad for p in fast.parameters())


def test_optimize_generic_sequential_and_leave_original_alone():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, groups=8, padding=1), torch.nn.ReLU6(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3),
    ).eval()  # fmt: skip
    _randomize_bn(tm[1])
    em = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 3),
    )  # fmt: skip
    _load(em, tm)
    keys = list(em.state_dict())
    x = _r(2, 3, 10, 12)
    fast = optimize_for_inference(em)
    with torch.no_grad():
        ref = tm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(fast(ember.from_numpy(x)).numpy(), ref, atol=1e-5)
    assert type(fast[0]) is FusedConv2d and fast[0].act == "relu"
    assert list(em.state_dict()) == keys and type(em[0]) is nn.Conv2d  # untouched
    assert em.training  # the original keeps its mode too


class Block(nn.Module):
    """A residual block written by a user: it only declares what its forward computes."""

    inference_block = {"chain": ("conv1", "bn1", "act", "conv2", "bn2"), "add": "proj",
                       "act": "relu6"}  # fmt: skip

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout)
        self.act = nn.ReLU()
        self.proj = None if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride)

    def forward(self, x):
        y = self.bn2(self.conv2(self.act(self.bn1(self.conv1(x)))))
        return nn.functional.relu6(y + (x if self.proj is None else self.proj(x)))


@pytest.mark.parametrize("cin,cout,stride", [(8, 8, 1), (8, 12, 2)])
def test_a_declared_residual_block_is_fused_and_exact(cin, cout, stride):
    em = Block(cin, cout, stride)
    for bn in (em.bn1, em.bn2):
        bn.running_mean._data[...] = _r(cout)
        bn.running_var._data[...] = np.abs(_r(cout)) + 0.5
    em.eval()
    x = ember.from_numpy(_r(2, cin, 9, 8))
    with ember.no_grad():
        ref = em(x).numpy()
    folded = fold_batchnorm(copy.deepcopy(em))  # each pass leaves a working model
    assert isinstance(folded.bn1, nn.Identity) and isinstance(folded.bn2, nn.Identity)
    with ember.no_grad():
        np.testing.assert_allclose(folded(x).numpy(), ref, atol=1e-5, rtol=1e-5)
    fast = optimize_for_inference(em)
    assert type(fast) is Residual and fast.fused and fast.last.act == "relu6"
    np.testing.assert_allclose(fast(x).numpy(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_residual_blocks_of_the_zoo_match_torch(name):
    from ember.models.vision import MODELS
    from tests.models.vision import twins

    torch.manual_seed(0)
    tm = twins.resnet(name) if name.startswith("resnet") else twins.MobileNetV2()
    tm = twins.randomize_bn(tm).eval()
    fast = optimize_for_inference(MODELS[name](weights=twins.to_numpy_state(tm)))
    assert sum(isinstance(m, Residual) and m.fused for m in fast.modules()) >= 8
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fast.modules())
    x = _r(1, 3, 40, 48)
    np.testing.assert_allclose(fast(ember.from_numpy(x)).numpy(), twins.logits(tm, x), atol=1e-4)


def test_fold_refuses_batchnorm_without_statistics():
    conv, bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)
    with pytest.raises(ember.errors.UnsupportedError):
        fold_bn(conv, bn)
    seq = optimize_for_inference(nn.Sequential(conv, bn))  # left unfolded: batch statistics
    assert isinstance(seq[1], nn.BatchNorm2d)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("kernels", [True, False])
def test_fused_conv_paths_match_torch_for_any_thread_count(threads, kernels, monkeypatch):
    if not kernels:  # the op's numpy forward (what runs without numba or AVX2)
        monkeypatch.setattr(config, "KERNELS", "reference")
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:  # in place (1x1), padded, window rows (few channels), uneven padding
        for cin, k, s, p in ((20, 3, 1, 1), (20, 1, 2, 0), (20, 1, 1, 0), (6, 3, 2, 1),
                             (17, 3, 2, 0)):  # fmt: skip
            tconv = torch.nn.Conv2d(cin, 40, k, s, p)
            x = _r(2, cin, 9, 7)
            res = _r(*tconv(torch.from_numpy(x)).shape)
            with torch.no_grad():
                ref = torch.relu(tconv(torch.from_numpy(x)) + torch.from_numpy(res)).numpy()
            em = _load(nn.Conv2d(cin, 40, k, s, p), tconv)
            fused = optimize_for_inference(em)
            fused.act = "relu"
            for _ in range(2):  # the second call reuses cached offsets and padded buffers
                y = fused(ember.from_numpy(x), residual=ember.from_numpy(res))
                np.testing.assert_allclose(y.numpy(), ref, atol=1e-5)
                assert K.is_channels_last(y._data) == (kernels and G.panel_width() is not None)
    finally:
        ember.set_num_threads(old)


def test_fused_conv_op_has_a_backward_matching_torch():
    x, w, b, r = _r(2, 4, 6, 5), _r(6, 4, 3, 3), _r(6), _r(2, 6, 3, 3)
    tx, tw, tb, tr = (torch.from_numpy(a).requires_grad_() for a in (x, w, b, r))
    torch.nn.functional.relu6(
        torch.nn.functional.conv2d(tx, tw, tb, 2, 1) + tr
    ).square().sum().backward()
    ex, ew, eb, er = (ember.from_numpy(a).requires_grad_() for a in (x, w, b, r))
    y = fused_conv2d(ex, ew, eb, er, stride=2, padding=1, act="relu6")
    (y * y).sum().backward()
    for e, t in ((ex, tx), (ew, tw), (eb, tb), (er, tr)):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("act", ["hardswish", "silu"])
def test_fused_conv_op_hardswish_silu_and_scale_have_a_backward_matching_torch(act):
    x, w, b = _r(2, 4, 6, 5), _r(6, 4, 3, 3), _r(6)
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    tf = torch.nn.functional.hardswish if act == "hardswish" else torch.nn.functional.silu
    (tf(torch.nn.functional.conv2d(tx, tw, tb, 1, 1)) * 0.5 + 0.25).square().sum().backward()
    ex, ew, eb = (ember.from_numpy(a).requires_grad_() for a in (x, w, b))
    y = fused_conv2d(ex, ew, eb, stride=1, padding=1, act=act, scale=0.5, shift=0.25)
    (y * y).sum().backward()
    for e, t in ((ex, tx), (ew, tw), (eb, tb)):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_tf_same_padding_and_bad_arguments():
    from ember.models.vision.efficientnet import Conv2dSame

    conv = Conv2dSame(5, 7, 3, 2)
    x = ember.from_numpy(_r(1, 5, 9, 8))
    with ember.no_grad():
        ref = conv(x).numpy()
    np.testing.assert_allclose(optimize_for_inference(conv)(x).numpy(), ref, atol=1e-5)
    with pytest.raises(ValueError):
        fused_conv2d(x, conv.weight, ember.zeros(7), act="gelu")
    with pytest.raises(ember.errors.ShapeError):
        fused_conv2d(x, ember.zeros(7, 4, 3, 3), ember.zeros(7))


def test_empty_batch_flows_through_a_fused_net():
    from ember.models.vision import mobilenet_v2

    fast = optimize_for_inference(mobilenet_v2(num_classes=4))
    assert tuple(fast(ember.zeros(0, 3, 32, 32)).shape) == (0, 4)
