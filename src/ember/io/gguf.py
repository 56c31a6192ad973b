"""GGUF v2/v3: a bounds-checked, memory-mapped reader and a writer built on gguf.GGUFWriter.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key-value count, the
key-value pairs, the tensor infos (name, u32 n_dims, n_dims x u64 `ne`, u32 ggml type, u64
offset), padding to `general.alignment` (default 32), then the data section. `ne[0]` is the
innermost (contiguous) dimension, so the torch-order shape is `reversed(ne)`.

The reader is our own rather than `gguf.GGUFReader`: that one builds a numpy array per metadata
item (seconds for a 50k-token vocabulary) and loops over counts the file claims without checking
them against the file size. Type ids and block sizes come from `gguf.constants`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ember.errors import DTypeError
from ember.io._common import LazyDTypes, atomic_write, checked_numel, fail, map_file

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses more
MAX_ARRAY_NESTING = 8

_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), "<u1"),
    GGUFValueType.INT8: (struct.Struct("<b"), "<i1"),
    GGUFValueType.UINT16: (struct.Struct("<H"), "<u2"),
    GGUFValueType.INT16: (struct.Struct("<h"), "<i2"),
    GGUFValueType.UINT32: (struct.Struct("<I"), "<u4"),
    GGUFValueType.INT32: (struct.Struct("<i"), "<i4"),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), "<f4"),
    GGUFValueType.UINT64: (struct.Struct("<Q"), "<u8"),
    GGUFValueType.INT64: (struct.Struct("<q"), "<i8"),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), "<f8"),
    GGUFValueType.BOOL: (struct.Struct("<B"), "<u1"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# ggml types whose data is handed out as typed arrays; all others are raw uint8 blocks.
TYPED = LazyDTypes(
    {
        "F32": "<f4",
        "F16": "<f2",
        "BF16": "ml_dtypes.bfloat16",
        "F64": "<f8",
        "I8": "<i1",
        "I16": "<i2",
        "I32": "<i4",
        "I64": "<i8",
    }
)


def qtype_sizes(qtype: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type name such as 'Q4_1' or 'F32'."""
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    except KeyError:
        raise DTypeError(f"unknown ggml type {qtype!r}") from None


def qtype_nbytes(qtype: str, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of torch-order `shape` takes in ggml type `qtype` (row must fill blocks)."""
    block, size = qtype_sizes(qtype)
    row = shape[-1] if shape else 1
    if row % block:
        raise DTypeError(f"{qtype} needs rows that are multiples of {block}, got shape {shape}")
    n = 1
    for d in shape[:-1]:
        n *= d
    return n * (row // block) * size


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor: ggml type name, torch-order shape, and its data as a view into the map.

    `data` is typed (float32, float16, bfloat16, float64, int8..int64) with shape `shape` for the
    plain types, and uint8 of shape `shape[:-1] + (bytes per row,)` for block-quantized types.
    """

    name: str
    qtype: str
    shape: tuple[int, ...]
    data: np.ndarray
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        """Number of logical elements (not bytes)."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_quantized(self) -> bool:
        """True when `data` holds raw quantized blocks rather than typed values."""
        return self.qtype not in TYPED


class GGUFFile:
    """An opened GGUF file: metadata decoded, tensor table checked, data memory-mapped."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._mm, self.file_size = map_file(path, 24, "GGUF")
        p = _Parser(self.path, self._mm, self.file_size)
        self.version: int = p.version
        self.metadata: dict[str, Any] = p.metadata
        self.metadata_types: dict[str, str] = p.types
        self.alignment: int = p.alignment
        self.data_offset: int = p.data_offset
        self.tensors: dict[str, GGUFTensorInfo] = p.tensors

    def get(self, name: str) -> np.ndarray:
        """The data array of one tensor (a read-only view into the map)."""
        return self.tensors[name].data

    def keys(self) -> list[str]:
        """Tensor names in file order."""
        return list(self.tensors)

    def close(self) -> None:
        """Drop this object's reference to the map; arrays handed out keep it alive."""
        self._mm = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.tensors)} tensors)"


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF v2/v3 file: parse and check metadata and tensor infos, map the data."""
    return GGUFFile(path)


class _Parser:
    """Walks the header with a cursor; every count is checked against the bytes left."""

    def __init__(self, path: str, mm: Any, size: int) -> None:
        self.path, self.mm, self.size, self.pos = path, mm, size, 0
        magic = mm[0:4]
        if magic != GGUF_MAGIC:
            raise fail(path, f"expected the magic bytes b'GGUF', found {magic!r}", 0)
        self.pos = 4
        self.version = self.u32("version")
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0 and self.version >> 24 in (2, 3):
                raise fail(path, "big-endian GGUF files are not supported", 4)
            raise fail(path, f"expected GGUF version 2 or 3, found {self.version}", 4)
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("key-value count")
        # smallest possible key-value: 8-byte key length + 4-byte type + 1-byte value
        self.check_count(n_kv, 13, "key-value pairs")
        self.metadata: dict[str, Any] = {}
        self.types: dict[str, str] = {}
        for _ in range(n_kv):
            at = self.pos
            key = self.string("metadata key")
            if key in self.metadata:
                raise fail(path, f"metadata key {key!r} appears twice", at)
            vtype = self.u32(f"type of {key!r}")
            self.metadata[key], self.types[key] = self.value(vtype, key, 0)

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            a = self.metadata["general.alignment"]
            if self.types["general.alignment"] != "UINT32" or a <= 0 or a & (a - 1):
                raise fail(path, f"general.alignment must be a UINT32 power of two, found {a!r}")
            self.alignment = a

        # smallest tensor info: name length 8 + n_dims 4 + type 4 + offset 8
        self.check_count(n_tensors, 24, "tensor infos")
        infos = [self.tensor_info() for _ in range(n_tensors)]
        self.data_offset = -(-self.pos // self.alignment) * self.alignment
        self.tensors = self.build_tensors(infos)

    # -- primitives ---------------------------------------------------------------------------
    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise fail(
                self.path,
                f"file ends inside {what}: needs {n} bytes, {self.size - self.pos} remain",
                self.pos,
            )

    def check_count(self, count: int, min_bytes: int, what: str) -> None:
        left = self.size - self.pos
        if count * min_bytes > left:
            raise fail(
                self.path,
                f"header claims {count} {what}, but the {left} bytes left hold at most "
                f"{left // min_bytes}",
                self.pos,
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.mm, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.mm, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        at = self.pos
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = self.mm[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise fail(
                self.path, f"{what} is not valid UTF-8 ({e.reason})", at + 8 + e.start
            ) from None

    # -- metadata values ----------------------------------------------------------------------
    def value(self, vtype: int, key: str, depth: int) -> tuple[Any, str]:
        if vtype in _SCALARS:
            st, _ = _SCALARS[vtype]
            self.need(st.size, f"value of {key!r}")
            (v,) = st.unpack_from(self.mm, self.pos)
            self.pos += st.size
            if vtype == GGUFValueType.BOOL:
                v = v != 0
            return v, GGUFValueType(vtype).name
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key!r}"), "STRING"
        if vtype == GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise fail(
                    self.path, f"{key!r}: arrays nested deeper than {MAX_ARRAY_NESTING}", self.pos
                )
            etype = self.u32(f"element type of {key!r}")
            count = self.u64(f"length of {key!r}")
            return self.array(etype, count, key, depth)
        raise fail(self.path, f"{key!r}: unknown metadata value type {vtype}", self.pos - 4)

    def array(self, etype: int, count: int, key: str, depth: int) -> tuple[list, str]:
        mm, path = self.mm, self.path
        if etype in _SCALARS:
            st, np_code = _SCALARS[etype]
            self.check_count(count, st.size, f"elements in {key!r}")
            arr = np.frombuffer(mm, np_code, count, self.pos) if count else np.empty(0, np_code)
            self.pos += count * st.size
            values = (arr != 0).tolist() if etype == GGUFValueType.BOOL else arr.tolist()
            return values, f"ARRAY[{GGUFValueType(etype).name}]"
        if etype == GGUFValueType.STRING:
            self.check_count(count, 8, f"strings in {key!r}")
            out: list[Any] = []
            pos, size, unpack = self.pos, self.size, _U64.unpack_from
            for i in range(count):
                if pos + 8 > size:
                    raise fail(path, f"file ends inside string {i} of {key!r}", pos)
                (n,) = unpack(mm, pos)
                end = pos + 8 + n
                if end > size:
                    raise fail(path, f"string {i} of {key!r} ({n} bytes) runs past the end", pos)
                try:
                    out.append(mm[pos + 8 : end].decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise fail(
                        path, f"string {i} of {key!r} is not valid UTF-8", pos + 8 + e.start
                    ) from None
                pos = end
            self.pos = pos
            return out, "ARRAY[STRING]"
        if etype == GGUFValueType.ARRAY:
            self.check_count(count, 12, f"nested arrays in {key!r}")
            out, inner = [], "UINT8"
            for _ in range(count):
                v, inner = self.value(etype, key, depth + 1)
                out.append(v)
            if not out:
                inner = "ARRAY[UINT8]"
            return out, f"ARRAY[{inner}]"
        raise fail(path, f"{key!r}: unknown array element type {etype}", self.pos - 12)

    # -- tensors ------------------------------------------------------------------------------
    def tensor_info(self) -> tuple[str, tuple[int, ...], int, int, int]:
        at = self.pos
        name = self.string("tensor name")
        n_dims = self.u32(f"n_dims of {name!r}")
        if n_dims > MAX_DIMS:
            raise fail(self.path, f"tensor {name!r} has {n_dims} dims, at most {MAX_DIMS}", at)
        ne = tuple(self.u64(f"shape of {name!r}") for _ in range(n_dims))
        ggml_type = self.u32(f"type of {name!r}")
        offset = self.u64(f"data offset of {name!r}")
        return name, ne, ggml_type, offset, at

    def build_tensors(self, infos: list) -> dict[str, GGUFTensorInfo]:
        path, tensors, spans = self.path, {}, []
        data_size = self.size - self.data_offset
        for name, ne, ggml_type, offset, at in infos:
            where = f"tensor {name!r}"
            if name in tensors:
                raise fail(path, f"tensor name {name!r} appears twice", at)
            try:
                qtype = GGMLQuantizationType(ggml_type).name
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError):
                raise fail(path, f"{where}: unknown ggml type id {ggml_type}", at) from None
            numel = checked_numel(ne, path, f"{where} (ne={list(ne)})")
            row = ne[0] if ne else 1
            if row % block:
                raise fail(
                    path, f"{where}: {qtype} rows must be multiples of {block}, ne[0]={row}", at
                )
            nbytes = numel // block * type_size
            if offset % self.alignment:
                raise fail(
                    path, f"{where}: offset {offset} is not a multiple of {self.alignment}", at
                )
            if offset > data_size or nbytes > data_size - offset:
                raise fail(
                    path,
                    f"{where}: bytes {offset}..{offset + nbytes} of the data section lie past its "
                    f"end ({data_size} bytes)",
                    at,
                )
            shape = tuple(reversed(ne))
            start = self.data_offset + offset
            if qtype in TYPED:
                dt, dshape = TYPED[qtype], shape
            else:
                dt, dshape = np.dtype(np.uint8), (*shape[:-1], row // block * type_size)
            checked_numel(dshape, path, f"{where} (ne={list(ne)})", dt.itemsize)
            if nbytes:
                data = np.frombuffer(self.mm, dt, nbytes // dt.itemsize, start).reshape(dshape)
                spans.append((start, start + nbytes, name))
            else:
                data = np.empty(dshape, dt)
            data.flags.writeable = False
            tensors[name] = GGUFTensorInfo(name, qtype, shape, data, start, nbytes)
        spans.sort()
        for (s0, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise fail(path, f"tensors {n0!r} (bytes {s0}..{e0}) and {n1!r} overlap", s1)
        return tensors


# --------------------------------------------------------------------------- writer

_NP_SCALAR_TYPES = {
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.int8): "INT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.int16): "INT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.int32): "INT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float32): "FLOAT32",
    np.dtype(np.float64): "FLOAT64",
    np.dtype(np.bool_): "BOOL",
}


def infer_gguf_type(value: Any, in_array: bool = False) -> str:
    """The GGUF value type save_gguf uses when none is given (llama.cpp's usual choices).

    bool -> BOOL, str -> STRING, float -> FLOAT32, numpy scalars keep their type; a plain int is
    UINT32 (INT32 inside arrays, as for token types), widened to 64 bits when it does not fit.
    """
    if isinstance(value, np.generic) and value.dtype in _NP_SCALAR_TYPES:
        return _NP_SCALAR_TYPES[value.dtype]
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        if in_array:
            return "INT32" if -(2**31) <= value < 2**31 else "INT64"
        if 0 <= value < 2**32:
            return "UINT32"
        return "INT64" if -(2**63) <= value < 2**63 else "UINT64"
    if isinstance(value, float):
        return "FLOAT32"
    if isinstance(value, str):
        return "STRING"
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if not items:
            return "ARRAY[UINT8]"
        kinds = {infer_gguf_type(v, True) for v in items}
        if kinds == {"INT32", "INT64"}:
            kinds = {"INT64"}
        if len(kinds) != 1:
            raise TypeError(f"GGUF arrays hold one type, found {sorted(kinds)}")
        return f"ARRAY[{kinds.pop()}]"
    raise TypeError(f"cannot store {type(value).__name__} as GGUF metadata")


def _parse_type(t: str) -> tuple[GGUFValueType, str | None]:
    if t.startswith("ARRAY[") and t.endswith("]"):
        return GGUFValueType.ARRAY, t[6:-1]
    try:
        return GGUFValueType[t], None
    except KeyError:
        raise TypeError(f"unknown GGUF value type {t!r}") from None


def _pack_numbers(values: list, code: str) -> bytes:
    """Little-endian bytes of a numeric metadata array; refuses values that do not fit."""
    dt = np.dtype(code)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if not all(type(v) in (int, bool) or isinstance(v, np.integer) for v in values):
            raise TypeError(f"{dt} arrays hold integers")
        if values and not (info.min <= min(values) and max(values) <= info.max):
            raise ValueError(f"values outside the {dt} range [{info.min}, {info.max}]")
    return np.asarray(values, dtype=dt).tobytes()


def _writer_class() -> type:
    from gguf import GGUFWriter

    class _Writer(GGUFWriter):
        """GGUFWriter that also packs empty and nested arrays with their declared types."""

        def _pack_val(self, val, vtype, add_vtype, sub_type=None):  # noqa: ANN001, ANN202
            if vtype != GGUFValueType.ARRAY or not isinstance(sub_type, str):
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            etype, inner = _parse_type(sub_type)
            out = [self._pack("I", vtype)] if add_vtype else []
            out += [self._pack("I", etype), self._pack("Q", len(val))]
            if etype in _SCALARS and etype != GGUFValueType.BOOL:
                out.append(_pack_numbers(val, _SCALARS[etype][1]))
            elif etype == GGUFValueType.STRING:
                for item in val:
                    b = item.encode("utf-8")
                    out += [_U64.pack(len(b)), b]
            else:
                out += [self._pack_val(v, etype, add_vtype=False, sub_type=inner) for v in val]
            return b"".join(out)

    return _Writer


def save_gguf(
    path: str | os.PathLike,
    metadata: Mapping[str, Any],
    tensors: Mapping[str, Any],
    *,
    metadata_types: Mapping[str, str] | None = None,
    alignment: int | None = None,
) -> None:
    """Write a GGUF v3 file (via a temporary file renamed into place).

    `tensors` maps names to a typed numpy array (f32, f16, bf16, f64, i8..i64), to a
    `(raw_bytes, qtype, shape)` triple for quantized blocks (torch-order shape), or to a
    GGUFTensorInfo from `open_gguf`. `metadata_types` gives value types such as 'UINT32' or
    'ARRAY[INT32]' (`GGUFFile.metadata_types` round-trips); others come from `infer_gguf_type`.
    """
    metadata = dict(metadata)
    types = dict(metadata_types or {})
    if alignment is not None:
        metadata["general.alignment"] = alignment
        types["general.alignment"] = "UINT32"
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if align <= 0 or align & (align - 1):
        raise ValueError(f"alignment must be a power of two, got {align}")

    prepared = {name: _prepare_tensor(name, value) for name, value in tensors.items()}
    with atomic_write(path) as tmp:
        w = _writer_class()(tmp, arch="")
        w.data_alignment = align
        for key, value in metadata.items():
            t = types.get(key) or infer_gguf_type(value)
            vtype, sub = _parse_type(t)
            if vtype == GGUFValueType.ARRAY:
                value = list(value.tolist() if isinstance(value, np.ndarray) else value)
            elif isinstance(value, np.generic):
                value = value.item()
            try:
                w._pack_val(value, vtype, add_vtype=True, sub_type=sub)  # fail here, naming the key
            except (struct.error, TypeError, ValueError, AttributeError) as e:
                raise ValueError(f"metadata {key!r} cannot be stored as {t}: {e}") from None
            w.add_key_value(key, value, vtype, sub)
        for name, (arr, qtype) in prepared.items():
            w.add_tensor(name, arr, raw_dtype=GGMLQuantizationType[qtype])
        try:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()


def _prepare_tensor(name: str, value: Any) -> tuple[np.ndarray, str]:
    """(contiguous array in the form GGUFWriter takes, ggml type name).

    Typed tensors keep their dtype and torch-order shape; quantized ones become uint8 of shape
    `shape[:-1] + (bytes per row,)`, from which GGUFWriter recovers the element shape.
    """
    if isinstance(value, GGUFTensorInfo):
        value = (value.data, value.qtype, value.shape)
    if isinstance(value, tuple):
        raw, qtype, shape = value
        shape = tuple(int(d) for d in shape) or (1,)  # ggml has no 0-d tensors
        need = qtype_nbytes(qtype, shape)
        if isinstance(raw, (bytes, bytearray, memoryview)):
            raw = np.frombuffer(raw, np.uint8)
        flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        if flat.nbytes != need:
            raise ValueError(
                f"tensor {name!r}: {qtype} of shape {shape} takes {need} bytes, got {flat.nbytes}"
            )
        if qtype in TYPED:
            arr = flat.view(TYPED[qtype]).reshape(shape)
        else:
            block, size = qtype_sizes(qtype)
            arr = flat.reshape(*shape[:-1], shape[-1] // block * size)
    else:
        arr = np.asarray(value)
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        qtype = TYPED.name_of(dt)
        if qtype is None:
            raise DTypeError(
                f"tensor {name!r}: GGUF has no type for {arr.dtype}; "
                f"supported: {', '.join(str(d) for d in TYPED.values())} or quantized blocks"
            )
        shape = tuple(arr.shape) or (1,)
        arr = np.ascontiguousarray(arr, dtype=dt).reshape(shape)
    if len(shape) > MAX_DIMS:
        raise ValueError(f"tensor {name!r}: GGUF holds at most {MAX_DIMS} dims, got {shape}")
    return arr, qtype
