"""The narrow packed GEMM (panels of one vector) against the float64 reference: awkward row
counts, 1..NR/2 outputs, residual and activations, serial and on the pool, both ISA families."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.kernels.cpu import gemm as G
from ember.kernels.cpu import gemm_narrow as N
from tests.kernels.test_gemm import _conv_case

RNG = np.random.default_rng(5)
pytestmark = pytest.mark.skipif(not G.microkernels_available(), reason="no packed GEMM here")


def _run(a, rowoff, tapoff, kc, o, act, with_res, threads, parallel):
    m = len(rowoff)
    w2 = RNG.standard_normal((len(tapoff) * kc, o)).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    res = RNG.standard_normal((m, o)).astype(np.float32) if with_res else None
    want = np.empty((m, o), np.float32)
    G.gemm_reference(a.astype(np.float64), rowoff, tapoff, kc, w2.astype(np.float64), bias, res,
                     act, want)  # fmt: skip
    old, old_serial = ember.get_num_threads(), G.SERIAL_BELOW
    ember.set_num_threads(threads)
    G.SERIAL_BELOW = 0 if parallel else old_serial
    try:
        out = np.full((m, o), np.nan, np.float32)
        packed = G.pack_weight(w2, N.width())
        assert G.gemm(a, rowoff, tapoff, kc, packed, bias, res, act, out) is out
    finally:
        ember.set_num_threads(old)
        G.SERIAL_BELOW = old_serial
    scale = np.abs(want).max() if want.size else 1.0
    np.testing.assert_allclose(out, want, atol=2e-6 * scale * np.sqrt(w2.shape[0]), rtol=1e-5)


CASES = [  # n, h, w, c, o, k, stride, pad
    (1, 9, 11, 3, 16, 3, 2, 1),  # the RGB stem's shape: a full narrow panel
    (2, 7, 5, 24, 5, 3, 1, 1),  # partial panel, two images
    (1, 13, 1, 40, 1, 1, 1, 0),  # one output column, 13 rows (a tile remainder)
    (3, 4, 5, 3, 8, 5, 1, 2),  # 25 taps of 3 channels
]


@pytest.mark.parametrize("n,h,w,c,o,k,s,pad", CASES)
@pytest.mark.parametrize("threads,parallel", [(1, False), (2, False), (2, True), (3, True)])
def test_narrow_conv_gemm_matches_reference(n, h, w, c, o, k, s, pad, threads, parallel):
    o = min(o, N.width())
    a, rowoff, tapoff, _ = _conv_case(n, h, w, c, o, k, s, pad)
    for act, with_res in ((0, False), (1, True), (2, False)):
        _run(a, rowoff, tapoff, c, o, act, with_res, threads, parallel)


def test_narrow_weights_are_packed_narrow_and_linear_stays_exact():
    """PackedWeight picks the narrow panels for at most NR/2 outputs; F.linear then runs them."""
    nr = G.panel_width()
    for o, want in ((nr // 2, N.width()), (nr // 2 + 1, nr), (1, N.width())):
        w = RNG.standard_normal((o, 37)).astype(np.float32)
        pw = G.PackedWeight(w)
        assert pw.panels.shape == (-(-o // want), 37, want)
        x = RNG.standard_normal((203, 37)).astype(np.float32)
        b = RNG.standard_normal(o).astype(np.float32)
        got = G.linear_packed(x, pw, b)
        np.testing.assert_allclose(got, x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-4)


def test_avx2_narrow_kernels_in_a_fresh_process():
    """The AVX2 family's narrow panels (8 columns), forced by EMBER_SGEMM_ISA on AVX-512."""
    code = (
        "from tests.kernels import test_gemm_narrow as t\n"
        "assert t.N.width() == 8, t.N.width()\n"
        "for case in t.CASES:\n"
        "    for tp in ((1, False), (2, True)):\n"
        "        t.test_narrow_conv_gemm_matches_reference(*case, *tp)\n"
        "t.test_narrow_weights_are_packed_narrow_and_linear_stays_exact()\n"
    )
    env = {**os.environ, "EMBER_SGEMM_ISA": "avx2"}
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True, timeout=300)
