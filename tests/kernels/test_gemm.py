"""The packed-weight GEMM (LLVM microkernels + numba driver), PackedWeight and the linear kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.kernels import registry
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu.conv import window_offsets
from tests.helpers import check_kernel

RNG = np.random.default_rng(1)
NR = G.panel_width()


def _conv_case(n, h, w, c, o, k, s, pad):
    """A padded NHWC input and the offsets of a kxk / stride-s convolution over it."""
    hp, wp = h + 2 * pad, w + 2 * pad
    x = np.zeros((n, hp, wp, c), np.float32)
    x[:, pad : pad + h, pad : pad + w] = RNG.standard_normal((n, h, w, c))
    oh, ow = (hp - k) // s + 1, (wp - k) // s + 1
    rowoff, tapoff = window_offsets(x.shape, (k, k), (s, s), oh, ow)
    return x.reshape(-1), rowoff, tapoff, n * oh * ow


def _check(a, rowoff, tapoff, kc, o, act, with_res, threads):
    m = len(rowoff)
    w2 = RNG.standard_normal((len(tapoff) * kc, o)).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    res = RNG.standard_normal((m, o)).astype(np.float32) if with_res else None
    ref = G.gemm_reference(a, rowoff, tapoff, kc, w2, bias, res, act, np.empty((m, o), np.float32))
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        out = np.full((m, o), np.nan, np.float32)
        G.gemm(a, rowoff, tapoff, kc, G.pack_weight(w2, NR), bias, res, act, out)
    finally:
        ember.set_num_threads(old)
    scale = np.abs(ref).max() if ref.size else 1.0
    np.testing.assert_allclose(out, ref, atol=2e-6 * scale * np.sqrt(w2.shape[0]), rtol=1e-5)


def test_microkernels_exist_on_this_cpu():
    assert NR in (16, 32)  # AVX2+FMA or AVX-512: the CI machines have at least AVX2


def test_avx2_microkernels_match_reference_in_a_fresh_process():
    """The AVX2 family (what an AVX2-only CPU runs) checked here too, forced by EMBER_SGEMM_ISA."""
    code = (
        "from tests.kernels import test_gemm as t\n"
        "assert t.NR == 16, t.NR\n"
        "for case in t.CONV_CASES:\n"
        "    t.test_conv_gemm_matches_reference(*case, 2, True)\n"
        "    t.test_rows_first_order_matches_reference(*case, 2, True)\n"
        "t.test_linear_rows_match_reference(13, 33, 65)\n"
        "t.test_activations_keep_nan_like_torch()\n"
        "t.test_linear_kernel_matches_reference()\n"
    )
    env = {**os.environ, "EMBER_SGEMM_ISA": "avx2"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


CONV_CASES = [  # n, h, w, c, o, k, stride, pad
    (1, 9, 11, 16, 37, 3, 1, 1),  # partial last panel, every row remainder
    (2, 7, 5, 24, 64, 3, 2, 1),  # stride 2 across two images
    (1, 6, 6, 40, 100, 1, 1, 0),  # 1x1: one tap
    (1, 9, 8, 20, 33, 1, 2, 0),  # strided 1x1 read in place
    (1, 3, 3, 8, 300, 3, 1, 1),  # few pixels, many panels (panel split)
    (3, 4, 5, 3, 8, 5, 1, 2),  # narrow output, 25 taps of 3 channels
    (1, 5, 5, 600, 40, 3, 1, 1),  # taps deeper than a K block: sliced channels
]


@pytest.mark.parametrize("n,h,w,c,o,k,s,pad", CONV_CASES)
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("parallel", [False, True])
def test_conv_gemm_matches_reference(n, h, w, c, o, k, s, pad, threads, parallel):
    # parallel: the driver's parallel region even for these small products (they run serially)
    old = G.SERIAL_BELOW
    G.SERIAL_BELOW = 0 if parallel else old
    try:
        _conv_gemm_case(n, h, w, c, o, k, s, pad, threads)
    finally:
        G.SERIAL_BELOW = old


@pytest.mark.parametrize("n,h,w,c,o,k,s,pad", CONV_CASES + [(2, 13, 11, 64, 2 * NR + 5, 1, 1, 0)])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("parallel", [False, True])
def test_rows_first_order_matches_reference(n, h, w, c, o, k, s, pad, threads, parallel):
    """Every product in the rows-first order (ROWS_FIRST_BYTES 0): tiles across all panels with
    the residual/output prefetches, where K is one block and a task has all panels."""
    old = G.SERIAL_BELOW, G.ROWS_FIRST_BYTES
    G.SERIAL_BELOW, G.ROWS_FIRST_BYTES = (0 if parallel else old[0]), 0
    try:
        _conv_gemm_case(n, h, w, c, o, k, s, pad, threads)
    finally:
        G.SERIAL_BELOW, G.ROWS_FIRST_BYTES = old


def _conv_gemm_case(n, h, w, c, o, k, s, pad, threads):
    a, rowoff, tapoff, _ = _conv_case(n, h, w, c, o, k, s, pad)
    for act, with_res in ((0, False), (1, True), (2, False)):
        _check(a, rowoff, tapoff, c, o, act, with_res, threads)


@pytest.mark.parametrize(
    "m,k,o", [(1, 7, 5), (13, 33, 65), (200, 4, 3), (0, 8, 8), (1, 1280, 1000)]
)
def test_linear_rows_match_reference(m, k, o):
    a = RNG.standard_normal(m * k).astype(np.float32)
    _check(a, np.arange(m, dtype=np.int64) * k, np.zeros(1, np.int64), k, o, 0, False, 2)


@pytest.mark.parametrize("m", [5, 128, 197, 256, 257])
def test_linear_products_on_the_pool_by_panels_or_by_row_blocks(m):
    """linear_packed_residual at 2 threads on the pool: up to LINEAR_ONE_BLOCK_ROWS rows a task
    takes every row and a group of panels, above it blocks of rows; the job kept on the weight
    serves the next calls (new inputs, residuals and outputs), with and without bias."""
    k, o = 384, 8 * NR + 5  # enough panels for the one-block split, a partial last one
    w = RNG.standard_normal((o, k)).astype(np.float32)
    pw, b = G.PackedWeight(w), RNG.standard_normal(o).astype(np.float32)
    old = ember.get_num_threads()
    ember.set_num_threads(2)
    try:
        for bias, with_res in ((b, True), (b, True), (None, False), (b, False), (None, True)):
            x = RNG.standard_normal((1, m, k)).astype(np.float32)
            res = RNG.standard_normal((1, m, o)).astype(np.float32) if with_res else None
            got = G.linear_packed_residual(x, pw, bias, res)
            want = x.astype(np.float64) @ w.T.astype(np.float64)
            want = want + (0 if bias is None else bias) + (0 if res is None else res)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    finally:
        ember.set_num_threads(old)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m,k,o", [(7, 301, 2 * NR + 3), (130, 1537, 8 * NR + 5), (300, 777, 37)])
@pytest.mark.parametrize("k_max", [None, 100])
def test_linear_k_in_one_block_or_in_blocks(m, k, o, threads, k_max, monkeypatch):
    """A linear's K is one block up to LINEAR_K_BLOCK_MAX channels (longer: blocks of K_BLOCK
    that accumulate in the output), on the calling thread and on the pool, with a residual."""
    if k_max is not None:
        monkeypatch.setattr(G, "LINEAR_K_BLOCK_MAX", k_max)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    pw, b = G.PackedWeight(w), RNG.standard_normal(o).astype(np.float32)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        x = RNG.standard_normal((m, k)).astype(np.float32)
        res = RNG.standard_normal((m, o)).astype(np.float32)
        got = G.linear_packed_residual(x, pw, b, res)
        want = x.astype(np.float64) @ w.T.astype(np.float64) + b + res
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-3)
    finally:
        ember.set_num_threads(old)


def test_activations_keep_nan_like_torch():
    a = np.array([np.nan, 1.0, -1.0, 7.0], np.float32)  # four rows of one feature
    out = np.empty((4, 1), np.float32)
    packed = G.pack_weight(np.ones((1, 1), np.float32), NR)
    rows, tap, zero = np.arange(4, dtype=np.int64), np.zeros(1, np.int64), np.zeros(1, np.float32)
    G.gemm(a, rows, tap, 1, packed, zero, None, 2, out)
    assert np.isnan(out[0, 0]) and out[1:, 0].tolist() == [1.0, 0.0, 6.0]


def test_pack_weight_layout():
    w2 = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)
    p = G.pack_weight(w2, 4)
    assert p.shape == (2, 3, 4)
    np.testing.assert_array_equal(p[0], w2[:, :4])
    np.testing.assert_array_equal(p[1, :, 0], w2[:, 4])
    assert not p[1, :, 1:].any()


def test_bad_operands_are_refused_before_any_pointer_is_followed():
    a = np.zeros(20, np.float32)
    rows, tap = np.arange(4, dtype=np.int64) * 4, np.zeros(1, np.int64)
    packed, bias = G.pack_weight(np.ones((4, 3), np.float32), NR), np.zeros(3, np.float32)
    out = np.empty((4, 3), np.float32)
    G.gemm(a, rows, tap, 4, packed, bias, None, 0, out)  # fits
    bad = [
        dict(a=np.zeros(15, np.float32)),  # the last row runs past the input
        dict(rows=rows - 1),  # negative offset
        dict(a=np.zeros(20, np.float64)),
        dict(rows=rows.astype(np.int32)),
        dict(out=np.empty((4, 40), np.float32)),  # wider than the weight
        dict(out=np.empty((5, 3), np.float32)),  # more rows than offsets
        dict(res=np.zeros((4, 2), np.float32)),
        dict(kc=5),
        dict(out=np.empty((3, 4), np.float32).T),  # not contiguous
    ]
    for case in bad:
        kw = dict(a=a, rows=rows, kc=4, out=out, res=None) | case
        with pytest.raises((ember.errors.ShapeError, ember.errors.DTypeError)):
            G.gemm(kw["a"], kw["rows"], tap, kw["kc"], packed, bias, kw["res"], 0, kw["out"])


def _kernel(op: str, name: str):
    return next(k for k in registry.kernels(op) if k.name == name)


def test_linear_kernel_matches_reference():
    k = _kernel("linear", "linear_packed")
    cases = []
    for shape, o in (((1, 7), 5), ((13, 33), 65), ((2, 3, 40), 37), ((0, 8), 4)):
        x = RNG.standard_normal(shape).astype(np.float32)
        w = RNG.standard_normal((o, shape[-1])).astype(np.float32)
        b = RNG.standard_normal(o).astype(np.float32)
        cases += [(x, G.PackedWeight(w), b), (x, G.PackedWeight(w))]
    assert check_kernel(k, cases=cases, rtol=1e-5, atol=1e-4) >= len(cases)


def test_packed_weight_is_the_weight_and_never_stale():
    w = RNG.standard_normal((40, 12)).astype(np.float32)
    p = G.PackedWeight(w.copy())  # a view of the array it is given
    assert p.panels is not None and p.panels.shape == (-(-40 // NR), 12, NR)
    np.testing.assert_array_equal(p, w)
    for derived in (p.T, p[:3], p * 2, p + 0, np.asarray(p).copy()):
        assert G.packed_panels(derived) is None  # derived arrays are plain weights
    assert type(p * 2) is np.ndarray
    q = p.copy()
    assert G.packed_panels(q) is not None and np.shares_memory(q, p) is False
    import copy
    import pickle

    assert G.packed_panels(copy.deepcopy(p)) is not None
    assert type(pickle.loads(pickle.dumps(p))) is np.ndarray
    p[0, 0] = 1.0  # writing into it drops the panels
    assert p.panels is None and p[0, 0] == 1.0
    q += 1
    assert q.panels is None
    np.testing.assert_allclose(np.asarray(q), w + 1)
    for write in (lambda a: np.copyto(a, 0.5), lambda a: np.clip(a, 0, 1, out=a)):
        r = G.PackedWeight(w.copy())
        write(r)
        assert r.panels is None
    t = ember.from_numpy(w.copy())
    t._data = G.PackedWeight(t._data)
    with ember.no_grad():
        t.mul_(2.0)  # a Tensor's in-place op (np.copyto underneath)
    assert G.packed_panels(t._data) is None
    np.testing.assert_allclose(t.numpy(), 2 * w)


def test_linear_op_picks_the_packed_kernel_and_stays_exact():
    w = RNG.standard_normal((9, 20)).astype(np.float32)
    b = RNG.standard_normal(9).astype(np.float32)
    x = ember.from_numpy(RNG.standard_normal((3, 4, 20)).astype(np.float32))
    lin = ember.nn.Linear(20, 9)
    lin.load_state_dict({"weight": w, "bias": b})
    with ember.no_grad():
        want = lin(x).numpy()
    lin.weight._data = G.PackedWeight(lin.weight._data)
    arrays = [x._data, lin.weight._data, lin.bias._data]
    assert registry.pick("linear", "cpu", arrays, {}).name == "linear_packed"
    tall = np.zeros((1500, 20), np.float32)  # tall products too (OpenBLAS's workers would spin)
    assert registry.pick("linear", "cpu", [tall, *arrays[1:]], {}).name == "linear_packed"
    with ember.no_grad():
        np.testing.assert_allclose(lin(x).numpy(), want, rtol=1e-5, atol=1e-5)
    # a graph being recorded: the kernel runs too (Linear.saved keeps x and w for backward)
    y = lin.requires_grad_(True)(x)
    y.sum().backward()
    np.testing.assert_allclose(
        lin.weight.grad.numpy(),
        np.broadcast_to(x.numpy().reshape(-1, 20).sum(0), (9, 20)),
        rtol=1e-5,
        atol=1e-5,  # a column sum near 0 (RNG's state depends on the test order) has no rtol
    )


def test_without_microkernels_nothing_is_packed_in_a_fresh_process():
    """EMBER_SGEMM_ISA=none: no panels, the ops' numpy paths (what a CPU without AVX2 runs)."""
    code = (
        "import numpy as np\n"
        "from ember.kernels.cpu import gemm as G\n"
        "assert G.panel_width() is None and G.isa() is None\n"
        "p = G.PackedWeight(np.ones((3, 4), np.float32))\n"
        "assert p.panels is None\n"
        "from tests.inference import test_optimize as t\n"
        "t.test_optimize_generic_sequential_and_leave_original_alone()\n"
        "t.test_residual_blocks_of_the_zoo_match_torch('resnet18')\n"
    )
    env = {**os.environ, "EMBER_SGEMM_ISA": "none"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)


def test_products_from_several_threads_at_once_on_the_pool():
    """Python threads calling products together: one holds the pool, the others run alone."""
    import threading

    old = G.SERIAL_BELOW
    G.SERIAL_BELOW = 0  # every product on the pool's path
    try:
        xs = [RNG.standard_normal((37, 48)).astype(np.float32) for _ in range(4)]
        w = G.PackedWeight(RNG.standard_normal((70, 48)).astype(np.float32))
        want = [x @ np.asarray(w).T for x in xs]
        got: list = [None] * 4

        def work(i):
            for _ in range(30):
                got[i] = G.linear_packed(xs[i], w)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)
    finally:
        G.SERIAL_BELOW = old


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "o,with_res,k", [(NR * 4, True, 24), (NR * 4 + NR // 2, False, 300), (NR + 3, True, 40)]
)
@pytest.mark.parametrize("rows_first", [1 << 40, 0])
def test_streamed_output_matches_reference(o, with_res, k, threads, rows_first, monkeypatch):
    """Outputs of STREAM_BYTES or more, rows on cache lines: non-temporal stores for the full
    panels (masked ones for a partial last panel), after K blocks too (k > K_BLOCK); in the
    rows-first order (rows_first 0) the streaming flag is dropped."""
    monkeypatch.setattr(G, "STREAM_BYTES", 1 << 16)
    monkeypatch.setattr(G, "ROWS_FIRST_BYTES", rows_first)
    m = 1000
    a = RNG.standard_normal(m * k).astype(np.float32)
    rowoff = np.arange(m, dtype=np.int64) * k
    tapoff = np.zeros(1, np.int64)
    w2 = RNG.standard_normal((k, o)).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    res = RNG.standard_normal((m, o)).astype(np.float32) if with_res else None
    ref = G.gemm_reference(a, rowoff, tapoff, k, w2, bias, res, 1, np.empty((m, o), np.float32))
    buf = np.full(m * o + 16, np.nan, np.float32)
    off = (-buf.ctypes.data % 64) // 4
    for start in (off, off + 1):  # on a cache line (streamed), and off one (stored as before)
        out = buf[start : start + m * o].reshape(m, o)
        G.gemm(a, rowoff, tapoff, k, G.pack_weight(w2, NR), bias, res, 1, out, threads=threads,
               stream=True)  # fmt: skip
        np.testing.assert_allclose(out, ref, atol=2e-6 * np.abs(ref).max() * np.sqrt(k), rtol=1e-5)


@pytest.mark.parametrize("m", [97, 197, 256, 257])
def test_linear_on_one_thread_sweeps_all_rows_up_to_one_block(m, serial_rows):
    """On the calling thread a linear of at most LINEAR_ONE_BLOCK_ROWS rows and enough panels
    sweeps all its rows per pass over the panels (each panel read once), a taller one blocks
    of CHUNK_PIXELS; results match float64 with and without a residual."""
    k, o = 300, 8 * NR + 5
    w = RNG.standard_normal((o, k)).astype(np.float32)
    pw, b = G.PackedWeight(w), RNG.standard_normal(o).astype(np.float32)
    for with_res in (False, True):
        x = RNG.standard_normal((m, k)).astype(np.float32)
        res = RNG.standard_normal((m, o)).astype(np.float32) if with_res else None
        got = G.linear_packed_residual(x, pw, b, res)
        want = x.astype(np.float64) @ w.T.astype(np.float64) + b
        want = want + (0 if res is None else res)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    mr = G._state()["mr"]
    one = m <= G.LINEAR_ONE_BLOCK_ROWS
    assert set(serial_rows) == {-(-m // mr) * mr if one else G.CHUNK_PIXELS}
