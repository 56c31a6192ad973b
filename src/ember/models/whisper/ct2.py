"""A reader for CTranslate2's ``model.bin`` and the mapping of its Whisper variables onto HF names.

Layout (little-endian; see CTranslate2's python/ctranslate2/specs/model_spec.py):

    u32 binary_version                         (1..6)
    str spec_name, u32 spec_revision           (version >= 2)
    u32 n_variables, then per variable:
        str name, u8 rank, u32 dims[rank],
        u8 dtype_id, u32 n_bytes               (version >= 4; before: u8 item_size, u32 n_items)
        n_bytes of raw data
    u32 n_aliases, then (str alias, str target) (version >= 3)

where ``str`` is a u16 length (counting a trailing NUL) followed by that many bytes. dtype ids:
0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16. Quantized weights (int8/int16) carry
a ``<name>_scale`` variable; the float value is ``weight / scale``. The file is memory-mapped and
every length is checked against it before anything is read or allocated.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ember.errors import FormatError, UnsupportedError
from ember.io._common import LazyDTypes, checked_numel

# dtype id -> numpy dtype; bfloat16 comes from ml_dtypes, imported when a file first uses it
CT2_DTYPES = LazyDTypes(
    {0: "<f4", 1: "i1", 2: "<i2", 3: "<i4", 4: "<f2", 5: "ml_dtypes.bfloat16"}  # type: ignore[dict-item]
)
_ITEM_SIZE_DTYPES = {4: np.dtype("<f4"), 2: np.dtype("<i2"), 1: np.dtype("i1")}  # version < 4
MAX_BINARY_VERSION = 6
MAX_RANK = 8


class _Cursor:
    """Bounds-checked little-endian reads over a buffer."""

    def __init__(self, buf, path: str) -> None:
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise FormatError(
                f"{self.path}: truncated CTranslate2 file: {what} needs {n} bytes at offset "
                f"{self.pos}, the file has {self.size - self.pos} left"
            )

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return v if len(v) > 1 else v[0]

    def string(self, what: str) -> str:
        n = self.unpack("H", what)
        if n == 0:
            raise FormatError(f"{self.path}: {what} at offset {self.pos - 2} has length 0")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        if raw[-1] != 0:
            raise FormatError(f"{self.path}: {what} at offset {self.pos - n} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(
                f"{self.path}: {what} at offset {self.pos - n} is not UTF-8"
            ) from None


@dataclass
class CT2Model:
    """The contents of a model.bin: header fields, variables (views into the file) and aliases."""

    path: str
    binary_version: int
    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str] = field(default_factory=dict)
    trailing_bytes: int = 0
    resolved: dict[str, str] = field(default_factory=dict, repr=False)  # alias -> variable

    def resolve(self, name: str) -> str:
        """The stored variable a name refers to, following aliases."""
        if name in self.variables:
            return name
        if name in self.resolved:
            return self.resolved[name]
        seen = set()
        while name not in self.variables:
            if name not in self.aliases or name in seen:
                raise KeyError(name)
            seen.add(name)
            name = self.aliases[name]
        return name

    def __contains__(self, name: str) -> bool:
        try:
            self.resolve(name)
        except KeyError:
            return False
        return True

    def __getitem__(self, name: str) -> np.ndarray:
        return self.variables[self.resolve(name)]

    def scalar(self, name: str, default=None):
        """A 0-d variable as a Python number (default when absent)."""
        if name not in self:
            return default
        arr = self[name]
        if arr.size != 1:
            raise FormatError(
                f"{self.path}: {name} should hold one number, it has shape {arr.shape}"
            )
        return arr.reshape(()).item()

    def float_array(self, name: str, dtype=np.float32) -> np.ndarray:
        """A variable as floats: float16/bfloat16 upcast, int8/int16 divided by its *_scale."""
        arr = self[name]
        if arr.dtype.kind in "iu":
            scale_name = name + "_scale"
            if scale_name not in self:
                raise FormatError(f"{self.path}: {name} is {arr.dtype} but has no {scale_name}")
            scale = self[scale_name].astype(np.float32)
            if scale.ndim == 1 and arr.ndim >= 1 and scale.shape[0] == arr.shape[0]:
                scale = scale.reshape((-1,) + (1,) * (arr.ndim - 1))
            elif scale.size != 1:
                raise FormatError(
                    f"{self.path}: {scale_name} of shape {scale.shape} does not fit "
                    f"{name} {arr.shape}"
                )
            return (arr.astype(np.float32) / scale).astype(dtype, copy=False)
        out = arr.astype(dtype, copy=arr.dtype != np.dtype(dtype))
        return out if out.flags.aligned else out.copy()

    def summary(self) -> dict[str, tuple[int, int]]:
        """{dtype name: (variables, bytes)} of what the file stores."""
        out: dict[str, tuple[int, int]] = {}
        for a in self.variables.values():
            n, b = out.get(str(a.dtype), (0, 0))
            out[str(a.dtype)] = (n + 1, b + a.nbytes)
        return out


def read_ct2(path: str | os.PathLike) -> CT2Model:
    """Parse a CTranslate2 model.bin (or a directory holding one); variables are memory-mapped."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "model.bin")
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise FormatError(f"{p}: cannot open CTranslate2 model ({e.strerror})") from None
    return parse_ct2(buf, p)


def parse_ct2(buf, path: str = "<bytes>") -> CT2Model:
    """Parse model.bin contents from a bytes-like object (bytes, mmap)."""
    c = _Cursor(buf, path)
    version = c.unpack("I", "binary version")
    if not 1 <= version <= MAX_BINARY_VERSION:
        raise UnsupportedError(
            f"{path}: CTranslate2 binary version {version} is not supported "
            f"(known: 1..{MAX_BINARY_VERSION})"
        )
    spec, revision = "", 1
    if version >= 2:
        spec = c.string("spec name")
        revision = c.unpack("I", "spec revision")
    n_vars = c.unpack("I", "variable count")
    if n_vars * 8 > c.size - c.pos:  # each variable needs >= 8 header bytes
        raise FormatError(f"{path}: {n_vars} variables cannot fit in {c.size} bytes")
    variables: dict[str, np.ndarray] = {}
    for i in range(n_vars):
        name = c.string(f"name of variable {i}")
        rank = c.unpack("B", f"rank of {name}")
        if rank > MAX_RANK:
            raise FormatError(f"{path}: {name} has rank {rank} (at most {MAX_RANK})")
        dims = [c.unpack("I", f"dim of {name}") for _ in range(rank)]
        if version >= 4:
            type_id = c.unpack("B", f"dtype of {name}")
            dtype = CT2_DTYPES.get(type_id)
            if dtype is None:
                raise FormatError(f"{path}: {name} has unknown dtype id {type_id}")
            n_bytes = c.unpack("I", f"size of {name}")
        else:
            item = c.unpack("B", f"item size of {name}")
            dtype = _ITEM_SIZE_DTYPES.get(item)
            if dtype is None:
                raise FormatError(f"{path}: {name} has unknown item size {item}")
            n_bytes = c.unpack("I", f"size of {name}") * item
        count = checked_numel(tuple(dims), path, f"variable {name!r}", dtype.itemsize)
        if count * dtype.itemsize != n_bytes:
            raise FormatError(
                f"{path}: {name} has shape {tuple(dims)} of {dtype} "
                f"({count * dtype.itemsize} bytes) "
                f"but declares {n_bytes} bytes"
            )
        c.need(n_bytes, f"data of {name}")
        if name in variables:
            raise FormatError(f"{path}: variable {name!r} appears twice")
        arr = (
            np.frombuffer(buf, dtype=dtype, count=count, offset=c.pos)
            if count
            else np.empty(0, dtype)
        )
        variables[name] = arr.reshape(dims)
        c.pos += n_bytes
    aliases: dict[str, str] = {}
    if version >= 3:
        n_alias = c.unpack("I", "alias count")
        if n_alias * 6 > c.size - c.pos:  # two strings of >= 3 bytes each
            raise FormatError(f"{path}: {n_alias} aliases cannot fit in the file")
        for i in range(n_alias):
            alias = c.string(f"alias {i}")
            aliases[alias] = c.string(f"target of alias {alias}")
    resolved = _resolve_aliases(path, variables, aliases)
    return CT2Model(path, version, spec, revision, variables, aliases, c.size - c.pos, resolved)


def _resolve_aliases(path: str, variables: dict, aliases: dict[str, str]) -> dict[str, str]:
    """Every alias's stored variable, in one pass over the chains (each link followed once)."""
    out: dict[str, str] = {}
    for alias in aliases:
        chain: dict[str, None] = {}  # ordered, with O(1) membership
        name = alias
        while name not in variables and name not in out:
            if name not in aliases or name in chain:
                raise FormatError(
                    f"{path}: alias {alias!r:.200} -> {aliases[alias]!r:.200} names no stored "
                    "variable"
                )
            chain[name] = None
            name = aliases[name]
        target = name if name in variables else out[name]
        for link in chain:
            out[link] = target
    return out


# --- Whisper: CTranslate2 WhisperSpec names -> transformers' WhisperForConditionalGeneration names


def _layer_count(ct2: CT2Model, prefix: str) -> int:
    """Layers 0..n-1 that have variables under `prefix/layer_i/` (one pass over the names)."""
    start = f"{prefix}/layer_"
    seen = set()
    for k in ct2.variables:
        if k.startswith(start):
            index, sep, _ = k[len(start) :].partition("/")
            if sep and index.isascii() and index.isdigit() and (index == "0" or index[0] != "0"):
                seen.add(int(index))
    n = 0
    while n in seen:
        n += 1
    return n


def whisper_config_from_ct2(ct2: CT2Model, extra: dict | None = None) -> dict:
    """A transformers-style WhisperConfig dict read off the variable shapes."""
    if ct2.spec not in ("WhisperSpec", ""):
        raise UnsupportedError(f"{ct2.path}: spec {ct2.spec!r} is not a Whisper model")
    try:
        vocab, d_model = _dims(ct2, "decoder/embeddings/weight", 2)
        n_mels = _dims(ct2, "encoder/conv1/weight", 3)[1]
        enc_ffn = _dims(ct2, "encoder/layer_0/ffn/linear_0/weight", 2)[0]
        dec_ffn = _dims(ct2, "decoder/layer_0/ffn/linear_0/weight", 2)[0]
        src_pos = _dims(ct2, "encoder/position_encodings/encodings", 2)[0]
        tgt_pos = _dims(ct2, "decoder/position_encodings/encodings", 2)[0]
    except KeyError as e:
        raise FormatError(f"{ct2.path}: not a Whisper model, missing {e.args[0]}") from None
    act = ct2.scalar("decoder/activation", 3)
    if act != 3:
        raise UnsupportedError(f"{ct2.path}: activation id {act} (Whisper uses 3, exact GELU)")
    cfg = {
        "model_type": "whisper",
        "vocab_size": int(vocab),
        "num_mel_bins": int(n_mels),
        "d_model": int(d_model),
        "encoder_layers": _layer_count(ct2, "encoder"),
        "decoder_layers": _layer_count(ct2, "decoder"),
        "encoder_attention_heads": int(ct2.scalar("encoder/num_heads", 0)),
        "decoder_attention_heads": int(ct2.scalar("decoder/num_heads", 0)),
        "encoder_ffn_dim": int(enc_ffn),
        "decoder_ffn_dim": int(dec_ffn),
        "max_source_positions": int(src_pos),
        "max_target_positions": int(tgt_pos),
    }
    if not cfg["encoder_attention_heads"] or not cfg["decoder_attention_heads"]:
        raise FormatError(f"{ct2.path}: missing encoder/num_heads or decoder/num_heads")
    for side in ("encoder", "decoder"):
        heads = cfg[f"{side}_attention_heads"]
        if heads < 1 or d_model % heads:
            raise FormatError(
                f"{ct2.path}: {side}/num_heads {heads} does not divide d_model {d_model}"
            )
    # The weights these sizes imply must be in the file: a model is never built bigger than
    # what it stores (zero-size variables cannot stand for layers).
    e, d = cfg["encoder_layers"], cfg["decoder_layers"]
    implied = (
        e * (4 * d_model + 2 * enc_ffn) * d_model
        + d * (8 * d_model + 2 * dec_ffn) * d_model
        + (vocab + src_pos + tgt_pos) * d_model
    )
    stored = sum(a.size for a in ct2.variables.values())
    if implied > stored:
        raise FormatError(
            f"{ct2.path}: its shapes imply a Whisper model of {implied} weights "
            f"({e} encoder and {d} decoder layers of width {d_model}) but it stores {stored}"
        )
    if extra:
        if "suppress_ids" in extra:
            cfg["suppress_tokens"] = list(extra["suppress_ids"])
        if "suppress_ids_begin" in extra:
            cfg["begin_suppress_tokens"] = list(extra["suppress_ids_begin"])
        if "lang_ids" in extra:
            cfg["lang_ids"] = list(extra["lang_ids"])
        if "alignment_heads" in extra:
            cfg["alignment_heads"] = [list(h) for h in extra["alignment_heads"]]
    return cfg


def _dims(ct2: CT2Model, name: str, rank: int) -> tuple[int, ...]:
    """The shape of a variable that sizes the model: `rank` dims, none of them zero."""
    shape = ct2[name].shape
    if len(shape) != rank or 0 in shape:
        raise FormatError(
            f"{ct2.path}: {name} should have {rank} non-zero dimensions, it has shape {shape}"
        )
    return shape


_LN = {"gamma": "weight", "beta": "bias"}


def whisper_state_dict(ct2: CT2Model, dtype=np.float32) -> dict[str, np.ndarray]:
    """HF-named float weights (``model.encoder.layers.0.self_attn.q_proj.weight`` ...).

    Fused projections are split: self-attention linear_0 is [q; k; v], cross-attention
    linear_1 is [k; v]. HF's k_proj has no bias; CTranslate2 stores zeros there (any constant
    key bias would cancel in the softmax anyway), so it is dropped.
    """
    f = lambda name: ct2.float_array(name, dtype)  # noqa: E731
    sd: dict[str, np.ndarray] = {}

    def ln(src: str, dst: str) -> None:
        for a, b in _LN.items():
            sd[f"{dst}.{b}"] = f(f"{src}/{a}")

    def lin(src: str, dst: str) -> None:
        sd[f"{dst}.weight"] = f(f"{src}/weight")
        sd[f"{dst}.bias"] = f(f"{src}/bias")

    def split(src: str, dsts: list[str]) -> None:
        w, b = f(f"{src}/weight"), f(f"{src}/bias")
        n = len(dsts)
        if w.shape[0] % n:
            raise FormatError(f"{ct2.path}: {src}/weight rows {w.shape[0]} do not split in {n}")
        for dst, wi, bi in zip(dsts, np.split(w, n), np.split(b, n)):
            sd[f"{dst}.weight"] = np.ascontiguousarray(wi)
            if not dst.endswith("k_proj"):
                sd[f"{dst}.bias"] = np.ascontiguousarray(bi)

    def block(src: str, dst: str, cross: bool) -> None:
        ln(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        split(f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}_proj" for p in "qkv"])
        lin(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
        if cross:
            ln(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
            lin(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
            split(f"{src}/attention/linear_1", [f"{dst}.encoder_attn.{p}_proj" for p in "kv"])
            lin(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
        ln(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
        lin(f"{src}/ffn/linear_0", f"{dst}.fc1")
        lin(f"{src}/ffn/linear_1", f"{dst}.fc2")

    try:
        for conv in ("conv1", "conv2"):
            lin(f"encoder/{conv}", f"model.encoder.{conv}")
        sd["model.encoder.embed_positions.weight"] = f("encoder/position_encodings/encodings")
        for i in range(_layer_count(ct2, "encoder")):
            block(f"encoder/layer_{i}", f"model.encoder.layers.{i}", cross=False)
        ln("encoder/layer_norm", "model.encoder.layer_norm")
        sd["model.decoder.embed_tokens.weight"] = f("decoder/embeddings/weight")
        sd["model.decoder.embed_positions.weight"] = f("decoder/position_encodings/encodings")
        for i in range(_layer_count(ct2, "decoder")):
            block(f"decoder/layer_{i}", f"model.decoder.layers.{i}", cross=True)
        ln("decoder/layer_norm", "model.decoder.layer_norm")
    except KeyError as e:
        raise FormatError(f"{ct2.path}: Whisper variable {e.args[0]!r} is missing") from None
    if "decoder/projection/weight" in ct2 and ct2.resolve(
        "decoder/projection/weight"
    ) != ct2.resolve("decoder/embeddings/weight"):
        sd["proj_out.weight"] = f("decoder/projection/weight")
    return sd


__all__ = [
    "CT2Model", "CT2_DTYPES", "read_ct2", "parse_ct2", "whisper_config_from_ct2",
    "whisper_state_dict",
]  # fmt: skip
