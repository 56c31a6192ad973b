"""Reverse-mode autograd: the Function base class (the one dispatch point), grad mode, backward.

Every op is a Function subclass whose ``forward`` and ``backward`` work on backend arrays.
``Function.apply`` is the single place that picks the device path (cpu or meta), picks a
registered kernel (``ember.kernels.registry``), records the graph node when grad mode is on and
an input requires grad, and wraps the result in a Tensor.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ember.device import META
from ember.errors import AutogradError, DeviceError, EmberError, ShapeError
from ember.kernels import registry
from ember.tensor import Tensor

_grad_enabled = True
# the ops of the steps being captured (ember.nn.graph), by thread: apply appends (the Kernel
# that ran, "forward", or None for a node it cannot replay; the Function class, the input
# arrays, the keyword arguments, the output array) to the calling thread's tape
_tapes: dict[int, list] = {}


def capture_ops(tape: list | None) -> list | None:
    """From now on record every op this thread runs into ``tape`` (None: stop recording);
    returns the tape that was active (ember.nn.graph restores it)."""
    tid = threading.get_ident()
    prev = _tapes.pop(tid, None)
    if tape is not None:
        _tapes[tid] = tape
    return prev


def is_grad_enabled() -> bool:
    """Whether operations record the graph for backward."""
    return _grad_enabled


class _GradMode:
    """A grad-mode switch usable as a context manager and as a decorator."""

    mode = True

    def __enter__(self) -> None:
        global _grad_enabled
        self.prev = _grad_enabled
        _grad_enabled = self.mode

    def __exit__(self, *exc) -> None:
        global _grad_enabled
        _grad_enabled = self.prev

    def __call__(self, fn: Callable) -> Callable:
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            global _grad_enabled
            prev, _grad_enabled = _grad_enabled, mode
            try:
                return fn(*args, **kwargs)
            finally:
                _grad_enabled = prev

        return wrapper


class no_grad(_GradMode):
    """Disable graph recording inside a ``with`` block or a decorated function."""

    mode = False


class enable_grad(_GradMode):
    """Re-enable graph recording inside a no_grad region."""

    mode = True


class inference_mode(_GradMode):
    """Like no_grad (ember has no version counters to skip, so the two cost the same)."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = not mode


class set_grad_enabled(_GradMode):
    """Turn graph recording on or off: at once when called, or for a ``with`` block / decorated function."""

    def __init__(self, mode: bool) -> None:
        global _grad_enabled
        self.mode = bool(mode)
        self.prev = _grad_enabled
        _grad_enabled = self.mode

    def __enter__(self) -> None:
        global _grad_enabled
        _grad_enabled = self.mode


def meta_array(shape: tuple, dtype) -> np.ndarray:
    """A data-free array of any shape: a 0-d zero broadcast with zero strides (no memory)."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def elementwise_meta(self, *arrays, **kwargs):
    """Meta rule for broadcasting ops: the broadcast shape, the dtype forward gives on 1-element inputs."""
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    out = self.forward(*(np.ones((1,) * a.ndim, a.dtype) for a in arrays), **kwargs)
    return shape, np.asarray(out).dtype


class Function:
    """An op: ``forward(*arrays, **kw) -> array`` and ``backward(grad) -> grads per input``.

    ``backward`` returns one gradient array (or None) per tensor input, in order. A subclass may
    define ``meta(*arrays, **kw) -> (shape, dtype)`` when running ``forward`` on zero-stride
    meta arrays would cost real compute (matmul, conv); otherwise meta runs ``forward``.
    ``kernel_op`` names the op in ``ember.kernels.registry``: a registered kernel that applies
    runs instead of ``forward`` (which stays the reference and the autograd path).
    """

    meta = None
    # True for ops whose output may be a view of their first input (reshape, permute, slicing):
    # a captured step (ember.nn.graph) need not run them again when it is one
    view = False
    # the registry name of this op's kernels (ember.kernels.registry); None: forward only
    kernel_op: str | None = None
    # saved(*arrays, **kw) stores what backward needs when a kernel ran instead of forward;
    # without it, kernels run only when no graph is recorded
    saved = None
    released = False
    _out_ref = staticmethod(
        lambda: None
    )  # weak reference to the output tensor, set by Tensor._wrap

    def forward(self, *arrays, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, grad):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    @classmethod
    def apply(cls, *inputs, **kwargs):
        """Run the op on tensors: the single dispatch point of ember (and its one kernel choice)."""
        dev = inputs[0]._device
        record = False
        for t in inputs:
            if t._device is not dev:
                raise DeviceError(
                    f"{cls.__name__}: expected all tensors on one device, got {dev} and {t._device}"
                )
            if t.requires_grad:
                record = _grad_enabled
        arrays = [t._data for t in inputs]
        op = cls.kernel_op
        if op is not None and not record and dev is not META:
            # the common inference case first: a kernel and nothing to record (no graph node)
            kernel = registry.pick(op, dev.type, arrays, kwargs)
            if kernel is not None:
                try:
                    out = kernel.fn(*arrays, **kwargs)
                except ValueError as e:
                    _shape_error(cls, e, inputs)
                if _tapes:
                    _record(kernel, cls, arrays, kwargs, out)
                return Tensor._wrap(out, dev)
            op = None  # no kernel applies: forward below, without asking again
        ctx = cls()
        try:
            if dev is META:
                if cls.meta is not None:
                    shape, dtype = ctx.meta(*arrays, **kwargs)
                else:
                    out = np.asarray(ctx.forward(*arrays, **kwargs))
                    shape, dtype = out.shape, out.dtype
                out = meta_array(shape, dtype)
            else:
                kernel = None
                if op is not None and cls.saved is not None:  # recording: saved() keeps inputs
                    kernel = registry.pick(op, dev.type, arrays, kwargs)
                if kernel is None:
                    out = ctx.forward(*arrays, **kwargs)
                else:
                    out = kernel.fn(*arrays, **kwargs)
                    ctx.saved(*arrays, **kwargs)
        except ValueError as e:
            _shape_error(cls, e, inputs)
        if _tapes:
            _record(None if record or dev is META else "forward", cls, arrays, kwargs, out)
        if record:
            ctx.parents = inputs
            # edges point at the parents' graph nodes as they are *now*, so a later
            # in-place op that rebinds a parent tensor does not rewrite this history
            ctx.edges = tuple(p._ctx if p._ctx is not None else p for p in inputs)
            ctx.in_meta = tuple((p._data.shape, p._data.dtype) for p in inputs)
            ctx.needs_input_grad = tuple(p.requires_grad for p in inputs)
            return Tensor._wrap(out, dev, ctx)
        return Tensor._wrap(out, dev)


def _record(runner, cls, arrays, kwargs, out) -> None:
    tape = _tapes.get(threading.get_ident())
    if tape is not None:
        tape.append((runner, cls, arrays, kwargs, out))


def _shape_error(cls, e: ValueError, inputs) -> None:
    """Re-raise a numpy ValueError from an op as a ShapeError naming the op and the input shapes."""
    if isinstance(e, EmberError):
        raise e
    shapes = ", ".join(str(tuple(t._data.shape)) for t in inputs)
    raise ShapeError(f"{cls.__name__.lower()}: {e} (input shapes {shapes})") from None


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a broadcast gradient back down to ``shape``."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad


def _node(t):
    """A tensor's graph node: the Function that made it, or the tensor itself for a leaf."""
    return t._ctx if t._ctx is not None else t


def _topo(roots) -> list:
    order, seen = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        if isinstance(n, Function):
            if n.released:
                raise AutogradError(
                    "trying to backward through the graph a second time; "
                    "pass retain_graph=True to the first backward()"
                )
            for e, need in zip(n.edges, n.needs_input_grad):
                if need and id(e) not in seen:
                    stack.append((e, False))
    return order


def _run_backward(roots, root_grads, retain_graph: bool, capture=None) -> dict:
    """Propagate gradients from root tensors; accumulate into .grad, or collect for ``capture``.

    The graph is walked over nodes (Functions, and leaf tensors); a non-leaf tensor's hooks and
    retain_grad are found through its node's ``out`` weak reference. ``capture`` maps
    id(node) -> id(tensor) for autograd.grad.
    """
    grads: dict[int, np.ndarray] = {}
    nodes = [_node(r) for r in roots]
    for n, g in zip(nodes, root_grads):
        grads[id(n)] = grads[id(n)] + g if id(n) in grads else g
    captured: dict[int, np.ndarray] = {}
    for n in reversed(_topo(nodes)):
        g = grads.pop(id(n), None)
        if g is None:
            continue
        is_fn = isinstance(n, Function)
        t = n._out_ref() if is_fn else n
        if t is not None and t._hooks:
            for hook in t._hooks:
                r = hook(Tensor._wrap(g, t._device))
                if r is not None:
                    g = r._data
        if capture is not None:
            if id(n) in capture:
                captured[capture[id(n)]] = g
        elif t is not None and (not is_fn or t._retain) and t.requires_grad:
            if t.grad is None:
                t.grad = Tensor._wrap(np.array(g, copy=True), t._device)
            else:
                t.grad = Tensor._wrap(t.grad._data + g, t._device)
        if not is_fn:
            continue
        in_grads = n.backward(g)
        if not isinstance(in_grads, tuple):
            in_grads = (in_grads,)
        for (shape, dtype), e, need, pg in zip(n.in_meta, n.edges, n.needs_input_grad, in_grads):
            if not need or pg is None:
                continue
            if pg.dtype != dtype:
                pg = pg.astype(dtype)
            if pg.shape != shape:
                raise ShapeError(
                    f"{type(n).__name__}.backward gave a gradient of shape {pg.shape} "
                    f"for an input of shape {shape}"
                )
            k = id(e)
            grads[k] = grads[k] + pg if k in grads else pg
        if not retain_graph:
            n.__dict__.clear()
            n.released = True
            n.parents = n.edges = n.needs_input_grad = n.in_meta = ()
    return captured


def _default_grads(tensors, grad_tensors) -> list:
    out = []
    for i, t in enumerate(tensors):
        g = None if grad_tensors is None else grad_tensors[i]
        if g is None:
            if t._data.size != 1:
                raise AutogradError(
                    f"grad can be implicitly created only for scalar outputs, got shape {tuple(t.shape)}"
                )
            out.append(np.ones(t._data.shape, t._data.dtype))
        else:
            ga = np.asarray(g._data if hasattr(g, "_data") else g, dtype=t._data.dtype)
            if ga.shape != t._data.shape:
                raise ShapeError(
                    f"backward: gradient shape {ga.shape} does not match output shape {t._data.shape}"
                )
            out.append(ga)
    return out


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None) -> None:
    """Accumulate d(tensors)/d(leaf) into every leaf's ``.grad`` (torch.autograd.backward)."""
    if not isinstance(tensors, (list, tuple)):
        tensors = [tensors]
        if grad_tensors is not None and not isinstance(grad_tensors, (list, tuple)):
            grad_tensors = [grad_tensors]
    for t in tensors:
        if not t.requires_grad:
            raise AutogradError(
                "element 0 of tensors does not require grad and does not have a grad_fn"
            )
    with no_grad():
        _run_backward(tensors, _default_grads(tensors, grad_tensors), bool(retain_graph))


def grad(
    outputs,
    inputs,
    grad_outputs=None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> tuple:
    """Return d(outputs)/d(inputs) without touching ``.grad`` (torch.autograd.grad)."""
    if create_graph:
        from ember.errors import UnsupportedError

        raise UnsupportedError("create_graph=True (higher-order gradients) is not supported")
    single = not isinstance(inputs, Sequence)
    inputs = [inputs] if single else list(inputs)
    outputs = [outputs] if not isinstance(outputs, Sequence) else list(outputs)
    if grad_outputs is not None and not isinstance(grad_outputs, Sequence):
        grad_outputs = [grad_outputs]
    reachable = {id(n) for n in _topo([_node(t) for t in outputs])}
    if not allow_unused and any(id(_node(t)) not in reachable for t in inputs):
        raise AutogradError(
            "one of the differentiated tensors was not used in the graph; pass allow_unused=True"
        )
    with no_grad():
        got = _run_backward(
            outputs,
            _default_grads(outputs, grad_outputs),
            bool(retain_graph),
            {id(_node(t)): id(t) for t in inputs},
        )
    res = []
    for t in inputs:
        g = got.get(id(t))
        if g is None:
            if not allow_unused:
                raise AutogradError(
                    "one of the differentiated tensors was not used in the graph; pass allow_unused=True"
                )
            res.append(None)
        else:
            res.append(Tensor._wrap(g, t._device))
    return tuple(res)
