import numpy as np
import pytest
import torch

import ember
from ember.errors import DeviceError, DTypeError


def test_dtype_table_and_conversions():
    x = ember.tensor([1.5, -2.25])
    assert x.dtype is ember.float32
    assert ember.tensor([1, 2]).dtype is ember.int64
    assert ember.tensor([True]).dtype is ember.bool
    for m, dt in [("float", ember.float32), ("double", ember.float64), ("half", ember.float16),
                  ("bfloat16", ember.bfloat16), ("long", ember.int64), ("int", ember.int32),
                  ("short", ember.int16), ("char", ember.int8), ("byte", ember.uint8), ("bool", ember.bool)]:  # fmt: skip
        assert getattr(x, m)().dtype is dt
    assert x.to(ember.float64).dtype is ember.float64
    assert x.to("float16").dtype is ember.float16
    assert x.to(torch.bfloat16).dtype is ember.bfloat16
    assert x.bfloat16().float().tolist() == [1.5, -2.25]
    assert ember.tensor([1.7, -1.7]).long().tolist() == [1, -1]
    with pytest.raises(DTypeError):
        ember.tensor(["a"])
    with pytest.raises(DTypeError):
        ember.zeros(2, dtype="complex128")


@pytest.mark.parametrize("a", list(ember.dtypes.ALL))
@pytest.mark.parametrize("b", list(ember.dtypes.ALL))
def test_promote_types_matches_torch(a, b):
    ta, tb = getattr(torch, a.name), getattr(torch, b.name)
    assert ember.promote_types(a, b).name == str(torch.promote_types(ta, tb)).split(".")[1]


def test_default_dtype():
    ember.set_default_dtype(ember.float64)
    try:
        assert ember.tensor([1.0]).dtype is ember.float64
        assert (ember.tensor([1]) + 0.5).dtype is ember.float64
        assert ember.zeros(2).dtype is ember.float64
    finally:
        ember.set_default_dtype(ember.float32)
    with pytest.raises(DTypeError):
        ember.set_default_dtype(ember.int32)


def test_devices():
    assert ember.device("cpu") == "cpu"
    assert ember.cuda_if_available() == ember.device("cpu")
    assert not ember.cuda.is_available()
    with pytest.raises(DeviceError, match="no CUDA backend"):
        ember.zeros(2, device="cuda")
    with pytest.raises(DeviceError, match="no CUDA backend"):
        ember.ones(2).cuda()
    with pytest.raises(DeviceError):
        ember.device("tpu")
    m = ember.zeros(2, 3, device="meta")
    with pytest.raises(DeviceError):
        ember.ones(2, 3) + m
    with pytest.raises(DeviceError):
        m.numpy()
    with pytest.raises(DeviceError):
        m.item()


def test_meta_device_holds_no_memory():
    m = ember.empty(100_000, 100_000, device="meta", dtype=ember.bfloat16)
    assert m.shape == (100_000, 100_000) and m.dtype is ember.bfloat16 and m.is_meta
    assert m._data.strides == (0, 0)
    y = (m * 2 + 1).exp()
    assert y.shape == m.shape and y.device == "meta" and y._data.strides == (0, 0)
    small = ember.ones(2, 2, device="meta")
    assert small.to("cpu").device == "cpu" and small.to("cpu").tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_creation_ops_match_torch():
    pairs = [
        (ember.arange(5), torch.arange(5)),
        (ember.arange(1, 4, 0.5), torch.arange(1, 4, 0.5)),
        (ember.arange(10, 0, -3), torch.arange(10, 0, -3)),
        (ember.linspace(0, 1, 7), torch.linspace(0, 1, 7)),
        (ember.eye(3, 4), torch.eye(3, 4)),
        (ember.full((2, 3), 7), torch.full((2, 3), 7)),
        (ember.full((2,), 1.5), torch.full((2,), 1.5)),
        (ember.zeros(2, 3, dtype=ember.int32), torch.zeros(2, 3, dtype=torch.int32)),
        (ember.ones((4,)), torch.ones((4,))),
        (
            ember.zeros_like(ember.ones(2, dtype=ember.float16)),
            torch.zeros_like(torch.ones(2, dtype=torch.float16)),
        ),
        (ember.full_like(ember.ones(2), 3), torch.full_like(torch.ones(2), 3)),
        (ember.tensor(3.5), torch.tensor(3.5)),
        (
            ember.tensor([[1, 2], [3, 4]], dtype=ember.float64),
            torch.tensor([[1, 2], [3, 4]], dtype=torch.float64),
        ),
    ]
    for e, t in pairs:
        assert tuple(e.shape) == tuple(t.shape)
        assert e.dtype.name == str(t.dtype).split(".")[1]
        np.testing.assert_allclose(e.numpy(), t.numpy(), rtol=1e-6)


def test_from_numpy_and_numpy_are_zero_copy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = ember.from_numpy(a)
    a[0, 0] = 42
    assert t[0, 0].item() == 42
    t.numpy()[1, 2] = -1
    assert a[1, 2] == -1
    assert np.asarray(t) is a or np.shares_memory(np.asarray(t), a)
    assert ember.tensor(a)._data is not a  # tensor() copies
    d = np.from_dlpack(t)
    assert np.shares_memory(d, a)


def test_properties():
    x = ember.zeros(2, 3, 4)
    assert x.shape == (2, 3, 4) and x.size() == (2, 3, 4) and x.size(-1) == 4
    assert x.ndim == 3 and x.dim() == 3 and x.numel() == 24
    assert x.stride() == (12, 4, 1) and x.is_contiguous()
    y = x.transpose(0, 2)
    assert y.stride() == (1, 4, 12) and not y.is_contiguous()
    assert x.T.shape == (4, 3, 2) and x.mT.shape == (2, 4, 3)
    assert ember.tensor([[1, 2]]).tolist() == [[1, 2]]
    assert ember.tensor(2.5).item() == 2.5
    assert repr(ember.tensor([1.0, 2.0])) == "tensor([1., 2.])"


def test_random_is_seeded():
    ember.manual_seed(123)
    a = ember.randn(3, 4)
    ember.manual_seed(123)
    b = ember.randn(3, 4)
    assert np.array_equal(a.numpy(), b.numpy())
    g = ember.Generator().manual_seed(5)
    r = ember.rand(1000, generator=g)
    assert 0 <= r.numpy().min() and r.numpy().max() < 1 and abs(r.numpy().mean() - 0.5) < 0.05
    i = ember.randint(3, 7, (1000,))
    assert i.dtype is ember.int64 and i.numpy().min() == 3 and i.numpy().max() == 6
    assert sorted(ember.randperm(10).tolist()) == list(range(10))
    x = ember.empty(10000)
    x.normal_(2.0, 0.5)
    assert abs(x.numpy().mean() - 2.0) < 0.05 and abs(x.numpy().std() - 0.5) < 0.05
    x.uniform_(-1, 1)
    assert x.numpy().min() >= -1 and x.numpy().max() < 1
