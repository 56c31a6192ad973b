"""Random numbers: a global seeded generator, Generator objects, and the sampling factories."""

from __future__ import annotations

import operator

import numpy as np

from ember import dtypes as _dt
from ember.autograd import meta_array
from ember.device import META, as_device
from ember.errors import ShapeError
from ember.memory import allocate
from ember.ops._util import SizeTypeError, shape_arg
from ember.tensor import Tensor


class Generator:
    """A seeded source of random numbers (numpy PCG64 underneath), as torch.Generator."""

    def __init__(self, device="cpu") -> None:
        self._seed: int | None = None
        self._rng: np.random.Generator | None = None  # seeded from entropy on first use

    @property
    def rng(self) -> np.random.Generator:
        """The numpy Generator drawing the numbers (numpy.random is imported on first use)."""
        if self._rng is None:
            self.manual_seed(int(np.random.SeedSequence().entropy % (2**63)))
        return self._rng

    def manual_seed(self, seed: int) -> Generator:
        """Reset the stream to a seed; returns self."""
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return self

    def initial_seed(self) -> int:
        """The seed this generator was last seeded with."""
        self.rng  # noqa: B018  (seeds it if nothing drew from it yet)
        return self._seed

    def get_state(self) -> dict:
        """The generator's state (pass to set_state to replay)."""
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        """Restore a state from get_state."""
        self.rng.bit_generator.state = state


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the global generator (numpy's legacy global state is left alone)."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seed the global generator from entropy; returns the seed."""
    s = int(np.random.SeedSequence().entropy % (2**63))
    default_generator.manual_seed(s)
    return s


def initial_seed() -> int:
    """The global generator's seed."""
    return default_generator.initial_seed()


def get_rng_state() -> dict:
    """The global generator's state."""
    return default_generator.get_state()


def set_rng_state(state: dict) -> None:
    """Restore the global generator's state."""
    default_generator.set_state(state)


def _rng(generator: Generator | None) -> np.random.Generator:
    return (generator or default_generator).rng


def _out(arr: np.ndarray, dtype, device, requires_grad) -> Tensor:
    dt = _dt.get_dtype(dtype) if dtype is not None else _dt.get_default_dtype()
    dev = as_device(device)
    arr = meta_array(arr.shape, dt.np) if dev is META else arr.astype(dt.np, copy=False)
    t = Tensor._wrap(arr, dev)
    return t.requires_grad_(True) if requires_grad else t


def _sample_shape(size, op: str = "rand") -> tuple:
    shape = shape_arg(size, op)
    if any(s < 0 for s in shape):
        raise ShapeError(f"{op}: negative dimension in shape {shape}")
    return shape


def _draw(shape, device, fn, op: str = "rand"):
    """Samples from fn(shape), or a data-free placeholder on the meta device (nothing is drawn)."""
    if as_device(device) is META:
        return allocate(lambda: meta_array(shape, np.float64), op, shape, np.float64)
    return allocate(lambda: fn(shape), op, shape, np.float64)


def rand(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1)."""
    shape = _sample_shape(size)
    return _out(_draw(shape, device, _rng(generator).random), dtype, device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples."""
    shape = _sample_shape(size, "randn")
    draw = _draw(shape, device, _rng(generator).standard_normal, "randn")
    return _out(draw, dtype, device, requires_grad)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None) -> Tensor:
    """Integers uniform in [low, high); randint(high, size) also works."""
    if size is None:
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    if size is None:
        raise ShapeError("randint: size is required")
    shape = _sample_shape((tuple(size),) if isinstance(size, (tuple, list)) else (size,), "randint")
    arr = _draw(
        shape, device, lambda s: _rng(generator).integers(low, high, s, dtype=np.int64), "randint"
    )
    return _out(arr, dtype or _dt.int64, device, False)


def randperm(n: int, *, generator=None, dtype=None, device=None) -> Tensor:
    """A random permutation of 0..n-1."""
    try:
        n = operator.index(n)
    except TypeError:
        raise SizeTypeError(f"randperm: n must be an int, got {type(n).__name__} ({n!r})") from None
    if n < 0:
        raise ShapeError(f"randperm: n must be non-negative, got {n}")
    perm = allocate(lambda: _rng(generator).permutation(n), "randperm", (n,), np.int64)
    return _out(perm.astype(np.int64, copy=False), dtype or _dt.int64, device, False)


def rand_like(input: Tensor, dtype=None, generator=None) -> Tensor:
    """Uniform samples with input's shape."""
    return rand(input.shape, generator=generator, dtype=dtype or input.dtype, device=input.device)


def randn_like(input: Tensor, dtype=None, generator=None) -> Tensor:
    """Normal samples with input's shape."""
    return randn(input.shape, generator=generator, dtype=dtype or input.dtype, device=input.device)


def randint_like(input: Tensor, low, high=None, dtype=None) -> Tensor:
    """Integer samples with input's shape."""
    if high is None:
        low, high = 0, low
    return randint(low, high, tuple(input.shape), dtype=dtype or input.dtype, device=input.device)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None) -> Tensor:
    """Normal samples with the given mean and std (numbers or tensors)."""
    m = mean._data if isinstance(mean, Tensor) else mean
    s = std._data if isinstance(std, Tensor) else std
    shape = tuple(size) if size is not None else np.broadcast_shapes(np.shape(m), np.shape(s))
    return _out(_rng(generator).normal(m, s, shape), dtype, device, False)


def bernoulli(input: Tensor, p: float | None = None, *, generator=None) -> Tensor:
    """0/1 samples with probability input (or p)."""
    prob = input._data if p is None else p
    arr = (_rng(generator).random(input._data.shape) < prob).astype(input._data.dtype)
    return Tensor._wrap(arr, input._device)


def _fill_(t: Tensor, arr: np.ndarray) -> Tensor:
    from ember import autograd

    if t.requires_grad and t._ctx is None and autograd.is_grad_enabled():
        from ember.errors import AutogradError

        raise AutogradError("a leaf tensor that requires grad is used in an in-place operation")
    if t._device is not META:
        np.copyto(t._data, arr, casting="unsafe")
    return t


def normal_(input: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    """Fill in place with normal samples."""
    return _fill_(input, _rng(generator).normal(mean, std, input._data.shape))


def uniform_(input: Tensor, a: float = 0.0, b: float = 1.0, *, generator=None) -> Tensor:
    """Fill in place with uniform samples in [a, b)."""
    return _fill_(input, _rng(generator).uniform(a, b, input._data.shape))


def bernoulli_(input: Tensor, p: float = 0.5, *, generator=None) -> Tensor:
    """Fill in place with 0/1 samples."""
    return _fill_(input, _rng(generator).random(input._data.shape) < p)


def exponential_(input: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    """Fill in place with exponential samples."""
    return _fill_(input, _rng(generator).exponential(1.0 / lambd, input._data.shape))


def random_(input: Tensor, low: int = 0, high: int | None = None, *, generator=None) -> Tensor:
    """Fill in place with integers in [low, high)."""
    if high is None:
        low, high = 0, (low or 2**24)
    return _fill_(input, _rng(generator).integers(low, high, input._data.shape))


__all__ = [
    "Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
    "set_rng_state", "rand", "randn", "randint", "randperm", "rand_like", "randn_like",
    "randint_like", "normal", "bernoulli",
]  # fmt: skip
