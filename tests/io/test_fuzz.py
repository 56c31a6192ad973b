"""Property tests: mutated real files either load correctly or raise FormatError, nothing else.

Every successful load is followed by reading every byte of every array, so an out-of-bounds
view would crash the test process rather than pass silently.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import struct
import tempfile
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ember import config
from ember.errors import FormatError
from ember.io import load_torch, open_gguf, open_safetensors, save_gguf, save_safetensors

from .torch_files import FakeStorage, FakeTensor, dumps, zip_checkpoint

# EMBER_FUZZ_EXAMPLES=5000 runs a longer, randomised search; the default stays fast and fixed.
_LONG = config.FUZZ_EXAMPLES
SETTINGS = settings(
    max_examples=int(_LONG or 150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=not _LONG,
    database=None,
)
_DIR = Path(tempfile.mkdtemp(prefix="ember-io-fuzz-"))
_COUNTER = itertools.count()


def write(data: bytes, suffix: str) -> Path:
    """A fresh file per example (a new inode, so older maps never see it change)."""
    path = _DIR / f"f{next(_COUNTER)}{suffix}"
    path.write_bytes(data)
    return path


def touch(obj) -> int:
    """Read every byte of every array in a nested result (iteratively; cycles allowed)."""
    seen, stack, total = set(), [obj], 0
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            total += len(np.ascontiguousarray(x).view(np.uint8).tobytes())
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack.extend(x)
    return total


def must_fail_cleanly(load, path: Path) -> None:
    """The property: FormatError or a load whose arrays are all readable."""
    try:
        result = load(path)
    except FormatError:
        return
    finally:
        path.unlink()
    touch(result)


@st.composite
def mutated(draw, base: bytes, hot: int):
    """Bytes flipped (mostly in the first `hot` bytes), truncated, extended, spliced."""
    data = bytearray(base)
    pos = st.one_of(st.integers(0, max(hot - 1, 0)), st.integers(0, len(base) - 1))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "flip", "byte", "truncate", "extend", "splice", "cut"]))
        if not data:
            data += draw(st.binary(min_size=1, max_size=8))
        p = min(draw(pos), len(data) - 1)
        if op == "flip":
            data[p] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[p] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x01]))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif op == "extend":
            data += draw(st.binary(min_size=1, max_size=64))
        elif op == "splice":
            data[p:p] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[p : p + draw(st.integers(1, 16))]
    return bytes(data)


# ------------------------------------------------------------------------------ base files


def _safetensors_base() -> tuple[bytes, int]:
    path = _DIR / "base.safetensors"
    save_safetensors(
        {
            "a": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b": np.ones(5, ml_dtypes.bfloat16),
            "c": np.array([1, -2], np.int64),
            "d": np.array([True, False, True]),
            "e": np.zeros((0, 3), np.uint8),
        },
        path,
        metadata={"format": "pt"},
    )
    data = path.read_bytes()
    return data, 8 + struct.unpack("<Q", data[:8])[0]


def _gguf_base() -> tuple[bytes, int]:
    path = _DIR / "base.gguf"
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    q8 = np.zeros((2, 34), np.uint8)
    save_gguf(
        path,
        {
            "general.architecture": "llama",
            "tokenizer.ggml.tokens": ["<s>", "a", "bc"],
            "tokenizer.ggml.token_type": [3, 1, 1],
            "llama.block_count": 2,
            "nested": [[1, 2], [3]],
            "flag": True,
        },
        {"x": x, "h": x.astype(np.float16), "q": (q8, "Q8_0", (2, 32)), "i": np.arange(3)},
        metadata_types={"nested": "ARRAY[ARRAY[INT32]]"},
    )
    f = open_gguf(path)
    return path.read_bytes(), f.data_offset


def _torch_objects() -> dict:
    base = torch.arange(12, dtype=torch.float32)
    return {
        "w": torch.randn(3, 4),
        "h": torch.ones(2).half(),
        "b": torch.ones(3).bfloat16(),
        "v": base[2:8].view(2, 3),
        "s": base[::4],
        "t": torch.randn(2, 3).t(),
        "meta": {"epoch": 1, "names": ["a", "b"], "size": torch.Size([1, 2])},
    }


def _torch_base(zip_format: bool) -> tuple[bytes, int]:
    path = _DIR / ("base_zip.pt" if zip_format else "base_legacy.pt")
    torch.save(_torch_objects(), path, _use_new_zipfile_serialization=zip_format)
    data = path.read_bytes()
    return data, (len(data) if zip_format else data.index(b"\x80\x02]"))  # storage keys list


SAFETENSORS, SAFETENSORS_HOT = _safetensors_base()
GGUF, GGUF_HOT = _gguf_base()
TORCH_ZIP, TORCH_ZIP_HOT = _torch_base(True)
TORCH_LEGACY, TORCH_LEGACY_HOT = _torch_base(False)


def _safetensors_load(path: Path) -> dict:
    f = open_safetensors(path)
    return {name: f.get(name) for name in f.keys()}


def _gguf_load(path: Path) -> dict:
    f = open_gguf(path)
    return {"meta": f.metadata, "tensors": [t.data for t in f.tensors.values()]}


def test_base_files_load():
    for data, suffix, load in [
        (SAFETENSORS, ".safetensors", _safetensors_load),
        (GGUF, ".gguf", _gguf_load),
        (TORCH_ZIP, ".pt", load_torch),
        (TORCH_LEGACY, ".pt", load_torch),
    ]:
        assert touch(load(write(data, suffix))) > 0


# ------------------------------------------------------------------------------ byte mutations


@SETTINGS
@given(mutated(SAFETENSORS, SAFETENSORS_HOT))
def test_mutated_safetensors(data):
    must_fail_cleanly(_safetensors_load, write(data, ".safetensors"))


@SETTINGS
@given(mutated(GGUF, GGUF_HOT))
def test_mutated_gguf(data):
    must_fail_cleanly(_gguf_load, write(data, ".gguf"))


@SETTINGS
@given(mutated(TORCH_ZIP, TORCH_ZIP_HOT))
def test_mutated_torch_zip(data):
    must_fail_cleanly(load_torch, write(data, ".pt"))


@SETTINGS
@given(mutated(TORCH_LEGACY, TORCH_LEGACY_HOT))
def test_mutated_torch_legacy(data):
    must_fail_cleanly(load_torch, write(data, ".pt"))


def _zip_parts() -> tuple[bytes, dict[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(TORCH_ZIP)) as z:
        names = z.namelist()
        pkl = next(n for n in names if n.endswith("data.pkl"))
        prefix = pkl[: -len("data.pkl")]
        storages = {
            n[len(prefix) + 5 :]: z.read(n) for n in names if n.startswith(prefix + "data/")
        }
        return z.read(pkl), storages


PICKLE, STORAGES = _zip_parts()


@SETTINGS
@given(mutated(PICKLE, len(PICKLE)))
def test_mutated_pickle_in_valid_zip(data):
    # zip CRCs catch most byte flips in data.pkl; re-zipping makes the unpickler face them
    must_fail_cleanly(load_torch, write(zip_checkpoint(data, STORAGES), ".pt"))


# ------------------------------------------------------------------------------ structured


_ODD = st.one_of(
    st.integers(-3, 40),
    st.integers(-(2**70), 2**70),
    st.lists(st.integers(-2, 2**64), max_size=4),
    st.sampled_from(["F32", "BF16", "F8_E4M3", "X", ""]),
    st.none(),
    st.floats(allow_nan=False),
    st.booleans(),
)


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcde"), st.sampled_from(["dtype", "shape", "data_offsets"]), _ODD
        ),
        min_size=1,
        max_size=3,
    )
)
def test_safetensors_header_fields(edits):
    n = struct.unpack("<Q", SAFETENSORS[:8])[0]
    header = json.loads(SAFETENSORS[8 : 8 + n])
    for name, field, value in edits:
        header[name][field] = value
    blob = json.dumps(header).encode()
    data = struct.pack("<Q", len(blob)) + blob + SAFETENSORS[8 + n :]
    path = write(data, ".safetensors")
    try:
        loaded = _safetensors_load(path)
    except FormatError:
        return
    finally:
        path.unlink()
    for name, arr in loaded.items():  # a header that passes must describe its data exactly
        info = header[name]
        assert list(arr.shape) == info["shape"]
        begin, end = info["data_offsets"]
        assert arr.nbytes == end - begin
        raw = SAFETENSORS[8 + n + begin : 8 + n + end]
        assert np.ascontiguousarray(arr).view(np.uint8).tobytes() == raw


@st.composite
def layouts(draw):
    """(offset, size, stride): mostly plausible over a 12-element storage, sometimes absurd."""
    small = draw(st.integers(0, 9)) > 0
    offset = draw(st.integers(0, 6) if small else st.integers(-3, 2**63))
    n = draw(st.integers(0, 3))
    dim = st.integers(0, 4) if small else st.sampled_from([0, 1, 3, 2**31, 2**62, 2**64])
    size = draw(st.lists(dim, min_size=n, max_size=n))
    step = st.integers(0, 4) if small else st.integers(-2, 2**40)
    m = n if draw(st.integers(0, 9)) else draw(st.integers(0, 3))
    stride = draw(st.lists(step, min_size=m, max_size=m))
    return offset, tuple(size), tuple(stride)


@settings(SETTINGS, max_examples=int(_LONG or 100))  # torch.load is the slow half here
@given(layouts())
def test_tensor_layouts_agree_with_torch(layout):
    offset, size, stride = layout
    raw = np.arange(12, dtype=np.float32).tobytes()
    tensor = FakeTensor(FakeStorage("0", numel=12), offset, size, stride)
    path = write(zip_checkpoint(dumps({"t": tensor}), {"0": raw}), ".pt")
    try:
        ref = torch.load(path, weights_only=True)["t"]
    except Exception:
        ref = None
    try:
        ours = load_torch(path)["t"]
    except FormatError:
        ours = None
    finally:
        os.unlink(path)
    event("both loaded" if ref is not None and ours is not None else "refused")
    if ref is None or ours is None:
        # torch may build views we refuse (never the reverse, except nothing we know of)
        assert ours is None, f"we loaded a layout torch refuses: {offset}, {size}, {stride}"
        return
    assert ours.shape == tuple(ref.shape) and np.array_equal(ours, ref.numpy())


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for p in _DIR.iterdir():
        p.unlink()
    _DIR.rmdir()
