"""Datasets: map-style and iterable bases, TensorDataset, Subset, ConcatDataset, random_split."""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ember.errors import ShapeError
from ember.tensor import Tensor


class Dataset:
    """A map-style dataset: ``__getitem__(index)`` and (usually) ``__len__``."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset that is a stream: implement ``__iter__`` (DataLoader batches what it yields)."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")

    def __add__(self, other: Dataset) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def _as_tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor._wrap(np.asarray(x))


class TensorDataset(Dataset):
    """Samples are ``tuple(t[i] for t in tensors)``; all tensors share their first dimension."""

    def __init__(self, *tensors: Tensor) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        self.tensors = tuple(_as_tensor(t) for t in tensors)
        n = self.tensors[0].shape[0] if self.tensors[0].ndim else None
        for t in self.tensors:
            if t.ndim == 0 or t.shape[0] != n:
                sizes = [tuple(x.shape) for x in self.tensors]
                raise ShapeError(f"TensorDataset: size mismatch between tensors: {sizes}")

    def __getitem__(self, index: Any) -> tuple[Tensor, ...]:
        return tuple(
            t[index] if t.requires_grad else Tensor._wrap(t._data[index], t._device)
            for t in self.tensors
        )

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Tensor, ...]]:
        return [self[i] for i in indices]

    def _get_batch(self, indices: Sequence[int]) -> list[Tensor] | None:
        """The default-collated batch in one fancy-indexing gather per tensor (DataLoader)."""
        if any(t.requires_grad for t in self.tensors):
            return None
        idx = np.asarray(indices, dtype=np.intp)
        return [Tensor._wrap(t._data[idx], t._device) for t in self.tensors]

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        inner = getattr(self.dataset, "__getitems__", None)
        mapped = [self.indices[i] for i in indices]
        if inner is not None:
            return inner(mapped)
        return [self.dataset[i] for i in mapped]

    def _get_batch(self, indices: Sequence[int]) -> Any:
        inner = getattr(self.dataset, "_get_batch", None)
        if inner is None:
            return None
        return inner([self.indices[i] for i in indices])

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Several map-style datasets one after another."""

    def __init__(self, datasets: Sequence[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> Any:
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[d - 1] if d > 0 else 0
        return self.datasets[d][idx - start]


class ChainDataset(IterableDataset):
    """Several iterable datasets chained one after another."""

    def __init__(self, datasets: Sequence[Dataset]) -> None:
        self.datasets = list(datasets)

    def __iter__(self) -> Iterator[Any]:
        for d in self.datasets:
            yield from d

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)  # type: ignore[arg-type]


def random_split(
    dataset: Dataset, lengths: Sequence[int | float], generator: Any = None
) -> list[Subset]:
    """Split into non-overlapping random Subsets of given lengths (or fractions summing to 1)."""
    from ember.ops.random import default_generator

    n = len(dataset)  # type: ignore[arg-type]
    lengths = list(lengths)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1 and all(0 <= x <= 1 for x in lengths):
        sizes = [int(math.floor(n * frac)) for frac in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    stacklevel=2,
                )
        lengths = sizes
    if any(int(x) != x or x < 0 for x in lengths):
        raise ValueError(
            f"random_split: lengths must be non-negative integers or fractions, got {lengths}"
        )
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    perm = (generator or default_generator).rng.permutation(n).tolist()
    out, offset = [], 0
    for size in lengths:
        size = int(size)
        out.append(Subset(dataset, perm[offset : offset + size]))
        offset += size
    return out


def get_worker_info() -> None:
    """Always None: ember's DataLoader loads in the main process (or in threads)."""
    return None
