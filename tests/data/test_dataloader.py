"""ember.data against torch.utils.data: collation, batching, samplers, splits."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import ember
from ember import data

Point = namedtuple("Point", "x y")


def _same(e, t):
    """Recursively compare an ember collate result with torch's."""
    if isinstance(t, torch.Tensor):
        assert isinstance(e, ember.Tensor), type(e)
        assert tuple(e.shape) == tuple(t.shape)
        assert str(e.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
        np.testing.assert_array_equal(e.numpy(), t.numpy())
    elif isinstance(t, dict):
        assert type(e) is type(t) and list(e) == list(t)
        for k in t:
            _same(e[k], t[k])
    elif isinstance(t, (list, tuple)):
        assert type(e) is type(t) and len(e) == len(t), (type(e), type(t))
        for a, b in zip(e, t):
            _same(a, b)
    else:
        assert e == t


def _both(sample_fn, n=5):
    rng = np.random.default_rng(0)
    samples = [sample_fn(rng, i) for i in range(n)]
    return samples


SAMPLES = {
    "float": lambda r, i: float(r.random()),
    "int": lambda r, i: int(r.integers(10)),
    "bool": lambda r, i: bool(i % 2),
    "np_f32_scalar": lambda r, i: np.float32(r.random()),
    "np_array": lambda r, i: r.random((2, 3)).astype(np.float32),
    "np_int_array": lambda r, i: r.integers(0, 5, (4,)),
    "str": lambda r, i: f"s{i}",
    "tuple": lambda r, i: (r.random((3,)), int(i)),
    "list": lambda r, i: [float(i), r.random((2,))],
    "dict": lambda r, i: {"a": r.random((2, 2)), "b": {"c": i, "d": "x"}},
    "namedtuple": lambda r, i: Point(r.random((1,)), float(i)),
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_default_collate_matches_torch(kind):
    samples = _both(SAMPLES[kind])
    t = tud.default_collate(samples)
    e = data.default_collate(samples)
    _same(e, t)


def test_default_collate_tensors_and_errors():
    rng = np.random.default_rng(1)
    arrs = [rng.standard_normal((3, 2)) for _ in range(4)]
    e = data.default_collate([ember.tensor(a, dtype=ember.float32) for a in arrs])
    t = tud.default_collate([torch.tensor(a, dtype=torch.float32) for a in arrs])
    _same(e, t)
    with pytest.raises(ember.errors.ShapeError):
        data.default_collate([ember.zeros(2), ember.zeros(3)])
    with pytest.raises(RuntimeError):
        data.default_collate([[1, 2], [1]])
    with pytest.raises(TypeError):
        data.default_collate([object(), object()])
    with pytest.raises(TypeError):
        data.default_collate([np.array(["a"]), np.array(["b"])])


def _tensor_ds(n=23):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = rng.integers(0, 4, n)
    return (
        data.TensorDataset(ember.tensor(x), ember.tensor(y)),
        tud.TensorDataset(torch.tensor(x), torch.tensor(y)),
    )


@pytest.mark.parametrize(
    "batch_size,drop_last", [(1, False), (5, False), (5, True), (23, True), (40, False)]
)
def test_sequential_batches_match_torch(batch_size, drop_last):
    eds, tds = _tensor_ds()
    el = data.DataLoader(eds, batch_size=batch_size, drop_last=drop_last)
    tl = tud.DataLoader(tds, batch_size=batch_size, drop_last=drop_last)
    assert len(el) == len(tl)
    eb, tb = list(el), list(tl)
    assert len(eb) == len(tb) == len(el)
    for e, t in zip(eb, tb):
        _same(e, t)


def test_fast_path_equals_generic_collation():
    eds, _ = _tensor_ds()
    fast = list(data.DataLoader(eds, batch_size=4))
    slow = list(data.DataLoader(eds, batch_size=4, collate_fn=lambda b: data.default_collate(b)))
    threads = list(data.DataLoader(eds, batch_size=4, num_workers=2))
    for f, s, t in zip(fast, slow, threads):
        for a, b, c in zip(f, s, t):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            np.testing.assert_array_equal(a.numpy(), c.numpy())
    assert len(fast) == len(slow) == len(threads) == 6


def test_shuffle_with_seeded_generator():
    eds, _ = _tensor_ds(50)
    y = eds.tensors[1].numpy()

    def epoch_orders(seed, epochs=3):
        g = ember.Generator().manual_seed(seed)
        loader = data.DataLoader(
            data.TensorDataset(ember.arange(50)), batch_size=8, shuffle=True, generator=g
        )
        return [np.concatenate([b[0].numpy() for b in loader]) for _ in range(epochs)]

    a, b, c = epoch_orders(0), epoch_orders(0), epoch_orders(1)
    for x, z in zip(a, b):
        np.testing.assert_array_equal(x, z)  # same seed, same order
    assert not np.array_equal(a[0], a[1])  # a fresh permutation each epoch
    assert not np.array_equal(a[0], c[0])  # another seed, another order
    for order in a:
        assert sorted(order.tolist()) == list(range(50))
    loader = data.DataLoader(
        eds, batch_size=8, shuffle=True, generator=ember.Generator().manual_seed(3)
    )
    seen = np.concatenate([yb.numpy() for _, yb in loader])
    assert sorted(seen.tolist()) == sorted(y.tolist())


def test_shuffle_without_generator_follows_manual_seed():
    ds = data.TensorDataset(ember.arange(30))
    ember.manual_seed(5)
    a = np.concatenate([b[0].numpy() for b in data.DataLoader(ds, batch_size=4, shuffle=True)])
    ember.manual_seed(5)
    b = np.concatenate([b[0].numpy() for b in data.DataLoader(ds, batch_size=4, shuffle=True)])
    np.testing.assert_array_equal(a, b)


class Squares(data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"x": np.full((2,), i, np.float32), "y": i * i, "name": f"n{i}"}


def test_custom_dataset_sampler_batch_sampler_collate():
    ds = Squares()
    loader = data.DataLoader(ds, batch_size=3, sampler=[9, 0, 4, 4, 1])
    batches = list(loader)
    assert len(loader) == 2 and len(batches) == 2
    assert batches[0]["y"].tolist() == [81, 0, 16] and batches[0]["y"].dtype == ember.int64
    assert batches[1]["name"] == ["n4", "n1"]
    assert batches[0]["x"].shape == (3, 2)

    bs = [[0, 1], [5, 6, 7], [2]]
    assert [b["y"].tolist() for b in data.DataLoader(ds, batch_sampler=bs)] == [
        [0, 1],
        [25, 36, 49],
        [4],
    ]

    loader = data.DataLoader(ds, batch_size=4, collate_fn=lambda items: [it["y"] for it in items])
    assert list(loader) == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]

    unbatched = list(data.DataLoader(ds, batch_size=None))
    assert len(unbatched) == 10 and isinstance(unbatched[3]["x"], ember.Tensor)
    assert unbatched[3]["y"] == 9

    rs = data.RandomSampler(
        ds, replacement=True, num_samples=25, generator=ember.Generator().manual_seed(0)
    )
    idx = list(rs)
    assert len(idx) == 25 and all(0 <= i < 10 for i in idx)
    rs = data.RandomSampler(ds, num_samples=23, generator=ember.Generator().manual_seed(0))
    idx = list(rs)
    assert len(idx) == 23 and sorted(idx[:20]) == sorted(list(range(10)) * 2)
    bsamp = data.BatchSampler(data.SequentialSampler(range(10)), 4, drop_last=True)
    assert list(bsamp) == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(bsamp) == 2
    tb = tud.BatchSampler(tud.SequentialSampler(range(10)), 4, drop_last=False)
    eb = data.BatchSampler(data.SequentialSampler(range(10)), 4, drop_last=False)
    assert list(eb) == list(tb) and len(eb) == len(tb)
    ws = data.WeightedRandomSampler(
        [0.0, 1.0, 0.0, 3.0], 50, generator=ember.Generator().manual_seed(1)
    )
    assert set(ws) <= {1, 3} and len(ws) == 50


class Stream(data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield np.array([i, i + 1], np.int64)

    def __len__(self):
        return self.n


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_dataset(drop_last):
    loader = data.DataLoader(Stream(11), batch_size=4, drop_last=drop_last)
    tl = tud.DataLoader(_TorchStream(11), batch_size=4, drop_last=drop_last)
    batches = list(loader)
    assert len(batches) == len(loader) == len(tl) == (2 if drop_last else 3)
    for e, t in zip(batches, tl):
        _same(e, t)
    with pytest.raises(ValueError):
        data.DataLoader(Stream(3), shuffle=True)


class _TorchStream(tud.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield np.array([i, i + 1], np.int64)

    def __len__(self):
        return self.n


def test_subset_random_split_concat():
    eds, _ = _tensor_ds(10)
    sub = data.Subset(eds, [7, 2, 5])
    assert sub[1][1].item() == eds[2][1].item() and len(sub) == 3
    batch = next(iter(data.DataLoader(sub, batch_size=3)))
    np.testing.assert_array_equal(batch[0].numpy(), eds.tensors[0].numpy()[[7, 2, 5]])

    for lengths in ([3, 7], [0.3, 0.7], [0.25, 0.25, 0.5], [0.33, 0.33, 0.34], [10, 0]):
        parts = data.random_split(eds, lengths, generator=ember.Generator().manual_seed(0))
        tparts = tud.random_split(range(10), lengths, generator=torch.Generator().manual_seed(0))
        assert [len(p) for p in parts] == [len(p) for p in tparts]
        allidx = sorted(i for p in parts for i in p.indices)
        assert allidx == list(range(10))
    a = data.random_split(eds, [5, 5], generator=ember.Generator().manual_seed(4))
    b = data.random_split(eds, [5, 5], generator=ember.Generator().manual_seed(4))
    assert a[0].indices == b[0].indices
    with pytest.raises(ValueError):
        data.random_split(eds, [3, 3])

    cat = eds + data.Subset(eds, [0, 1])
    assert (
        len(cat) == 12
        and cat[11][1].item() == eds[1][1].item()
        and cat[-1][1].item() == eds[1][1].item()
    )


def test_tensor_dataset_errors_and_loader_options():
    with pytest.raises(ember.errors.ShapeError):
        data.TensorDataset(ember.zeros(3, 2), ember.zeros(4))
    eds, _ = _tensor_ds()
    with pytest.raises(ValueError):
        data.DataLoader(eds, sampler=[0, 1], shuffle=True)
    with pytest.raises(ValueError):
        data.DataLoader(eds, batch_sampler=[[0]], batch_size=3)
    with pytest.raises(ValueError):
        data.DataLoader(eds, batch_size=None, drop_last=True)
    with pytest.raises(ValueError):
        data.DataLoader(eds, batch_size=0)
    assert data.get_worker_info() is None
