"""One row of x times a packed weight on the pool (kernels.cpu.gemv): a float64 reference on
awkward shapes, bitwise the packed GEMM's row at every thread count, the channel mean before it,
NaN and inf, callers on two threads, a deep copy, the operand checks and the AVX2 family."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest

from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import gemv
from tests.helpers import _thread_counts, threads_set

pytestmark = pytest.mark.skipif(gemv.state() is None, reason="no AVX2 / llvmlite / numba here")
RNG = np.random.default_rng(5)
# (outputs, inputs): one panel partly used, panels and a partial one, K not a multiple of the
# unroll, K = 1, ResNet-50's classifier
SHAPES = [(17, 5), (33, 130), (70, 1), (100, 67), (1000, 2048)]


def _f32(*shape, offset=0.0):
    return (RNG.standard_normal(shape) + offset).astype(np.float32)


def _product(o, k, bias=True):
    w = _f32(o, k)
    b = _f32(o) if bias else None
    pw = G.PackedWeight(w)
    if pw.panels is None or pw.panels.shape[2] != gemv.state()["nr"]:
        pytest.skip("narrow panels here")
    return w, b, pw, gemv.RowProduct(pw.panels, o, b)


@pytest.mark.parametrize("o,k", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_matches_float64_and_is_the_gemm_row_bitwise(o, k, bias):
    w, b, pw, rp = _product(o, k, bias)
    x = _f32(3, k)
    rows = G.linear_packed_residual(x, pw, b, None)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    for threads in _thread_counts():
        with threads_set(threads):
            for i in range(3):
                got = rp(np.ascontiguousarray(x[i]))
                assert got.shape == (o,) and got.dtype == np.float32
                np.testing.assert_allclose(got, want[i], rtol=1e-5, atol=1e-4 * np.sqrt(k))
                np.testing.assert_array_equal(got, rows[i], err_msg=f"row {i}, {threads} thr")


@pytest.mark.parametrize("o,k", SHAPES)
@pytest.mark.parametrize("rows", [1, 7, 49])
def test_mean_of_rows_then_product(o, k, rows):
    """The global average pool's mean (float64 sums) then the product: bitwise the product of
    numpy's float64 mean rounded to float32."""
    _, b, _, rp = _product(o, k)
    x = _f32(rows, k, offset=3.0)  # an offset: float32 running sums would drift
    mean = (x.astype(np.float64).sum(axis=0) / rows).astype(np.float32)
    for threads in _thread_counts():
        with threads_set(threads):
            got = rp(x.reshape(-1), rows)
            np.testing.assert_array_equal(got, rp(mean))


def test_nan_and_inf_go_through():
    _, _, _, rp = _product(40, 64)
    x = _f32(64)
    x[3], x[10] = np.nan, np.inf
    got = rp(x)
    assert np.isnan(got).all()  # every output reads x[3]
    x = _f32(5, 64)
    x[2, 9] = np.inf
    got = rp(x.reshape(-1), 5)
    assert not np.isnan(got).all()
    assert np.isinf(got).any() or np.isnan(got).any()


def test_callers_on_two_threads():
    """Two Python threads at once: one takes the pool's job block, the other runs on its own."""
    w, b, pw, rp = _product(300, 256)
    xs = [_f32(256) for _ in range(8)]
    want = [rp(x) for x in xs]
    bad = []

    def work(i: int) -> None:
        for _ in range(50):
            if not np.array_equal(rp(xs[i]), want[i]):
                bad.append(i)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


def test_deep_copy_owns_its_operands():
    w, b, pw, rp = _product(50, 40)
    x = _f32(40)
    want = rp(x)
    cp = copy.deepcopy(rp)
    del rp
    np.testing.assert_array_equal(cp(x), want)
    assert cp.panels is not pw.panels


def test_operand_checks():
    w, b, pw, rp = _product(50, 40)
    for bad in (_f32(41), _f32(2, 40), _f32(80)[::2], _f32(40).astype(np.float64)):
        with pytest.raises(ValueError):
            rp(bad)
    with pytest.raises(ValueError):
        rp(_f32(3 * 40), 2)  # not rows x K values
    with pytest.raises(ValueError):
        gemv.RowProduct(pw.panels, 50, _f32(49))
    with pytest.raises(ValueError):
        gemv.RowProduct(pw.panels, pw.panels.shape[0] * pw.panels.shape[2] + 1, None)
    with pytest.raises(ValueError):
        gemv.RowProduct(pw.panels[:, :, :8].copy(), 8, None)  # panels of another width


def test_avx2_family_in_a_fresh_process():
    """NR = 16 panels and 8-lane vectors (what an AVX2-only CPU runs)."""
    from tests.helpers import run_fresh

    code = (
        "from ember.kernels.cpu import gemm\n"
        "from tests.kernels import test_gemv as t\n"
        "assert gemm.isa() == 'avx2'\n"
        "for o, k in t.SHAPES:\n"
        "    t.test_matches_float64_and_is_the_gemm_row_bitwise(o, k, True)\n"
        "    t.test_mean_of_rows_then_product(o, k, 7)\n"
        "print('ok')\n"
    )
    assert run_fresh(code, {"EMBER_SGEMM_ISA": "avx2"})[-1] == "ok"
