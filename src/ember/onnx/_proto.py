"""Reading ONNX protobufs safely: parse, check sizes, resolve external data inside the model's folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import FormatError, UnsupportedError

# ONNX TensorProto.DataType -> numpy dtype (those ember can hold or convert)
_NP: dict[int, Any] = {
    1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
    9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64,
}  # fmt: skip
_NAMES = {
    0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16",
    17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4",
    22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2",
}  # fmt: skip
MAX_ELEMENTS = (
    1 << 40
)  # no tensor in a real model comes near this; a larger dims product is hostile
MAX_RANK = 64


def import_onnx():
    """The onnx package, imported on first use (the `onnx` extra)."""
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise UnsupportedError("ember.onnx needs the onnx package: pip install 'onnx>=1.16'") from e
    return onnx


def np_dtype(code: int, where: str) -> np.dtype:
    """The numpy dtype of an ONNX element type code, or a clear error."""
    if code == 16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code in (17, 19):
        import ml_dtypes

        return np.dtype(ml_dtypes.float8_e4m3fn if code == 17 else ml_dtypes.float8_e5m2)
    if code in _NP:
        return np.dtype(_NP[code])
    if code in _NAMES:
        raise UnsupportedError(f"{where}: ONNX element type {_NAMES[code]} is not supported")
    raise FormatError(f"{where}: unknown ONNX element type {code}")


def onnx_code(dtype: np.dtype) -> int:
    """The ONNX element type code of a numpy dtype."""
    dtype = np.dtype(dtype)
    for code, t in _NP.items():
        if np.dtype(t) == dtype:
            return code
    if dtype.name == "bfloat16":
        return 16
    raise UnsupportedError(f"numpy dtype {dtype} has no ONNX element type here")


def parse_model(data: bytes, where: str):
    """A ModelProto from bytes; malformed bytes raise FormatError."""
    onnx = import_onnx()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(bytes(data))
    except Exception as e:  # protobuf's DecodeError and friends
        raise FormatError(f"{where}: not a valid ONNX protobuf ({type(e).__name__}: {e})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise FormatError(f"{where}: no ONNX graph in the file (truncated or not an ONNX model)")
    if model.ir_version <= 0:
        raise FormatError(f"{where}: ONNX ir_version {model.ir_version} is invalid")
    return model


def read_source(src) -> tuple[bytes, Path | None, str]:
    """The bytes of a model given as a path or as bytes, its folder (None for bytes), a name."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src), None, "<bytes>"
    if isinstance(src, (str, os.PathLike)):
        p = Path(src)
        if not p.is_file():
            raise FormatError(f"{p}: no such ONNX file")
        return p.read_bytes(), p.resolve().parent, str(p)
    raise TypeError(f"ember.onnx.load: expected a path or bytes, got {type(src).__name__}")


def _numel(dims, where: str) -> int:
    if len(dims) > MAX_RANK:
        raise FormatError(f"{where}: rank {len(dims)} is over {MAX_RANK}")
    n = 1
    for d in dims:
        if d < 0:
            raise FormatError(f"{where}: negative dim {d} in {list(dims)}")
        n *= d
        if n > MAX_ELEMENTS:
            raise FormatError(f"{where}: dims {list(dims)} are absurdly large")
    return n


def _external(t, base: Path | None, where: str, nbytes: int) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if base is None:
        raise FormatError(f"{where}: external data {loc!r} needs the model loaded from a path")
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise FormatError(f"{where}: bad external data offset/length {info}") from None
    if not loc or os.path.isabs(loc) or "\x00" in loc:
        raise FormatError(f"{where}: external data location {loc!r} must be a relative path")
    root = os.path.realpath(base)
    path = os.path.realpath(os.path.join(root, loc))
    if os.path.commonpath([root, path]) != root:
        raise FormatError(f"{where}: external data {loc!r} escapes the model's folder {root}")
    if not os.path.isfile(path):
        raise FormatError(f"{where}: external data file {loc!r} not found in {root}")
    size = os.path.getsize(path)
    if length is None:
        length = size - offset
    if offset < 0 or length != nbytes or offset + length > size:
        raise FormatError(
            f"{where}: external data {loc!r} [offset {offset}, length {length}] does not hold the "
            f"{nbytes} bytes the tensor needs (file has {size})"
        )
    if nbytes == 0:
        return np.empty(0, np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(nbytes,))


def tensor_to_numpy(t, base: Path | None = None) -> np.ndarray:
    """A TensorProto as a numpy array, every size checked against the data before reading."""
    where = f"tensor {t.name!r}" if t.name else "tensor"
    dims = tuple(int(d) for d in t.dims)
    n = _numel(dims, where)
    if t.data_type == 8:
        if len(t.string_data) != n:
            raise FormatError(f"{where}: {len(t.string_data)} strings for dims {list(dims)}")
        return np.array([s.decode("utf-8", "replace") for s in t.string_data], object).reshape(dims)
    dtype = np_dtype(t.data_type, where)
    nbytes = n * dtype.itemsize
    if t.data_location == 1:
        raw = _external(t, base, where, nbytes)
        return raw.view(dtype).reshape(dims)
    if t.HasField("raw_data"):
        if len(t.raw_data) != nbytes:
            raise FormatError(
                f"{where}: raw_data has {len(t.raw_data)} bytes, dims {list(dims)} need {nbytes}"
            )
        return np.frombuffer(t.raw_data, dtype).reshape(dims).copy()
    code = t.data_type
    if code in (1,):
        vals, src = t.float_data, np.float32
    elif code == 11:
        vals, src = t.double_data, np.float64
    elif code == 7:
        vals, src = t.int64_data, np.int64
    elif code in (12, 13):
        vals, src = t.uint64_data, np.uint64
    else:
        vals, src = t.int32_data, np.int32
    if len(vals) != n:
        raise FormatError(f"{where}: {len(vals)} values for dims {list(dims)} ({n} elements)")
    a = np.asarray(vals, dtype=src)
    if code in (10, 16, 17, 19):  # 16-bit and 8-bit floats are stored as their bit patterns
        bits = np.uint16 if code in (10, 16) else np.uint8
        return a.astype(bits).view(dtype).reshape(dims)
    return a.astype(dtype).reshape(dims)
