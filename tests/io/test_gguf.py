"""GGUF reader/writer against gguf.GGUFReader and the real SmolLM2 file."""

from __future__ import annotations

import struct

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as T

from ember.errors import DTypeError, FormatError
from ember.io import GGUFTensorInfo, open_gguf, save_gguf
from ember.io.gguf import infer_gguf_type, qtype_nbytes

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def smollm(smollm_gguf):
    return open_gguf(smollm_gguf)


@pytest.fixture(scope="module")
def reference(smollm_gguf):
    return gguf.GGUFReader(smollm_gguf)


def raw_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def test_real_file_metadata_matches_gguf_reader(smollm, reference):
    fields = {k: f for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert list(smollm.metadata) == list(fields)
    for key, field in fields.items():
        assert smollm.metadata[key] == field.contents(), key
        t = field.types
        want = t[0].name if len(t) == 1 else f"ARRAY[{t[-1].name}]"
        assert smollm.metadata_types[key] == want, key
    assert smollm.version == 3 and smollm.alignment == reference.alignment == 32
    assert smollm.data_offset == reference.data_offset
    assert smollm.metadata["general.architecture"] == "llama"
    assert len(smollm.metadata["tokenizer.ggml.tokens"]) == 49152


def test_real_file_tensors_match_gguf_reader(smollm, reference):
    assert list(smollm.tensors) == [t.name for t in reference.tensors]
    for ref in reference.tensors:
        t = smollm.tensors[ref.name]
        assert t.qtype == ref.tensor_type.name
        assert t.shape == tuple(reversed(ref.shape.tolist()))  # torch order
        assert t.offset == ref.data_offset and t.nbytes == ref.n_bytes
        assert t.data.shape == ref.data.shape and not t.data.flags.writeable
        assert np.array_equal(raw_bytes(t.data), raw_bytes(ref.data)), ref.name
    emb = smollm.tensors["token_embd.weight"]
    assert (emb.qtype, emb.shape, emb.data.shape) == ("Q8_0", (49152, 576), (49152, 612))
    assert emb.is_quantized and emb.n_elements == 49152 * 576
    norm = smollm.tensors["blk.0.attn_norm.weight"]
    assert norm.data.dtype == np.float32 and not norm.is_quantized


def test_real_file_roundtrips_byte_for_byte(smollm, smollm_gguf, tmp_path):
    out = tmp_path / "copy.gguf"
    save_gguf(out, smollm.metadata, smollm.tensors, metadata_types=smollm.metadata_types)
    assert out.read_bytes() == smollm_gguf.read_bytes()


def test_writer_every_type(tmp_path):
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    tensors = {
        "f32": x,
        "f16": x.astype(np.float16),
        "bf16": x.astype(ml_dtypes.bfloat16),
        "f64": RNG.standard_normal((2, 3, 4)),
        "i8": RNG.integers(-128, 127, (5,), dtype=np.int8),
        "i16": RNG.integers(-999, 999, (2, 2), dtype=np.int16),
        "i32": RNG.integers(-999, 999, (7,), dtype=np.int32),
        "i64": RNG.integers(-999, 999, (1, 2, 3, 4), dtype=np.int64),
        "scalar": np.float32(2.5),
        "transposed": x.T,  # non-contiguous input
        "q8_0": (gguf.quants.quantize(x, T.Q8_0), "Q8_0", (3, 64)),
        "q4_1": (gguf.quants.quantize(x, T.Q4_1).tobytes(), "Q4_1", (3, 64)),
        "q4_k": (RNG.integers(0, 255, 2 * 144, dtype=np.uint8), "Q4_K", (2, 256)),
        "q6_k": (RNG.integers(0, 255, (4, 210), dtype=np.uint8), "Q6_K", (2, 2, 256)),
    }
    path = tmp_path / "t.gguf"
    meta = {"general.architecture": "llama", "general.name": "tiny"}
    save_gguf(path, meta, tensors)
    f = open_gguf(path)
    ref = gguf.GGUFReader(path)
    assert f.metadata == meta
    for r in ref.tensors:
        t = f.tensors[r.name]
        assert t.qtype == r.tensor_type.name and np.array_equal(
            raw_bytes(t.data), raw_bytes(r.data)
        )
    for name in ("f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64", "transposed"):
        want = tensors[name]
        got = f.tensors[name]
        assert got.data.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got.data, want), name
    assert f.tensors["scalar"].shape == (1,) and f.tensors["scalar"].data[0] == 2.5
    q = f.tensors["q8_0"]
    assert (q.qtype, q.shape, q.data.shape) == ("Q8_0", (3, 64), (3, 68))
    assert np.array_equal(gguf.quants.dequantize(q.data, T.Q8_0),
                          gguf.quants.dequantize(tensors["q8_0"][0], T.Q8_0))  # fmt: skip
    assert f.tensors["q4_k"].data.shape == (2, 144)
    assert f.tensors["q6_k"].shape == (2, 2, 256) and f.tensors["q6_k"].nbytes == 4 * 210
    assert f.tensors["q4_1"].nbytes == qtype_nbytes("Q4_1", (3, 64)) == 3 * 2 * 20
    # offsets are aligned and tensors come back in the order given
    assert list(f.tensors) == list(tensors)
    assert all((t.offset - f.data_offset) % 32 == 0 for t in f.tensors.values())


def test_metadata_types_and_inference(tmp_path):
    meta = {
        "u8": 1, "i8": -1, "u16": 2, "i16": -2, "u32": 3, "i32": -3, "u64": 2**40, "i64": -(2**40),
        "f32": 0.5, "f64": 0.25, "bool": True, "str": "héllo", "empty_str": "",
        "arr_i32": [1, -2, 3], "arr_str": ["a", "", "ü"], "arr_f32": [0.5, 1.5],
        "arr_bool": [True, False], "arr_u8_empty": [], "nested": [[1, 2], [3]],
        "np_u16": np.uint16(7), "np_arr": np.array([1.5, 2.5], np.float32),
    }  # fmt: skip
    types = {
        "u8": "UINT8", "i8": "INT8", "u16": "UINT16", "i16": "INT16", "i32": "INT32",
        "u64": "UINT64", "f64": "FLOAT64", "arr_u8_empty": "ARRAY[UINT8]",
        "nested": "ARRAY[ARRAY[INT32]]",
    }  # fmt: skip
    path = tmp_path / "m.gguf"
    save_gguf(path, meta, {}, metadata_types=types)
    f = open_gguf(path)
    want_types = {
        **types, "u32": "UINT32", "i64": "INT64", "f32": "FLOAT32", "bool": "BOOL",
        "str": "STRING", "empty_str": "STRING", "arr_i32": "ARRAY[INT32]",
        "arr_str": "ARRAY[STRING]", "arr_f32": "ARRAY[FLOAT32]", "arr_bool": "ARRAY[BOOL]",
        "np_u16": "UINT16", "np_arr": "ARRAY[FLOAT32]",
    }  # fmt: skip
    assert f.metadata_types == want_types
    assert f.metadata == {**meta, "np_u16": 7, "np_arr": [1.5, 2.5]}
    assert f.tensors == {}
    ref = gguf.GGUFReader(path)
    assert ref.fields["arr_str"].contents() == ["a", "", "ü"]
    assert ref.fields["u64"].contents() == 2**40
    # and the types survive a second round trip
    save_gguf(tmp_path / "m2.gguf", f.metadata, {}, metadata_types=f.metadata_types)
    assert (tmp_path / "m2.gguf").read_bytes() == path.read_bytes()
    assert infer_gguf_type(5) == "UINT32" and infer_gguf_type([5]) == "ARRAY[INT32]"


def test_writer_errors(tmp_path):
    path = tmp_path / "e.gguf"
    with pytest.raises(DTypeError, match="bool"):
        save_gguf(path, {}, {"b": np.zeros(2, bool)})
    with pytest.raises(ValueError, match="takes 68 bytes, got 67"):
        save_gguf(path, {}, {"q": (np.zeros(67, np.uint8), "Q8_0", (1, 64))})
    with pytest.raises(DTypeError, match="multiples of 32"):
        save_gguf(path, {}, {"q": (np.zeros(34, np.uint8), "Q8_0", (33,))})
    with pytest.raises(DTypeError, match="unknown ggml type 'Q9'"):
        save_gguf(path, {}, {"q": (b"", "Q9", (1,))})
    with pytest.raises(ValueError, match="'k' cannot be stored as UINT8"):
        save_gguf(path, {"k": 300}, {}, metadata_types={"k": "UINT8"})
    with pytest.raises(TypeError, match="one type"):
        save_gguf(path, {"k": [1, "a"]}, {})
    with pytest.raises(ValueError, match="at most 4 dims"):
        save_gguf(path, {}, {"t": np.zeros((1, 1, 1, 1, 1), np.float32)})
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_alignment_and_v2(tmp_path):
    path = tmp_path / "a.gguf"
    save_gguf(path, {}, {"a": np.ones(3, np.float32), "b": np.ones(5, np.int8)}, alignment=64)
    f = open_gguf(path)
    assert f.alignment == 64 and f.metadata_types["general.alignment"] == "UINT32"
    assert f.data_offset % 64 == 0 and (f.tensors["b"].offset - f.data_offset) == 64
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<I", 2)  # v2 and v3 share one layout
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(raw))
    g = open_gguf(v2)
    assert g.version == 2 and np.array_equal(g.get("a"), np.ones(3, np.float32))
    assert gguf.GGUFReader(v2).tensors[0].name == "a"


def test_tensor_info_is_a_plain_record(smollm):
    t = smollm.tensors["output_norm.weight"]
    assert isinstance(t, GGUFTensorInfo)
    assert (t.name, t.qtype, t.shape) == ("output_norm.weight", "F32", (576,))
    assert smollm.get("output_norm.weight") is t.data


# ------------------------------------------------------------------------------ hostile files


def gstr(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name: str, ne: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    dims = b"".join(struct.pack("<Q", d) for d in ne)
    return gstr(name) + struct.pack("<I", len(ne)) + dims + struct.pack("<IQ", ggml_type, offset)


def build(kvs=(), tis=(), data=b"", version=3, n_kv=None, n_t=None, align=32) -> bytes:
    nt = len(tis) if n_t is None else n_t
    nk = len(kvs) if n_kv is None else n_kv
    out = b"GGUF" + struct.pack("<IQQ", version, nt, nk) + b"".join(kvs) + b"".join(tis)
    return out + bytes(-len(out) % align) + data


U32 = lambda v: struct.pack("<I", v)  # noqa: E731
F32_2 = tinfo("t", (2,))

HOSTILE = [
    (b"GGUX" + bytes(20), "expected the magic bytes b'GGUF', found b'GGUX'"),
    (build(version=1), "expected GGUF version 2 or 3, found 1"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    (build(n_kv=2**63), "claims 9223372036854775808 key-value pairs"),
    (build(n_t=2**40), "claims 1099511627776 tensor infos"),
    (build([gstr("kkkkk")], align=1), "file ends inside type of 'kkkkk'"),
    (build([struct.pack("<Q", 2**60) + b"key" + bytes(10)]), "file ends inside metadata key"),
    (build([kv("k", 99, bytes(8))]), "'k': unknown metadata value type 99"),
    (build([kv("k", 8, struct.pack("<Q", 2**62))]), "file ends inside value of 'k': needs"),
    (build([kv(b"\xff", 4, U32(1))]), "metadata key is not valid UTF-8"),
    (build([kv("k", 8, gstr(b"\xc3"))]), "value of 'k' is not valid UTF-8"),
    (build([kv("k", 9, U32(4) + struct.pack("<Q", 2**50))]), "claims 1125899906842624 elements"),
    (build([kv("k", 9, U32(8) + struct.pack("<Q", 2**50))]), "claims 1125899906842624 strings"),
    (
        build([kv("k", 9, U32(8) + struct.pack("<Q", 2) + gstr("a") + struct.pack("<Q", 99))]),
        "string 1 of 'k' \\(99 bytes\\) runs past the end",
    ),
    (build([kv("k", 9, U32(77) + struct.pack("<Q", 0))]), "unknown array element type 77"),
    (
        build([kv("k", 9, (U32(9) + struct.pack("<Q", 1)) * 12 + U32(4) + bytes(8))]),
        "nested deeper than 8",
    ),
    (build([kv("k", 4, U32(1)), kv("k", 4, U32(1))]), "'k' appears twice"),
    (build([kv("general.alignment", 4, U32(24))]), "power of two, found 24"),
    (build([kv("general.alignment", 4, U32(0))]), "power of two, found 0"),
    (build([kv("general.alignment", 10, bytes(8))]), "must be a UINT32"),
    (build(tis=[tinfo("t", (1, 1, 1, 1, 1))]), "has 5 dims, at most 4"),
    (build(tis=[tinfo("t", (2,), ggml_type=4)], data=bytes(32)), "unknown ggml type id 4"),
    (build(tis=[tinfo("t", (2,), ggml_type=999)], data=bytes(32)), "unknown ggml type id 999"),
    (build(tis=[tinfo("t", (2**32, 2**32))], data=bytes(32)), "too large for any array"),
    (build(tis=[tinfo("t", (2**63 + 5,))], data=bytes(32)), "ne=\\[9223372036854775813\\]"),
    (build(tis=[tinfo("t", (2**31, 2**31, 0))], data=b""), "too large"),
    (build(tis=[tinfo("t", (2**20,))], data=bytes(32)), "bytes 0..4194304 of the data section"),
    (build(tis=[tinfo("t", (2,), offset=2**64 - 32)], data=bytes(32)), "lie past its end"),
    (build(tis=[tinfo("t", (2,), offset=4)], data=bytes(64)), "offset 4 is not a multiple of 32"),
    (build(tis=[tinfo("t", (33,), ggml_type=8)], data=bytes(64)), "ne\\[0\\]=33"),
    (build(tis=[F32_2, F32_2], data=bytes(32)), "tensor name 't' appears twice"),
    (build(tis=[tinfo("a", (16,)), tinfo("b", (2,), offset=32)], data=bytes(64)), "overlap"),
    (build(tis=[F32_2])[:-8], "ends inside|past its end"),
]


@pytest.mark.parametrize("raw,match", HOSTILE)
def test_hostile(tmp_path, raw, match):
    path = tmp_path / "h.gguf"
    path.write_bytes(raw)
    with pytest.raises(FormatError, match=match) as e:
        open_gguf(path)
    assert str(path) in str(e.value)


def test_truncated_real_header(smollm_gguf, tmp_path):
    head = smollm_gguf.read_bytes()[:2_000_000]
    for cut in (3, 10, 23, 1000, 500_000, 1_785_000, 1_800_000):
        p = tmp_path / "cut.gguf"
        p.write_bytes(head[:cut])
        with pytest.raises(FormatError):
            open_gguf(p)


def test_minimal_files_open(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(build())
    assert open_gguf(p).tensors == {}
    p.write_bytes(build(tis=[tinfo("z", (0, 5))]))  # zero-size tensor needs no data
    z = open_gguf(p).tensors["z"]
    assert z.shape == (5, 0) and z.data.shape == (5, 0) and z.nbytes == 0


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.3.attn_q.weight"])
def test_real_blocks_feed_ember_quant(smollm, name):
    from ember.quant import dequantize

    t = smollm.tensors[name]
    rows = t.data[:64]  # a slice of raw block rows is itself valid block data
    want = gguf.quants.dequantize(rows, T[t.qtype])
    got = dequantize(rows, t.qtype, (64, t.shape[1]))
    assert got.shape == want.shape == (64, t.shape[1])
    assert np.allclose(got, want, rtol=0, atol=1e-6)
