"""PyTorch habits: ember.save/load, ember.utils.data, dir(ember), meta backward, torch's index
and size checks, impossible allocations, and zero-copy exchange (numpy, DLPack, Arrow, Polars)."""

from __future__ import annotations

import io
import math

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch

import ember
import ember.nn.functional as F
from ember.errors import AutogradError, DeviceError, DTypeError, EmberError, UnsupportedError
from ember.memory import AllocationError

# ----------------------------------------------------------------------------- save / load


def test_save_load_state_dict_is_a_plain_safetensors_file(tmp_path):
    lin = ember.nn.Linear(3, 2)
    sd = lin.state_dict()
    path = tmp_path / "sd.safetensors"
    ember.save(sd, path)
    back = ember.load(path)
    assert isinstance(back, dict) and set(back) == set(sd)
    for k in sd:
        assert isinstance(back[k], ember.Tensor)
        np.testing.assert_array_equal(back[k].numpy(), sd[k].detach().numpy())
    plain = safetensors.numpy.load_file(str(path))  # the official reader opens it as is
    np.testing.assert_array_equal(plain["weight"], sd["weight"].detach().numpy())
    other = ember.nn.Linear(3, 2)
    other.load_state_dict(back)
    np.testing.assert_array_equal(other.weight.detach().numpy(), lin.weight.detach().numpy())


def test_save_load_a_tensor_keeps_dtype_and_shape(tmp_path):
    for t in (
        ember.arange(6.0).reshape(2, 3).T,  # non-contiguous
        ember.tensor(3, dtype=ember.int64),  # 0-d
        ember.tensor(np.arange(4.0).astype(ml_dtypes.bfloat16)),
        ember.zeros(0, 4),
    ):
        path = tmp_path / "t.safetensors"
        ember.save(t, path)
        back = ember.load(path)
        assert isinstance(back, ember.Tensor)
        assert back.dtype is t.dtype and back.shape == t.shape
        np.testing.assert_array_equal(back.numpy().astype(np.float64), t.numpy().astype(np.float64))


def test_save_load_nested_checkpoint_to_a_file_object():
    model = ember.nn.Linear(2, 2)
    opt = ember.optim.Adam(model.parameters(), lr=0.1)
    model(ember.randn(3, 2)).sum().backward()
    opt.step()
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "epoch": 3,
        "loss": 0.25,
        "best": float("inf"),
        "tags": ("a", None, True),
        "history": [1.0, 2.0],
    }
    buf = io.BytesIO()
    ember.save(ckpt, buf)
    buf.seek(0)
    back = ember.load(buf)
    assert back["epoch"] == 3 and back["loss"] == 0.25 and math.isinf(back["best"])
    assert back["tags"] == ("a", None, True) and back["history"] == [1.0, 2.0]
    assert back["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    state = opt.state_dict()["state"]
    assert set(back["optimizer"]["state"]) == set(state)  # int keys stay ints
    for i, s in state.items():
        for name, v in s.items():
            got = back["optimizer"]["state"][i][name]
            if isinstance(v, ember.Tensor):
                np.testing.assert_array_equal(got.numpy(), v.numpy())
            else:
                assert got == v
    model2 = ember.nn.Linear(2, 2)
    model2.load_state_dict(back["model"])
    opt2 = ember.optim.Adam(model2.parameters(), lr=0.1)
    opt2.load_state_dict(back["optimizer"])


def test_load_gives_writable_tensors_and_mmap_gives_read_only_views(tmp_path):
    path = tmp_path / "w.safetensors"
    ember.save({"w": ember.ones(3)}, path)
    w = ember.load(path)["w"]
    w.add_(1)  # torch.load's tensors are writable
    np.testing.assert_array_equal(w.numpy(), [2.0, 2.0, 2.0])
    mapped = ember.load(path, mmap=True)["w"]
    assert not mapped.numpy().flags.writeable
    meta = ember.load(path, map_location="meta")["w"]
    assert meta.device.type == "meta" and meta.shape == (3,)


@pytest.mark.parametrize("zipfile", [True, False])
def test_load_reads_torch_save_files_without_torch(tmp_path, zipfile):
    path = tmp_path / "t.pt"
    lin = torch.nn.Linear(3, 2)
    obj = {"model": lin.state_dict(), "step": 7, "x": torch.arange(5, dtype=torch.int32)}
    torch.save(obj, path, _use_new_zipfile_serialization=zipfile)
    back = ember.load(path, weights_only=True)
    assert back["step"] == 7
    np.testing.assert_array_equal(back["x"].numpy(), obj["x"].numpy())
    assert back["x"].dtype is ember.int32
    for k, v in lin.state_dict().items():
        np.testing.assert_array_equal(back["model"][k].numpy(), v.numpy())
    single = tmp_path / "one.pt"
    torch.save(torch.eye(2), single)
    np.testing.assert_array_equal(ember.load(single).numpy(), np.eye(2, dtype=np.float32))


def test_load_reads_files_written_by_torch_safetensors(tmp_path):
    import safetensors.torch

    path = tmp_path / "t.safetensors"
    t = {"a": torch.randn(2, 3), "b": torch.arange(4)}
    safetensors.torch.save_file(t, str(path))
    back = ember.load(path)
    for k, v in t.items():
        np.testing.assert_array_equal(back[k].numpy(), v.numpy())


def test_save_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(UnsupportedError, match="object"):
        ember.save({"a": object()}, tmp_path / "x")
    with pytest.raises(UnsupportedError, match="dict key"):
        ember.save({(1, 2): ember.ones(1)}, tmp_path / "x")
    with pytest.raises(DeviceError, match="meta"):
        ember.save({"m": ember.ones(2, device="meta")}, tmp_path / "x")
    with pytest.raises(UnsupportedError, match="map_location"):
        ember.load(tmp_path / "x", map_location={"cuda:0": "cpu"})


def test_save_file_and_load_file_callers_still_work(tmp_path):
    path = tmp_path / "f.safetensors"
    ember.save_file({"a": ember.ones(2)}, path, metadata={"format": "pt"})
    assert ember.serialization.load_metadata(path) == {"format": "pt"}
    np.testing.assert_array_equal(ember.load_file(path)["a"].numpy(), [1.0, 1.0])
    ember.serialization.save({"a": ember.zeros(2)}, path, {"k": "v"})  # the old alias's form
    assert ember.serialization.load_metadata(path) == {"k": "v"}


# ----------------------------------------------------------------------------- names


def test_utils_data_is_ember_data():
    import ember.utils.data
    from ember.utils.data import DataLoader, Dataset, TensorDataset
    from ember.utils.data.dataloader import default_collate

    assert ember.utils.data is ember.data
    assert DataLoader is ember.data.DataLoader and Dataset is ember.data.Dataset
    assert default_collate is ember.data.default_collate
    ds = TensorDataset(ember.arange(4.0))
    assert [b[0].tolist() for b in DataLoader(ds, batch_size=2)] == [[0.0, 1.0], [2.0, 3.0]]


def test_dir_lists_the_lazy_names_and_each_resolves():
    names = dir(ember)
    for lazy in ("nn", "optim", "data", "utils", "io", "models", "save", "load", "save_file"):
        assert lazy in names
    for name in names:
        getattr(ember, name)  # nothing listed is missing
    assert ember.load is ember.serialization.load and ember.save is ember.serialization.save


def test_backward_on_meta_raises_unsupported():
    x = ember.ones(3, device="meta", requires_grad=True)
    with pytest.raises(UnsupportedError, match="meta"):
        (x * 2).sum().backward()


# ----------------------------------------------------------------------------- index ops

_X = np.arange(20.0).reshape(4, 5)
_N = 4  # the size of dim 0


def _index_cases():
    """(name, torch fn, ember fn) taking one index value v along dim 0 (size 4)."""
    src = np.ones((1, 5))
    return [
        ("gather", lambda m, x, v: m.gather(x, 0, m.tensor([[v] * 5]))),
        ("index_select", lambda m, x, v: m.index_select(x, 0, m.tensor([v, 0]))),
        ("index_copy", lambda m, x, v: x.index_copy(0, m.tensor([v]), m.tensor(src))),
        ("index_add", lambda m, x, v: x.index_add(0, m.tensor([v]), m.tensor(src))),
        ("index_fill", lambda m, x, v: x.index_fill(0, m.tensor([v]), -1.0)),
        ("scatter", lambda m, x, v: x.scatter(0, m.tensor([[v] * 5]), m.tensor(src))),
        ("scatter_add", lambda m, x, v: x.scatter_add(0, m.tensor([[v] * 5]), m.tensor(src))),
        (
            "scatter_reduce",
            lambda m, x, v: x.scatter_reduce(0, m.tensor([[v] * 5]), m.tensor(src), "amax"),
        ),
        ("take", lambda m, x, v: m.take(x, m.tensor([v * 5, 3]))),
        ("put", lambda m, x, v: x.put(m.tensor([v * 5]), m.tensor([9.0], dtype=m.float64))),
    ]


@pytest.mark.parametrize("v", [-1, -2, -_N, -_N - 1, _N, 0, _N - 1])
@pytest.mark.parametrize("case", _index_cases(), ids=lambda c: c[0])
def test_index_ops_treat_negative_indices_as_torch_does(case, v):
    _, fn = case
    tx, ex = torch.tensor(_X), ember.tensor(_X)
    try:
        want = fn(torch, tx, v).numpy()
    except (IndexError, RuntimeError) as e:
        with pytest.raises(IndexError) as info:  # torch raised: ember raises its own error
            fn(ember, ex, v)
        assert isinstance(info.value, EmberError), (type(info.value), e)
        assert str(v) in str(info.value) or str(v * 5) in str(info.value)
        return
    np.testing.assert_array_equal(fn(ember, ex, v).numpy(), want)


def test_take_along_dim_wraps_negatives_and_checks_the_range():
    x = np.arange(12.0).reshape(3, 4)
    idx = np.array([[-1, 0], [-4, 3], [2, -2]])
    want = torch.take_along_dim(torch.tensor(x), torch.tensor(idx), 1).numpy()
    got = ember.take_along_dim(ember.tensor(x), ember.tensor(idx), 1).numpy()
    np.testing.assert_array_equal(got, want)
    # torch reads index 4 and -5 modulo the size without a check; ember refuses them
    for bad in (4, -5):
        with pytest.raises(IndexError, match=str(bad)) as info:
            ember.take_along_dim(ember.tensor(x), ember.tensor([[bad]]), 1)
        assert isinstance(info.value, EmberError)


def test_gather_backward_still_works_after_the_check():
    x = ember.tensor(_X, requires_grad=True)
    tx = torch.tensor(_X, requires_grad=True)
    idx = [[3, 0, 1, 2, 0], [0, 0, 0, 0, 3]]
    ember.gather(x, 0, ember.tensor(idx)).sum().backward()
    torch.gather(tx, 0, torch.tensor(idx)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


# ----------------------------------------------------------------------------- sizes, BCE


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.empty(2.9),
        lambda m: m.empty((2.9, 3)),
        lambda m: m.zeros(2, 2.0),
        lambda m: m.ones([3.5]),
        lambda m: m.full((2.5,), 1.0),
        lambda m: m.rand(2.5),
        lambda m: m.randn(1, 2.5),
        lambda m: m.randint(0, 3, (2.5,)),
        lambda m: m.randperm(2.5),
    ],
)
def test_float_sizes_raise_type_errors_as_in_torch(call):
    with pytest.raises(TypeError):
        call(torch)
    with pytest.raises(TypeError) as info:
        call(ember)
    assert isinstance(info.value, EmberError) and "int" in str(info.value)


def test_integer_like_sizes_still_work():
    assert ember.zeros(np.int64(2), ember.tensor(3)).shape == (2, 3)
    assert ember.empty(ember.Size([2, 1])).shape == (2, 1)
    assert ember.full(2, 1.0).shape == (2,)
    assert sorted(ember.randperm(np.int32(5)).tolist()) == [0, 1, 2, 3, 4]


def test_randperm_negative_raises_and_zero_is_empty():
    with pytest.raises(RuntimeError):
        torch.randperm(-1)
    with pytest.raises(EmberError, match="-1"):
        ember.randperm(-1)
    assert ember.randperm(0).shape == (0,) and ember.randperm(0).dtype is ember.int64


@pytest.mark.parametrize(
    "inp,target",
    [([0.5, 0.2], [1.5, 0.0]), ([0.5], [-0.5]), ([0.5], [math.nan]), ([1.5], [0.5])],
)
def test_bce_values_outside_0_1_raise_as_in_torch(inp, target):
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        torch.nn.functional.binary_cross_entropy(torch.tensor(inp), torch.tensor(target))
    with pytest.raises(ValueError, match="between 0 and 1") as info:
        F.binary_cross_entropy(ember.tensor(inp), ember.tensor(target))
    assert isinstance(info.value, EmberError)
    with pytest.raises(EmberError):
        ember.nn.BCELoss()(ember.tensor(inp), ember.tensor(target))


def test_bce_on_valid_values_matches_torch():
    rng = np.random.default_rng(0)
    p = rng.random((3, 4)).astype(np.float32)
    p[0, 0], p[0, 1] = 0.0, 1.0  # the edges are valid (logs clamped at -100)
    t = rng.random((3, 4)).astype(np.float32)
    t[1, :2] = [0.0, 1.0]
    want = torch.nn.functional.binary_cross_entropy(torch.tensor(p), torch.tensor(t))
    got = F.binary_cross_entropy(ember.tensor(p), ember.tensor(t))
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
    meta = F.binary_cross_entropy(ember.ones(3, device="meta"), ember.ones(3, device="meta"))
    assert meta.device.type == "meta"


@pytest.mark.parametrize(
    "call,shape",
    [
        (lambda: ember.empty(2**40, 2**40), "[1099511627776, 1099511627776]"),
        (lambda: ember.zeros(2**31, 2**20), "[2147483648, 1048576]"),  # 8 PiB: malloc fails
        (lambda: ember.full((2**31, 2**20), 3.0), "[2147483648, 1048576]"),
        (lambda: ember.randn(2**40, 2**40), "[1099511627776, 1099511627776]"),
        (lambda: ember.empty(2**40, 2**40, device="meta"), "[1099511627776, 1099511627776]"),
    ],
)
def test_impossible_allocations_name_the_size(call, shape):
    with pytest.raises(AllocationError) as info:
        call()
    assert isinstance(info.value, EmberError) and isinstance(info.value, MemoryError)
    assert shape in str(info.value) and "bytes" in str(info.value)


# ----------------------------------------------------------------------------- zero-copy


def test_from_numpy_shares_memory_both_ways():
    a = np.arange(6.0).reshape(2, 3)
    t = ember.from_numpy(a)
    t[0, 0] = 42.0
    assert a[0, 0] == 42.0
    a[1, 2] = -1.0
    assert t[1, 2].item() == -1.0
    with pytest.raises(DTypeError):
        ember.from_numpy([1, 2])


def test_dlpack_with_torch_and_numpy_shares_memory():
    t = ember.arange(4.0)
    tt = torch.from_dlpack(t)
    tt[0] = 7.0
    assert t[0].item() == 7.0
    n = np.from_dlpack(t)
    assert np.shares_memory(n, t.numpy())
    assert t.__dlpack_device__() == (1, 0)
    src = torch.arange(5, dtype=torch.int64)
    e = ember.from_dlpack(src)
    e[1] = 99
    assert src[1].item() == 99 and e.dtype is ember.int64
    assert ember.from_dlpack(t) is t
    assert np.shares_memory(ember.from_dlpack(n).numpy(), n)


def test_dlpack_refusals():
    with pytest.raises(AutogradError, match="detach"):
        ember.ones(2, requires_grad=True).__dlpack__()
    with pytest.raises(DeviceError):
        ember.ones(2, device="meta").__dlpack__()
    with pytest.raises(BufferError, match="bfloat16"):
        ember.ones(2, dtype=ember.bfloat16).__dlpack__()
    with pytest.raises(DTypeError, match="__dlpack__"):
        ember.from_dlpack([1.0, 2.0])
    with pytest.raises(DTypeError, match="uint32"):
        ember.from_dlpack(np.arange(3, dtype=np.uint32))


def test_arrow_arrays_become_tensors_without_a_copy():
    pa = pytest.importorskip("pyarrow")
    arr = pa.array(np.arange(5, dtype=np.float32))
    t = ember.from_dlpack(arr)
    assert t.dtype is ember.float32 and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert t.numpy().ctypes.data == arr.buffers()[1].address  # the Arrow buffer itself
    assert np.shares_memory(t.numpy(), np.from_dlpack(arr))
    ints = pa.array([3, 1, 2], type=pa.int64())
    assert ember.from_dlpack(ints).numpy().ctypes.data == ints.buffers()[1].address
    with pytest.raises(DTypeError, match="null"):
        ember.from_dlpack(pa.array([1.0, None]))
    table = pa.table({"x": np.arange(4.0)})
    col = table["x"]  # a ChunkedArray of one chunk
    t = ember.from_dlpack(col)
    assert t.numpy().ctypes.data == col.chunks[0].buffers()[1].address
    with pytest.raises(DTypeError, match="combine_chunks"):
        ember.from_dlpack(pa.chunked_array([[1.0], [2.0]]))


def test_polars_columns_become_tensors_without_a_copy():
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"x": [1.0, 2.0, 3.0], "n": [4, 5, 6]})
    for name, dtype in (("x", ember.float64), ("n", ember.int64)):
        col = df[name]
        address = col.to_arrow().buffers()[1].address
        via_arrow = ember.from_dlpack(col.to_arrow())
        via_numpy = ember.from_numpy(col.to_numpy())
        for t in (via_arrow, via_numpy):
            assert t.dtype is dtype and t.tolist() == col.to_list()
            assert t.numpy().ctypes.data == address  # polars' own buffer
    with pytest.raises(DTypeError, match="to_arrow"):
        ember.from_dlpack(df["x"])


@pytest.mark.parametrize(
    "tree", ['{"__tensor__": ["x"]}', '{"__items__": [1]}', "[" * 5000 + "]" * 5000]
)
def test_load_refuses_a_malformed_saved_structure(tmp_path, tree):
    import ember
    from ember.errors import FormatError
    from ember.io import save_safetensors

    path = tmp_path / "bad.safetensors"
    save_safetensors({"x": np.zeros(2, np.float32)}, path,
                     metadata={"ember.save": "tree", "ember.save.tree": tree})  # fmt: skip
    with pytest.raises(FormatError):
        ember.load(path)
