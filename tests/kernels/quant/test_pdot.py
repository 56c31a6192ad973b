"""Weights repacked in panels of 16 rows (kernels.cpu.quant._panels) and their integer products
(_pdot): the layout against its numpy twin, the products on every path (512-bit VNNI, 256-bit
VNNI, AVX2) bitwise equal, large prompts, the x quantizer, and what the repacked copy must leave
alone (the GGUF bytes, dequantization, the transposed product). test_idot.py checks the
products against float64 references and their batch invariance, on both layouts.
"""

import numpy as np
import pytest

from ember import config
from ember.errors import DTypeError, ShapeError
from ember.kernels import registry
from ember.kernels.cpu.quant import _common, _panels, _pdot, _q8x
from ember.kernels.cpu.quant.transposed import matmul_qt, matmul_qt_reference
from ember.quant import QTensor
from tests.helpers import run_fresh, threads_set
from tests.quant.conftest import random_blocks

FORMATS = list(_pdot.FORMATS)
pytestmark = pytest.mark.skipif(_pdot.state() is None, reason="no AVX2 / llvmlite here")


@pytest.fixture(autouse=True)
def _panels_on(monkeypatch):
    monkeypatch.setattr(config, "QUANT_DOT", "int8")
    monkeypatch.setattr(config, "QUANT_REPACK", True)
    monkeypatch.setattr(_common, "INT_DOT_FORMATS", tuple(FORMATS))


def _w3(rng, qtype, n, nb):
    bs = _panels.BLOCK_BYTES[qtype]
    return random_blocks(rng, qtype, n * nb).reshape(n, nb, bs)


def _k(qtype, nb):
    return _panels.BLOCK_ELEMENTS[qtype] * nb


def _fmt(qtype):
    registry.kernels("linear_q")  # imports the format modules
    return _common.FORMATS[qtype]


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 37])
@pytest.mark.parametrize("nb", [1, 3, 18])
def test_pack_matches_numpy_and_unpacks(qtype, n, nb):
    rng = np.random.default_rng(n * 100 + nb)
    w3 = _w3(rng, qtype, n, nb)
    p = _panels.pack(w3, qtype)
    assert p.shape == (-(-n // 16), _panels.panel_bytes(qtype, nb))
    assert p.shape[1] % 64 == 0 and p.ctypes.data % 64 == 0
    np.testing.assert_array_equal(p, _panels.pack_reference(w3, qtype))
    np.testing.assert_array_equal(_panels.unpack(p, qtype, n, nb), w3)
    np.testing.assert_array_equal(_panels.unpack_reference(p, qtype, n, nb), w3)


def test_layout_of_one_panel():
    """Lane i of quant group k is bytes 4k..4k+3 of row i's block; Q8_0's bytes plus 128; the
    fp16 scales of the 16 rows follow the quants of all blocks."""
    rng = np.random.default_rng(0)
    w3 = _w3(rng, "Q8_0", 16, 2)
    p = _panels.pack(w3, "Q8_0")[0]
    for b in range(2):
        for k in range(8):
            for i in range(16):
                got = p[(b * 8 + k) * 64 + 4 * i : (b * 8 + k) * 64 + 4 * i + 4]
                np.testing.assert_array_equal(got, w3[i, b, 2 + 4 * k : 6 + 4 * k] ^ 0x80)
        np.testing.assert_array_equal(p[1024 + 32 * b : 1056 + 32 * b], w3[:, b, 0:2].ravel())


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_layout_of_one_k_quant_panel(qtype):
    """Q4_K / Q5_K: lane i of quant group k is 4 bytes of row i's nibbles (Q5_K: then its qh);
    each sub-block's 16 scales, then 16 mins, as bytes (ggml's 6-bit unpacking); then per
    super-block the 16 rows' d, then their dmin."""
    rng = np.random.default_rng(1)
    nb = 2
    w3 = _w3(rng, qtype, 16, nb)
    p = _panels.pack(w3, qtype)[0]
    qoff, groups, per = _panels.KQUANT[qtype]
    assert p.size == per * nb and groups * 64 + 256 + 64 == per
    qn = nb * groups * 64
    for b in range(nb):
        for k in range(groups):
            src = qoff + 4 * k if k < 32 else 16 + 4 * (k - 32)
            for i in range(16):
                got = p[(b * groups + k) * 64 + 4 * i : (b * groups + k) * 64 + 4 * i + 4]
                np.testing.assert_array_equal(got, w3[i, b, src : src + 4])
        for c in range(8):
            for i in range(16):
                sc, mn = _common.scale_min_k4(w3, i, b, c)
                assert p[qn + 256 * b + 32 * c + i] == sc
                assert p[qn + 256 * b + 32 * c + 16 + i] == mn
        d = p[qn + 256 * nb + 64 * b : qn + 256 * nb + 64 * (b + 1)]
        np.testing.assert_array_equal(d[:32], w3[:, b, 0:2].ravel())
        np.testing.assert_array_equal(d[32:], w3[:, b, 2:4].ravel())


def test_quantizer_matches_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    x[:, ::7] *= 10
    x[1, 3] = np.nan
    x[2, 40] = np.inf
    x[3, 64:96] = 0  # scale 0
    x[4, 100] = 127 / 2 * 1e-3  # halfway: to even
    x[5, 128:160] = 1e-38  # 1 / d overflows: 0 * inf counts as 0
    x[6, 0:32] = 3e38  # the block's sum overflows: still finite, still quantized
    x[7, 200] = -np.inf
    x[8, 32:64] = np.float32(2.0**-140)  # subnormal values
    got = _q8x.quantize_rows(x)
    want = _q8x.quantize_reference(x)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    q, d, s, t = got
    assert np.isnan(d[[1, 2, 7], [0, 1, 6]]).all() and (q[1, :32] == 0).all() and t[1, 0] == 0
    assert d[3, 2] == 0 and (q[3, 64:96] == 0).all()
    assert (q[6, :32] == 127).all() and np.isfinite(d[6, 0])


@pytest.mark.parametrize("qtype", FORMATS)
def test_products_of_many_rows(qtype):
    """More rows than one pool job carries (a long prompt) are split; each row as if alone."""
    rng = np.random.default_rng(7)
    n, nb = 40, 5
    w3 = _w3(rng, qtype, n, nb)
    p = _panels.pack(w3, qtype)
    m = _pdot.max_rows() + 9
    x = rng.standard_normal((m, _k(qtype, nb))).astype(np.float32)
    y = np.empty((m, n), np.float32)
    with threads_set(2):
        _pdot.product(qtype, p, n, x, y)
    with threads_set(1):
        for i in (0, 1, _pdot.max_rows() - 1, _pdot.max_rows(), m - 1):
            one = np.empty((1, n), np.float32)
            _pdot.product(qtype, p, n, x[i : i + 1], one)
            np.testing.assert_array_equal(y[i], one[0])
    wf = _fmt(qtype).dequantize_rows_reference(w3, 0, n).astype(np.float64)
    exact = x.astype(np.float64) @ wf.T
    scale = np.abs(x).astype(np.float64) @ np.abs(wf).T
    assert (np.abs(y - exact) <= 0.02 * scale).all()  # the int8 step's error, not a bug's


def test_qtensor_keeps_its_panels():
    """Packed once on first use and kept; packed again when the data is replaced; the GGUF
    bytes, dequantization and the transposed (QLoRA) product are untouched."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 96)).astype(np.float32)
    q = QTensor.from_float(w, "Q4_0")
    raw = q.data.copy()
    x = rng.standard_normal((3, 96)).astype(np.float32)
    y = q.matmul_t(x)
    first = q._packed[1]
    assert q._packed[0] is q.data
    q.matmul_t(x[:1])
    assert q._packed[1] is first  # not packed again
    np.testing.assert_array_equal(q.data, raw)
    np.testing.assert_array_equal(q.dequantize_rows(3, 17), q.dequantize()[3:17])
    g = rng.standard_normal((5, 40)).astype(np.float32)
    np.testing.assert_allclose(matmul_qt(q, g), matmul_qt_reference(g, qweight=q), rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    q.data = QTensor.from_float(-w, "Q4_0").data  # a new weight: new panels
    np.testing.assert_allclose(q.matmul_t(x), -y, rtol=1e-5, atol=1e-4)
    assert q._packed[1] is not first


@pytest.mark.parametrize("qtype", FORMATS)
def test_prepared_product_is_the_same(qtype):
    """A captured step's bound product (prepare_linear) runs the same panels and kernels."""
    rng = np.random.default_rng(6)
    w3 = _w3(rng, qtype, 37, 4)
    q = QTensor(w3.reshape(-1), qtype, (37, _k(qtype, 4)))
    x = rng.standard_normal((2, 3, _k(qtype, 4))).astype(np.float32)
    out = np.empty((2, 3, 37), np.float32)
    run = _fmt(qtype).prepare_linear(out, x, qweight=q)
    run()
    np.testing.assert_array_equal(out, _fmt(qtype).linear(x, qweight=q))
    x[...] = rng.standard_normal(x.shape)  # the same arrays, new values
    run()
    np.testing.assert_array_equal(out, _fmt(qtype).linear(x, qweight=q))


def test_checks_refuse_bad_operands():
    rng = np.random.default_rng(1)
    w3 = _w3(rng, "Q4_1", 20, 2)
    p = _panels.pack(w3, "Q4_1")
    x = np.zeros((2, 64), np.float32)
    y = np.zeros((2, 20), np.float32)
    _pdot.check("Q4_1", p, 20, x, y)
    with pytest.raises(ShapeError):
        _pdot.check("Q4_0", p, 20, x, y)  # Q4_1's panels are not Q4_0's
    with pytest.raises(ShapeError):
        _pdot.check("Q4_1", p, 33, x, np.zeros((2, 33), np.float32))  # one panel short
    with pytest.raises(ShapeError):
        _pdot.check("Q4_1", p, 20, np.zeros((2, 96), np.float32), y)
    with pytest.raises(ShapeError):
        _pdot.check("Q4_1", p, 20, x, np.zeros((3, 20), np.float32))
    raw = np.empty(p.size + 65, np.uint8)
    off = -raw.ctypes.data % 64 + 1
    with pytest.raises(ShapeError):  # not on a cache line: the kernels' aligned loads
        _pdot.check("Q4_1", raw[off : off + p.size].reshape(p.shape), 20, x, y)
    with pytest.raises(DTypeError):
        _pdot.check("Q4_1", p, 20, x.astype(np.float64), y)
    with pytest.raises(DTypeError):
        _pdot.check("Q5_0", p, 20, x, y)
    with pytest.raises(ShapeError):
        _panels.pack(w3[:, :, 1:], "Q4_1")
    with pytest.raises(DTypeError):
        _panels.pack(w3.view(np.int8), "Q4_1")


@pytest.mark.parametrize(
    "path, cpu, features",
    [("zmm", "znver4", ""), ("ymm", "x86-64-v3", "+avxvnni"), ("avx2", "haswell", "")],
)
def test_kernels_compile_to_their_instructions(path, cpu, features):
    """Each path compiles for a CPU that has it (this host need not run them all)."""
    import llvmlite.binding as llvm

    from ember.kernels.cpu import gemm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    have = gemm._declarations(16 if path == "zmm" else 8)
    attrs = ' "min-legal-vector-width"="512" "prefer-vector-width"="512"' * (path == "zmm")
    mod = llvm.parse_assembly(
        "\n".join([*have, *_pdot.module_ir(path, have), f"attributes #0 = {{ nounwind{attrs} }}"])
    )
    mod.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(cpu, features, opt=2)
    asm = tm.emit_assembly(mod)
    if path == "zmm":  # x's 4 bytes broadcast from memory inside the instruction
        assert "{1to16}, %zmm" in asm and "vpdpbusd" in asm
    elif path == "ymm":
        assert "vpdpbusd" in asm and "%zmm" not in asm
    else:
        assert "vpmaddubsw" in asm and "vpdpbusd" not in asm


_SCRIPT = """
import numpy as np, zlib
from ember.kernels.cpu.quant import _pdot, _panels
from tests.quant.conftest import random_blocks
rng = np.random.default_rng(2)
out = []
for q, bs, k in (("Q8_0", 34, 96), ("Q4_0", 18, 96), ("Q4_1", 20, 96), ("Q6_K", 210, 768),
                 ("Q4_K", 144, 768), ("Q5_K", 176, 768)):
    w3 = random_blocks(rng, q, 37 * 3).reshape(37, 3, bs)
    p = _panels.pack(w3, q)
    for m in (1, 5, 19):
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = np.empty((m, 37), np.float32)
        _pdot.product(q, p, 37, x, y)
        out.append(y)
print(_pdot.state()["path"], zlib.crc32(np.concatenate([o.ravel() for o in out]).tobytes()))
"""


def _run(env):
    return run_fresh(_SCRIPT, env)


def test_paths_give_the_same_bits():
    """512-bit VNNI, 256-bit VNNI and AVX2 form the same integers and the same float steps."""
    runs = [
        _run({"EMBER_SGEMM_ISA": "", "EMBER_QUANT_DOT": ""}),
        _run({"EMBER_SGEMM_ISA": "", "EMBER_QUANT_DOT": "int8-256"}),
        _run({"EMBER_SGEMM_ISA": "avx2", "EMBER_QUANT_DOT": ""}),
    ]
    assert runs[2][0] == "avx2"
    assert len({r[1] for r in runs}) == 1, runs


@pytest.mark.parametrize("rows", [(32, 16, 48), (20, 7, 33)])
def test_stacked_weight_is_only_panels(rows, monkeypatch):
    """inference.stack's q/k/v or gate/up weight: panels only, each part's rows bitwise its own
    product; the GGUF bytes come back on demand; the reference path still reads them."""
    from ember.kernels.cpu import quant

    rng = np.random.default_rng(9)
    parts = [QTensor(_w3(rng, "Q4_0", r, 3).reshape(-1), "Q4_0", (r, 96)) for r in rows]
    s = quant.stack(parts)
    assert s._data is None and s.shape == (sum(rows), 96)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    y = s.matmul_t(x)
    assert s._data is None  # the product read the panels only
    for part, (a, b) in zip(parts, [(0, rows[0]), (rows[0], rows[0] + rows[1]),
                                    (rows[0] + rows[1], sum(rows))]):  # fmt: skip
        np.testing.assert_array_equal(y[:, a:b], part.matmul_t(x))
    want = np.concatenate([p.data for p in parts])
    np.testing.assert_array_equal(s.data, want)  # unpacked on first access
    assert s._packed[0] is s._data  # and the panels stay valid for those bytes
    np.testing.assert_array_equal(s.matmul_t(x), y)
    monkeypatch.setattr(config, "KERNELS", "reference")
    assert quant.stack(parts)._data is not None  # no kernels: the blocks, concatenated
    np.testing.assert_allclose(s.matmul_t(x), y, rtol=1e-2, atol=0.1 * np.abs(y).max())


def _exact_weight(qtype, w3):
    """The weight (n, K) in float64, exactly (Q6_K by its dequantizer, whose float32 steps are
    exact for its values; Q4_K / Q5_K from their integers), and |its scaled-quant part| plus
    |its min part| (the scale of the product's float32 rounding)."""
    from ember.quant.dequant import DEQUANTIZERS

    n, nb, bs = w3.shape
    if qtype == "Q6_K":
        w = DEQUANTIZERS["Q6_K"](w3.reshape(-1, 210)).reshape(n, 256 * nb).astype(np.float64)
        return w, np.abs(w)
    d = w3[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)[..., None, None]
    dmin = w3[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)[..., None, None]
    sc, mn = (v[..., None].astype(np.float64) for v in _panels.scales_mins_reference(w3[..., 4:16]))
    qoff = _panels.KQUANT[qtype][0]
    qs = w3[..., qoff : qoff + 128].reshape(n, nb, 4, 32).astype(np.int64)
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, nb, 8, 32)
    if qtype == "Q5_K":  # bit c of qh byte l: value l of sub-block c, bit 4
        qh = w3[..., 16:48].astype(np.int64)[:, :, None, :]
        q = q + 16 * ((qh >> np.arange(8)[None, None, :, None]) & 1)
    scaled, low = d * sc * q, dmin * mn * np.ones(32)
    return (scaled - low).reshape(n, -1), (np.abs(scaled) + np.abs(low)).reshape(n, -1)


def _same_x_reference(qtype, w3, x):
    """x @ W.T from x's Q8 blocks and the exact weight, in float64 (exact but for rounding)."""
    w, aw = _exact_weight(qtype, w3)
    q, d, _, _ = _q8x.quantize_rows(x)
    m = x.shape[0]
    xr = (q.reshape(m, -1, 32) * d[..., None].astype(np.float64)).reshape(m, -1)
    return xr @ w.T, np.abs(xr) @ aw.T, w


def test_q4_k_reference_is_the_dequantizer():
    """The exact float64 Q4_K / Q5_K weights above are ember's dequantization (to its float32)."""
    from ember.quant.dequant import DEQUANTIZERS

    rng = np.random.default_rng(3)
    for qtype, bs in (("Q4_K", 144), ("Q5_K", 176)):
        w3 = _w3(rng, qtype, 5, 3)
        want = DEQUANTIZERS[qtype](w3.reshape(-1, bs)).reshape(5, -1).astype(np.float64)
        got, terms = _exact_weight(qtype, w3)
        assert (np.abs(got - want) <= 1e-6 * terms).all()


K_QUANTS = ["Q6_K", "Q4_K", "Q5_K"]


@pytest.mark.parametrize("qtype", K_QUANTS)
@pytest.mark.parametrize("n, nb", [(1, 1), (17, 2), (37, 3), (48, 5)])
def test_k_quants_match_the_same_quantized_x(qtype, n, nb):
    """The K-quants' panel kernels: against float64 of the same int8 x, every row's own terms
    setting the float32 tolerance (N not a multiple of 16, K = 256 k, M = 1..17 and a
    prompt's 128 rows), and within the int8 step's error of the float product."""
    rng = np.random.default_rng(n + nb)
    w3 = _w3(rng, qtype, n, nb)
    for m in (*range(1, 18), 128):
        x = rng.standard_normal((m, 256 * nb)).astype(np.float32)
        x[:, ::7] *= 10
        y = _fmt(qtype).matmul_t(w3, x).astype(np.float64)
        want, terms, w = _same_x_reference(qtype, w3, x)
        assert (np.abs(y - want) <= 2e-6 * terms + 1e-30).all(), f"M={m}"
        _, d, _, _ = _q8x.quantize_rows(x)
        exact = x.astype(np.float64) @ w.T
        bound = (d.astype(np.float64) / 2) @ np.abs(w).reshape(n, -1, 32).sum(axis=2).T
        assert (np.abs(y - exact) <= bound * (1 + 1e-4) + 1e-5 * terms).all()


def test_k_quants_take_the_panels_by_default(monkeypatch):
    """Q4_K / Q5_K products (decode and prefill) run the panel kernels by default (the QTensor
    keeps its panels); EMBER_QUANT_REPACK=0 and EMBER_QUANT_DOT=float give back the float
    kernels on the GGUF blocks."""
    monkeypatch.undo()  # the defaults (no INT_DOT_FORMATS override)
    rng = np.random.default_rng(8)
    for qtype in ("Q4_K", "Q5_K"):
        w3 = _w3(rng, qtype, 37, 2)
        fmt = _fmt(qtype)
        assert fmt.panel_dot() and fmt.int_dot()
        x = rng.standard_normal((9, 512)).astype(np.float32)
        for m in (1, 9):
            q = QTensor(w3.reshape(-1), qtype, (37, 512))
            y = q.matmul_t(x[:m])
            assert q._packed is not None and q._packed[0] is q._data
            np.testing.assert_array_equal(y, _fmt(qtype).matmul_t(w3, x[:m]))
        for name, value in (("QUANT_REPACK", False), ("QUANT_DOT", "float")):
            with monkeypatch.context() as mp:
                mp.setattr(config, name, value)
                assert not fmt.panel_dot() and not fmt.int_dot()
                q = QTensor(w3.reshape(-1), qtype, (37, 512))
                y = q.matmul_t(x)
                assert q._packed is None
                want = fmt.matmul_t_reference(w3, x)  # float x: the float product's rounding
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("qtype", K_QUANTS)
@pytest.mark.parametrize("threads", [1, 2])
def test_k_quants_batch_invariance(qtype, threads, monkeypatch):
    monkeypatch.setattr(_pdot, "CHUNK_BYTES", 1)  # chunks of 16 rows, shared by the threads
    rng = np.random.default_rng(12)
    n, nb = 75, 2
    w3 = _w3(rng, qtype, n, nb)
    q = QTensor(w3.reshape(-1), qtype, (n, 512))
    x = rng.standard_normal((21, 512)).astype(np.float32)
    with threads_set(1):
        alone = np.stack([q.matmul_t(x[i : i + 1])[0] for i in range(len(x))])
    with threads_set(threads):
        for m in (2, 5, 8, 9, 16, 21):
            np.testing.assert_array_equal(q.matmul_t(x[:m]), alone[:m], err_msg=f"M={m}")
    assert _fmt(qtype).panel_dot() and quant_invariant_rows(q) >= 16


def quant_invariant_rows(q):
    from ember.kernels.cpu import quant

    return quant.invariant_rows(q)


def test_copies_keep_usable_panels():
    """pickle and copy.deepcopy (optimize_for_inference copies a model) keep the panels, on a
    64-byte boundary again, and a stacked weight stays panels only."""
    import copy
    import pickle

    from ember.kernels.cpu import quant

    rng = np.random.default_rng(13)
    q = QTensor.from_float(rng.standard_normal((40, 96)).astype(np.float32), "Q4_1")
    x = rng.standard_normal((3, 96)).astype(np.float32)
    y = q.matmul_t(x)
    s = quant.stack([q, q])
    ys = s.matmul_t(x)
    for c in (pickle.loads(pickle.dumps(q)), copy.deepcopy(q)):
        assert c._packed[0] is c._data and c._packed[1].ctypes.data % 64 == 0
        np.testing.assert_array_equal(c.matmul_t(x), y)
    for c in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert c._data is None and c._packed[1].ctypes.data % 64 == 0
        np.testing.assert_array_equal(c.matmul_t(x), ys)
    assert s._data is None
