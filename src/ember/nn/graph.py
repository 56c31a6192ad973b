"""A step of ops captured once and replayed without Python dispatch (tinygrad's TinyJit, CUDA
graphs): what makes a small model's decode step cost its kernels, not its interpreter.

``StepGraph(fn)`` is called like ``fn(*tensors)``. Its first call copies the inputs into
buffers of its own and runs fn on them while ``Function.apply`` records every op (the kernel
that ran, its input arrays, keyword arguments and output array). Later calls with inputs of the
same shapes and dtypes copy the new values into those buffers and run the recorded kernels
again on the same arrays, each writing into the output array it wrote the first time, so that
every later op reads the fresh values; ops whose output was a view of their input (reshape,
slicing, permute) need not run again. A kernel registered with ``prepare`` hands over a
function bound to those arrays (the quantized products: one call into machine code); the others
are called as ``Function.apply`` would call them and their result is copied into place.

The contract, as for any such capture: everything that changes from one call to the next must
reach the ops through the input tensors, or through state the kernels read when they run (the
KV cache's buffers and positions in ``cached_attention``). Python values computed from data
inside fn are frozen at capture. ``DecoderForCausalLM.decode_body`` is written to this contract;
tests compare replays with plain forwards bitwise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import ember
from ember import autograd, config
from ember.errors import UnsupportedError
from ember.tensor import Tensor


class StepGraph:
    """``fn(*tensors) -> Tensor`` captured at the first call, replayed at the next ones."""

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        self.fn = fn
        self._inputs: list[np.ndarray] | None = None  # the buffers the ops read the inputs from
        self._steps: list[Callable[[], object]] = []
        self._out: np.ndarray | None = None
        self._device = None
        self.captures = self.replays = 0

    def __call__(self, *inputs: Tensor) -> Tensor:
        """fn(*inputs): recorded the first time (or when the shapes change), then replayed."""
        bufs = self._inputs
        if (
            bufs is None
            or len(bufs) != len(inputs)
            or any(
                b.shape != t._data.shape or b.dtype != t._data.dtype for b, t in zip(bufs, inputs)
            )
        ):
            return self._capture(inputs)
        for b, t in zip(bufs, inputs):
            np.copyto(b, t._data)
        for step in self._steps:
            step()
        self.replays += 1
        return Tensor._wrap(self._out.copy(), self._device)

    def _capture(self, inputs) -> Tensor:
        """Run fn on private copies of the inputs, recording its ops into replay steps."""
        bufs = [np.array(t._data, order="C", copy=True) for t in inputs]
        tensors = [Tensor._wrap(b, t._device) for b, t in zip(bufs, inputs)]
        tape: list = []
        prev = autograd.capture_ops(tape)
        try:
            with autograd.no_grad():
                out = self.fn(*tensors)
        finally:
            autograd.capture_ops(prev)
        steps = []
        for runner, cls, arrays, kwargs, res in tape:
            if runner is None:
                raise UnsupportedError(f"StepGraph: {cls.__name__} ran on a path it cannot replay")
            if cls.view and arrays and np.may_share_memory(res, arrays[0]):
                continue  # a view of a buffer that stays where it is
            steps.append(_step(runner, cls, arrays, kwargs, res))
        self._inputs, self._steps, self._device = bufs, steps, out._device
        self._out = out._data
        self.captures += 1
        return Tensor._wrap(out._data.copy(), out._device)


def _step(runner, cls, arrays, kwargs, out) -> Callable[[], object]:
    """A no-argument function that computes one recorded op again into its output array."""
    if not isinstance(out, np.ndarray) or not out.flags.writeable:
        raise UnsupportedError(f"StepGraph: {cls.__name__}'s output cannot be rewritten in place")
    if runner != "forward":
        prepare = runner.prepare
        if prepare is not None:
            fast = prepare(out, *arrays, **kwargs)
            if fast is not None:
                return fast
        fn = runner.fn
    else:

        def fn(*a, **kw):
            return cls().forward(*a, **kw)

    def step() -> None:
        np.copyto(out, fn(*arrays, **kwargs))

    return step


class DecodeGraphs:
    """A causal LM's one-token steps (``model(ids, cache=cache)``, ids (b, 1)) as StepGraphs:
    one per batch size, on one cache's buffers (``BatchKVCache`` rows: the slots are an input
    of the graph, so any b slots reuse it). Other steps, and models without ``decode_body``,
    run plain forwards."""

    def __init__(self, model, logits_to_keep: int = 0) -> None:
        self.model = model
        self.logits_to_keep = logits_to_keep
        self._graphs: dict = {}  # batch size -> (StepGraph, its slots buffer or None)
        self._buffers = None  # the cache buffers the graphs write into
        capture = getattr(model, "can_capture_decode", None)
        self.enabled = config.GRAPHS and capture is not None and capture()

    def __call__(self, ids: np.ndarray, cache) -> Tensor:
        """Logits (b, 1 or logits_to_keep, vocab) of one new token per row; advances the cache."""
        model = self.model
        ids = np.asarray(ids, np.int64)
        if not self.enabled or ids.ndim != 2 or ids.shape[1] != 1 or cache is None:
            return model(ember.from_numpy(ids), cache=cache, logits_to_keep=self.logits_to_keep)
        b = ids.shape[0]
        past = np.ascontiguousarray(np.broadcast_to(np.asarray(cache.pos, np.int64), (b,)))
        if cache.k[0] is not self._buffers:  # a new or reallocated cache: new graphs
            self._graphs.clear()
            self._buffers = cache.k[0]
        rows = getattr(cache, "rows", None)
        entry = self._graphs.get(b)
        if entry is None:
            slots = None if rows is None else np.array(rows, np.int64)
            view = cache if rows is None else type(cache)(cache.cache, slots)
            keep = self.logits_to_keep

            def body(x, cos, sin, p):
                rope = None if cos.ndim == 0 else (cos, sin)
                return model.decode_body(x, rope, p._data, None, view, keep)

            entry = self._graphs[b] = (StepGraph(body), slots)
        graph, slots = entry
        if slots is not None:
            slots[:] = rows
        x, rope = model.decode_inputs(ember.from_numpy(ids), past[:, None])
        cos, sin = rope if rope is not None else (_NO_ROPE, _NO_ROPE)
        out = graph(x, cos, sin, Tensor._wrap(past))
        cache.advance(1)
        return out


_NO_ROPE = Tensor._wrap(np.zeros((), np.float32))

__all__ = ["StepGraph", "DecodeGraphs"]
