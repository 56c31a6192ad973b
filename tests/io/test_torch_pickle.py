"""PyTorch checkpoints read without torch, compared with torch.load."""

from __future__ import annotations

import collections
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from ember.errors import FormatError
from ember.io import load_torch

from .torch_files import FakeStorage, FakeTensor, dumps, legacy_checkpoint, zip_checkpoint

LOW_PRECISION = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """torch -> numpy bits for any dtype (bf16/fp8 through integer views)."""
    t = t.detach()
    if t.dtype in LOW_PRECISION:
        return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy()
    return t.numpy()


def same(a: np.ndarray, t: torch.Tensor) -> bool:
    """Same shape, dtype size and bits as the torch tensor."""
    want = as_numpy(t)
    got = (
        a.view(want.dtype)
        if a.dtype.itemsize == want.dtype.itemsize and t.dtype in LOW_PRECISION
        else a
    )
    return a.shape == tuple(t.shape) and got.dtype == want.dtype and np.array_equal(got, want)


def assert_tree_equal(ours, ref, path="root"):
    """Walk torch.load's result beside ours: same containers, same tensors, same values."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(ours, np.ndarray), path
        assert same(ours, ref), path
    elif isinstance(ref, dict):
        assert isinstance(ours, dict) and list(ours) == list(ref), path
        for k in ref:
            assert_tree_equal(ours[k], ref[k], f"{path}.{k}")
    elif isinstance(ref, (list, tuple)):
        assert type(ours) is (tuple if isinstance(ref, tuple) else list), path
        assert len(ours) == len(ref), path
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_tree_equal(a, b, f"{path}[{i}]")
    elif isinstance(ref, torch.dtype):
        assert str(ours) == str(ref).removeprefix("torch."), path
    else:
        assert ours == ref, path


def test_real_legacy_checkpoint(efficientnet_pth):
    with open(efficientnet_pth, "rb") as f:
        assert f.read(2) == b"\x80\x02"  # legacy format, not zip
    ref = torch.load(efficientnet_pth, map_location="cpu", weights_only=True)
    ours = load_torch(efficientnet_pth)
    assert len(ours) == len(ref) == 296
    assert_tree_equal(ours, ref)
    w = ours["_conv_stem.weight"]
    assert w.dtype == np.float32 and w.shape == (32, 3, 3, 3) and not w.flags.writeable


def checkpoint_objects():
    """Everything torch.save can put in a weights checkpoint."""
    base = torch.arange(24, dtype=torch.float32)
    mod = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    return {
        "f32": torch.randn(3, 5),
        "f16": torch.randn(7).half(),
        "bf16": torch.randn(2, 3).bfloat16(),
        "f64": torch.randn(2, dtype=torch.float64),
        "i64": torch.arange(-5, 5),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "i16": torch.tensor([-3, 4], dtype=torch.int16),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.randn(3, dtype=torch.complex64),
        "u16": torch.tensor([1, 65535], dtype=torch.uint16),
        "u32": torch.tensor([1, 2**32 - 1], dtype=torch.uint32),
        "f8": torch.randn(5).to(torch.float8_e4m3fn),
        "f8b": torch.randn(5).to(torch.float8_e5m2),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "param": torch.nn.Parameter(torch.randn(2, 2)),
        "shared_a": base[2:10].view(2, 4),  # view with an offset into a shared storage
        "shared_b": base[::3],  # same storage, strided
        "transposed": torch.randn(3, 4).t(),
        "sliced": torch.randn(4, 6)[1:, ::2],
        "expanded": torch.randn(3).expand(4, 3),  # stride 0
        "state_dict": mod.state_dict(),
        "nested": {"list": [torch.ones(2), 3, "x"], "tuple": (1.5, torch.zeros(1)), "none": None},
        "meta": {"epoch": 3, "lr": 0.1, "name": "run", "flag": True, "size": torch.Size([2, 3])},
        "bytes": b"\x00\xff",
        "set": {1, 2},
        "dtype": torch.float16,
    }


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_save_roundtrip(tmp_path, zip_format):
    objs = checkpoint_objects()
    if not zip_format:  # torch.load cannot read these back from legacy files (see below)
        for k in ("u16", "u32", "f8", "f8b"):
            del objs[k]
    path = tmp_path / "ckpt.pt"
    torch.save(objs, path, _use_new_zipfile_serialization=zip_format)
    with open(path, "rb") as f:
        assert (f.read(2) == b"PK") == zip_format
    ref = torch.load(path, weights_only=True)
    ours = load_torch(path)
    assert_tree_equal(ours, ref)
    assert isinstance(ours["state_dict"], collections.OrderedDict)
    assert ours["state_dict"]._metadata == ref["state_dict"]._metadata
    assert np.shares_memory(ours["shared_a"], ours["shared_b"])
    assert ours["shared_a"].strides == (16, 4) and ours["shared_b"].strides == (12,)
    assert ours["transposed"].strides == (4, 16) and ours["expanded"].strides == (0, 4)
    assert all(not a.flags.writeable for a in (ours["f32"], ours["shared_a"], ours["param"]))


def test_legacy_files_with_untyped_storages(tmp_path):
    # torch.save writes uint16/uint32/float8 to legacy files as UntypedStorage + v3 rebuilds;
    # torch.load fails on them (no .dtype on UntypedStorage), ember reads them
    objs = {k: v for k, v in checkpoint_objects().items() if k in ("u16", "u32", "f8", "f8b")}
    objs["f32"] = torch.randn(3)
    path = tmp_path / "l.pt"
    torch.save(objs, path, _use_new_zipfile_serialization=False)
    with pytest.raises(AttributeError):
        torch.load(path, weights_only=True)
    assert_tree_equal(load_torch(path), objs)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_copy_gives_writable_arrays_that_still_share(tmp_path, zip_format):
    base = torch.arange(10.0)
    path = tmp_path / "c.pt"
    torch.save({"a": base[:5], "b": base[3:]}, path, _use_new_zipfile_serialization=zip_format)
    ours = load_torch(path, copy=True)
    a, b = ours["a"], ours["b"]
    assert a.flags.writeable and np.shares_memory(a, b)
    a[4] = -1.0  # like torch: writing through one view shows in the other
    assert b[1] == -1.0
    assert load_torch(path)["a"][4] == 4.0  # the file is untouched


# ------------------------------------------------------------------------------ malicious files


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_malicious_pickle_is_refused(tmp_path, zip_format):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": Evil(str(marker))}, path,
               _use_new_zipfile_serialization=zip_format)  # fmt: skip
    assert not marker.exists()
    with pytest.raises(FormatError, match=f"refusing to load global {os.system.__module__}.system"):
        load_torch(path)
    assert not marker.exists()
    # the same file really is dangerous: unrestricted pickle would have run the command
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert not marker.exists()


@pytest.mark.parametrize(
    "global_,expected",
    [
        (b"cbuiltins\neval\n", "builtins.eval"),
        (b"cnumpy.core.multiarray\n_reconstruct\n", "numpy.core.multiarray._reconstruct"),
        (b"ctorch\nload\n", "torch.load"),
        (b"ccopyreg\n_reconstructor\n", "copyreg._reconstructor"),
        (b"X\x05\x00\x00\x00posixX\x06\x00\x00\x00system\x93", "posix.system"),  # STACK_GLOBAL
    ],
)
def test_refused_globals(tmp_path, global_, expected):
    body = b"\x80\x04" + global_ + b"."
    path = tmp_path / "g.pt"
    path.write_bytes(zip_checkpoint(body, {}))
    with pytest.raises(FormatError, match=f"refusing to load global {expected}"):
        load_torch(path)


def test_build_on_a_dtype_is_refused(tmp_path):
    # GLOBAL torch.float32, then BUILD with a state: would mutate numpy's float32 singleton
    state = b"(K\x03X\x01\x00\x00\x00>NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00t"
    body = b"\x80\x02ctorch\nfloat32\n" + state + b"b."
    path = tmp_path / "b.pt"
    path.write_bytes(zip_checkpoint(body, {}))
    with pytest.raises(FormatError, match="refusing to set state on a"):
        load_torch(path)
    assert np.dtype(np.float32).byteorder == "="


# ------------------------------------------------------------------------------ broken files


def test_hand_written_files_match_torch(tmp_path):
    raw = np.arange(12, dtype=np.float32).tobytes()
    st = FakeStorage("0", numel=12)
    obj = {"a": FakeTensor(st, 2, (2, 3), (3, 1)), "b": FakeTensor(st, 1, (3,), (4,))}
    for name, data in [
        ("z.pt", zip_checkpoint(dumps(obj), {"0": raw})),
        ("l.pt", legacy_checkpoint(dumps(obj, legacy=True), {"0": (12, raw)})),
    ]:
        (tmp_path / name).write_bytes(data)
        assert_tree_equal(load_torch(tmp_path / name), torch.load(tmp_path / name))


def test_legacy_storage_views(tmp_path):
    # torch < 1.0 pickled views of storages as ('storage', type, root, loc, numel, (key, off, n))
    raw = np.arange(12, dtype=np.float32).tobytes()
    v1 = FakeStorage("0", numel=12, view=("v1", 4, 6))
    v2 = FakeStorage("0", numel=12, view=("v2", 0, 12))
    obj = {"a": FakeTensor(v1, 1, (2, 2), (2, 1)), "b": FakeTensor(v2, 0, (12,), (1,))}
    path = tmp_path / "v.pt"
    path.write_bytes(legacy_checkpoint(dumps(obj, legacy=True), {"0": (12, raw)}))
    ours = load_torch(path)
    assert_tree_equal(ours, torch.load(path))
    assert ours["a"].tolist() == [[5.0, 6.0], [7.0, 8.0]]
    assert np.shares_memory(ours["a"], ours["b"])
    bad = {"a": FakeTensor(FakeStorage("0", numel=12, view=("v", 10, 6)))}
    path.write_bytes(legacy_checkpoint(dumps(bad, legacy=True), {"0": (12, raw)}))
    with pytest.raises(FormatError, match="bad storage view"):
        load_torch(path)


def bad_layouts():
    st = FakeStorage("0", numel=12)
    return [
        (FakeTensor(st, 0, (13,), (1,)), "reaches element 12 of a storage holding 12"),
        (FakeTensor(st, 11, (2,), (1,)), "reaches element 12"),
        (FakeTensor(st, 0, (3, 4), (4, 2)), "reaches element 14"),
        (FakeTensor(st, 0, (2**40, 2**40), (0, 0)), "too large"),
        (FakeTensor(st, 0, (2,), (-1,)), "non-negative ints"),
        (FakeTensor(st, -1, (2,), (1,)), "bad tensor layout"),
        (FakeTensor(st, 0, (2, 2), (1,)), "bad tensor layout"),
        (FakeTensor(st, 0, (2.0,), (1,)), "non-negative ints"),
        (FakeTensor("not a storage", 0, (2,), (1,)), "persistent id"),
        (FakeTensor(FakeStorage("9", numel=12), 0, (2,), (1,)), "storage|keys"),
    ]


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("tensor,match", bad_layouts())
def test_bad_layouts(tmp_path, zip_format, tensor, match):
    raw = np.arange(12, dtype=np.float32).tobytes()
    if zip_format:
        data = zip_checkpoint(dumps({"t": tensor}), {"0": raw})
    else:
        data = legacy_checkpoint(dumps({"t": tensor}, legacy=True), {"0": (12, raw)})
    path = tmp_path / "bad.pt"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=match):
        load_torch(path)


def test_zip_storage_problems(tmp_path):
    path = tmp_path / "s.pt"
    st = FakeStorage("0", numel=4)
    body = dumps({"t": FakeTensor(st)})
    path.write_bytes(zip_checkpoint(body, {"0": bytes(12)}))
    with pytest.raises(FormatError, match="needs 16 bytes, the record holds 12"):
        load_torch(path)
    path.write_bytes(zip_checkpoint(body, {}))
    with pytest.raises(FormatError, match="storage '0' has no record 'archive/data/0'"):
        load_torch(path)
    path.write_bytes(zip_checkpoint(dumps({"t": FakeTensor(FakeStorage("0", numel=-4))}), {}))
    with pytest.raises(FormatError, match="bad storage size"):
        load_torch(path)


def test_legacy_storage_problems(tmp_path):
    path = tmp_path / "s.pt"
    body = dumps({"t": FakeTensor(FakeStorage("0", numel=4))}, legacy=True)
    path.write_bytes(legacy_checkpoint(body, {"0": (5, bytes(16))}))
    with pytest.raises(FormatError, match="expected 4 elements, found 5"):
        load_torch(path)
    path.write_bytes(legacy_checkpoint(body, {"0": (4, bytes(15))}))
    with pytest.raises(FormatError, match="run past the end"):
        load_torch(path)
    path.write_bytes(legacy_checkpoint(body, {"0": (4, bytes(16)), "1": (0, b"")}))
    with pytest.raises(FormatError, match="do not match"):
        load_torch(path)
    big = dumps({"t": FakeTensor(FakeStorage("0", numel=2**60))}, legacy=True)
    path.write_bytes(legacy_checkpoint(big, {"0": (2**60, b"")}))
    with pytest.raises(FormatError, match="more than the whole file"):
        load_torch(path)
    good = legacy_checkpoint(body, {"0": (4, bytes(16))})
    path.write_bytes(good.replace(struct.pack("<I", 1001)[:2], b"\xe8\x04", 1))
    with pytest.raises(FormatError, match="expected legacy protocol 1001, found 1256"):
        load_torch(path)


@pytest.mark.parametrize(
    "raw,match",
    [
        (b"", "at least 4 bytes"),
        (b"abcd", "expected a zip archive"),
        (b"PK\x03\x04garbage", "not a readable zip archive"),
        (pickle.dumps(12345, 2), "expected the torch magic number"),
        (b"\x80\x02\x8a\x0a" + b"\x00" * 3, "corrupt pickle, the data ends before"),
        (b"\x80\x02\xff\x00", "magic number: corrupt pickle, unknown opcode 0xff \\(near byte 3"),
    ],
)
def test_not_checkpoints(tmp_path, raw, match):
    path = tmp_path / "x.pt"
    path.write_bytes(raw)
    with pytest.raises(FormatError, match=match):
        load_torch(path)


def test_truncated_real_checkpoints(efficientnet_pth, tmp_path):
    data = efficientnet_pth.read_bytes()
    zpath = tmp_path / "z.pt"
    torch.save({"w": torch.randn(64, 64)}, zpath)
    zdata = zpath.read_bytes()
    for src in (data, zdata):
        for cut in (5, 100, 2000, len(src) // 2, len(src) - 1):
            p = tmp_path / "cut.pt"
            p.write_bytes(src[:cut])
            with pytest.raises(FormatError):
                load_torch(p)
