"""Block layouts, numpy dequantize/quantize against gguf.quants and llama.cpp's reference."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from ember.errors import DTypeError, FormatError, ShapeError, UnsupportedError
from ember.quant import (
    FORMATS,
    SUPPORTED_TYPES,
    block_format,
    byte_shape,
    dequantize,
    nbytes_of,
    quantize_array,
)

from .conftest import random_blocks
from .llama_ref import quantize_q4_k_block, quantize_q6_k_block

ALL = list(SUPPORTED_TYPES)
GGUF_QUANTIZE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_table_matches_gguf():
    assert set(ALL) == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}  # fmt: skip
    for name, fmt in FORMATS.items():
        gt = GT[name]
        assert fmt.ggml_type == gt.value
        assert (fmt.block_size, fmt.type_size) == gguf.GGML_QUANT_SIZES[gt]
        assert block_format(gt) is fmt and block_format(name.lower()) is fmt
        assert block_format(int(gt)) is fmt


@pytest.mark.parametrize("qtype", ALL)
def test_dequantize_random_blocks_equal_gguf(qtype):
    rng = np.random.default_rng(hash(qtype) % 2**32)
    fmt = block_format(qtype)
    shape = (3, 5, 2 * fmt.block_size) if fmt.block_size > 1 else (3, 7, 5)
    n_blocks = int(np.prod(shape)) // fmt.block_size
    raw = random_blocks(rng, qtype, n_blocks)
    got = dequantize(raw.reshape(*shape[:-1], -1), qtype, shape)
    want = gguf_dequantize(raw.reshape(*shape[:-1], -1), GT[qtype])
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(bits(got), bits(want))


def test_dequantize_accepts_typed_raw_arrays():
    a = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(dequantize(a, "F32", (4, 6)), a)
    np.testing.assert_array_equal(dequantize(a.astype(np.float16), "F16", (4, 6)),
                                  a.astype(np.float16).astype(np.float32))  # fmt: skip
    assert dequantize(np.zeros(0, np.uint8), "Q4_K", (0, 256)).shape == (0, 256)


def _sample_rows(t, limit=256):
    data = np.asarray(t.data)
    return data[:limit] if data.ndim == 2 else data


def test_dequantize_every_smollm2_tensor(smollm2_reader):
    seen = set()
    for t in smollm2_reader.tensors:
        qtype = t.tensor_type.name
        data = _sample_rows(t)  # the 49152-row embedding: its first 256 rows
        shape = tuple(int(s) for s in t.shape[::-1])
        shape = (data.shape[0], *shape[1:]) if data.ndim == 2 else shape
        got = dequantize(data, qtype, shape)
        want = gguf_dequantize(data, t.tensor_type)
        np.testing.assert_array_equal(bits(got), bits(want.reshape(shape)), err_msg=t.name)
        seen.add(qtype)
    assert seen == {"F32", "Q4_1", "Q8_0"}


def _awkward_inputs(rng, block, rows=6):
    x = rng.standard_normal((rows, 3 * block)).astype(np.float32)
    x[0, :block] = 0  # all-zero block
    x[1, :block] = 0.75  # constant positive block
    x[1, block : 2 * block] = -1.25  # constant negative block
    x[2] *= 1e3
    x[3, :block] = np.round(x[3, :block] * 4) / 4  # ties in the rounding
    x[4, :block] = np.abs(x[4, :block])  # one-signed block
    return x


@pytest.mark.parametrize("qtype", GGUF_QUANTIZE)
def test_quantize_equals_gguf(qtype):
    rng = np.random.default_rng(7)
    x = _awkward_inputs(rng, 32).reshape(2, 3, 96)
    got = quantize_array(x, qtype)
    want = gguf_quantize(x, GT[qtype]).view(np.uint8).reshape(got.shape)
    assert got.shape == byte_shape(x.shape, qtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("qtype", "scalar_ref"), [("Q4_K", quantize_q4_k_block), ("Q6_K", quantize_q6_k_block)]
)
def test_k_quants_equal_llama_cpp_reference(qtype, scalar_ref):
    rng = np.random.default_rng(11)
    x = _awkward_inputs(rng, 256, rows=6)
    x[5] = rng.laplace(size=768).astype(np.float32) * 0.02
    got = quantize_array(x, qtype).reshape(-1, block_format(qtype).type_size)
    want = [scalar_ref(b) for b in x.reshape(-1, 256)]
    for i, w in enumerate(want):
        assert got[i].tobytes() == w, f"{qtype} super-block {i}"


def _ideal_rmse(x, group, levels, asymmetric):
    """Round-trip RMSE with unquantized float32 per-group scales (and mins)."""
    g = x.reshape(-1, group).astype(np.float64)
    if asymmetric:
        lo = np.minimum(g.min(1, keepdims=True), 0)
        d = (g.max(1, keepdims=True) - lo) / (levels - 1)
        q = np.clip(np.rint((g - lo) / np.where(d == 0, 1, d)), 0, levels - 1)
        r = q * d + lo
    else:
        d = np.abs(g).max(1, keepdims=True) / (levels // 2)
        q = np.clip(np.rint(g / np.where(d == 0, 1, d)), -(levels // 2), levels // 2 - 1)
        r = q * d
    return np.sqrt(((r - g) ** 2).mean())


@pytest.mark.parametrize(("qtype", "group", "levels", "asym", "slack"),
                         [("Q4_K", 32, 16, True, 1.0), ("Q6_K", 16, 64, False, 1.1)])  # fmt: skip
def test_k_quant_round_trip_near_float_scale_bound(qtype, group, levels, asym, slack):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((24, 512)) * rng.uniform(0.01, 2, (24, 1))).astype(np.float32)
    back = dequantize(quantize_array(x, qtype), qtype, x.shape)
    rmse = np.sqrt(((back.astype(np.float64) - x) ** 2).mean())
    # 6-bit scales cost a little; llama.cpp's scale search wins some of it back
    assert rmse <= slack * _ideal_rmse(x, group, levels, asym)
    assert rmse < {"Q4_K": 0.1, "Q6_K": 0.025}[qtype] * np.sqrt((x.astype(np.float64) ** 2).mean())


def test_quantize_round_trip_errors_are_small():
    x = np.random.default_rng(5).standard_normal((8, 256)).astype(np.float32)
    for qtype, tol in [("Q8_0", 0.01), ("Q4_0", 0.12), ("Q4_1", 0.1), ("F16", 1e-3)]:
        back = dequantize(quantize_array(x, qtype), qtype, x.shape)
        assert np.sqrt(((back - x) ** 2).mean()) < tol, qtype


def test_validation_errors():
    with pytest.raises(FormatError, match=r"Q4_0 tensor of shape \(2, 64\) takes 72 bytes"):
        dequantize(np.zeros(70, np.uint8), "Q4_0", (2, 64))
    with pytest.raises(ShapeError, match="not a multiple of the Q4_K block size 256"):
        dequantize(np.zeros(144, np.uint8), "Q4_K", (1, 128))
    with pytest.raises(ShapeError, match="block size 32"):
        quantize_array(np.zeros((2, 48), np.float32), "Q8_0")
    with pytest.raises(UnsupportedError, match="not supported"):
        block_format("Q7_X")
    with pytest.raises(UnsupportedError, match="quantizing to Q2_K is not implemented"):
        quantize_array(np.zeros(256, np.float32), "Q2_K")
    with pytest.raises(FormatError, match="C-contiguous"):
        dequantize(np.zeros((4, 36), np.uint8)[:, ::2], "Q8_0", (2, 32))
    with pytest.raises(DTypeError):
        quantize_array(np.array(["a"] * 32), "Q8_0")
    assert nbytes_of((3, 512), "Q6_K") == 3 * 2 * 210
