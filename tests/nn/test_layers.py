"""Layers vs their torch twins: weights copied through state_dict, forward and every grad."""

import numpy as np
import pytest
import torch

import ember
from ember import nn
from tests.helpers import assert_close
from tests.nn.common import check_module, make_pair, rnd, sync

F64 = ember.float64


def _twins(name, *args, **kwargs):
    e = getattr(nn, name)(*args, **kwargs).double()
    t = getattr(torch.nn, name)(*args, **kwargs).double()
    return e, t


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize(
    "name,args,kwargs,shape",
    [
        ("Linear", (5, 3), {}, (2, 4, 5)),
        ("Linear", (5, 3), {"bias": False}, (7, 5)),
        ("Linear", (1, 1), {}, (1,)),
        ("Conv1d", (4, 6, 3), {"stride": 2, "padding": 1, "dilation": 1}, (2, 4, 11)),
        (
            "Conv1d",
            (4, 4, 3),
            {"groups": 4, "padding": "same", "padding_mode": "circular"},
            (2, 4, 9),
        ),
        ("Conv2d", (3, 5, 3), {"padding": 1}, (2, 3, 7, 6)),
        (
            "Conv2d",
            (4, 6, (3, 2)),
            {"stride": (2, 1), "dilation": (1, 2), "groups": 2, "bias": False},
            (1, 4, 9, 8),
        ),
        ("Conv2d", (3, 3, 3), {"groups": 3, "padding": 2, "padding_mode": "reflect"}, (2, 3, 6, 5)),
        ("Conv2d", (2, 4, 4), {"padding": "same", "padding_mode": "replicate"}, (1, 2, 6, 7)),
        ("Conv2d", (2, 4, 4), {"padding": "same"}, (1, 2, 6, 7)),
        ("Conv2d", (3, 4, 1), {}, (2, 3, 4, 4)),
        (
            "ConvTranspose2d",
            (4, 3, 3),
            {"stride": 2, "padding": 1, "output_padding": 1},
            (2, 4, 5, 4),
        ),
        ("ConvTranspose2d", (4, 6, (2, 3)), {"groups": 2, "dilation": 2}, (1, 4, 3, 5)),
        ("ConvTranspose1d", (3, 2, 3), {"stride": 3}, (2, 3, 5)),
        ("MaxPool2d", (3,), {"stride": 2, "padding": 1}, (2, 3, 7, 8)),
        ("MaxPool2d", (2,), {"ceil_mode": True}, (1, 2, 5, 5)),
        ("MaxPool1d", (3,), {}, (2, 3, 10)),
        ("AvgPool2d", (3,), {"stride": 2, "padding": 1, "count_include_pad": False}, (2, 3, 7, 8)),
        ("AvgPool2d", (2,), {}, (2, 3, 6, 4)),
        ("AvgPool1d", (3,), {"stride": 1, "padding": 1}, (2, 3, 7)),
        ("AdaptiveAvgPool2d", ((1, 1),), {}, (2, 3, 5, 7)),
        ("AdaptiveAvgPool2d", ((3, 2),), {}, (2, 3, 8, 5)),
        ("AdaptiveAvgPool1d", (4,), {}, (2, 3, 9)),
        ("AdaptiveMaxPool2d", ((2, 3),), {}, (1, 2, 7, 7)),
        ("Upsample", (), {"scale_factor": 2, "mode": "nearest"}, (1, 2, 3, 4)),
        (
            "Upsample",
            (),
            {"size": (5, 7), "mode": "bilinear", "align_corners": False},
            (2, 2, 3, 4),
        ),
        (
            "Upsample",
            (),
            {"scale_factor": 1.5, "mode": "bilinear", "align_corners": True},
            (1, 1, 4, 4),
        ),
        ("Flatten", (), {}, (2, 3, 4, 5)),
        ("Flatten", (0, 1), {}, (2, 3, 4)),
        ("Unflatten", (1, (2, 3)), {}, (4, 6, 2)),
        ("Identity", (3, 4), {}, (2, 3)),
        ("PixelShuffle", (2,), {}, (1, 8, 3, 2)),
        ("PixelUnshuffle", (2,), {}, (1, 2, 4, 6)),
        ("ZeroPad2d", ((1, 2, 0, 1),), {}, (1, 2, 3, 3)),
        ("ReflectionPad1d", (2,), {}, (2, 3, 5)),
        ("PReLU", (3,), {}, (2, 3, 4)),
        ("GroupNorm", (2, 6), {}, (3, 6, 4, 5)),
        ("GroupNorm", (3, 3), {"affine": False}, (2, 3, 7)),
        ("GroupNorm", (1, 4), {"bias": False, "eps": 1e-3}, (2, 4)),
        ("LayerNorm", (6,), {}, (3, 4, 6)),
        ("LayerNorm", ((4, 6),), {"bias": False, "eps": 1e-3}, (2, 4, 6)),
        ("LayerNorm", (5,), {"elementwise_affine": False}, (7, 5)),
        ("RMSNorm", (6,), {}, (3, 4, 6)),
        ("RMSNorm", ((2, 3),), {"eps": 1e-3}, (4, 2, 3)),
        ("RMSNorm", (4,), {"elementwise_affine": False}, (5, 4)),
        ("InstanceNorm2d", (3,), {"affine": True}, (2, 3, 4, 5)),
        ("InstanceNorm1d", (3,), {}, (3, 6)),
    ],
)
def test_layer_matches_torch(name, args, kwargs, shape):
    e, t = _twins(name, *args, **kwargs)
    check_module(e, t, [rnd(*shape, seed=len(shape))])


@pytest.mark.parametrize(
    "name,args",
    [
        ("ReLU", ()),
        ("ReLU6", ()),
        ("GELU", ()),
        ("GELU", ("tanh",)),
        ("SiLU", ()),
        ("Sigmoid", ()),
        ("Tanh", ()),
        ("Softmax", (1,)),
        ("LogSoftmax", (-1,)),
        ("Softmin", (0,)),
        ("LeakyReLU", (0.2,)),
        ("ELU", (0.7,)),
        ("CELU", (1.3,)),
        ("SELU", ()),
        ("Hardswish", ()),
        ("Hardsigmoid", ()),
        ("Mish", ()),
        ("Softplus", (2.0, 3.0)),
        ("Hardtanh", (-0.5, 0.8)),
        ("LogSigmoid", ()),
        ("Softsign", ()),
        ("Tanhshrink", ()),
        ("Softshrink", (0.3,)),
        ("Hardshrink", (0.4,)),
        ("Threshold", (0.1, -2.0)),
        ("GLU", (1,)),
    ],
)
def test_activations(name, args):
    x = rnd(3, 4, 6, low=-4, high=4, seed=1)
    x[np.abs(x) < 1e-3] = 0.5  # keep off kinks
    e, t = _twins(name, *args)
    # torch rounds a few backward constants (celu's 1/alpha, hardsigmoid's 1/6) through float32
    check_module(e, t, [x], atol=1e-7, rtol=1e-7)
    assert repr(e) == repr(t)
    x32 = x.astype(np.float32)
    e32, t32 = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    check_module(e32, t32, [x32], dtype=ember.float32, atol=1e-5, rtol=1e-5)


def test_inplace_activations():
    x = ember.randn(3, 4)
    ref = np.maximum(x.numpy(), 0)
    out = nn.ReLU(inplace=True)(x)
    assert out is x and np.array_equal(x.numpy(), ref)
    assert repr(nn.ReLU(inplace=True)) == "ReLU(inplace=True)"


def test_bilinear():
    e, t = _twins("Bilinear", 3, 4, 5)
    check_module(e, t, [rnd(2, 6, 3), rnd(2, 6, 4, seed=1)])


def test_embedding():
    e, t = _twins("Embedding", 10, 4, padding_idx=2)
    idx = np.array([[1, 2, 3], [2, 9, 1]])
    assert float(e.weight[2].abs().sum()) == 0.0
    sync(t, e)
    out_e = e(ember.tensor(idx))
    out_t = t(torch.tensor(idx))
    np.testing.assert_allclose(out_e.detach().numpy(), out_t.detach().numpy())
    w = np.random.default_rng(0).standard_normal(out_t.shape)
    (out_t * torch.tensor(w)).sum().backward()
    (out_e * ember.tensor(w)).sum().backward()
    np.testing.assert_allclose(e.weight.grad.numpy(), t.weight.grad.numpy())
    assert float(e.weight.grad[2].abs().sum()) == 0.0
    # from_pretrained: frozen by default, shares memory, padding row untouched
    table = ember.randn(5, 3)
    fe = nn.Embedding.from_pretrained(table)
    assert not fe.weight.requires_grad and fe.weight.numpy(force=True) is table.numpy()
    assert nn.Embedding.from_pretrained(table, freeze=False).weight.requires_grad
    assert (
        repr(nn.Embedding.from_pretrained(table, padding_idx=1)) == "Embedding(5, 3, padding_idx=1)"
    )
    assert nn.Embedding(5, 3, padding_idx=-1).padding_idx == 4
    # max_norm renormalises looked-up rows in place, as torch
    me, mt = _twins("Embedding", 6, 3, max_norm=1.0)
    sync(mt, me)
    me(ember.tensor([0, 1, 1]))
    mt(torch.tensor([0, 1, 1]))
    np.testing.assert_allclose(me.weight.detach().numpy(), mt.weight.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("cls", ["BatchNorm1d", "BatchNorm2d"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"momentum": None},
        {"affine": False},
        {"track_running_stats": False},
        {"momentum": 0.3, "eps": 1e-3},
    ],
)
def test_batchnorm(cls, kwargs):
    shape = (6, 3) if cls == "BatchNorm1d" else (4, 3, 5, 2)
    e, t = _twins(cls, 3, **kwargs)
    sync(t, e)
    for step in range(3):  # training: batch stats, running stats updated every step
        check_module(e, t, [rnd(*shape, seed=step)], load=False, seed=step)
        for k, v in t.state_dict().items():
            np.testing.assert_allclose(
                e.state_dict()[k].numpy(), v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k
            )
        e.zero_grad()
        t.zero_grad()
    e.eval()
    t.eval()
    check_module(e, t, [rnd(*shape, seed=9)], load=False)
    if cls == "BatchNorm1d":
        check_module(e, t, [rnd(4, 3, 7, seed=3)], load=False)
    assert repr(e) == repr(t)
    with pytest.raises(ember.errors.ShapeError):
        e(ember.randn(2, 3, 4, 5, 6, dtype=F64))


def test_batchnorm_single_value_in_training_raises():
    with pytest.raises(ember.errors.ShapeError):
        nn.BatchNorm1d(3)(ember.randn(1, 3))


def test_dropout():
    ember.manual_seed(0)
    d = nn.Dropout(0.3)
    x = ember.ones(200, 50, requires_grad=True)
    y = d(x)
    a = y.detach().numpy()
    frac = float((a == 0).mean())
    assert 0.25 < frac < 0.35
    np.testing.assert_allclose(np.unique(a), [0.0, 1 / 0.7], rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), a)
    d.eval()
    assert d(x) is x
    assert float(nn.Dropout(1.0)(x).abs().sum()) == 0.0
    assert nn.Dropout(0.0)(x) is x
    c = nn.Dropout2d(0.5)(ember.ones(4, 6, 3, 3)).numpy()
    per_channel = c.reshape(24, 9)
    assert all(len(np.unique(r)) == 1 for r in per_channel)
    c1 = nn.Dropout1d(0.5)(ember.ones(6, 5)).numpy()
    assert all(len(np.unique(r)) == 1 for r in c1)
    with pytest.raises(ValueError):
        nn.Dropout(1.5)
    ember.manual_seed(1)
    r1 = nn.Dropout()(ember.ones(10)).numpy()
    ember.manual_seed(1)
    r2 = nn.Dropout()(ember.ones(10)).numpy()
    np.testing.assert_array_equal(r1, r2)


def test_default_init_statistics_like_torch():
    ember.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / np.sqrt(400)
    w = lin.weight.detach().numpy()
    assert np.abs(w).max() <= bound + 1e-7 and np.abs(w).max() > 0.95 * bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.02 * bound
    conv = nn.Conv2d(16, 32, 3)
    cb = 1 / np.sqrt(16 * 9)
    cw = conv.weight.detach().numpy()
    assert np.abs(cw).max() <= cb + 1e-7 and abs(cw.std() - cb / np.sqrt(3)) < 0.05 * cb
    assert np.abs(conv.bias.detach().numpy()).max() <= cb
    emb = nn.Embedding(1000, 64).weight.detach().numpy()
    assert abs(emb.mean()) < 0.01 and abs(emb.std() - 1) < 0.01
    ember.manual_seed(3)
    a = nn.Linear(5, 5).weight.detach().numpy().copy()
    ember.manual_seed(3)
    b = nn.Linear(5, 5).weight.detach().numpy()
    np.testing.assert_array_equal(a, b)
    rnn = nn.LSTM(10, 20)
    assert max(float(p.abs().max()) for p in rnn.parameters()) <= 1 / np.sqrt(20)


def test_conv_transpose_output_size():
    e, t = _twins("ConvTranspose2d", 2, 3, 3, stride=2, padding=1)
    sync(t, e)
    x = rnd(1, 2, 4, 4)
    (ei,), (ti,) = make_pair([x], False)
    oe = e(ei, output_size=[8, 8])
    ot = t(ti, output_size=[8, 8])
    assert tuple(oe.shape) == tuple(ot.shape) == (1, 3, 8, 8)
    np.testing.assert_allclose(oe.detach().numpy(), ot.detach().numpy(), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError):
        e(ei, output_size=[20, 20])


def test_float32_layers_and_low_precision():
    e, t = nn.Linear(8, 4), torch.nn.Linear(8, 4)
    check_module(e, t, [rnd(3, 8, dtype=ember.float32)], dtype=ember.float32, atol=1e-5, rtol=1e-5)
    ln_e, ln_t = nn.LayerNorm(8), torch.nn.LayerNorm(8)
    check_module(
        ln_e, ln_t, [rnd(3, 8, dtype=ember.float32)], dtype=ember.float32, atol=1e-5, rtol=1e-4
    )
    for name in ("LayerNorm", "RMSNorm"):
        e, t = getattr(nn, name)(16).bfloat16(), getattr(torch.nn, name)(16).bfloat16()
        sync(t, e)
        x = rnd(4, 16, dtype=ember.float32, seed=2)
        xb = ember.from_numpy(x).to(ember.bfloat16)
        oe = e(xb)
        ref = t.double()(torch.from_numpy(xb.double().numpy())).to(torch.bfloat16)  # same values
        assert_close(oe, ref, ember.bfloat16, f"bf16 {name}")
