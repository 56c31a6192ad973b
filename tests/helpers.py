"""One helper to test an op against torch: forward, backward, dtypes, non-contiguous, meta.

check(ember.exp, torch.exp, [(3, 4)])                       # one line per op
check(lambda a, b: a + b, None, [(3, 1), (4,)])              # same lambda for both
check(lambda a, b: a * b, None, [(3, 4), (4,)], dtypes=LOW, reduce=3)  # see low_tol
gradcheck(ember.exp, [(3, 4)])                               # finite differences, float64

float16 and bfloat16 are never compared with torch's own float16/bfloat16 output, which
depends on the CPU (oneDNN/AVX-512 paths accumulate differently): the reference is torch in
float64 on the same (upcast) values, rounded to the dtype, and the tolerance is ``low_tol``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

import ember

TORCH_DT = {
    ember.float32: torch.float32, ember.float64: torch.float64, ember.float16: torch.float16,
    ember.bfloat16: torch.bfloat16, ember.int64: torch.int64, ember.int32: torch.int32,
    ember.int16: torch.int16, ember.int8: torch.int8, ember.uint8: torch.uint8, ember.bool: torch.bool,
}  # fmt: skip
TOL = {ember.float64: (1e-10, 1e-10), ember.float32: (1e-5, 1e-5)}  # float16/bfloat16: low_tol
FLOATS = (ember.float32, ember.float64)
LOW = (ember.float16, ember.bfloat16)
EPS = {ember.float16: 2.0**-10, ember.bfloat16: 2.0**-7}  # machine epsilon: 1 ulp at 1.0


def low_tol(dtype, reduce: int = 1) -> tuple[float, float]:
    """(atol, rtol) for a float16/bfloat16 result against the float64 reference rounded to it.

    An op that accumulates in float32 (or better) and rounds once to the dtype is within one
    ulp of ``ref = round(exact)`` (its float32 error, ~2**-24 per term, is far below an ulp):
    ``ulp(r) <= eps * |r|``, so ``rtol = 2 * eps`` with one ulp to spare. ``reduce`` counts the
    values already rounded to the dtype that are summed into one output, forward or backward:
    1 for a fused op (matmul, conv, norms), n for a sum over n rounded products (a lambda of
    several ops, the grad of a broadcast input). Their rounding errors (each <= eps/2 of a
    term; terms are O(1): check draws inputs from [-2, 2]) add up like a random walk, which may
    cancel to near zero: ``atol = 2 * eps * sqrt(reduce)``. Accumulating a length-k sum in the
    dtype itself (k roundings of partial sums ~sqrt(j) terms big) errs by ~eps * k / 3 terms
    and fails: 16-48 eps on the conv tests (k = 18-144), where a correct one is within an ulp.
    """
    e = EPS[dtype]
    return 2 * e * math.sqrt(max(reduce, 1)), 2 * e


def rand_array(shape, dtype, rng, low=-2.0, high=2.0, positive=False) -> np.ndarray:
    """Random data of an ember dtype as a numpy array (ints in a small range, bools 50/50)."""
    if dtype is ember.bool:
        return np.asarray(rng.random(shape) < 0.5)
    if not dtype.is_floating_point:
        lo = 0 if (positive or not dtype.is_signed) else -5
        return rng.integers(lo + (1 if positive else 0), 6, shape).astype(dtype.np)
    a = rng.uniform(0.1 if positive else low, high, shape)
    return a.astype(dtype.np)


def noncontig(a: np.ndarray) -> np.ndarray:
    """The same values in a non-contiguous (transposed-storage) layout."""
    if a.ndim < 2:
        b = np.empty(a.shape[:-1] + (a.shape[-1] * 2,) if a.ndim else (), a.dtype)
        if a.ndim:
            b[..., ::2] = a
            return b[..., ::2]
        b[...] = a
        return b
    return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """numpy (incl. ml_dtypes bfloat16) -> torch, same values."""
    if a.dtype == ember.bfloat16.np:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(a, order="C", copy=True))


def from_torch(t: torch.Tensor) -> np.ndarray:
    """torch -> numpy, bfloat16 via float32."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ember.bfloat16.np)
    return t.numpy()


def assert_close(e, t, dtype, what="", atol=None, rtol=None, reduce: int = 1) -> None:
    """Compare an ember result with a reference: shape, dtype and values.

    Default tolerance: ``TOL`` for float32/float64 results, ``low_tol(dtype, reduce)`` for
    float16/bfloat16 ones (then ``t`` must be a float64 reference rounded to the dtype, as
    ``check`` makes it, never torch's own low-precision output). Explicit ``atol``/``rtol``
    replace TOL; for float16/bfloat16 they only loosen ``low_tol``.
    """
    if isinstance(t, (tuple, list)):
        assert isinstance(e, (tuple, list)) and len(e) == len(t), f"{what}: {type(e)} vs {type(t)}"
        for i, (ee, tt) in enumerate(zip(e, t)):
            assert_close(ee, tt, dtype, f"{what}[{i}]", atol, rtol, reduce)
        return
    if not isinstance(t, torch.Tensor):
        assert e == t or np.allclose(e, t), f"{what}: {e} vs {t}"
        return
    assert isinstance(e, ember.Tensor), f"{what}: expected a Tensor, got {type(e)}"
    assert tuple(e.shape) == tuple(t.shape), (
        f"{what}: shape {tuple(e.shape)} vs torch {tuple(t.shape)}"
    )
    assert str(e.dtype).split(".")[1] == str(t.dtype).split(".")[1], (
        f"{what}: dtype {e.dtype} vs {t.dtype}"
    )
    if e.dtype in LOW:
        a0, r0 = low_tol(e.dtype, reduce)
        atol, rtol = max(atol or 0, a0), max(rtol or 0, r0)
    a0, r0 = TOL.get(e.dtype, (0, 0))
    ea = e.detach().numpy().astype(np.float64) if e.dtype is ember.bfloat16 else e.detach().numpy()
    ta = from_torch(t)
    ta = ta.astype(np.float64) if ta.dtype == ember.bfloat16.np else ta
    np.testing.assert_allclose(ea, ta, atol=atol if atol is not None else a0, rtol=rtol if rtol is not None else r0,
                               err_msg=what, equal_nan=True)  # fmt: skip


def to_float64(a):
    """A float16/bfloat16 array as a float64 torch tensor of the same values (others as to_torch)."""
    if isinstance(a, np.ndarray) and a.dtype in (np.float16, ember.bfloat16.np):
        return torch.from_numpy(np.array(a, np.float64, order="C"))
    return to_torch(a) if isinstance(a, np.ndarray) else a


def round_like(ref, like):
    """A float64 reference rounded to the dtypes of ``like`` (torch's output in the test dtype).

    Floating outputs are rounded (round-to-nearest-even) to like's dtype; integer and bool
    outputs (indices, comparisons: exact on the dtype's values) and non-tensors are like's own.
    """
    if isinstance(like, (tuple, list)):
        return [round_like(r, k) for r, k in zip(ref, like)]
    if isinstance(like, torch.Tensor) and like.dtype.is_floating_point:
        return ref.detach().to(like.dtype)
    return like


def check(
    efn,
    tfn,
    shapes,
    dtypes=FLOATS,
    grad: bool = True,
    atol=None,
    rtol=None,
    positive: bool = False,
    low: float = -2.0,
    high: float = 2.0,
    meta: bool = True,
    contig_variants: bool = True,
    seed: int = 0,
    reduce: int = 1,
) -> None:
    """Run efn on ember tensors and tfn (default: efn) on torch tensors made from the same data.

    shapes: list of input shapes (a non-tuple item is passed to both as is, e.g. a scalar).
    Checks forward values/shape/dtype for each dtype, backward grads for float dtypes, the same on
    non-contiguous inputs, and that the meta device gives the same output shape and dtype.
    float16/bfloat16: the reference is tfn in float64 on the same values, rounded to the dtype
    (shapes, dtypes and integer outputs from tfn in the dtype itself), within
    ``low_tol(dtype, reduce)``: ``reduce`` counts the dtype-rounded values summed into one
    output, forward or backward (1 for a single fused op).
    """
    tfn = tfn or efn
    rng = np.random.default_rng(seed)
    for dt in dtypes:
        base = [
            rand_array(s, dt, rng, low, high, positive) if isinstance(s, tuple) else s
            for s in shapes
        ]
        variants = [base]
        if contig_variants:
            variants.append([noncontig(a) if isinstance(a, np.ndarray) else a for a in base])
        for k, arrays in enumerate(variants):
            tag = f"{getattr(efn, '__name__', 'op')} {dt} {'noncontig' if k else 'contig'} shapes={shapes}"
            want_grad = grad and dt.is_floating_point
            lowp = dt in LOW
            to_ref = to_float64 if lowp else to_torch
            e_in = [
                ember.from_numpy(a).requires_grad_(want_grad) if isinstance(a, np.ndarray) else a
                for a in arrays
            ]
            t_in = [
                to_ref(a).requires_grad_(want_grad) if isinstance(a, np.ndarray) else a
                for a in arrays
            ]
            t_out = tfn(*t_in)
            t_want = t_out
            if lowp:  # torch in the dtype itself gives only dtypes, shapes and integer outputs
                with torch.no_grad():
                    like = tfn(*[to_torch(a) if isinstance(a, np.ndarray) else a for a in arrays])
                t_want = round_like(t_out, like)
            e_out = efn(*e_in)
            assert_close(e_out, t_want, dt, tag + " forward", atol, rtol, reduce)
            if want_grad:
                outs_t = t_out if isinstance(t_out, (tuple, list)) else [t_out]
                outs_e = e_out if isinstance(e_out, (tuple, list)) else [e_out]
                loss_t, loss_e = 0, 0
                for ot, oe in zip(outs_t, outs_e):
                    if isinstance(ot, torch.Tensor) and ot.requires_grad:
                        w = rand_array(tuple(ot.shape), dt, rng)
                        loss_t = loss_t + (ot * to_ref(w)).sum()
                        loss_e = loss_e + (oe * ember.from_numpy(w)).sum()
                if isinstance(loss_t, torch.Tensor):
                    loss_t.backward()
                    loss_e.backward()
                    for i, (a, b) in enumerate(zip(e_in, t_in)):
                        if isinstance(b, torch.Tensor) and b.requires_grad:
                            if b.grad is None:
                                assert a.grad is None or not np.any(a.grad.numpy()), (
                                    f"{tag}: grad {i} should be None"
                                )
                            else:
                                assert a.grad is not None, f"{tag}: missing grad for input {i}"
                                bg = b.grad.to(TORCH_DT[dt]) if lowp else b.grad
                                assert_close(a.grad, bg, dt, f"{tag} grad[{i}]", atol, rtol, reduce)
            if meta and k == 0:
                m_in = [x.detach().to("meta") if isinstance(x, ember.Tensor) else x for x in e_in]
                m_out = efn(*m_in)
                outs_m = m_out if isinstance(m_out, (tuple, list)) else [m_out]
                outs_e = e_out if isinstance(e_out, (tuple, list)) else [e_out]
                for om, oe in zip(outs_m, outs_e):
                    if isinstance(oe, ember.Tensor):
                        assert om.device == "meta", f"{tag}: meta output on {om.device}"
                        assert om.shape == oe.shape and om.dtype == oe.dtype, (
                            f"{tag}: meta {om.shape}/{om.dtype}"
                        )


def gradcheck(
    efn,
    shapes,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    positive=False,
    low=-2.0,
    high=2.0,
    seed: int = 0,
) -> None:
    """Compare ember's analytic gradient with central finite differences in float64."""
    rng = np.random.default_rng(seed)
    arrays = [
        rand_array(s, ember.float64, rng, low, high, positive) if isinstance(s, tuple) else s
        for s in shapes
    ]
    ins = [
        ember.from_numpy(a.copy()).requires_grad_() if isinstance(a, np.ndarray) else a
        for a in arrays
    ]
    out = efn(*ins)
    out = out[0] if isinstance(out, (tuple, list)) else out
    w = rng.standard_normal(tuple(out.shape))
    (out * ember.from_numpy(w)).sum().backward()
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            continue
        num = np.zeros_like(a)
        flat = a.reshape(-1)
        for j in range(flat.size):
            old = flat[j]
            vals = []
            for d in (eps, -eps):
                flat[j] = old + d
                args = [
                    ember.from_numpy(x.reshape(x.shape)) if isinstance(x, np.ndarray) else x
                    for x in arrays
                ]
                o = efn(*args)
                o = o[0] if isinstance(o, (tuple, list)) else o
                vals.append(float((o.detach().numpy() * w).sum()))
            flat[j] = old
            num.reshape(-1)[j] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(
            ins[i].grad.numpy(), num, atol=atol, rtol=rtol, err_msg=f"gradcheck input {i}"
        )


def _thread_counts() -> list[int]:
    """Numba thread counts to run kernels at: 1 to 3, as far as numba's pool allows."""
    from ember.kernels.cpu import numba_or_none

    nb = numba_or_none()
    return [1] if nb is None else list(range(1, min(3, nb.config.NUMBA_NUM_THREADS) + 1))


def check_kernel(kernel, reference=None, cases=(), *, rtol=1e-5, atol=1e-5, threads=None) -> int:
    """Compare a kernel with its numpy reference on every case; returns how many runs it made.

    ``kernel``: a registry ``Kernel`` (its ``reference`` is the default) or a plain function.
    ``cases``: ``(args, kwargs)`` pairs (or bare ``args`` tuples) of numpy arrays and values.
    Each case runs as given and with every array argument in a non-contiguous layout, at 1-3
    numba threads; a registry kernel runs only where its conditions hold (as ``Function.apply``
    would pick it). NaN and infinity must appear in the same places as in the reference.
    """
    from ember.kernels.registry import Kernel

    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    ref = reference if reference is not None else kernel.reference
    runs = 0
    for case in cases:
        args, kwargs = case if len(case) == 2 and isinstance(case[1], dict) else (case, {})
        variants = [tuple(args)]
        if any(isinstance(a, np.ndarray) and a.ndim for a in args):
            variants.append(tuple(noncontig(a) if isinstance(a, np.ndarray) else a for a in args))
        want = ref(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args], **kwargs)
        for v in variants:
            arrays = [a for a in v if isinstance(a, np.ndarray)]
            if isinstance(kernel, Kernel) and not kernel.applies(arrays, kwargs):
                continue
            for n in threads or _thread_counts():
                with threads_set(n):
                    got = fn(*v, **kwargs)
                _compare_kernel(got, want, rtol, atol, f"{getattr(fn, '__name__', fn)} {n} thr")
                runs += 1
    assert runs, "check_kernel ran nothing: no case met the kernel's conditions"
    return runs


def _compare_kernel(got, want, rtol, atol, what) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for g, w in zip(got, want):
            _compare_kernel(g, w, rtol, atol, what)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs reference {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs reference {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what, equal_nan=True)


class threads_set:
    """Run a block with numba and ember's worker pool at n threads (restored after)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        from ember.kernels.cpu import numba_or_none, pool

        self.nb = numba_or_none()
        if self.nb is not None:
            self.prev = self.nb.get_num_threads()
            self.nb.set_num_threads(self.n)
        pool.set_workers(self.n - 1)

    def __exit__(self, *exc) -> None:
        from ember.kernels.cpu import pool

        if self.nb is not None:
            self.nb.set_num_threads(self.prev)
        pool.reconfigure()


def picked_kernels(monkeypatch) -> list:
    """The names of the kernels ``registry.pick`` returns from now on (None: no kernel), in
    order: a list that fills as ops run."""
    from ember.kernels import registry

    names: list = []
    real = registry.pick

    def spy(op, *a):
        kern = real(op, *a)
        names.append(kern.name if kern is not None else None)
        return kern

    monkeypatch.setattr(registry, "pick", spy)
    return names


def run_fresh(code: str, env: dict) -> list[str]:
    """Run Python code in a fresh process from the repository root with env added to the
    environment (switches read at import); its stdout split into words."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, cwd=root, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.split()
