"""safetensors reader/writer against the safetensors package and torch."""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from ember.errors import DTypeError, FormatError
from ember.io import (
    load_safetensors,
    load_safetensors_dir,
    open_safetensors,
    open_safetensors_index,
    save_safetensors,
)

RNG = np.random.default_rng(0)
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 3), (2, 3, 4, 5)]
NP_DTYPES = [
    np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64,
    np.float16, ml_dtypes.bfloat16, np.float32, np.float64, ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
]  # fmt: skip
TORCH_OF = {
    np.bool_: torch.bool, np.uint8: torch.uint8, np.int8: torch.int8, np.uint16: torch.uint16,
    np.int16: torch.int16, np.uint32: torch.uint32, np.int32: torch.int32,
    np.uint64: torch.uint64, np.int64: torch.int64, np.float16: torch.float16,
    ml_dtypes.bfloat16: torch.bfloat16, np.float32: torch.float32, np.float64: torch.float64,
    ml_dtypes.float8_e4m3fn: torch.float8_e4m3fn, ml_dtypes.float8_e5m2: torch.float8_e5m2,
}  # fmt: skip


def rand(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Random values of any dtype, including the ml_dtypes ones."""
    if dtype is np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return (RNG.standard_normal(shape) * 3).astype(dtype)


def bits(a: np.ndarray) -> np.ndarray:
    """Compare arrays bit for bit (NaNs and -0.0 included)."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype != np.bool_ else a


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """torch -> numpy for every dtype, via the raw bits where numpy lacks the type."""
    dt = next(k for k, v in TORCH_OF.items() if v == t.dtype)
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        raw = t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int16)
        return raw.numpy().view(dt)
    return t.numpy()


def all_dtypes_dict() -> dict[str, np.ndarray]:
    """One tensor per (dtype, shape) pair, plus a non-contiguous one."""
    out = {
        f"{np.dtype(dt).name}.{i}": rand(s, dt) for dt in NP_DTYPES for i, s in enumerate(SHAPES)
    }
    out["transposed"] = rand((4, 6), np.float32).T
    return out


def test_roundtrip_every_dtype(tmp_path):
    tensors = all_dtypes_dict()
    path = tmp_path / "m.safetensors"
    save_safetensors(tensors, path, metadata={"format": "pt", "note": "é"})
    f = open_safetensors(path)
    assert f.metadata == {"format": "pt", "note": "é"}
    assert set(f.keys()) == set(tensors)
    for name, want in tensors.items():
        got = f.get(name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(bits(got), bits(want)), name
        info = f.tensors[name]
        assert info.nbytes == want.nbytes and info.np_dtype == want.dtype
        # every tensor starts at a multiple of its item size
        assert info.start % want.dtype.itemsize == 0


def test_views_are_zero_copy_and_read_only(tmp_path):
    path = tmp_path / "m.safetensors"
    save_safetensors({"a": np.arange(10, dtype=np.float32)}, path)
    a = load_safetensors(path)["a"]
    assert not a.flags.writeable and not a.flags.owndata
    with pytest.raises(ValueError):
        a[0] = 1.0


def test_files_we_write_open_in_safetensors_and_torch(tmp_path):
    tensors = all_dtypes_dict()
    path = tmp_path / "m.safetensors"
    save_safetensors(tensors, path, metadata={"k": "v"})
    ref = safetensors.torch.load_file(path)
    assert set(ref) == set(tensors)
    for name, want in tensors.items():
        assert np.array_equal(bits(to_numpy(ref[name])), bits(want)), name
    ml = {np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn),
          np.dtype(ml_dtypes.float8_e5m2)}  # fmt: skip
    native = {k: v for k, v in tensors.items() if v.dtype not in ml}
    save_safetensors(native, tmp_path / "native.safetensors")
    ref_np = safetensors.numpy.load_file(tmp_path / "native.safetensors")
    assert set(ref_np) == set(native)
    for name, want in native.items():
        assert np.array_equal(bits(ref_np[name]), bits(want)), name
    with safetensors.safe_open(path, "np") as g:
        assert g.metadata() == {"k": "v"}


def test_we_read_files_from_safetensors_and_torch(tmp_path):
    src = {
        f"{np.dtype(dt).name}.{i}": torch.from_numpy(bits(rand(s, dt)).copy()).view(TORCH_OF[dt])
        if dt in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
        else torch.from_numpy(np.ascontiguousarray(rand(s, dt)))
        for dt in NP_DTYPES
        for i, s in enumerate(SHAPES)
        if s != ()  # torch.view of a 0-d tensor to another size is not allowed
    }
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(src, path, metadata={"format": "pt"})
    got = load_safetensors(path)
    assert set(got) == set(src)
    for name, t in src.items():
        assert got[name].shape == tuple(t.shape)
        assert np.array_equal(bits(got[name]), bits(to_numpy(t))), name
    # torch.save-free path used by transformers: save_file of a state dict of a real module
    lin = torch.nn.Linear(3, 5)
    safetensors.torch.save_file(lin.state_dict(), tmp_path / "lin.safetensors")
    got = load_safetensors(tmp_path / "lin.safetensors")
    assert np.array_equal(got["weight"], lin.weight.detach().numpy())


def test_real_model_matches_reference(minilm_safetensors):
    ref = safetensors.numpy.load_file(minilm_safetensors)
    f = open_safetensors(minilm_safetensors)
    assert f.metadata == {"format": "pt"}
    assert list(f.keys()) == list(safetensors.safe_open(minilm_safetensors, "np").keys()) or set(
        f.keys()
    ) == set(ref)
    for name, want in ref.items():
        assert np.array_equal(f.get(name), want), name


def test_sharded_index(tmp_path):
    a = {"w1": rand((3, 4), np.float32), "w2": rand((5,), np.int64)}
    b = {"w3": rand((2, 2), ml_dtypes.bfloat16)}
    save_safetensors(a, tmp_path / "model-00001-of-00002.safetensors")
    save_safetensors(b, tmp_path / "model-00002-of-00002.safetensors")
    index = {
        "metadata": {"total_size": 84},
        "weight_map": {
            "w1": "model-00001-of-00002.safetensors",
            "w2": "model-00001-of-00002.safetensors",
            "w3": "model-00002-of-00002.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    for got in (
        load_safetensors(tmp_path),
        load_safetensors_dir(tmp_path),
        load_safetensors(tmp_path / "model.safetensors.index.json"),
    ):
        assert set(got) == {"w1", "w2", "w3"}
        for k, v in {**a, **b}.items():
            assert np.array_equal(bits(got[k]), bits(v))
    s = open_safetensors_index(tmp_path)
    assert s.metadata == {"total_size": 84} and len(s) == 3 and "w3" in s
    assert s.tensors["w3"].dtype == "BF16"


def test_sharded_index_refuses_escaping_and_missing(tmp_path):
    save_safetensors({"w": np.zeros(2, np.float32)}, tmp_path / "a.safetensors")
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"w": "../a.safetensors"}}))
    with pytest.raises(FormatError, match="outside"):
        load_safetensors(idx)
    idx.write_text(json.dumps({"weight_map": {"v": "a.safetensors"}}))
    with pytest.raises(FormatError, match="'v' is mapped to a.safetensors but is not in it"):
        load_safetensors(tmp_path)
    idx.write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        load_safetensors(tmp_path)


def test_dir_with_single_file(tmp_path):
    save_safetensors({"w": np.ones(3, np.float16)}, tmp_path / "model.safetensors")
    assert np.array_equal(load_safetensors(tmp_path)["w"], np.ones(3, np.float16))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FormatError, match="found none"):
        load_safetensors_dir(empty)


def test_writer_refuses_unsupported_and_is_atomic(tmp_path):
    path = tmp_path / "m.safetensors"
    save_safetensors({"old": np.zeros(1, np.float32)}, path)
    with pytest.raises(DTypeError, match="object"):
        save_safetensors({"x": np.array([object()])}, path)
    with pytest.raises(TypeError):
        save_safetensors({"x": np.zeros(1)}, path, metadata={"k": 1})
    # the failed writes left the old file intact and no temporary behind
    assert list(load_safetensors(path)) == ["old"]
    assert os.listdir(tmp_path) == ["m.safetensors"]
    # big-endian input is stored little-endian
    save_safetensors({"be": np.arange(3, dtype=">i4")}, path)
    assert load_safetensors(path)["be"].tolist() == [0, 1, 2]


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def test_open_is_lazy_and_rss_grows_only_with_touched_data(tmp_path):
    chunk = np.arange(1 << 20, dtype=np.float32)  # 4 MiB, reused: the test never holds 200 MB
    path = tmp_path / "big.safetensors"
    save_safetensors({f"t{i:02d}": chunk for i in range(50)}, path)  # 200 MiB file
    del chunk
    assert path.stat().st_size > 200 * 2**20

    rss0, read0 = _rss_kb(), _rchar()
    f = open_safetensors(path)
    views = load_safetensors(path)
    read = _rchar() - read0
    assert read < 64 * 1024, f"opening read {read} bytes; only the header should be read"
    assert _rss_kb() - rss0 < 16 * 1024, "opening a 200 MB file must not make it resident"
    assert len(views) == 50 and len(f) == 50

    rss1 = _rss_kb()
    assert float(views["t07"][-1]) == (1 << 20) - 1  # touches the last page only
    total = float(views["t13"].sum(dtype=np.float64))  # touches all 4 MiB of one tensor
    assert total == (1 << 20) * ((1 << 20) - 1) / 2
    grew = _rss_kb() - rss1
    assert 3 * 1024 <= grew < 24 * 1024, f"touching one 4 MiB tensor grew RSS by {grew} kB"


# ------------------------------------------------------------------------------ hostile files


def write_raw(tmp_path, header: bytes | dict, data: bytes = b"", n: int | None = None):
    """A safetensors file from a raw header (dict -> JSON) and data, with an optional fake N."""
    if isinstance(header, dict):
        header = json.dumps(header).encode()
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if n is None else n) + header + data)
    return path


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize(
    "header,data,n,match",
    [
        (b"", b"", None, "header is not valid JSON"),
        (b"{", b"", None, "not valid JSON: Expecting property name"),
        (b"\xff\xfe{}", b"", None, "not valid UTF-8"),
        (b"[]", b"", None, "must be a JSON object, found list"),
        (b"{}", b"", 1 << 40, "header length is 1099511627776 bytes but only 2 bytes follow"),
        (b'{"a":1,"a":2}', b"", None, "the key 'a' twice"),
        (b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}", b"", None, "JSON"),
        (b'{"a":{"dtype":"F32","shape":[1' + b"0" * 5000 + b'],"data_offsets":[0,4]}}', b"",
         None, "JSON"),
        ({"a": entry(dtype="F17")}, bytes(8), None, "unknown dtype 'F17'"),
        ({"a": entry(dtype=3)}, bytes(8), None, "unknown dtype 3"),
        ({"a": entry(shape=(-2,))}, bytes(8), None, "non-negative integers"),
        ({"a": {**entry(), "shape": [2.0]}}, bytes(8), None, "non-negative integers"),
        ({"a": {**entry(), "shape": [True, 2]}}, bytes(8), None, "non-negative integers"),
        ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), None, r"missing field\(s\)"),
        ({"a": entry(offsets=(0, 16))}, bytes(8), None, r"\[0, 16\] do not fit in the 8-byte"),
        ({"a": entry(offsets=(8, 0))}, bytes(8), None, "do not fit"),
        ({"a": entry(offsets=(0, 4))}, bytes(8), None, "needs 8 bytes, data_offsets"),
        ({"a": entry(shape=(2**30, 2**30), offsets=(0, 8))}, bytes(8), None, "needs"),
        ({"a": entry(shape=(2**40, 2**40), offsets=(0, 8))}, bytes(8), None, "too large"),
        ({"a": entry(shape=(2**62, 2**62, 0), offsets=(0, 0))}, b"", None, "too large"),
        ({"a": entry(shape=[1] * 65, offsets=(0, 4))}, bytes(8), None, "65 dimensions"),
        ({"a": entry(), "b": entry(offsets=(4, 12))}, bytes(12), None, "overlap"),
        ({"__metadata__": {"a": 1}}, b"", None, "__metadata__ must be"),
        ({"a": [1, 2]}, b"", None, "expected an object, found list"),
    ],
)  # fmt: skip
def test_hostile_headers(tmp_path, header, data, n, match):
    path = write_raw(tmp_path, header, data, n)
    with pytest.raises(FormatError, match=match) as e:
        load_safetensors(path)
    assert str(path) in str(e.value)


def test_short_files(tmp_path):
    for raw in (b"", b"\x01\x02"):
        p = tmp_path / "s.safetensors"
        p.write_bytes(raw)
        with pytest.raises(FormatError, match="at least 8 bytes"):
            open_safetensors(p)


def test_huge_header_length_is_refused_before_reading(tmp_path):
    p = tmp_path / "big.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 200_000_000))
        f.truncate(200_000_100)  # sparse file: header length fits in the file but exceeds limit
    with pytest.raises(FormatError, match="exceeds the 100000000-byte limit"):
        open_safetensors(p)


def test_gaps_between_tensors_are_refused_as_the_reference_does(tmp_path):
    # The official reader refuses bytes no tensor covers (tests/io/test_strict.py compares more)
    from safetensors import SafetensorError, safe_open

    path = write_raw(tmp_path, {"a": entry(offsets=(4, 12))}, struct.pack("<3f", 9, 1, 2))
    with pytest.raises(FormatError, match=r"leaves bytes 0..4 unused"):
        load_safetensors(path)
    with pytest.raises(SafetensorError, match="invalid offset"):
        safe_open(path, "np")
