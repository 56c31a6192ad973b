"""The scheduler on a fake model (no weights): chunked prefill at fixed offsets whatever runs
beside a sequence, every prompt token fed once and in order, slots, queue limits, cancellation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ember.generation.sampling import SamplingParams
from ember.generation.streaming import StreamDecoder
from ember.serve.engine import Engine, QueueFull, SequenceSpec, StepInput

VOCAB = 50
EOS = 0


class FakeCache:
    def __init__(self, capacity: int) -> None:
        self.max_len, self.pos, self.fed, self.k, self.v = capacity, 0, [], [], []


class FakeRunner:
    """Logits whose argmax is a hash of the whole history fed so far (never EOS)."""

    context_length = 4096

    def __init__(self) -> None:
        self.live: set[int] = set()  # caches handed out and not released yet

    def new_cache(self, capacity: int, prompt=None, block: int = 0) -> FakeCache:
        cache = FakeCache(capacity)
        self.live.add(id(cache))
        return cache

    def reserve(self, cache: FakeCache, length: int) -> FakeCache:
        cache.max_len = max(cache.max_len, length)
        return cache

    def release(self, cache: FakeCache) -> None:
        self.live.remove(id(cache))  # a second release of one cache fails here

    def step(self, inputs: list[StepInput]) -> list[np.ndarray]:
        rows = []
        for inp in inputs:
            assert inp.cache.pos + len(inp.tokens) <= inp.cache.max_len
            inp.cache.fed.append(list(inp.tokens))
            inp.cache.pos += len(inp.tokens)
            history = [t for chunk in inp.cache.fed for t in chunk]
            row = np.zeros(VOCAB, np.float32)
            row[1 + (sum(history) * 31 + len(history)) % (VOCAB - 1)] = 5.0
            rows.append(row)
        return rows


class FakeTokenizer:
    eos_token_ids = frozenset({EOS})

    def decode(self, ids, skip_special_tokens=False):
        return "".join(
            chr(ord("a") + i % 26) for i in ids if not (skip_special_tokens and i == EOS)
        )

    def stream(self, skip_special_tokens=False):
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)


def _engine(**kw) -> Engine:
    e = Engine(FakeRunner(), FakeTokenizer(), **kw)
    e.start()
    return e


async def _run(handle) -> dict:
    """index -> (text, finish reason, token count)."""
    texts: dict[int, str] = {}
    out = {}
    while len(out) < len(handle.seqs):
        ev = await asyncio.wait_for(handle.queue.get(), 30)
        if ev[0] == "token":
            texts[ev[1]] = texts.get(ev[1], "") + ev[2]
        else:
            out[ev[1]] = (texts.get(ev[1], ""), ev[2], ev[3])
    return out


def _spec(prompt, max_tokens=5, **kw) -> SequenceSpec:
    return SequenceSpec(list(prompt), max_tokens, SamplingParams(), **kw)


def test_chunks_do_not_depend_on_neighbours():
    async def main():
        e = _engine(prefill_chunk=16, max_running=8)
        try:
            long = list(range(1, 41))
            h = e.submit([_spec(long)])
            alone = await _run(h)
            alone_feeds = h.seqs[0].cache_feeds
            hs = [e.submit([_spec(range(i + 1, i + 30))]) for i in range(5)]
            h2 = e.submit([_spec(long)])
            together = await _run(h2)
            for other in hs:
                await _run(other)
            return alone, together, alone_feeds, h2.seqs[0].cache_feeds
        finally:
            e.stop()

    alone, together, feeds_alone, feeds_together = asyncio.run(main())
    assert alone == together
    assert [len(f) for f in feeds_alone[:3]] == [16, 16, 8] == [len(f) for f in feeds_together[:3]]
    assert [t for f in feeds_alone[:3] for t in f] == list(range(1, 41))
    assert alone[0][1] == "length" and alone[0][2] == 5


def test_stop_string_and_n_choices():
    async def main():
        e = _engine()
        try:
            ref = await _run(e.submit([_spec([3, 4, 5], max_tokens=8)]))
            text = ref[0][0]
            stop = text[3:5]
            got = await _run(
                e.submit([_spec([3, 4, 5], 8, stop=[stop], index=i) for i in range(2)])
            )
            return text, stop, got
        finally:
            e.stop()

    text, stop, got = asyncio.run(main())
    assert got[0] == got[1] and got[0][1] == "stop"
    assert got[0][0] == text[: text.index(stop)]


def test_queue_limit_is_all_or_none_and_cancel_frees_slots():
    async def main():
        e = _engine(max_running=1, max_queue=2)
        try:
            a = e.submit([_spec([1], max_tokens=10**6)])
            while e.num_running == 0:
                await asyncio.sleep(0.01)
            b = e.submit([_spec([2], max_tokens=10**6)])
            with pytest.raises(QueueFull):
                e.submit([_spec([3]), _spec([4])])  # two sequences, one free place
            assert e.num_waiting == 1
            a.cancel()
            b.cancel()
            while e.num_running or e.num_waiting:
                await asyncio.sleep(0.01)
            assert not e.runner.live  # cancelled sequences gave their caches back
            out = await _run(e.submit([_spec([5])]))
            assert not e.runner.live
            return out
        finally:
            e.stop()

    assert asyncio.run(main())[0][1] == "length"


def test_free_slots_do_not_count_as_queued():
    """Requests that arrive before the worker admits them take free slots, not queue places."""

    async def main():
        e = _engine(max_running=2, max_queue=0)
        try:
            a = e.submit([_spec([1], max_tokens=10**6), _spec([2], max_tokens=10**6)])
            with pytest.raises(QueueFull):
                e.submit([_spec([3])])  # both slots taken, no queue
            a.cancel()
        finally:
            e.stop()

    asyncio.run(main())


@pytest.fixture(autouse=True)
def _record_feeds(monkeypatch):
    """Keep each sequence's fed chunks after the engine releases its cache."""
    from ember.serve import engine as eng

    orig = eng.Engine._finish

    def finish(self, seq, reason, running=True):
        if seq.cache is not None:
            seq.cache_feeds = seq.cache.fed
        orig(self, seq, reason, running)

    monkeypatch.setattr(eng.Engine, "_finish", finish)
