"""ember.save_file / load_file: round trips, interop with the safetensors package and torch."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import ember
from ember import serialization as ser


def _tensors(rng):
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f64": rng.standard_normal((2,)),
        "f16": rng.standard_normal((4, 1, 2)).astype(np.float16),
        "bf16": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
        "i64": rng.integers(-9, 9, (2, 3)),
        "i32": rng.integers(-9, 9, (5,)).astype(np.int32),
        "u8": rng.integers(0, 255, (6,)).astype(np.uint8),
        "bool": rng.random((3,)) < 0.5,
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "a.b.c": rng.standard_normal((2, 2)).astype(np.float32),
    }


def test_round_trip_and_zero_copy(tmp_path):
    arrays = _tensors(np.random.default_rng(0))
    tensors = {k: ember.Tensor._wrap(v) for k, v in arrays.items()}
    tensors["noncontig"] = ember.tensor(np.arange(12.0).reshape(3, 4)).T
    path = tmp_path / "t.safetensors"
    ember.serialization.save_file(tensors, path, metadata={"format": "pt", "note": "hi"})
    loaded = ser.load_file(path)
    assert set(loaded) == set(tensors)
    for k, t in tensors.items():
        assert loaded[k].dtype == t.dtype, k
        assert loaded[k].shape == t.shape, k
        np.testing.assert_array_equal(np.asarray(loaded[k]), np.asarray(t))
    # memory-mapped: no copy, read-only views
    arr = loaded["f32"].numpy()
    assert not arr.flags.writeable and not arr.flags.owndata
    assert ser.load_metadata(path) == {"format": "pt", "note": "hi"}
    meta = ser.load_file(path, device="meta")
    assert meta["f32"].is_meta and meta["f32"].shape == (3, 5)


def test_files_open_in_safetensors_and_torch(tmp_path):
    arrays = _tensors(np.random.default_rng(1))
    path = tmp_path / "ember.safetensors"
    ser.save_file({k: ember.Tensor._wrap(v) for k, v in arrays.items()}, path)
    np_loaded = safetensors.numpy.load_file(str(path))
    t_loaded = safetensors.torch.load_file(str(path))
    for k, v in arrays.items():
        np.testing.assert_array_equal(np_loaded[k], v)
        t = t_loaded[k]
        got = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        np.testing.assert_array_equal(
            got, v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v
        )


def test_files_from_torch_open_in_ember(tmp_path):
    g = torch.Generator().manual_seed(0)
    src = {
        "w": torch.randn(4, 3, generator=g),
        "h": torch.randn(5, generator=g).half(),
        "b": torch.randn(2, 2, generator=g).bfloat16(),
        "i": torch.arange(6).reshape(2, 3),
        "m": torch.tensor([True, False]),
    }
    path = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(src, str(path), metadata={"format": "pt"})
    loaded = ser.load_file(path)
    for k, t in src.items():
        want = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        got = loaded[k].float().numpy() if k == "b" else loaded[k].numpy()
        np.testing.assert_array_equal(got, want)
        assert str(loaded[k].dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
    assert ser.load_metadata(path) == {"format": "pt"}


def test_module_state_dict_round_trip(tmp_path):
    from ember import nn

    ember.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    path = tmp_path / "model.safetensors"
    ember.serialization.save_file(model.state_dict(), path)
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    other.load_state_dict(ser.load_file(path))
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    # the copied parameters are ordinary writable arrays, trainable as before
    assert all(p._data.flags.writeable for p in other.parameters())
    ser.save_module(model, tmp_path / "m2.safetensors", metadata={"arch": "mlp"})
    third = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    ser.load_module(third, tmp_path / "m2.safetensors")
    np.testing.assert_array_equal(
        third[0].weight.detach().numpy(), model[0].weight.detach().numpy()
    )
    # the same file loads into torch with the same keys
    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    tm.load_state_dict(safetensors.torch.load_file(str(path)))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(
        model(ember.tensor(x)).detach().numpy(), tm(torch.tensor(x)).detach().numpy(), atol=1e-6
    )


def test_errors(tmp_path):
    with pytest.raises(TypeError):
        ser.save_file([ember.zeros(2)], tmp_path / "x.safetensors")
    with pytest.raises(TypeError):
        ser.save_file({"a": 1.0}, tmp_path / "x.safetensors")
    with pytest.raises(ember.errors.DeviceError):
        ser.save_file({"a": ember.zeros(2, device="meta")}, tmp_path / "x.safetensors")
    with pytest.raises((FileNotFoundError, OSError)):
        ser.load_file(tmp_path / "missing.safetensors")
