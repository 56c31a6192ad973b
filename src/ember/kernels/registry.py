"""The kernel registry: the one place that says which kernel runs an op, and when.

An op is a ``Function`` (``ember.autograd``) whose ``forward`` is the reference path and the
autograd path. A kernel is a faster way to compute the same ``forward`` on some inputs; it is
registered for the op's name with the conditions under which it applies::

    @register("rms_norm", dtypes=(np.float32,), reference=rms_norm_reference)
    def rms_norm_f32(x, w, *, eps): ...

``Function.apply`` asks ``pick`` for a kernel and calls it with the arrays and keyword arguments
``forward`` would get. A kernel applies when

- the op's class names it (``kernel_op = "rms_norm"``),
- the inputs live on its backend (``"cpu"``),
- every array input has one of its ``dtypes`` (None: any),
- its ``when(*arrays, **kwargs)`` predicate holds (layout, shapes, weight types such as QTensor),
- it is ``available()`` on this machine (numba importable, the instruction set present), and
- no autograd graph is being recorded, unless the op defines ``saved()`` (it then stores what
  ``backward`` needs from the inputs, and the kernel replaces ``forward`` in training too).

Kernels are tried in registration order; the first that applies runs. With
``EMBER_KERNELS=reference`` none does. Each kernel carries its numpy ``reference`` (same
signature), which the tests compare it with through ``tests.helpers.check_kernel``.

Kernel modules register at import and import nothing heavy (numba is loaded on a kernel's first
call); ``ember.kernels.cpu`` imports them all the first time any op asks for a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ember import config


class Kernel:
    """One registered kernel: the function, its reference and the conditions it applies under."""

    __slots__ = (
        "op",
        "name",
        "fn",
        "reference",
        "backend",
        "dtypes",
        "when",
        "available",
        "prepare",
        "_ok",
    )

    def __init__(
        self,
        op: str,
        fn: Callable,
        reference: Callable,
        *,
        name: str | None = None,
        backend: str = "cpu",
        dtypes: Sequence | None = (np.float32,),
        when: Callable[..., bool] | None = None,
        available: Callable[[], bool] | None = None,
        prepare: Callable | None = None,
    ) -> None:
        self.op = op
        self.fn = fn
        self.reference = reference
        self.name = name or getattr(fn, "__name__", op)
        self.backend = backend
        self.dtypes = None if dtypes is None else frozenset(np.dtype(d) for d in dtypes)
        self.when = when
        self.available = available
        # prepare(out, *arrays, **kwargs): a no-argument function that computes the op again
        # into out on the same (fixed) arrays, for a captured step (ember.nn.graph); or None
        self.prepare = prepare
        self._ok: bool | None = None  # available(), asked once

    def applies(self, arrays: Sequence[np.ndarray], kwargs: dict) -> bool:
        """Whether this kernel may compute the op on these arrays and keyword arguments."""
        dts = self.dtypes
        if dts is not None:
            for a in arrays:
                if a.dtype not in dts:
                    return False
        if self.when is not None and not self.when(*arrays, **kwargs):
            return False
        ok = self._ok
        if ok is None:
            ok = self._ok = self.available is None or bool(self.available())
        return ok

    def __call__(self, *arrays, **kwargs):
        return self.fn(*arrays, **kwargs)

    def __repr__(self) -> str:
        return f"Kernel({self.op!r}, {self.name!r}, backend={self.backend!r})"


_TABLE: dict[tuple[str, str], list[Kernel]] = {}
_loaded = False


def register(
    op: str,
    *,
    reference: Callable,
    name: str | None = None,
    backend: str = "cpu",
    dtypes: Sequence | None = (np.float32,),
    when: Callable[..., bool] | None = None,
    available: Callable[[], bool] | None = None,
    prepare: Callable | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: register fn as a kernel for op (see the module docstring); returns fn."""

    def deco(fn: Callable) -> Callable:
        k = Kernel(
            op,
            fn,
            reference,
            name=name,
            backend=backend,
            dtypes=dtypes,
            when=when,
            available=available,
            prepare=prepare,
        )
        _TABLE.setdefault((op, backend), []).append(k)
        return fn

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import ember.kernels.cpu.catalog  # noqa: F401  (registers every CPU kernel)


def kernels(op: str, backend: str = "cpu") -> list[Kernel]:
    """The kernels registered for op on backend, in the order they are tried."""
    _load()
    return list(_TABLE.get((op, backend), ()))


def pick(op: str, backend: str, arrays: Sequence[np.ndarray], kwargs: dict) -> Kernel | None:
    """The first kernel registered for op that applies to these inputs, or None."""
    if not _loaded:
        _load()
    ks = _TABLE.get((op, backend))
    if not ks or config.KERNELS == "reference":
        return None
    for k in ks:
        if k.applies(arrays, kwargs):
            return k
    return None


def table() -> dict[str, list[str]]:
    """{op: [kernel names]} for every backend, for docs and debugging."""
    _load()
    return {f"{op}@{be}": [k.name for k in ks] for (op, be), ks in sorted(_TABLE.items())}
