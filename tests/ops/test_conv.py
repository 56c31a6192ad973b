import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.errors import DTypeError, ShapeError
from ember.ops import conv as conv_mod
from ember.ops.conv import Geom
from tests.helpers import check, gradcheck

ALL_FLOATS = (ember.float32, ember.float64, ember.float16, ember.bfloat16)

# (input shape, weight shape, bias?, kwargs)
CONV2D = [
    ((2, 4, 7, 6), (6, 4, 3, 3), True, {}),
    ((2, 4, 7, 6), (6, 4, 3, 3), True, dict(stride=2, padding=1)),
    ((1, 3, 11, 9), (4, 3, 5, 3), False, dict(stride=3, padding=(2, 1))),
    (
        (1, 4, 9, 8),
        (6, 2, 3, 2),
        True,
        dict(stride=(2, 3), padding=(1, 2), dilation=(2, 1), groups=2),
    ),
    ((2, 4, 7, 7), (4, 1, 3, 3), True, dict(padding=1, groups=4)),  # depthwise
    ((2, 4, 7, 7), (8, 1, 3, 3), True, dict(stride=2, padding=1, groups=4)),  # depthwise x2
    ((2, 4, 7, 7), (8, 1, 3, 3), False, dict(stride=3, padding=2, dilation=2, groups=4)),
    ((2, 4, 6, 7), (5, 4, 4, 4), True, dict(padding="same")),  # even kernel: extra pad at the end
    ((2, 4, 6, 7), (5, 4, 4, 2), True, dict(padding="same", dilation=2)),
    ((2, 4, 6, 7), (5, 4, 1, 1), True, {}),  # 1x1: plain matmul
    ((2, 4, 6, 7), (5, 4, 1, 1), True, dict(stride=2)),
    ((2, 4, 6, 7), (6, 2, 1, 1), True, dict(groups=2)),
    ((2, 4, 6, 7), (5, 4, 1, 1), False, dict(padding=1)),
    ((4, 6, 7), (5, 4, 3, 3), True, dict(padding="valid")),  # unbatched
    ((0, 4, 6, 7), (5, 4, 3, 3), True, {}),  # empty batch
    ((1, 2, 3, 3), (3, 2, 3, 3), True, {}),  # kernel == input
]


@pytest.mark.parametrize("xs,ws,bias,kw", CONV2D, ids=[str(c[3]) + str(c[1]) for c in CONV2D])
def test_conv2d(xs, ws, bias, kw):
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    check(
        lambda *a: ember.conv2d(*a, **kw), lambda *a: F.conv2d(*a, **kw), shapes, dtypes=ALL_FLOATS
    )


CONV1D = [
    ((2, 4, 9), (6, 2, 3), True, dict(groups=2, padding="same", dilation=2)),
    ((2, 4, 9), (6, 4, 3), True, dict(stride=2, padding=1)),
    ((4, 9), (6, 4, 3), False, {}),
    ((2, 4, 9), (4, 1, 3), True, dict(groups=4, stride=2)),
    ((2, 4, 9), (3, 4, 1), True, {}),
]


@pytest.mark.parametrize("xs,ws,bias,kw", CONV1D, ids=[str(c[3]) + str(c[1]) for c in CONV1D])
def test_conv1d(xs, ws, bias, kw):
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    check(
        lambda *a: ember.conv1d(*a, **kw), lambda *a: F.conv1d(*a, **kw), shapes, dtypes=ALL_FLOATS
    )


CONVT = [
    ((2, 4, 5, 6), (4, 3, 3, 3), True, {}),
    ((2, 4, 5, 6), (4, 3, 3, 2), True, dict(stride=2, padding=1, output_padding=1)),
    (
        (1, 4, 5, 6),
        (4, 2, 3, 3),
        True,
        dict(stride=(2, 3), padding=(1, 0), output_padding=(0, 2), groups=2, dilation=(1, 2)),
    ),
    ((4, 5, 5), (4, 3, 2, 2), False, dict(stride=2)),
    ((1, 4, 3, 3), (4, 1, 3, 3), True, dict(stride=2, groups=4)),
]


@pytest.mark.parametrize("xs,ws,bias,kw", CONVT, ids=[str(c[3]) for c in CONVT])
def test_conv_transpose2d(xs, ws, bias, kw):
    shapes = [xs, ws] + ([(ws[1] * kw.get("groups", 1),)] if bias else [])
    f, tf = (lambda *a: ember.conv_transpose2d(*a, **kw)), (lambda *a: F.conv_transpose2d(*a, **kw))
    check(f, tf, shapes, dtypes=ALL_FLOATS)


def test_conv_transpose1d():
    kw = dict(stride=2, padding=1, output_padding=1, dilation=2)
    f, tf = (lambda *a: ember.conv_transpose1d(*a, **kw)), (lambda *a: F.conv_transpose1d(*a, **kw))
    check(f, tf, [(2, 4, 7), (4, 3, 3), (3,)])


def test_conv_grad_fd():
    gradcheck(lambda *a: ember.conv2d(*a, stride=2, padding=1), [(1, 2, 5, 5), (3, 2, 3, 3), (3,)])
    gradcheck(lambda *a: ember.conv2d(*a, padding=1, groups=2), [(1, 2, 5, 5), (4, 1, 3, 3), (4,)])
    gradcheck(lambda *a: ember.conv2d(*a, padding="same", dilation=2), [(1, 2, 5, 4), (2, 2, 2, 3)])
    gradcheck(lambda *a: ember.conv1d(*a, stride=2), [(2, 2, 7), (3, 2, 1), (3,)])
    gradcheck(
        lambda *a: ember.conv_transpose2d(*a, stride=2, padding=1, output_padding=1),
        [(1, 2, 3, 3), (2, 2, 3, 3), (2,)],
    )


def test_conv_int64_forward():
    check(
        lambda *a: ember.conv2d(*a, padding=1),
        lambda *a: F.conv2d(*a, padding=1),
        [(1, 2, 5, 5), (3, 2, 3, 3)],
        dtypes=(ember.int64,),
        grad=False,
    )


def test_conv_batch_chunks(monkeypatch):
    """Chunking the batch (bounded im2col buffer) gives the same values and gradients."""
    monkeypatch.setattr(conv_mod, "_CHUNK_BYTES", 1)
    monkeypatch.setattr(conv_mod, "_BAND_BYTES", 200)  # forward: bands of a few output rows
    monkeypatch.setattr(conv_mod, "_BAND_ABOVE", 0)
    for kw, ws in (
        (dict(padding=2, dilation=2, groups=2), (6, 2, 3, 3)),
        (dict(stride=(2, 1), padding=(1, 0)), (3, 4, 3, 2)),
    ):
        f, tf = (lambda *a, kw=kw: ember.conv2d(*a, **kw)), (lambda *a, kw=kw: F.conv2d(*a, **kw))
        check(f, tf, [(2, 4, 9, 7), ws, (ws[0],)], contig_variants=False)
    check(
        lambda *a: ember.conv2d(*a, stride=2, padding=1),
        lambda *a: F.conv2d(*a, stride=2, padding=1),
        [(3, 2, 6, 5), (4, 2, 3, 3), (4,)],
        contig_variants=False,
    )
    check(
        lambda *a: ember.conv2d(*a),
        lambda *a: F.conv2d(*a),
        [(3, 4, 5, 5), (2, 4, 1, 1)],
        contig_variants=False,
    )


def test_conv_weight_grad_only():
    x = ember.randn(2, 3, 6, 6)
    w = ember.randn(4, 3, 3, 3, requires_grad=True)
    ember.conv2d(x, w, padding=1).sum().backward()
    tw = torch.from_numpy(w.detach().numpy()).requires_grad_()
    F.conv2d(torch.from_numpy(x.numpy()), tw, padding=1).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_meta():
    x = ember.ones(8, 3, 224, 224, device="meta")
    w = ember.ones(64, 3, 7, 7, device="meta")
    y = ember.conv2d(x, w, stride=2, padding=3)
    assert y.device == "meta" and tuple(y.shape) == (8, 64, 112, 112)
    z = ember.conv_transpose2d(y, ember.ones(64, 3, 4, 4, device="meta"), stride=2, padding=1)
    assert tuple(z.shape) == (8, 3, 224, 224)


def test_conv_errors():
    x = ember.ones(1, 4, 7, 7)
    with pytest.raises(ShapeError, match="channels"):
        ember.conv2d(x, ember.ones(6, 3, 3, 3))
    with pytest.raises(ShapeError, match="kernel"):
        ember.conv2d(x, ember.ones(6, 4, 9, 9))
    with pytest.raises(ShapeError):
        ember.conv2d(ember.ones(4, 7), ember.ones(6, 4, 3, 3))
    with pytest.raises(ShapeError):
        ember.conv2d(x, ember.ones(6, 4, 3, 3), ember.ones(5))
    with pytest.raises(ShapeError):
        ember.conv2d(x, ember.ones(6, 2, 3, 3), groups=3)
    with pytest.raises(ValueError, match="strided"):
        ember.conv2d(x, ember.ones(6, 4, 3, 3), padding="same", stride=2)
    with pytest.raises(DTypeError):
        ember.conv2d(x, ember.ones(6, 4, 3, 3, dtype=ember.float64))
    with pytest.raises(ShapeError, match="output padding"):
        ember.conv_transpose2d(x, ember.ones(4, 3, 3, 3), stride=2, output_padding=2)


DEPTHWISE = [
    ((2, 3, 9, 8), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), None),
    ((1, 4, 9, 8), (8, 1, 3, 2), (2, 3), (2, 1), (2, 0), None),
    ((1, 2, 6, 7), (2, 1, 5, 5), (1, 1), (1, 2), (3, 3), (6, 7)),
    ((1, 2, 4, 4), (2, 1, 2, 2), (3, 3), (1, 1), (0, 0), None),
]


@pytest.mark.parametrize("xs,ws,s,d,p,out", DEPTHWISE, ids=str)
def test_depthwise_kernels_match_references(xs, ws, s, d, p, out):
    from ember.kernels.cpu import conv as dw

    rng = np.random.default_rng(0)
    k = ws[2:]
    out = out or tuple((xs[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    for dt in (np.float32, np.float64):
        x, w = rng.standard_normal(xs).astype(dt), rng.standard_normal(ws).astype(dt)
        g = rng.standard_normal((xs[0], ws[0], *out)).astype(dt)
        pb = (out[0] - 1) * s[0] + d[0] * (k[0] - 1) + 1 - xs[2] - p[0]
        pr = (out[1] - 1) * s[1] + d[1] * (k[1] - 1) + 1 - xs[3] - p[1]
        geom = Geom(s, d, (p[0], max(pb, 0), p[1], max(pr, 0)), xs[1], 2, True)
        pairs = [
            (dw.depthwise_nchw(x, w, geom=geom), dw.depthwise_conv2d_reference(x, w, s, d, p, out)),
            (
                dw.depthwise_grad_input(g, w, xs, s, d, p),
                dw.depthwise_grad_input_reference(g, w, xs, s, d, p),
            ),
            (
                dw.depthwise_grad_weight(g, x, ws, s, d, p),
                dw.depthwise_grad_weight_reference(g, x, ws, s, d, p),
            ),
        ]
        for got, ref in pairs:
            assert got.shape == ref.shape and got.dtype == ref.dtype
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    # float64 against torch where torch's symmetric padding gives the same output size
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    t = F.conv2d(tx, tw, stride=s, padding=p, dilation=d, groups=xs[1])
    if tuple(t.shape[2:]) == out:
        t.backward(torch.from_numpy(g))
        np.testing.assert_allclose(pairs[0][0], t.detach().numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(pairs[1][0], tx.grad.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(pairs[2][0], tw.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_meta_does_no_compute():
    """Shapes far too large for memory: any real compute on meta would raise MemoryError."""
    x = ember.empty(4096, 256, 512, 512, device="meta")
    y = ember.conv2d(
        x, ember.empty(512, 256, 3, 3, device="meta"), ember.empty(512, device="meta"), padding=1
    )
    assert tuple(y.shape) == (4096, 512, 512, 512)
    y = ember.conv2d(x, ember.empty(256, 1, 3, 3, device="meta"), stride=2, padding=1, groups=256)
    assert tuple(y.shape) == (4096, 256, 256, 256)
    y = ember.conv_transpose2d(x, ember.empty(256, 64, 4, 4, device="meta"), stride=2, padding=1)
    assert tuple(y.shape) == (4096, 64, 1024, 1024) and y.device == "meta"
    y = ember.conv1d(x[0], ember.empty(8, 512, 5, device="meta"), padding="same")
    assert tuple(y.shape) == (256, 8, 512)
