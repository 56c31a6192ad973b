"""numba kernels; each module keeps a pure-numpy reference beside every kernel.

Nothing here imports numba at module import: ``numba_or_none()`` does it on first use, so
``import ember`` stays light, and the numpy references serve where numba is absent.
"""

from __future__ import annotations

import os

import numpy as np

from ember import config

_numba = False


def numba_or_none():
    """The numba module, or None when it is not installed or EMBER_NO_NUMBA=1."""
    global _numba
    if _numba is False:
        # How numba's OpenMP workers wait between parallel regions: they go to sleep at once
        # (GOMP_SPINCOUNT=0), a futex wake-up per region. libgomp's default spins 300k rounds
        # (~10 ms): with another busy process on the machine that turned a 40 us matrix-vector
        # product into a 13 ms one (the spinners hold the core the main thread needs). 10k rounds
        # (~0.1-0.2 ms, ember's setting before) kept workers awake from one layer to the next on
        # an idle machine, but on a shared one (2 cores, load ~4) every spin is charged to this
        # process by the scheduler and each region then waited for a core: 0.5 ms for a 13 us
        # conv, ResNet-50 b1 66 ms vs 39 ms asleep (bench/vision.py, torch eager in the same
        # process 215 vs 56 ms: it shares libgomp), MobileNetV2 b1 37 vs 12 ms; decoding (ember's
        # own worker pool) is unchanged. Users' own OMP_WAIT_POLICY / GOMP_SPINCOUNT win.
        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", "0")
        if config.NO_NUMBA:
            _numba = None
        else:
            try:
                import numba
            except ImportError:  # pragma: no cover - numba is a required dependency
                numba = None
            _numba = numba
            if numba is not None:
                from ember.threads import apply_numba_threads

                apply_numba_threads()
    return _numba


def renamed(fn, suffix: str):
    """A copy of fn whose qualified name ends in _suffix, for a separate numba cache entry.

    numba's on-disk cache tells functions apart by file and qualified name, not by compile
    options or by what they link: a parallel variant of a kernel, or one keyed on another
    module's source (``vecmath.keyed``), needs a name of its own.
    """
    import types

    g = types.FunctionType(
        fn.__code__, fn.__globals__, f"{fn.__name__}_{suffix}", fn.__defaults__, fn.__closure__
    )
    g.__qualname__ = f"{fn.__qualname__}_{suffix}"
    return g


def have_numba() -> bool:
    """Whether numba kernels can run here (the registry's ``available`` for them)."""
    return numba_or_none() is not None


# fast-math without "no infinities/NaNs": masked scores are -inf and must stay so
FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})


class jit:
    """A numba kernel compiled on its first call (``@njit(cache=True, nogil=True)``).

    ``jit(fn)(*args)`` compiles fn (or loads it from numba's cache) the first time; options are
    numba's (``parallel=True``, ``fastmath=...``). ``suffix`` gives a variant its own cache
    entry (see ``renamed``). Callers check ``have_numba()`` first: without numba this raises.
    """

    def __init__(self, fn, *, suffix: str | None = None, **options) -> None:
        self.py = fn if suffix is None else renamed(fn, suffix)
        opts = {"cache": True, "nogil": True, "error_model": "numpy", "fastmath": set(FASTMATH)}
        opts.update(options)
        self.options = opts
        self._compiled = None

    def __call__(self, *args):
        k = self._compiled
        if k is None:
            nb = numba_or_none()
            if nb is None:
                raise RuntimeError("numba kernel called without numba (check have_numba() first)")
            k = self._compiled = nb.njit(**self.options)(self.py)
        return k(*args)


def built_once(state: dict, lock, build) -> dict | None:
    """``state`` filled once by ``build()`` (a dict with "ok"), under ``lock`` so that two
    threads never compile the same kernels; the state, or None where "ok" is False."""
    if "ok" not in state:
        with lock:
            if "ok" not in state:
                state.update(build())
    return state if state["ok"] else None


def with_bias(run, out, bias):
    """A bound product ``run`` (a captured step's kernel call into out), then ``out += bias``;
    ``run`` itself when bias is None."""
    if bias is None:
        return run

    def run_bias() -> None:
        run()
        np.add(out, bias, out=out)

    return run_bias
