"""Each format module of ember.kernels.cpu.quant against its numpy reference (check_kernel),
the references against gguf, and the linear_q op that picks the kernels."""

import importlib

import gguf
import numpy as np
import pytest

import ember
from ember import config
from ember.errors import DTypeError, FormatError, ShapeError
from ember.kernels import registry
from ember.kernels.cpu.quant import KERNEL_TYPES, _common
from ember.ops.linalg import QLinear
from ember.quant import QTensor, quantize_array
from ember.quant.formats import QUANTIZE_TYPES
from tests.helpers import check_kernel
from tests.quant.conftest import random_blocks

FORMATS = list(KERNEL_TYPES)


def _module(qtype):
    return importlib.import_module(f"ember.kernels.cpu.quant.{qtype.lower()}")


def _kernels(qtype):
    return getattr(_module(qtype), qtype)


def _weight(rng, qtype, n, k) -> QTensor:
    """A QTensor of n rows: quantized random floats, or random blocks where ember has no encoder."""
    if qtype in QUANTIZE_TYPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[0] *= 30  # rows of very different scale
        return QTensor(quantize_array(w, qtype), qtype, (n, k))
    bs = _kernels(qtype).block_size
    return QTensor(random_blocks(rng, qtype, n * k // bs), qtype, (n, k))


def _registered(qtype):
    (k,) = [k for k in registry.kernels("linear_q") if k.name == f"linear_{qtype.lower()}"]
    return k


def _tol(want) -> dict:
    """float32 sums of K products in another order: atol scaled to the output."""
    finite = np.abs(want[np.isfinite(want)])
    return {"rtol": 2e-5, "atol": 2e-5 * max(float(finite.max()) if finite.size else 1.0, 1.0)}


@pytest.fixture(autouse=True)
def _float_kernels(float_activations):
    """These tests hold the float kernels to float tolerances: the int8-activation kernels
    (Q4_0/Q4_1, up to 16 rows of x) have their own bounds, in test_idot.py."""


@pytest.fixture(params=["serial", "static", "dynamic"])
def schedule(request, monkeypatch):
    """The thread split: one thread, static row chunks, chunks handed out one at a time."""
    if request.param != "serial":  # force the threaded paths on these small weights
        monkeypatch.setattr(_common, "SERIAL_MAX_BYTES", 0)
        dyn = 0 if request.param == "dynamic" else 1 << 40
        monkeypatch.setattr(_common, "DYNAMIC_MIN_BYTES", dyn)
    return request.param


def test_every_format_module_registers_one_linear_q_kernel():
    names = [k.name for k in registry.kernels("linear_q")]
    # (and kernels.cpu.quant.half one for BF16/F16 weights)
    assert sorted(names) == sorted([f"linear_{q.lower()}" for q in KERNEL_TYPES] + ["linear_half"])
    for q in KERNEL_TYPES:
        assert _common.FORMATS[q] is _kernels(q) and _registered(q).fn == _kernels(q).linear


@pytest.mark.parametrize("qtype", FORMATS)
def test_dequantize_reference_equals_gguf(qtype):
    rng = np.random.default_rng(3)
    raw = random_blocks(rng, qtype, 12)
    got = _module(qtype).dequantize_reference(raw)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(12, -1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("qtype", FORMATS)
def test_dequantize_rows_kernel_matches_reference(qtype):
    qk = _kernels(qtype)
    rng = np.random.default_rng(4)
    w3 = _weight(rng, qtype, 13, 2 * qk.block_size).blocks3d()
    cases = [(w3, 0, 13), (w3, 4, 9), (w3, 12, 13), (w3, 5, 5)]
    check_kernel(qk.dequantize_rows, qk.dequantize_rows_reference, cases, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n", [1, 3, 37, 70])  # rows: not a multiple of the 2-row step or chunk
def test_matvec_kernel_matches_reference(qtype, n, schedule):
    qk = _kernels(qtype)
    rng = np.random.default_rng(n)
    k = 2 * qk.block_size if qk.block_size > 32 else 512
    w3 = _weight(rng, qtype, n, k).blocks3d()
    x = rng.standard_normal(k).astype(np.float32)
    want = qk.matvec_reference(w3, x)
    exact = qk.dequantize_rows_reference(w3, 0, n).astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(want, exact, **_tol(exact))
    check_kernel(qk.matvec, qk.matvec_reference, [(w3, x)], **_tol(want))


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("m", [2, 3, 7, 8, 9, 16, 17, 40])  # matvec per row, then tiles
def test_matmul_t_kernel_matches_reference(qtype, m, schedule, monkeypatch):
    from ember.kernels.cpu.quant import packed

    monkeypatch.setattr(packed, "MIN_ROWS", 1 << 30)  # the BLAS tiles (test_packed: the GEMM's)
    qk = _kernels(qtype)
    monkeypatch.setattr(_common, "TILE_ELEMENTS", 3 * 512)  # prefill: a ragged last tile
    monkeypatch.setattr(_common, "THREAD_TILE_BYTES", 16 * 512 * 4)
    rng = np.random.default_rng(m)
    n, k = 37, 512
    w3 = _weight(rng, qtype, n, k).blocks3d()
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = qk.matmul_t_reference(w3, x)
    check_kernel(qk.matmul_t, qk.matmul_t_reference, [(w3, x)], **_tol(want))


def _linear_cases(rng, q, n, k):
    cases = []
    for shape in [(k,), (1, k), (2, k), (5, k), (16, k), (17, k), (2, 3, k), (1, 1, k)]:
        x = rng.standard_normal(shape).astype(np.float32)
        cases.append(((x,), {"qweight": q}))
        cases.append(((x, rng.standard_normal(n).astype(np.float32)), {"qweight": q}))
    x = rng.standard_normal((4, k)).astype(np.float32)
    x[1, 5] = np.nan  # one poisoned row of a small batch: only that output row is NaN
    cases.append(((x,), {"qweight": q}))
    cases.append(((x[1],), {"qweight": q}))
    return cases


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n", [1, 38, 75])
def test_linear_q_kernel_matches_reference(qtype, n, schedule):
    kernel = _registered(qtype)
    rng = np.random.default_rng(n + 1)
    k = 512
    q = _weight(rng, qtype, n, k)
    cases = _linear_cases(rng, q, n, k)
    runs = 0
    for args, kw in cases:
        want = kernel.reference(*[np.array(a) for a in args], **kw)
        runs += check_kernel(kernel, cases=[(args, kw)], **_tol(want))
    assert runs >= 2 * len(cases)  # every case also ran on a non-contiguous x (and bias)


@pytest.mark.parametrize("qtype", FORMATS)
def test_inf_in_x_gives_non_finite_rows_as_the_reference(qtype):
    """Q4_0/Q4_1 fold the offset into per-lane sums of x, so inf - inf can be NaN where BLAS
    gives inf: the kernel promises non-finite exactly where the reference is, not which one."""
    kernel = _registered(qtype)
    rng = np.random.default_rng(7)
    q = _weight(rng, qtype, 9, 512)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[0, 3] = np.inf
    x[2, 100] = -np.inf
    got, want = kernel.fn(x, qweight=q), kernel.reference(x, qweight=q)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[1], want[1], **_tol(want[1]))
    assert not np.isfinite(got[0]).any() and np.isfinite(got[1]).all()


@pytest.mark.parametrize("qtype", FORMATS)
def test_kernels_refuse_hostile_operands(qtype):
    qk = _kernels(qtype)
    rng = np.random.default_rng(5)
    k = 2 * qk.block_size
    q = _weight(rng, qtype, 4, k)
    w3 = q.blocks3d()
    with pytest.raises(ShapeError, match="x must be"):
        qk.matvec(w3, np.zeros(k - qk.block_size, np.float32))  # one block short
    with pytest.raises(ShapeError, match="x must be"):
        qk.matmul_t(w3, np.zeros((3, k + qk.block_size), np.float32))  # one block too many
    with pytest.raises(ShapeError, match="1-d"):
        qk.matvec(w3, np.zeros((1, k), np.float32))
    with pytest.raises(ShapeError, match="view of"):
        qk.matvec(w3.reshape(4, -1), np.zeros(k, np.float32))  # 2-d bytes
    with pytest.raises(ShapeError, match="view of"):
        qk.matvec(w3[:, :, 1:], np.zeros(k, np.float32))  # bytes per block wrong
    with pytest.raises(DTypeError):
        qk.matvec(w3.view(np.int8), np.zeros(k, np.float32))
    with pytest.raises(DTypeError):
        qk.matvec(w3, np.zeros(k, np.complex64))
    with pytest.raises(ShapeError, match="row range"):
        qk.dequantize_rows(w3, 3, 5)
    with pytest.raises(ShapeError, match="out must be"):
        qk.dequantize_rows(w3, 0, 2, out=np.empty((2, k - 1), np.float32))
    with pytest.raises(ShapeError):
        _registered(qtype).fn(np.zeros((2, k + qk.block_size), np.float32), qweight=q)
    q.data = q.data[: -qk.type_size]  # a block of the weight gone after construction
    with pytest.raises(FormatError):
        q.matmul_t(np.zeros(k, np.float32))
    with pytest.raises(ShapeError):
        ember.nn.functional.linear(ember.zeros(2, k - qk.block_size), q)


@pytest.mark.parametrize("qtype", FORMATS)
def test_linear_picks_the_kernel_also_while_recording_a_graph(qtype, monkeypatch):
    rng = np.random.default_rng(11)
    n, k = 23, 512
    q = _weight(rng, qtype, n, k)
    x = rng.standard_normal((3, 4, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    w = q.dequantize()
    want = x @ w.T + b

    def no_forward(self, *a, **kw):
        raise AssertionError("QLinear.forward ran although a kernel applies")

    monkeypatch.setattr(QLinear, "forward", no_forward)
    xe = ember.from_numpy(x).requires_grad_()
    be = ember.from_numpy(b).requires_grad_()
    out = ember.nn.functional.linear(xe, q, be)
    np.testing.assert_allclose(out.detach().numpy(), want, **_tol(want))
    g = rng.standard_normal(want.shape).astype(np.float32)
    monkeypatch.setattr(QLinear, "ROW_BLOCK_ELEMENTS", 5 * k)  # backward in row blocks of 5
    out.backward(ember.from_numpy(g))
    gx = g.reshape(-1, n) @ w
    np.testing.assert_allclose(xe.grad.numpy(), gx.reshape(x.shape), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(be.grad.numpy(), g.reshape(-1, n).sum(0), rtol=1e-5, atol=1e-4)
    # QTensor.matmul_t goes through the same kernel
    np.testing.assert_allclose(q.matmul_t(x), want - b, **_tol(want))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K", "Q5_0", "F16"])
def test_reference_forward_decodes_row_blocks(qtype, monkeypatch):
    """EMBER_KERNELS=reference (and formats without a kernel): QLinear.forward, row blocks."""
    monkeypatch.setattr(config, "KERNELS", "reference")
    monkeypatch.setattr(QLinear, "ROW_BLOCK_ELEMENTS", 4 * 256)  # 4 rows a block: a ragged last
    calls = []
    real = QTensor.dequantize_rows

    def spy(self, r0, r1, out=None):
        calls.append(r1 - r0)
        return real(self, r0, r1, out)

    monkeypatch.setattr(QTensor, "dequantize_rows", spy)
    rng = np.random.default_rng(12)
    n, k = 10, 256
    q = _weight(rng, qtype, n, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    xe = ember.from_numpy(x).requires_grad_()
    out = ember.nn.functional.linear(xe, q)
    want = x @ q.dequantize().T
    np.testing.assert_allclose(out.detach().numpy(), want, **_tol(want))
    assert calls == [4, 4, 2]
    out.sum().backward()
    np.testing.assert_allclose(xe.grad.numpy(), np.ones((2, n)) @ q.dequantize(), rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    assert calls == [4, 4, 2] * 2
    bf = ember.nn.functional.linear(ember.from_numpy(x).bfloat16(), q)  # no kernel: forward
    assert bf.dtype is ember.bfloat16 and tuple(bf.shape) == (2, n)
    np.testing.assert_allclose(q.matmul_t(x), want, **_tol(want))


def test_without_numba_the_references_serve(monkeypatch):
    from ember.kernels.cpu.quant import q4_0

    monkeypatch.setattr(q4_0.Q4_0, "_mv", None)  # would raise if called
    monkeypatch.setattr(registry.Kernel, "applies", lambda self, a, kw: False)
    monkeypatch.setattr(_common, "have_numba", lambda: False)
    rng = np.random.default_rng(6)
    q = _weight(rng, "Q4_0", 5, 64)
    x = rng.standard_normal(64).astype(np.float32)
    want = q.dequantize() @ x
    np.testing.assert_allclose(q.matmul_t(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(q4_0.Q4_0.matvec(q.blocks3d(), x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(q.dequantize_rows(1, 4), q.dequantize()[1:4])
