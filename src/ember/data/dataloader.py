"""DataLoader and default_collate: turn a dataset into an iterable of batches, as in PyTorch.

Loading happens in the calling thread; ``num_workers > 0`` prefetches batches on that many
threads (numpy releases the GIL while copying), keeping batch order.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ember.data.dataset import Dataset, IterableDataset
from ember.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from ember.errors import ShapeError
from ember.tensor import Tensor

_ERR = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


def _stack(arrays: list[np.ndarray], what: str) -> np.ndarray:
    shape = arrays[0].shape
    for a in arrays:
        if a.shape != shape:
            raise ShapeError(
                f"default_collate: stack expects each {what} to be equal size, "
                f"but got {shape} and {a.shape}"
            )
    return np.stack(arrays)


def default_collate(batch: Sequence[Any]) -> Any:
    """Stack samples into a batch: tensors/arrays -> one Tensor, numbers -> a Tensor, containers
    element-wise (tuples come back as lists, as in PyTorch), strings as a list."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        arrays = [b._data for b in batch]
        return Tensor._wrap(_stack(arrays, "tensor"), elem._device)
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "SUO":
            raise TypeError(_ERR.format(elem.dtype))
        return Tensor._wrap(_stack([np.asarray(b) for b in batch], "array"))
    if isinstance(elem, np.generic):
        if elem.dtype.kind in "SUO":
            raise TypeError(_ERR.format(elem.dtype))
        return Tensor._wrap(np.array(batch))
    if isinstance(elem, bool):
        return Tensor._wrap(np.array(batch, dtype=np.bool_))
    if isinstance(elem, float):
        return Tensor._wrap(np.array(batch, dtype=np.float64))
    if isinstance(elem, int):
        return Tensor._wrap(np.array(batch, dtype=np.int64))
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, Mapping):
        out = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(out)
        except TypeError:
            return out
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, Sequence):
        n = len(elem)
        if any(len(b) != n for b in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        cols = [default_collate(list(s)) for s in zip(*batch)]
        if isinstance(elem, tuple) or type(elem) is list:
            return cols
        try:
            return type(elem)(cols)
        except TypeError:
            return cols
    raise TypeError(_ERR.format(type(elem).__name__))


def default_convert(data: Any) -> Any:
    """Without batching: numpy arrays -> Tensors, containers converted element-wise."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray) and data.dtype.kind not in "SUO":
        return Tensor._wrap(data)
    if isinstance(data, np.generic) and data.dtype.kind not in "SUO":
        return Tensor._wrap(np.asarray(data))
    if isinstance(data, Mapping):
        out = {k: default_convert(v) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        try:
            return type(data)([default_convert(d) for d in data])  # type: ignore[call-arg]
        except TypeError:
            return [default_convert(d) for d in data]
    return data


class _InfiniteConstantSampler(Sampler):
    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class DataLoader:
    """Batches from a dataset: sampler/shuffle picks indices, collate_fn stacks samples."""

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | Iterable | None = None,
        batch_sampler: Sampler | Iterable | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
    ) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified with num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else 2
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (None, False):
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}"
                )
            if sampler is not None or batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: sampler options are not allowed")
        elif sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if batch_sampler is not None else default_convert
        self.collate_fn = collate_fn

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Iterable:
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)  # type: ignore[arg-type]
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ iteration
    def _fetch(self, index: Any) -> Any:
        ds = self.dataset
        if not self._auto_collation:
            return self.collate_fn(ds[index])
        if self.collate_fn is default_collate:
            fast = getattr(ds, "_get_batch", None)
            if fast is not None:
                out = fast(index)
                if out is not None:
                    return out
        getitems = getattr(ds, "__getitems__", None)
        data = getitems(index) if getitems is not None else [ds[i] for i in index]
        return self.collate_fn(data)

    def _iter_iterable(self) -> Iterator[Any]:
        it = iter(self.dataset)
        if self.batch_size is None:
            for item in it:
                yield self.collate_fn(item)
            return
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield self.collate_fn(batch)

    def __iter__(self) -> Iterator[Any]:
        if self._iterable:
            return self._iter_iterable()
        indices = iter(self._index_sampler)
        if self.num_workers == 0:
            return (self._fetch(i) for i in indices)
        return self._iter_threads(indices)

    def _iter_threads(self, indices: Iterator[Any]) -> Iterator[Any]:
        init = self.worker_init_fn
        counter = itertools.count()

        def initializer() -> None:
            if init is not None:
                init(next(counter))

        depth = self.num_workers * self.prefetch_factor
        with ThreadPoolExecutor(self.num_workers, initializer=initializer) as pool:
            pending: collections.deque = collections.deque()
            for index in itertools.islice(indices, depth):
                pending.append(pool.submit(self._fetch, index))
            while pending:
                result = pending.popleft().result(timeout=self.timeout or None)
                for index in itertools.islice(indices, 1):
                    pending.append(pool.submit(self._fetch, index))
                yield result

    def __repr__(self) -> str:
        return (
            f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"batches={len(self) if hasattr(self.dataset, '__len__') else '?'})"
        )
