"""The LLVM IR decode attention (kernels.cpu.decode_attention) against the op's numpy reference:
head sizes, query heads per key head, windows, cache rows, strided queries; batched rows bitwise
as each row alone, at one and two threads; the captured-step binding equal to the plain call."""

import numpy as np
import pytest

from ember.errors import ShapeError
from ember.kernels.cpu import cached_attention as ca
from ember.kernels.cpu import decode_attention as da
from tests.helpers import threads_set

pytestmark = pytest.mark.skipif(da._compiled(64, 1) is None, reason="no AVX2 / llvmlite here")

# (batch, new tokens, query heads, key heads, head size, first position, window)
CASES = [(1, 1, 9, 3, 64, 40, 0), (8, 1, 9, 3, 64, 0, 0), (3, 2, 32, 4, 64, 100, 0),
         (2, 1, 4, 4, 128, 7, 5), (5, 3, 6, 2, 64, 30, 4), (2, 1, 8, 1, 64, 300, 0)]  # fmt: skip


def _case(rng, b, t, hq, hk, d, past, window, max_len=512):
    slots = b + 2
    kc = rng.standard_normal((slots, hk, max_len, d)).astype(np.float32)
    vc = rng.standard_normal((slots, hk, max_len, d)).astype(np.float32)
    qk = rng.standard_normal((b, t, hq + hk, d)).astype(np.float32)
    q = qk[:, :, :hq]  # a strided view, as the rotary kernel leaves it
    k = rng.standard_normal((b, t, hk, d)).astype(np.float32)
    v = rng.standard_normal((b, t, hk, d)).astype(np.float32)
    pasts = np.array([past + 5 * i for i in range(b)], np.int64)
    rows = rng.permutation(slots)[:b].astype(np.int64)
    kw = dict(kc=kc, vc=vc, past=pasts, window=window, pad=None, scale=0.125, softcap=None,
              rows=rows)  # fmt: skip
    return (q, k, v), kw


@pytest.mark.parametrize("case", CASES)
def test_matches_the_reference_and_each_row_alone(case):
    rng = np.random.default_rng(sum(case))
    (q, k, v), kw = _case(rng, *case)
    assert da.applies(q, kw["kc"], None, None)
    want = ca.cached_attention_reference(q, k, v, **kw)  # stores k, v too
    n = int(kw["past"].max()) + q.shape[1]
    for threads in (1, 2):
        with threads_set(threads):
            got = da.attend(q, kw["kc"], kw["vc"], kw["rows"], kw["past"], n, case[6], 0.125)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
            for b in range(q.shape[0]):
                p = kw["past"][b : b + 1]
                one = da.attend(q[b : b + 1], kw["kc"], kw["vc"], kw["rows"][b : b + 1], p,
                                int(p[0]) + q.shape[1], case[6], 0.125)  # fmt: skip
                np.testing.assert_array_equal(one[0], got[b])


def test_the_op_kernel_takes_it_and_the_others_keep_numba():
    rng = np.random.default_rng(1)
    (q, k, v), kw = _case(rng, 2, 1, 6, 2, 64, 10, 0)
    got = ca.cached_attention(q, k, v, **kw)
    np.testing.assert_allclose(got, ca.cached_attention_reference(q, k, v, **kw), 1e-5, 2e-6)
    assert not da.applies(q, kw["kc"], np.ones((2, 12), bool), None)  # padding
    assert not da.applies(q, kw["kc"], None, 30.0)  # soft-capping
    assert not da.applies(q[..., :12], kw["kc"][..., :12], None, None)  # 12 floats a head
    assert not da.applies(np.zeros((1, 1, 18, 64), np.float32), kw["kc"], None, None)  # rep 9


def test_bound_step_equals_the_plain_call_and_checks_the_cache_end():
    rng = np.random.default_rng(2)
    (q, k, v), kw = _case(rng, 3, 1, 9, 3, 64, 20, 0, max_len=64)
    kc2, vc2 = kw["kc"].copy(), kw["vc"].copy()
    past = kw["past"].copy()  # the buffer a captured step reads
    out = np.empty((3, 1, 9 * 64), np.float32)
    run = da.bind(q, k, v, kc2, vc2, kw["rows"], past, 0, 0.125, out)
    for step in range(3):
        want = ca.cached_attention(q, k, v, **kw)
        run()
        np.testing.assert_array_equal(out, want, err_msg=f"step {step}")
        kw["past"] += 1
        past += 1
    np.testing.assert_array_equal(kc2, kw["kc"])
    past[:] = 63 + np.arange(3)  # the last row would write past the cache
    with pytest.raises(ShapeError, match="overflow"):
        run()
