import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.errors import ShapeError, UnsupportedError
from tests.helpers import check, gradcheck

ALL_FLOATS = (ember.float32, ember.float64, ember.float16, ember.bfloat16)


def both(name, shape, dtypes=ALL_FLOATS, **kw):
    check(
        lambda x: getattr(ember, name)(x, **kw),
        lambda x: getattr(F, name)(x, **kw),
        [shape],
        dtypes=dtypes,
    )


POOLS = [
    ("max_pool2d", (2, 3, 7, 6), dict(kernel_size=3)),
    ("max_pool2d", (2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    (
        "max_pool2d",
        (2, 3, 7, 6),
        dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), dilation=(2, 1), ceil_mode=True),
    ),
    ("max_pool2d", (3, 7, 6), dict(kernel_size=2, ceil_mode=True)),
    ("max_pool2d", (1, 2, 5, 5), dict(kernel_size=3, stride=3, ceil_mode=True)),
    ("max_pool1d", (2, 3, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("max_pool1d", (3, 9), dict(kernel_size=2, dilation=3)),
    ("avg_pool2d", (2, 3, 7, 6), dict(kernel_size=3)),
    ("avg_pool2d", (2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1)),
    (
        "avg_pool2d",
        (2, 3, 7, 6),
        dict(kernel_size=3, stride=2, padding=1, count_include_pad=False, ceil_mode=True),
    ),
    (
        "avg_pool2d",
        (2, 3, 8, 6),
        dict(kernel_size=(3, 2), stride=(3, 2), padding=(1, 1), ceil_mode=True),
    ),
    ("avg_pool2d", (2, 3, 7, 6), dict(kernel_size=3, stride=2, padding=1, divisor_override=5)),
    (
        "avg_pool1d",
        (2, 3, 9),
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    ),
    ("adaptive_avg_pool2d", (2, 3, 7, 6), dict(output_size=(3, 4))),
    ("adaptive_avg_pool2d", (2, 3, 7, 6), dict(output_size=1)),
    ("adaptive_avg_pool2d", (2, 3, 6, 8), dict(output_size=(3, 4))),
    ("adaptive_avg_pool2d", (3, 7, 6), dict(output_size=(None, 4))),
    ("adaptive_avg_pool2d", (1, 2, 3, 3), dict(output_size=5)),
    ("adaptive_avg_pool1d", (2, 3, 10), dict(output_size=4)),
    ("adaptive_max_pool2d", (2, 3, 7, 6), dict(output_size=(3, 4))),
    ("adaptive_max_pool2d", (2, 3, 4, 6), dict(output_size=2)),
    ("adaptive_max_pool1d", (2, 3, 10), dict(output_size=4)),
]


@pytest.mark.parametrize("name,shape,kw", POOLS, ids=[f"{p[0]}{p[2]}" for p in POOLS])
def test_pools(name, shape, kw):
    both(name, shape, **kw)


def test_pools_return_indices():
    check(
        lambda x: ember.max_pool2d(x, 3, 2, 1, return_indices=True),
        lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
        [(2, 3, 7, 6)],
    )
    check(
        lambda x: ember.max_pool1d(x, 3, 2, 1, return_indices=True),
        lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True),
        [(2, 3, 7)],
    )
    check(
        lambda x: ember.adaptive_max_pool2d(x, (3, 4), True),
        lambda x: F.adaptive_max_pool2d(x, (3, 4), True),
        [(2, 3, 7, 6)],
    )
    with ember.no_grad():
        v, i = ember.max_pool2d(ember.arange(16.0).reshape(1, 1, 4, 4), 2, return_indices=True)
    assert i.tolist() == [[[[5, 7], [13, 15]]]] and i.dtype is ember.int64


def test_pool_ints_and_nan():
    both("avg_pool2d", (2, 3, 7, 6), dtypes=(ember.int64,), kernel_size=3, stride=2)
    both(
        "max_pool2d",
        (2, 3, 7, 6),
        dtypes=(ember.int64, ember.int32),
        kernel_size=3,
        stride=2,
        padding=1,
    )
    x = np.ones((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    assert np.isnan(ember.max_pool2d(ember.from_numpy(x), 2).numpy()[0, 0, 0, 0])


def test_pool_grad_fd():
    gradcheck(lambda x: ember.max_pool2d(x, 3, 2, 1), [(1, 2, 5, 5)])
    gradcheck(
        lambda x: ember.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        [(1, 2, 5, 5)],
    )
    gradcheck(lambda x: ember.adaptive_avg_pool2d(x, (2, 3)), [(1, 2, 5, 5)])
    gradcheck(lambda x: ember.adaptive_avg_pool2d(x, (2, 3)), [(1, 2, 4, 6)])
    gradcheck(lambda x: ember.adaptive_max_pool2d(x, (2, 3)), [(1, 2, 5, 5)])


def test_pool_errors_and_meta():
    with pytest.raises(ShapeError, match="half"):
        ember.max_pool2d(ember.ones(1, 1, 5, 5), 3, padding=2)
    with pytest.raises(ShapeError):
        ember.max_pool2d(ember.ones(5, 5), 2)
    with pytest.raises(ShapeError):
        ember.avg_pool2d(ember.ones(1, 1, 2, 2), 3)
    m = ember.max_pool2d(ember.ones(2, 3, 112, 112, device="meta"), 3, 2, 1)
    assert m.device == "meta" and tuple(m.shape) == (2, 3, 56, 56)
    v, i = ember.max_pool2d(ember.ones(2, 3, 8, 8, device="meta"), 2, return_indices=True)
    assert tuple(i.shape) == (2, 3, 4, 4) and i.device == "meta"


INTERP = [
    ((2, 3, 4, 6), dict(size=(5, 9))),
    ((2, 3, 4, 6), dict(scale_factor=2)),
    ((2, 3, 4, 6), dict(scale_factor=1.7)),
    ((2, 3, 4, 6), dict(scale_factor=(0.5, 1.3))),
    ((2, 3, 4, 6), dict(size=(5, 9), mode="nearest-exact")),
    ((2, 3, 4, 6), dict(scale_factor=1.7, mode="nearest-exact")),
    ((2, 3, 4, 6), dict(size=(5, 9), mode="bilinear")),
    ((2, 3, 4, 6), dict(size=(5, 9), mode="bilinear", align_corners=True)),
    ((2, 3, 4, 6), dict(scale_factor=1.7, mode="bilinear")),
    ((2, 3, 4, 6), dict(scale_factor=0.6, mode="bilinear", align_corners=True)),
    ((2, 3, 4, 6), dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)),
    ((2, 3, 4, 6), dict(size=(3, 2), mode="bilinear")),
    ((2, 3, 4, 6), dict(size=(1, 1), mode="bilinear", align_corners=True)),
    ((2, 3, 4, 6), dict(size=(3, 2), mode="area")),
    ((2, 3, 5), dict(scale_factor=2.5, mode="linear")),
    ((2, 3, 5), dict(size=7, mode="linear", align_corners=True)),
    ((2, 3, 5), dict(size=7)),
    ((1, 2, 3, 4, 5), dict(size=(4, 3, 7), mode="trilinear")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2)),
]


@pytest.mark.parametrize("shape,kw", INTERP, ids=[str(i[1]) for i in INTERP])
def test_interpolate(shape, kw):
    both("interpolate", shape, **kw)


def test_interpolate_nearest_uint8():
    both("interpolate", (1, 3, 4, 5), dtypes=(ember.uint8,), scale_factor=2)
    both("interpolate", (1, 3, 4, 5), dtypes=(ember.uint8,), size=(3, 7), mode="nearest-exact")


def test_interpolate_grad_fd_and_errors():
    gradcheck(lambda x: ember.interpolate(x, scale_factor=1.5, mode="bilinear"), [(1, 2, 3, 4)])
    gradcheck(lambda x: ember.interpolate(x, size=(5, 3)), [(1, 2, 3, 4)])
    with pytest.raises(ValueError):
        ember.interpolate(ember.ones(1, 1, 4, 4), size=2, scale_factor=2)
    with pytest.raises(ValueError, match="align_corners"):
        ember.interpolate(ember.ones(1, 1, 4, 4), size=2, align_corners=True)
    with pytest.raises(ShapeError):
        ember.interpolate(ember.ones(1, 1, 4), size=2, mode="bilinear")
    with pytest.raises(UnsupportedError):
        ember.interpolate(ember.ones(1, 1, 4, 4), size=2, mode="bicubic")


def test_pixel_shuffle():
    both("pixel_shuffle", (2, 8, 3, 4), upscale_factor=2)
    both("pixel_unshuffle", (2, 2, 6, 4), downscale_factor=2)
    with pytest.raises(ShapeError):
        ember.pixel_shuffle(ember.ones(1, 3, 2, 2), 2)


UNFOLD = [
    dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
    dict(kernel_size=3),
    dict(kernel_size=2, stride=2),
]


@pytest.mark.parametrize("kw", UNFOLD, ids=str)
def test_unfold_fold(kw):
    x = (2, 3, 6, 7)
    blocks = F.unfold(torch.zeros(x), **kw).shape
    fkw = dict(output_size=x[2:], **kw)
    check(lambda a: ember.unfold(a, **kw), lambda a: F.unfold(a, **kw), [x], dtypes=ALL_FLOATS)
    check(
        lambda a: ember.fold(a, **fkw),
        lambda a: F.fold(a, **fkw),
        [tuple(blocks)],
        dtypes=ALL_FLOATS,
    )
    gradcheck(lambda a: ember.fold(a, **fkw), [tuple(blocks)])


def test_unfold_unbatched_and_errors():
    check(lambda a: ember.unfold(a, 2), lambda a: F.unfold(a, 2), [(3, 4, 5)])
    with pytest.raises(ShapeError):
        ember.fold(ember.ones(1, 12, 5), (4, 4), 2)


def test_meta_does_no_compute():
    """Shapes far too large for memory: any real compute on meta would raise MemoryError."""
    x = ember.empty(4096, 256, 512, 512, device="meta")
    cases = [
        (ember.max_pool2d(x, 3, 2, 1), (4096, 256, 256, 256)),
        (ember.max_pool2d(x, 3, 2, 1, return_indices=True)[1], (4096, 256, 256, 256)),
        (ember.avg_pool2d(x, 2, ceil_mode=True), (4096, 256, 256, 256)),
        (ember.adaptive_avg_pool2d(x, (7, 5)), (4096, 256, 7, 5)),
        (ember.adaptive_max_pool2d(x, 3), (4096, 256, 3, 3)),
        (ember.interpolate(x, scale_factor=2, mode="bilinear"), (4096, 256, 1024, 1024)),
        (ember.interpolate(x, size=(3, 4)), (4096, 256, 3, 4)),
        (ember.unfold(x, 3, padding=1), (4096, 256 * 9, 512 * 512)),
        (
            ember.fold(ember.empty(4096, 256 * 4, 256 * 256, device="meta"), 512, 2, stride=2),
            (4096, 256, 512, 512),
        ),
        (ember.max_pool1d(x[0], 4), (256, 512, 128)),
    ]
    for out, shape in cases:
        assert out.device == "meta" and tuple(out.shape) == shape, (out.shape, shape)


def test_identity_resize_returns_a_copy():
    x = ember.randn(1, 2, 4, 4)
    ember.interpolate(x, size=(4, 4)).zero_()
    ember.adaptive_avg_pool2d(x, 4).zero_()
    assert x.abs().sum().item() > 0
