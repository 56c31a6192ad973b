"""The int8-activation kernels of Q8_0, Q4_0, Q4_1: ember.kernels.cpu.quant._pdot on the
weights repacked in panels (the default), and _idot on the GGUF blocks (EMBER_QUANT_REPACK=0).

Three checks, for both layouts: the kernels against a float64 product of the same quantized x
(kernel bugs, at float32 tolerance), the whole product against the dequantized weight times the
float x (the activation quantization's error, within the bound its step gives), and batch
invariance (row i of an M-row product is bitwise the product of x[i] alone, at every thread
count and split). test_pdot.py has the panel layout's own tests.
"""

import numpy as np
import pytest

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.kernels import registry
from ember.kernels.cpu.quant import _common, _idot, _pdot, _q8x
from ember.quant import QTensor, quantize_array
from tests.helpers import _thread_counts, check_kernel, run_fresh, threads_set
from tests.quant.conftest import random_blocks

FORMATS = list(_idot.SPECS)
pytestmark = pytest.mark.skipif(_idot.state() is None, reason="no AVX2 / llvmlite here")


def _kernels(qtype):
    return _common.FORMATS[qtype] if qtype in _common.FORMATS else _load(qtype)


def _load(qtype):
    registry.kernels("linear_q")  # imports the format modules
    return _common.FORMATS[qtype]


def _w3(rng, qtype, n, k, real=False):
    """(n, K/32, bytes) blocks: random bytes (every code, Q8_0's -128 too) or quantized floats."""
    if real:
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[0] *= 30
        return QTensor(quantize_array(w, qtype), qtype, (n, k)).blocks3d()
    bs = _idot.SPECS[qtype][1]
    return random_blocks(rng, qtype, n * k // 32).reshape(n, k // 32, bs)


def _x(rng, m, k):
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, ::7] *= 10  # blocks with one large value: a coarse step for the others
    return x


def _quantize_np(x):
    """numpy's twin of the kernels' quantization (same float32 roundings)."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32)
    amax = np.abs(xb).max(axis=2)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv[..., None]), -127, 127).astype(np.int8).reshape(m, k)
    s = d * q.reshape(m, k // 32, 32).sum(axis=2, dtype=np.int32).astype(np.float32)
    return q, d, s


def _ints(qtype, w3):
    """The weight's integers (n, K) and fp16 scale / min (n, K/32) as float64."""
    n, nb, _ = w3.shape
    d = w3[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if qtype == "Q8_0":
        return w3[:, :, 2:].view(np.int8).reshape(n, -1).astype(np.int64), d, None
    p = w3[:, :, _idot.SPECS[qtype][2] :].astype(np.int64)
    q = np.concatenate([p & 15, p >> 4], axis=2).reshape(n, -1)
    if qtype == "Q4_0":
        return q - 8, d, None
    return q, d, w3[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)


def _same_q8_reference(qtype):
    """x @ W.T from x's Q8 blocks (numpy's quantization), integers exact, the rest float64."""

    def ref(w3, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        q, d, s = _quantize_np(x)
        wq, wd, wm = _ints(qtype, w3)
        m, k = x.shape
        n, nb = wq.shape[0], k // 32
        isum = np.einsum(
            "nbj,mbj->mnb", wq.reshape(n, nb, 32), q.reshape(m, nb, 32).astype(np.int64)
        )
        y = (isum * (wd[None] * d[:, None, :].astype(np.float64))).sum(axis=2)
        if wm is not None:
            y += s.astype(np.float64) @ wm.T
        return y.astype(np.float32)

    return ref


def _terms(qtype, w3, x):
    """sum over the product's terms of |term|: the scale of its float32 rounding."""
    q, d, s = _quantize_np(x)
    wq, wd, wm = _ints(qtype, w3)
    m, k = x.shape
    n, nb = wq.shape[0], k // 32
    aq = np.abs(q.reshape(m, nb, 32)).astype(np.int64)
    isum = np.einsum("nbj,mbj->mnb", np.abs(wq.reshape(n, nb, 32)), aq)
    t = (isum * (np.abs(wd)[None] * d[:, None, :].astype(np.float64))).sum(axis=2)
    if wm is not None:
        t += np.abs(s.astype(np.float64)) @ np.abs(wm).T
    return t


@pytest.fixture(params=["one chunk", "small chunks"])
def schedule(request, monkeypatch):
    """How kernels.cpu.pool splits the weight's rows: one chunk, or chunks of two rows (which
    the worker threads share with the caller)."""
    monkeypatch.setattr(_idot, "CHUNK_BYTES", 1 << 40 if request.param == "one chunk" else 1)
    monkeypatch.setattr(_pdot, "CHUNK_BYTES", 1 << 40 if request.param == "one chunk" else 1)
    return request.param


@pytest.fixture(autouse=True)
def _int8(monkeypatch):
    """Every format with an integer kernel uses it here (as by default: _common.INT_DOT_FORMATS)."""
    monkeypatch.setattr(config, "QUANT_DOT", "int8")
    monkeypatch.setattr(_common, "INT_DOT_FORMATS", tuple(FORMATS))


@pytest.fixture(params=["panels", "gguf"])
def layout(request, monkeypatch):
    """The weight repacked in panels (_pdot, the default) or read as GGUF blocks (_idot)."""
    monkeypatch.setattr(config, "QUANT_REPACK", request.param == "panels")
    return request.param


def test_the_formats_use_the_integer_kernels(monkeypatch, layout):
    for q in FORMATS:
        assert _load(q).int_dot() and _load(q).panel_dot() == (layout == "panels")
    assert not _load("Q4_K").int_dot() and not _load("Q4_K").panel_dot()
    monkeypatch.undo()
    monkeypatch.setattr(config, "QUANT_DOT", "int8")  # the defaults: all three, on panels
    assert all(_load(q).int_dot() and _load(q).panel_dot() for q in FORMATS)
    monkeypatch.setattr(config, "QUANT_DOT", "float")
    assert not any(_load(q).int_dot() or _load(q).panel_dot() for q in FORMATS)


def test_quantization_matches_numpy():
    rng = np.random.default_rng(0)
    x = _x(rng, 5, 96)
    x[2, 32:64] = 0  # a zero block: scale 0, values 0
    x[3, 5] = 127 / 2 * 1e-3  # exactly halfway cases round to even, as np.rint does
    q, d, s, t = _q8x.quantize_rows(x)
    wq, wd, ws = _quantize_np(x)
    np.testing.assert_array_equal(q, wq)
    np.testing.assert_array_equal(d, wd)
    np.testing.assert_array_equal(s, ws)
    np.testing.assert_array_equal(t, q.reshape(5, 3, 32).sum(axis=2, dtype=np.int32))
    assert np.abs(x - np.repeat(d, 32, axis=1) * q).max() <= d.max() / 2 * (1 + 1e-6)


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("k", [32, 96, 576, 1536])
@pytest.mark.parametrize("n", [1, 7, 37])
def test_kernel_matches_the_same_quantized_x(qtype, k, n, schedule, layout):
    qk = _kernels(qtype)
    rng = np.random.default_rng(k + n)
    w3 = _w3(rng, qtype, n, k)
    cases = [(w3, _x(rng, m, k)) for m in (1, 2, 5, 16)]
    ref = _same_q8_reference(qtype)
    for w, x in cases:
        atol = 2e-6 * float(_terms(qtype, w, x).max()) + 1e-30
        check_kernel(qk.matmul_t, ref, [(w, x)], rtol=1e-6, atol=atol)


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("k", [32, 96, 576, 1536])
def test_error_within_the_q8_step_bound(qtype, k, layout):
    """|y - W x| <= sum_b d_b / 2 * sum_j |w_bj| (+ float32 rounding), against float64."""
    qk = _kernels(qtype)
    rng = np.random.default_rng(k)
    for real in (False, True):
        n = 29
        w3 = _w3(rng, qtype, n, k, real=real)
        x = _x(rng, 16, k)
        y = qk.matmul_t(w3, x).astype(np.float64)
        wf = qk.dequantize_rows_reference(w3, 0, n).astype(np.float64)
        exact = x.astype(np.float64) @ wf.T
        _, d, _ = _quantize_np(x)
        absw = np.abs(wf).reshape(n, k // 32, 32).sum(axis=2)  # (n, blocks)
        bound = (d.astype(np.float64) / 2) @ absw.T
        rounding = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(wf).T) + 1e-30
        err = np.abs(y - exact)
        assert (err <= bound * (1 + 1e-4) + rounding).all(), float((err / (bound + rounding)).max())
        assert err.max() > 0  # it is the int8 path, not a float one


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("threads", _thread_counts())
def test_batch_invariance(qtype, threads, schedule, layout):
    qk = _kernels(qtype)
    rng = np.random.default_rng(11)
    n, k = 75, 96  # rows not a multiple of any chunk
    w3 = _w3(rng, qtype, n, k)
    x = _x(rng, 23, k)
    with threads_set(1):
        alone = np.stack([qk.matmul_t(w3, x[i : i + 1])[0] for i in range(len(x))])
    with threads_set(threads):
        for m in list(range(1, 17)):
            for start in (0, 23 - m):
                got = qk.matmul_t(w3, x[start : start + m])
                np.testing.assert_array_equal(got, alone[start : start + m], err_msg=f"M={m}")
        # the linear_q kernel: 1-d x, a (2, 3, K) batch, the same rows
        np.testing.assert_array_equal(qk.linear(x[4], qweight=_q(w3, qtype)), alone[4])
        got = qk.linear(x[:6].reshape(2, 3, k), qweight=_q(w3, qtype))
        np.testing.assert_array_equal(got.reshape(6, n), alone[:6])


def _q(w3, qtype):
    n, nb, _ = w3.shape
    return QTensor(w3.reshape(-1), qtype, (n, 32 * nb))


@pytest.mark.parametrize("qtype", FORMATS)
def test_linear_q_registered_kernel(qtype, layout):
    (kernel,) = [k for k in registry.kernels("linear_q") if k.name == f"linear_{qtype.lower()}"]
    rng = np.random.default_rng(5)
    n, k = 38, 576
    w3 = _w3(rng, qtype, n, k, real=True)
    q = _q(w3, qtype)
    ref = _same_q8_reference(qtype)
    for shape in [(k,), (1, k), (3, k), (16, k), (2, 3, k)]:
        x = _x(rng, int(np.prod(shape[:-1], dtype=int)), k).reshape(shape)
        b = rng.standard_normal(n).astype(np.float32)
        want = ref(w3, x.reshape(-1, k)).reshape(shape[:-1] + (n,))
        atol = 2e-6 * float(_terms(qtype, w3, x.reshape(-1, k)).max())
        check_kernel(
            kernel,
            lambda x, qweight, want=want: want,
            [((x,), {"qweight": q})],
            rtol=1e-6,
            atol=atol,
        )
        check_kernel(
            kernel, lambda x, b, qweight, want=want: want + b, [((x, b), {"qweight": q})], rtol=1e-6,
            atol=atol + 1e-6,
        )  # fmt: skip
    if _kernels(qtype).panel_dot():  # a prompt of more rows than one pool job takes: split
        x = _x(rng, _pdot.max_rows() + 3, k)
        atol = 2e-6 * float(_terms(qtype, w3, x).max())
        np.testing.assert_allclose(kernel.fn(x, qweight=q), ref(w3, x), rtol=1e-6, atol=atol)
        return
    # one row more than the integer kernels take: the prefill path (float weights, BLAS)
    # (float32 rounding, against the scale of the terms: w's first row is 30x the others, so
    # elementwise tolerances fail on cancelled entries)
    x = _x(rng, _kernels(qtype).int_rows() + 1, k)
    w = _kernels(qtype).dequantize_rows_reference(w3, 0, n).astype(np.float64)
    terms = np.abs(x.astype(np.float64)) @ np.abs(w).T
    assert (np.abs(kernel.fn(x, qweight=q) - kernel.reference(x, qweight=q)) <= 1e-5 * terms).all()


@pytest.mark.parametrize("qtype", FORMATS)
def test_non_finite_rows(qtype, layout):
    qk = _kernels(qtype)
    rng = np.random.default_rng(9)
    w3 = _w3(rng, qtype, 9, 96)
    x = _x(rng, 5, 96)
    x[1, 40] = np.nan
    x[3, 3] = np.inf
    x[4, 95] = -np.inf
    y = qk.matmul_t(w3, x)
    assert not np.isfinite(y[[1, 3, 4]]).any()
    with threads_set(1):
        for i in (0, 2):
            np.testing.assert_array_equal(y[i], qk.matmul_t(w3, x[i : i + 1])[0])


def test_checks_refuse_bad_operands():
    rng = np.random.default_rng(1)
    w3 = _w3(rng, "Q4_1", 4, 64)
    x = np.zeros((2, 64), np.float32)
    y = np.zeros((2, 4), np.float32)
    _idot.check("Q4_1", w3, x, y)
    with pytest.raises(ShapeError):
        _idot.check("Q8_0", w3, x, y)  # 20-byte blocks are not Q8_0's
    with pytest.raises(ShapeError):
        _idot.check("Q4_1", w3, np.zeros((2, 96), np.float32), y)
    with pytest.raises(ShapeError):
        _idot.check("Q4_1", w3, x, np.zeros((2, 5), np.float32))
    with pytest.raises(DTypeError):
        _idot.check("Q4_1", w3, x.astype(np.float64), y)
    with pytest.raises(DTypeError):
        _idot.check("Q4_1", w3, np.zeros((64, 2), np.float32).T, y)
    with pytest.raises(DTypeError):
        _idot.check("Q4_1", w3.view(np.int8), x, y)
    with pytest.raises(DTypeError):
        _idot.check("Q4_K", w3, x, y)


def test_vnni_kernels_compile():
    """The VNNI variant (vpdpbusd) compiles to that instruction; this host may not run it."""
    import llvmlite.binding as llvm

    from ember.kernels.cpu import gemm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    ir = [*gemm._declarations(8), *_idot.module_ir(vnni=True), "attributes #0 = { nounwind }"]
    mod = llvm.parse_assembly("\n".join(ir))
    mod.verify()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine("x86-64-v3", "+avxvnni", opt=2)
    asm = tm.emit_assembly(mod)
    assert "vpdpbusd" in asm and "vpmaddubsw" not in asm


def test_wide_kernels_compile():
    """The 512-bit loop (two blocks per vpdpbusd on zmm registers) compiles for AVX-512 VNNI."""
    import llvmlite.binding as llvm

    from ember.kernels.cpu import gemm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    ir = [*gemm._declarations(16), *_idot.module_ir(vnni=True, lanes=16, wide=True)]
    mod = llvm.parse_assembly(
        "\n".join([*ir, 'attributes #0 = { nounwind "min-legal-vector-width"="512" }'])
    )
    mod.verify()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine("znver4", "+avx512vnni,+avx512bw,+avx512vl", opt=2)
    asm = tm.emit_assembly(mod)
    assert "vpdpbusd\t%zmm" in asm or "vpdpbusd %zmm" in asm


_SCRIPT = """
import numpy as np, zlib
from ember import config
from ember.kernels import registry
from ember.kernels.cpu.quant import _common
config.QUANT_REPACK = False  # _idot's loops (test_pdot.py runs the same for the panels)
from tests.quant.conftest import random_blocks
registry.kernels("linear_q")
_common.INT_DOT_FORMATS = ("Q8_0", "Q4_0", "Q4_1")
rng = np.random.default_rng(2)
out = []
for q, bs in (("Q8_0", 34), ("Q4_0", 18), ("Q4_1", 20)):
    w3 = random_blocks(rng, q, 33 * 3).reshape(33, 3, bs)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    qk = _common.FORMATS[q]
    y = qk.matmul_t(w3, x)
    out.append(y)
    w = qk.dequantize_rows_reference(w3, 0, 33).astype(np.float64)
    exact = x.astype(np.float64) @ w.T  # within the int8 step's error of the float product
    close = np.abs(y - exact).max() <= 0.02 * (np.abs(x) @ np.abs(w).T).max()
    print(q, qk.int_dot(), close)
print(_common._idot.state() is not None and _common._idot.state()["wide"])
print(zlib.crc32(np.concatenate([o.ravel() for o in out]).tobytes()))
"""


def _run(env):
    return run_fresh(_SCRIPT, env)


@pytest.mark.parametrize(
    "env, uses_int",
    [({"EMBER_SGEMM_ISA": "avx2"}, True), ({"EMBER_QUANT_DOT": "int8-256"}, True),
     ({"EMBER_SGEMM_ISA": "none"}, False), ({"EMBER_QUANT_DOT": "float"}, False)],
)  # fmt: skip
def test_isa_switches(env, uses_int):
    """Each switch's kernels run and are right (this host runs them all), and the 256-bit
    loops, AVX2 or VNNI, give the same integers, so the same floats."""
    got = _run(env)
    assert got[1:9:3] == [str(uses_int)] * 3 and got[2:9:3] == ["True"] * 3
    assert got[-2] == "False"  # the 512-bit loop only by default
    base = _run({"EMBER_SGEMM_ISA": "", "EMBER_QUANT_DOT": "int8-256"})
    if uses_int:
        assert got[-1] == base[-1]
    else:
        assert got[-1] != base[-1]


def test_default_kernels_in_a_fresh_process():
    """The default path (the 512-bit loop on AVX-512 VNNI hosts) is right in a fresh process."""
    got = _run({"EMBER_SGEMM_ISA": "", "EMBER_QUANT_DOT": ""})
    assert got[1:9:3] == ["True"] * 3 and got[2:9:3] == ["True"] * 3
