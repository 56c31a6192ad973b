"""The CTranslate2 model.bin reader: the real tiny.en file, synthetic files, hostile files."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.errors import EmberError, FormatError, UnsupportedError
from ember.models.whisper import default_model_dir
from ember.models.whisper.ct2 import (
    parse_ct2,
    read_ct2,
    whisper_config_from_ct2,
    whisper_state_dict,
)

TYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def pack_ct2(variables: dict, aliases: dict | None = None, version: int = 6) -> bytes:
    """A model.bin as CTranslate2's model_spec.py writes it (version < 4: item-size records)."""
    out = [struct.pack("<I", version)]
    if version >= 2:
        out += [_s("WhisperSpec"), struct.pack("<I", 3)]
    out.append(struct.pack("<I", len(variables)))
    for name, arr in variables.items():
        arr = np.asarray(arr)
        out += [_s(name), struct.pack("<B", arr.ndim), struct.pack(f"<{arr.ndim}I", *arr.shape)]
        if version >= 4:
            out.append(struct.pack("<BI", TYPE_IDS[str(arr.dtype)], arr.nbytes))
        else:
            out.append(struct.pack("<BI", arr.dtype.itemsize, arr.size))
        out.append(arr.tobytes())
    if version >= 3:
        aliases = aliases or {}
        out.append(struct.pack("<I", len(aliases)))
        for a, t in aliases.items():
            out += [_s(a), _s(t)]
    return b"".join(out)


@pytest.fixture(scope="module")
def tiny():
    return read_ct2(default_model_dir() / "model.bin")


def test_real_file_header_and_storage(tiny):
    assert (tiny.binary_version, tiny.spec, tiny.revision) == (6, "WhisperSpec", 3)
    assert len(tiny.variables) == 148 and tiny.trailing_bytes == 0
    assert tiny.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    summary = tiny.summary()
    print("tiny.en model.bin stores:", summary)  # float16 weights + int8/int16 scalar flags
    assert summary["float16"] == (139, 75529728)
    assert {k for k in summary} == {"float16", "int8", "int16"}
    assert all(tiny[k].ndim == 0 for k, v in tiny.variables.items() if v.dtype.kind == "i")
    assert not any(k.endswith("_scale") for k in tiny.variables)  # nothing is quantized
    w = tiny["decoder/projection/weight"]
    assert w.shape == (51864, 384) and w.dtype == np.float16 and not w.flags.owndata  # mapped


def test_real_file_config(tiny):
    cfg = whisper_config_from_ct2(tiny)
    assert cfg == {
        "model_type": "whisper",
        "vocab_size": 51864,
        "num_mel_bins": 80,
        "d_model": 384,
        "encoder_layers": 4,
        "decoder_layers": 4,
        "encoder_attention_heads": 6,
        "decoder_attention_heads": 6,
        "encoder_ffn_dim": 1536,
        "decoder_ffn_dim": 1536,
        "max_source_positions": 1500,
        "max_target_positions": 448,
    }


def test_fused_projections_split_onto_hf_names(tiny):
    sd = whisper_state_dict(tiny)
    assert len(sd) == 167  # transformers' 168 keys minus the tied proj_out.weight
    qkv = tiny["encoder/layer_2/self_attention/linear_0/weight"].astype(np.float32)
    for i, p in enumerate("qkv"):
        got = sd[f"model.encoder.layers.2.self_attn.{p}_proj.weight"]
        np.testing.assert_array_equal(got, qkv[384 * i : 384 * (i + 1)])
    kv = tiny["decoder/layer_1/attention/linear_1/weight"].astype(np.float32)
    np.testing.assert_array_equal(sd["model.decoder.layers.1.encoder_attn.k_proj.weight"], kv[:384])
    np.testing.assert_array_equal(sd["model.decoder.layers.1.encoder_attn.v_proj.weight"], kv[384:])
    # HF's k_proj has no bias; CTranslate2 stores zeros there, so dropping it is exact
    for i in range(4):
        b = tiny[f"decoder/layer_{i}/self_attention/linear_0/bias"]
        assert not b[384:768].any()
        assert not tiny[f"decoder/layer_{i}/attention/linear_1/bias"][:384].any()
    assert "model.encoder.layers.0.self_attn.k_proj.bias" not in sd
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in sd.values())


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_round_trip_every_dtype(version):
    rng = np.random.default_rng(version)
    variables = {
        "a/f32": rng.standard_normal((3, 5)).astype(np.float32),
        "a/i8": rng.integers(-127, 128, (4, 2)).astype(np.int8),
        "a/i8_scale": np.array([2.0, 4.0, 0.5, 1.0], np.float32),
        "a/i16": rng.integers(-999, 999, (7,)).astype(np.int16),
        "a/i16_scale": np.array(8.0, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "flag": np.array(1, np.int8),
    }
    if version >= 4:
        variables |= {
            "a/f16": rng.standard_normal((2, 3)).astype(np.float16),
            "a/bf16": rng.standard_normal((2, 2)).astype(ml_dtypes.bfloat16),
            "a/i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        }
    m = parse_ct2(pack_ct2(variables, {"b/alias": "a/f32", "c/chain": "b/alias"}, version))
    assert m.binary_version == version and m.spec == "WhisperSpec"
    for k, v in variables.items():
        assert m[k].dtype == v.dtype and m[k].shape == v.shape
        np.testing.assert_array_equal(m[k], v)
    np.testing.assert_array_equal(m["c/chain"], variables["a/f32"])
    deq = m.float_array("a/i8")
    want = variables["a/i8"].astype(np.float32) / variables["a/i8_scale"][:, None]
    np.testing.assert_allclose(deq, want)
    np.testing.assert_allclose(m.float_array("a/i16"), variables["a/i16"] / 8.0)
    assert m.scalar("flag") == 1 and m.scalar("missing", 7) == 7


def test_version_1_and_2_without_aliases():
    arr = np.arange(4, dtype=np.float32)
    for v in (1, 2):
        m = parse_ct2(pack_ct2({"x": arr}, version=v))
        np.testing.assert_array_equal(m["x"], arr)
        assert m.aliases == {}


def base_file() -> bytes:
    return pack_ct2(
        {"w": np.arange(6, dtype=np.float16).reshape(2, 3), "s": np.array(3, np.int16)},
        {"alias": "w"},
    )


def test_every_truncation_is_a_format_error():
    data = base_file()
    parse_ct2(data)
    for n in range(len(data)):
        with pytest.raises(FormatError):
            parse_ct2(data[:n])


def rec(name: str, dims, type_id: int, nbytes: int, payload: bytes = b"") -> bytes:
    return (
        _s(name)
        + struct.pack("<B", len(dims))
        + struct.pack(f"<{len(dims)}I", *dims)
        + struct.pack("<BI", type_id, nbytes)
        + payload
    )


def header(n_vars: int, version: int = 6) -> bytes:
    return struct.pack("<I", version) + _s("WhisperSpec") + struct.pack("<II", 3, n_vars)


@pytest.mark.parametrize(
    "data, err",
    [
        (struct.pack("<I", 7) + b"\0" * 32, UnsupportedError),  # future version
        (struct.pack("<I", 0), UnsupportedError),
        (header(0xFFFFFFFF), FormatError),  # absurd variable count
        # huge shape, small declared size: never allocated
        (header(1) + rec("w", [0xFFFFFFFF, 0xFFFFFFFF], 0, 16, b"\0" * 16), FormatError),
        # consistent but larger than the file
        (header(1) + rec("w", [1 << 20], 0, 4 << 20, b"\0" * 64), FormatError),
        (header(1) + rec("w", [2], 9, 8, b"\0" * 8), FormatError),  # unknown dtype id
        (header(1) + rec("w", [1] * 9, 0, 4, b"\0" * 4), FormatError),  # rank too big
        (header(2) + rec("w", [1], 0, 4, b"\0" * 4) * 2 + b"\0" * 4, FormatError),  # duplicate
        (
            header(1) + rec("w", [1], 0, 4, b"\0" * 4) + struct.pack("<I", 1) + _s("a") + _s("x"),
            FormatError,
        ),  # alias to nothing
        (struct.pack("<I", 6) + b"\x03\x00ab\x01", FormatError),  # string without NUL
        (struct.pack("<I", 6) + b"\x03\x00\xff\xfe\x00", FormatError),  # not UTF-8
        (struct.pack("<I", 6) + b"\x00\x00", FormatError),  # zero-length string
    ],
)
def test_hostile_headers(data, err):
    with pytest.raises(err):
        parse_ct2(data)


def test_read_ct2_errors(tmp_path):
    with pytest.raises(FormatError):
        read_ct2(tmp_path / "missing.bin")
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(FormatError):
        read_ct2(tmp_path)  # a directory means its model.bin
    (tmp_path / "model.bin").write_bytes(pack_ct2({"x": np.ones(2, np.float32)}))
    with pytest.raises(FormatError, match="not a Whisper model"):
        whisper_config_from_ct2(read_ct2(tmp_path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzzed_bytes_fail_cleanly(data):
    raw = bytearray(base_file())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        m = parse_ct2(bytes(raw[:cut]))
    except EmberError:
        return
    total = sum(v.nbytes for v in m.variables.values())
    assert total <= cut  # whatever parses is backed by bytes of the file
