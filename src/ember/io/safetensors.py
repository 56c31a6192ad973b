"""safetensors: a bounds-checked header parser, zero-copy mmap reader, sharded index, writer.

Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data section.
The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the data section) and may hold "__metadata__": {str: str}.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import DTypeError, FormatError
from ember.io._common import LazyDTypes, atomic_write, checked_numel, fail, map_file

# The reference implementation refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000
MAX_DIMS = 64  # numpy's limit

# safetensors dtype codes -> numpy codes; "ml_dtypes.X" ones are imported when first used
DTYPES = LazyDTypes(
    {
        "BOOL": "?",
        "U8": "u1",
        "I8": "i1",
        "U16": "<u2",
        "I16": "<i2",
        "U32": "<u4",
        "I32": "<i4",
        "U64": "<u8",
        "I64": "<i8",
        "F16": "<f2",
        "BF16": "ml_dtypes.bfloat16",
        "F32": "<f4",
        "F64": "<f8",
        "F8_E4M3": "ml_dtypes.float8_e4m3fn",
        "F8_E5M2": "ml_dtypes.float8_e5m2",
        "C64": "<c8",
    }
)


@dataclass(frozen=True)
class SafetensorsTensorInfo:
    """Where one tensor lives: dtype code ('F32', 'BF16', ...), shape, absolute byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return self.end - self.start

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype the data is viewed as."""
        return DTYPES[self.dtype]


class SafetensorsFile:
    """An opened .safetensors file: header parsed, data memory-mapped, nothing else read."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._mm, self.file_size = map_file(path, 8, "safetensors")
        self.metadata, self.tensors, self.data_offset = _parse_header(
            self.path, self._mm, self.file_size
        )

    def keys(self) -> list[str]:
        """Tensor names in file order."""
        return list(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def get(self, name: str) -> np.ndarray:
        """A read-only array viewing the tensor's bytes in the map (no copy, no read)."""
        try:
            info = self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None
        if self._mm is None:
            raise ValueError(f"{self.path}: file is closed")
        dt = info.np_dtype
        if info.nbytes == 0:
            arr = np.empty(info.shape, dt)
        else:
            arr = np.frombuffer(self._mm, dt, info.nbytes // dt.itemsize, info.start)
            arr = arr.reshape(info.shape)
        arr.flags.writeable = False
        return arr

    __getitem__ = get

    def close(self) -> None:
        """Drop this object's reference to the map; arrays already handed out keep it alive."""
        self._mm = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}, {len(self.tensors)} tensors)"


def _parse_header(
    path: str, mm: mmap.mmap, size: int
) -> tuple[dict[str, str], dict[str, SafetensorsTensorInfo], int]:
    (n,) = struct.unpack_from("<Q", mm, 0)
    if n > size - 8:
        raise fail(path, f"header length is {n} bytes but only {size - 8} bytes follow it", 0)
    if n > MAX_HEADER_BYTES:
        raise fail(path, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit", 0)
    raw = mm[8 : 8 + n]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fail(path, f"header is not valid UTF-8: {e.reason}", 8 + e.start) from None
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _DuplicateKey as e:
        raise fail(path, f"header JSON has the key {e.args[0]!r:.200} twice", 8) from None
    except _Constant as e:
        raise fail(path, f"header JSON holds {e.args[0]}, which JSON does not allow", 8) from None
    except json.JSONDecodeError as e:
        raise fail(
            path, f"header is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", 8
        ) from None
    except (ValueError, RecursionError) as e:  # huge integers, absurd nesting
        raise fail(path, f"header is not usable JSON: {e}", 8) from None
    if not isinstance(header, dict):
        raise fail(path, f"header must be a JSON object, found {type(header).__name__}", 8)
    _check_strings(path, header)

    data_offset = 8 + n
    data_size = size - data_offset
    metadata = header.pop("__metadata__", None)
    if metadata is None:  # the reference reader takes null for no metadata
        metadata = {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise fail(path, "__metadata__ must be an object mapping strings to strings", 8)

    tensors: dict[str, SafetensorsTensorInfo] = {}
    for name, entry in header.items():
        info = _parse_entry(path, name, entry, data_size)
        tensors[name] = SafetensorsTensorInfo(
            name, info[0], info[1], data_offset + info[2], data_offset + info[3]
        )

    # As the reference reader: the tensors, in offset order, tile the data section exactly:
    # no byte belongs to two tensors, none to no tensor, and nothing follows the last one.
    at = 0
    for start, end, name in sorted((t.start, t.end, t.name) for t in tensors.values()):
        begin = start - data_offset
        if begin != at:
            what = (
                "overlaps the tensor before it"
                if begin < at
                else f"leaves bytes {at}..{begin} unused"
            )
            raise fail(
                path,
                f"tensor {name!r} (data_offsets [{begin}, {end - data_offset}]) {what}; the "
                "tensors must cover the data section exactly, in order",
            )
        at = end - data_offset
    if at != data_size:
        raise fail(
            path,
            f"the data section holds {data_size} bytes but its tensors cover {at}: "
            f"{data_size - at} bytes belong to no tensor",
            data_offset + at,
        )
    return dict(metadata), tensors, data_offset


MAX_JSON_NESTING = 128  # serde_json's limit, which the reference reader keeps


def _check_strings(path: str, header: dict) -> None:
    """Refuse lone surrogates in any string (not UTF-8; Python's json lets `\\ud800` through)
    and nesting past MAX_JSON_NESTING, as the reference reader's JSON parser does."""
    stack: list[tuple[Any, int]] = [(header, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_JSON_NESTING:
            raise fail(path, f"header JSON is nested deeper than {MAX_JSON_NESTING}", 8)
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for k, v in items:
            for x in (k, v):
                if isinstance(x, str):
                    try:
                        x.encode("utf-8")
                    except UnicodeEncodeError:
                        raise fail(
                            path, f"header JSON string {x!r:.80} holds a lone surrogate", 8
                        ) from None
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))


def _parse_entry(
    path: str, name: str, entry: Any, data_size: int
) -> tuple[str, tuple[int, ...], int, int]:
    where = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise fail(path, f"{where}: expected an object, found {type(entry).__name__}")
    missing = {"dtype", "shape", "data_offsets"} - entry.keys()
    if missing:
        raise fail(path, f"{where}: missing field(s) {sorted(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise fail(path, f"{where}: unknown dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise fail(path, f"{where}: shape must be a list of non-negative integers, found {shape!r}")
    if len(shape) > MAX_DIMS:
        raise fail(path, f"{where}: {len(shape)} dimensions, at most {MAX_DIMS} are supported")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        raise fail(path, f"{where}: data_offsets must be [begin, end], found {offsets!r}")
    begin, end = offsets
    if not begin <= end <= data_size:
        raise fail(
            path,
            f"{where}: data_offsets [{begin}, {end}] do not fit in the "
            f"{data_size}-byte data section",
        )
    numel = checked_numel(tuple(shape), path, where, DTYPES[dtype].itemsize)
    expected = numel * DTYPES[dtype].itemsize
    if end - begin != expected:
        raise fail(
            path,
            f"{where}: shape {shape} of {dtype} needs {expected} bytes, "
            f"data_offsets [{begin}, {end}] hold {end - begin}",
        )
    return dtype, tuple(shape), begin, end


def _is_uint(x: object) -> bool:
    return type(x) is int and x >= 0


class _DuplicateKey(Exception):
    pass


class _Constant(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise _Constant(name)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def open_safetensors(path: str | os.PathLike) -> SafetensorsFile:
    """Open a .safetensors file: parse and check the header, map the data, read nothing else."""
    return SafetensorsFile(path)


# --------------------------------------------------------------------------- sharded checkpoints

INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 100_000_000


class ShardedSafetensors:
    """A checkpoint split over several files by a `model.safetensors.index.json`."""

    def __init__(self, index_path: str | os.PathLike) -> None:
        self.path = os.fspath(index_path)
        index = _read_index(self.path)
        root = Path(self.path).parent
        self.metadata: dict[str, Any] = index.get("metadata") or {}
        self.weight_map: dict[str, str] = index["weight_map"]
        self.shards: dict[str, SafetensorsFile] = {}
        for fname in dict.fromkeys(self.weight_map.values()):
            self.shards[fname] = open_safetensors(root / fname)
        for name, fname in self.weight_map.items():
            if name not in self.shards[fname].tensors:
                raise FormatError(
                    f"{self.path}: tensor {name!r} is mapped to {fname} but is not in it"
                )
        self.tensors: dict[str, SafetensorsTensorInfo] = {
            name: self.shards[fname].tensors[name] for name, fname in self.weight_map.items()
        }

    def keys(self) -> list[str]:
        """Tensor names in index order."""
        return list(self.weight_map)

    def __contains__(self, name: object) -> bool:
        return name in self.weight_map

    def __iter__(self):
        return iter(self.weight_map)

    def __len__(self) -> int:
        return len(self.weight_map)

    def get(self, name: str) -> np.ndarray:
        """A read-only view of one tensor from whichever shard holds it."""
        if name not in self.weight_map:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return self.shards[self.weight_map[name]].get(name)

    __getitem__ = get

    def close(self) -> None:
        """Close every shard."""
        for shard in self.shards.values():
            shard.close()

    def __enter__(self) -> ShardedSafetensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_index(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read(MAX_INDEX_BYTES + 1)
    if len(raw) > MAX_INDEX_BYTES:
        raise FormatError(f"{path}: index file is larger than {MAX_INDEX_BYTES} bytes")
    try:
        index = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: index is not valid UTF-8 (at byte {e.start})") from None
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{path}: index is not valid JSON: {e}") from None
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in wm.items()
    ):
        raise FormatError(
            f"{path}: expected an object with a 'weight_map' of strings to file names"
        )
    if not isinstance(index.get("metadata") or {}, dict):
        raise FormatError(f"{path}: 'metadata' must be an object")
    for fname in set(wm.values()):
        norm = os.path.normpath(fname)
        if os.path.isabs(fname) or norm == ".." or norm.startswith(".." + os.sep) or "\0" in fname:
            raise FormatError(f"{path}: shard {fname!r} lies outside the index's directory")
    return index


def open_safetensors_index(path: str | os.PathLike) -> ShardedSafetensors:
    """Open every shard listed by a model.safetensors.index.json (or a directory holding one)."""
    p = Path(path)
    return ShardedSafetensors(p / INDEX_NAME if p.is_dir() else p)


def load_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a file, an index .json or a model directory, as lazy read-only views."""
    p = Path(path)
    if p.is_dir():
        return load_safetensors_dir(p)
    src = open_safetensors_index(p) if p.suffix == ".json" else open_safetensors(p)
    return {name: src.get(name) for name in src.keys()}


def load_safetensors_dir(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Tensors of a model directory: its index if present, else its single .safetensors file."""
    p = Path(path)
    if (p / INDEX_NAME).is_file():
        return load_safetensors(p / INDEX_NAME)
    files = sorted(p.glob("*.safetensors"))
    if (p / "model.safetensors").is_file():
        files = [p / "model.safetensors"]
    if len(files) != 1:
        found = ", ".join(f.name for f in files) or "none"
        raise FormatError(
            f"{p}: expected {INDEX_NAME} or exactly one .safetensors file, found {found}"
        )
    return load_safetensors(files[0])


# --------------------------------------------------------------------------- writer


def save_safetensors(
    tensors: dict[str, Any], path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """Write arrays to a .safetensors file (via a temporary file renamed into place)."""
    if metadata is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TypeError("safetensors metadata must map str to str")
    arrays: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"invalid tensor name {name!r}")
        arr = np.asarray(value)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        if DTYPES.name_of(arr.dtype) is None:
            raise DTypeError(
                f"cannot store {name!r} of dtype {arr.dtype} in safetensors; "
                f"supported: {', '.join(DTYPES)}"
            )
        arrays[name] = arr

    # Widest items first, so every tensor starts at a multiple of its item size.
    order = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in order:
        arr = arrays[name]
        header[name] = {
            "dtype": DTYPES.name_of(arr.dtype),
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)

    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in order:
            arr = np.ascontiguousarray(arrays[name]).reshape(-1)
            f.write(memoryview(arr.view(np.uint8)))
