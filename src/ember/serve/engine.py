"""The serving engine: a scheduler and the model loop on one worker thread.

HTTP handlers submit sequences (`Engine.submit`) and read their tokens from an asyncio queue;
the worker thread runs steps. Each step it

1. drops sequences that were cancelled (client gone), ran past `--timeout`, or are cut off by a
   shutdown, and answers jobs queued with `Engine.call` (embeddings run here too, so only one
   thread ever drives the kernels);
2. admits queued sequences while fewer than `max_running` run (each gets its own KV cache
   slot, position and seeded sampler);
3. gives every running sequence its next input: the next chunk of its prompt (chunks of
   `prefill_chunk` tokens at fixed offsets, so a long prompt never stalls the others for more
   than a chunk and is cut the same way whatever runs beside it) or its last sampled token;
4. runs them all through `StepRunner.step`: the decoding sequences as one batched forward over
   their cache slots, the prompt chunks together where the products allow it (see StepRunner);
5. samples, detokenizes and checks stop tokens and strings per sequence, pushes the new text to
   its request's queue (`loop.call_soon_threadsafe`) and removes finished sequences at once.

A sequence with a grammar (structured output, `ember.serve.structured`) has its logits masked
to the tokens the grammar allows before sampling, its matcher advanced after, and it ends with
"stop" the moment the grammar is complete.

Each sequence's numbers are those it would get alone (see `StepRunner`): a request's greedy
output is the same whatever else is batched with it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.generation.generate import _stop_split
from ember.generation.sampling import Sampler, SamplingParams, token_logprobs
from ember.nn.graph import DecodeGraphs

log = logging.getLogger("ember.serve")


class QueueFull(EmberError):
    """More sequences are waiting than the server's --max-queue allows."""


class ShuttingDown(EmberError):
    """The server stopped accepting work (SIGTERM)."""


# --- the model-facing interface --------------------------------------------------------------


@dataclass
class StepInput:
    """One sequence's share of a step: the tokens to feed and the cache they extend."""

    tokens: list[int]
    cache: Any


@dataclass(eq=False)
class Slot:
    """A sequence's row of the runner's ``BatchKVCache`` (what the engine holds as its cache).

    reused: prompt positions already in the row when it was handed out (a shared prefix).
    """

    index: int
    reused: int = 0


def decode_batch(model: Any, default: int) -> int:
    """Decode rows one forward may carry so that each row's logits are those it gets alone:
    the fewest any of the model's quantized weights allows, `default` for a model without any."""
    from ember.kernels.cpu.quant import invariant_rows
    from ember.quant.qtensor import QTensor

    limits = {
        invariant_rows(w)
        for m in model.modules()
        for w in vars(m).values()
        if isinstance(w, QTensor) and len(w.shape) == 2
    }
    return min(limits) if limits else default


def prompts_batch(model: Any) -> bool:
    """Whether prompt chunks of several sequences may share a forward, each row computing what
    it computes alone: every linear layer's weight a QTensor whose products are row-invariant
    at any number of rows (a float weight's BLAS product is not)."""
    from ember.kernels.cpu.quant import invariant_at_any_rows
    from ember.nn import Linear
    from ember.quant.nn import QLinear
    from ember.quant.qtensor import QTensor

    linears = [m for m in model.modules() if isinstance(m, (Linear, QLinear))]
    return bool(linears) and all(
        isinstance(m.weight, QTensor) and invariant_at_any_rows(m.weight) for m in linears
    )


def ragged_groups(lengths: list[int], waste: float = 0.25) -> list[list[int]]:
    """Indices of prompt chunks grouped for forwards right-padded to their longest: longest
    first, a chunk joins while the padding stays within ``waste`` of the real tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g is not None:
            top, real = lengths[g[0]], sum(lengths[j] for j in g) + lengths[i]
            if (len(g) + 1) * top <= (1 + waste) * real:
                g.append(i)
                continue
        groups.append([i])
    return groups


class StepRunner:
    """The model behind the engine: a KV cache slot per sequence, batched forwards per step.

    The engine needs exactly this from a model: `new_cache(capacity)`, `reserve(cache, length)`,
    `release(cache)` and `step(inputs) -> one row of next-token logits per input`. All sequences
    live in one ``ember.nn.BatchKVCache`` (a row each, grown on demand in length and in slots).
    A step runs every one-token input (decoding sequences) as one forward over their rows, up to
    ``MAX_BATCH`` at a time, and the prompt chunks together where every product is
    row-invariant (``prompts_batch``: right-padded rows of similar lengths, each attending over
    its own tokens only), else each as a forward of its own. Row b of a batched
    forward computes exactly what that sequence would alone, so a request's greedy output does
    not depend on what else runs. Longrope models (their positions depend on a sequence's whole
    history) keep one ``KVCache`` per sequence and run one after another.

    Shared prefixes: a slot remembers the prompt blocks it was fed as whole prompt chunks (a
    feed of exactly ``block`` tokens at a multiple of ``block``). A new sequence whose prompt
    starts with such blocks gets them copied into its slot (or keeps them, when that slot is the
    free one it gets) and starts its prefill after them. Only whole chunks are reused, so the
    reused keys and values are bitwise those the sequence would compute itself: a prefix hit
    changes time to first token, never an output. Free slots keep their blocks until reused
    (least recently freed first).
    """

    # decode rows per forward, at most: up to 8 rows every quantized kernel computes each row as
    # it would alone (one matrix-vector pass per row up to kernels.cpu.quant SMALL_M = 8), so a
    # row's numbers are those of a batch of one; a model whose quantized weights all run the
    # _idot kernels (Q4_0/Q4_1/Q8_0 here) keeps that promise up to 16 (see decode_batch)
    MAX_BATCH = 8

    def __init__(self, model: Any, slots: int = 8, initial_capacity: int = 512) -> None:
        """Drive `model` (an ember causal LM) with room for `slots` sequences to start with."""
        self.model = model
        cfg = model.config
        self.context_length = int(getattr(cfg, "max_position_embeddings", 2048))
        self.initial_capacity = initial_capacity
        spec = getattr(model, "spec", None)
        # longrope keys each cache to its own history: such caches are never reallocated
        self._fixed = getattr(spec, "rope_long_inv_freq", None) is not None
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self._dims = (cfg.num_hidden_layers, self.model.num_kv_heads, int(hd))
        self._slots = max(1, slots)
        self.decode_batch = decode_batch(model, self.MAX_BATCH)
        self._decode = DecodeGraphs(model)  # batched one-token steps, captured and replayed
        self.prompts_together = not self._fixed and prompts_batch(model)
        self._free = list(range(self._slots))  # least recently freed first
        self.cache: Any = None  # the BatchKVCache, made at the first sequence
        self._prefix: dict[int, list[int]] = {}  # slot -> its reusable prompt blocks' tokens
        self._block: dict[int, int] = {}  # slot -> its prompt chunk size (0: no reuse)
        self.reused_tokens = 0  # prompt positions served from shared prefixes so far

    def new_cache(self, capacity: int, prompt: list[int] | None = None, block: int = 0) -> Any:
        """A cache for one sequence of up to `capacity` positions (grown on demand); with its
        prompt and prompt chunk size, a slot that may already hold a shared prefix of it."""
        if self._fixed:
            return self._alloc(min(capacity, self.context_length))
        if not self._free:  # more sequences than slots: twice the slots
            self._free = list(range(self._slots, 2 * self._slots))
            self._slots *= 2
        self._resize(min(self.initial_capacity, capacity, self.context_length))
        src, n = self._longest_prefix(prompt or [], block)
        dst = src if src in self._free else self._free[0]
        self._free.remove(dst)
        if n and src != dst:
            self.cache.copy(src, dst, n)
        self.cache.crop(dst, n)
        self._prefix[dst] = list(self._prefix.get(src, [])[:n]) if n else []
        self._block[dst] = block
        self.reused_tokens += n
        return Slot(dst, n)

    def _longest_prefix(self, prompt: list[int], block: int) -> tuple[int, int]:
        """(slot, positions) of the longest reusable prefix of prompt: whole blocks, at least
        one prompt token left to feed; (-1, 0) when none."""
        best, best_n = -1, 0
        if block <= 0:
            return best, best_n
        limit = (len(prompt) - 1) // block * block
        for slot, toks in self._prefix.items():
            if self._block.get(slot) != block or len(toks) < block or best_n >= limit:
                continue
            n = 0
            top = min(limit, len(toks))
            while n < top and toks[n : n + block] == prompt[n : n + block]:
                n += block
            if n > best_n or (n == best_n and n and slot in self._free):
                best, best_n = slot, n
        return best, best_n

    def reserve(self, cache: Any, length: int) -> Any:
        """A cache holding at least `length` positions: `cache` itself, or a larger copy."""
        if isinstance(cache, Slot):
            self._resize(length)
            return cache
        if cache.max_len >= length:
            return cache
        new = self._alloc(max(length, min(2 * cache.max_len, self.context_length)))
        for dst, src in zip(new.k + new.v, cache.k + cache.v):
            dst[:, :, : cache.pos] = src[:, :, : cache.pos]
        new.pos = cache.pos
        return new

    def release(self, cache: Any) -> None:
        """The sequence is done: its slot is free for the next one (its prefix kept)."""
        if isinstance(cache, Slot):
            self._free.append(cache.index)

    def _alloc(self, capacity: int) -> Any:
        from ember.nn import KVCache

        layers, hk, hd = self._dims
        return KVCache(layers, 1, hk, capacity, hd)

    def _resize(self, length: int) -> None:
        """Make the batch cache hold self._slots rows of at least `length` positions."""
        from ember.nn import BatchKVCache

        old = self.cache
        if old is not None and old.slots >= self._slots and old.max_len >= length:
            return
        cap = length
        if old is not None:
            cap = max(length, old.max_len if length <= old.max_len else 2 * old.max_len)
        layers, hk, hd = self._dims
        new = BatchKVCache(layers, self._slots, hk, min(cap, self.context_length), hd)
        # touch every page now: a fresh slot's first prompt would otherwise stop on page faults
        # (numpy asks for huge pages on big arrays: each first write zeroes 2 MiB), about 80 ms
        # of a bundled-model request's time to first token
        for a in (*new.k, *new.v):
            a.fill(0)
        if old is not None:
            n, s = old.max_len, old.slots
            for dst, src in zip(new.k + new.v, old.k + old.v):
                dst[:s, :, :n] = src
            new.lengths[:s] = old.lengths
        self.cache = new

    def step(self, inputs: list[StepInput]) -> list[np.ndarray]:
        """Feed each input's tokens through its cache; the next-token logits (vocab,) of each."""
        import ember

        out: list = [None] * len(inputs)
        batch = [i for i, inp in enumerate(inputs) if isinstance(inp.cache, Slot)]
        for i in batch:  # a whole prompt chunk right after the slot's blocks: one block more
            slot, toks = inputs[i].cache.index, self._prefix[inputs[i].cache.index]
            block = self._block[slot]
            if block and len(inputs[i].tokens) == block and self.cache.lengths[slot] == len(toks):
                toks.extend(inputs[i].tokens)
        decode = [i for i in batch if len(inputs[i].tokens) == 1]
        with ember.no_grad():
            for c in range(0, len(decode), self.decode_batch):
                part = decode[c : c + self.decode_batch]
                ids = np.asarray([inputs[i].tokens for i in part], np.int64)
                rows = self.cache.rows([inputs[i].cache.index for i in part])
                logits = self._decode(ids, rows).numpy()[:, -1]
                for i, row in zip(part, logits):
                    out[i] = row.astype(np.float32, copy=False)
            if self.prompts_together:
                self._prompts([i for i in batch if out[i] is None], inputs, out)
            for i, inp in enumerate(inputs):
                if out[i] is not None:
                    continue
                c = inp.cache
                cache = self.cache.rows([c.index]) if isinstance(c, Slot) else c
                ids = ember.from_numpy(np.asarray([inp.tokens], np.int64))
                logits = self.model(ids, cache=cache, logits_to_keep=1)
                out[i] = logits.numpy()[0, -1].astype(np.float32, copy=False)
        return out

    def _prompts(self, chunks: list[int], inputs: list[StepInput], out: list) -> None:
        """Prompt chunks (indices into inputs) as right-padded forwards over their slots, a
        group of similar lengths each; the next-token logits of each into out."""
        import ember

        lengths = [len(inputs[i].tokens) for i in chunks]
        groups = []
        for group in ragged_groups(lengths):
            idx = [chunks[g] for g in group]
            top = max(lengths[g] for g in group)
            past = self.cache.lengths[[inputs[i].cache.index for i in idx]]
            # padding positions past the context window (a learned position table ends there)
            wide = len(idx) > 1 and int(past.max()) + top > self.context_length
            groups += [[i] for i in idx] if wide else [idx]
        for idx in groups:
            n = np.asarray([len(inputs[i].tokens) for i in idx], np.int64)
            ids = np.zeros((len(idx), int(n.max())), np.int64)
            for row, i in enumerate(idx):
                ids[row, : n[row]] = inputs[i].tokens
            cache = self.cache.rows([inputs[i].cache.index for i in idx], n)
            logits = self.model(ember.from_numpy(ids), cache=cache, logits_to_keep=n - 1)
            for i, row in zip(idx, logits.numpy()[:, -1]):
                out[i] = row.astype(np.float32, copy=False)


# --- sequences and requests ------------------------------------------------------------------


@dataclass
class TokenInfo:
    """A generated token with its log-probability and the most likely alternatives."""

    id: int
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class SequenceSpec:
    """What to generate for one choice of a request."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None
    index: int = 0
    ignore_eos: bool = False  # run to max_tokens (benchmarks; vLLM's extension)
    grammar: str | None = None  # llguidance grammar the output must follow (structured output)


class Sequence:
    """One choice being generated: its prompt, cache, sampler, text and where its tokens go."""

    _ids = itertools.count()

    def __init__(
        self, spec: SequenceSpec, handle: RequestHandle, tokenizer: Any, matcher: Any = None
    ) -> None:
        """A sequence of `handle`'s request (not yet admitted: no cache)."""
        self.matcher = matcher  # a structured.Matcher when the output follows a grammar
        self.id = next(Sequence._ids)
        self.spec = spec
        self.handle = handle
        self.sampler = Sampler(spec.sampling)
        self.needs_history = spec.sampling.repetition_penalty != 1.0 or bool(
            spec.sampling.presence_penalty or spec.sampling.frequency_penalty
        )
        self.history = list(spec.prompt)
        self.cache: Any = None
        self.fed = 0  # positions in the cache
        self.generated: list[int] = []
        self.decoder = tokenizer.stream(skip_special_tokens=True)
        self.text, self.sent = "", 0
        self.pending: list[TokenInfo] = []  # tokens whose text is still held back
        self.last_token_time: float | None = None

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens are still to be fed."""
        return self.fed < len(self.spec.prompt)


class RequestHandle:
    """The asyncio side of a request: its events arrive on `queue`; `cancel()` ends it.

    Events: ("token", index, text, [TokenInfo]) and ("finish", index, reason, completion_tokens)
    where reason is "stop", "length", "abort" (shutdown), "timeout" or "error".
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        """A handle whose events are delivered on `loop`."""
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrival = time.monotonic()
        self.deadline = deadline
        self.cancelled = False
        self.first_token_time: float | None = None
        self.seqs: list[Sequence] = []
        self._engine: Engine | None = None

    def cancel(self) -> None:
        """Stop generating (the client left); the slots are freed at the next step."""
        if not self.cancelled:
            self.cancelled = True
            if self._engine is not None:
                self._engine._wake()

    def _put(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


# --- the engine ------------------------------------------------------------------------------


class Engine:
    """The scheduler: admits, steps and retires sequences on one worker thread."""

    def __init__(
        self,
        runner: StepRunner,
        tokenizer: Any,
        *,
        max_running: int = 8,
        max_queue: int = 64,
        prefill_chunk: int = 256,
        timeout: float | None = None,
        metrics: Any = None,
        stop_token_ids: Any = None,
    ) -> None:
        """An engine over `runner`; call start() before submitting."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_running = max_running
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.timeout = timeout
        self.metrics = metrics
        ids = tokenizer.eos_token_ids if stop_token_ids is None else stop_token_ids
        self.stop_token_ids = frozenset(int(i) for i in ids)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._running: list[Sequence] = []
        self._jobs: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._draining_until: float | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._grammar_table: Any = None

    # --- called from the event loop ---

    @property
    def num_running(self) -> int:
        """Sequences being generated."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences queued for admission."""
        return len(self._waiting)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread = threading.Thread(target=self._loop, name="ember-engine", daemon=True)
        self._thread.start()

    def submit(
        self, specs: list[SequenceSpec], loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestHandle:
        """Queue one request's sequences (all or none); raises QueueFull or ShuttingDown."""
        loop = loop or asyncio.get_running_loop()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        handle = RequestHandle(loop, deadline)
        handle._engine = self
        handle.seqs = [Sequence(s, handle, self.tokenizer, self._matcher(s)) for s in specs]
        with self._cond:
            if self._draining_until is not None or self._stopping:
                raise ShuttingDown("the server is shutting down")
            # sequences the worker will admit at its next step (free slots) are not queued
            free = max(0, self.max_running - len(self._running))
            if len(self._waiting) + len(specs) > self.max_queue + free:
                raise QueueFull(
                    f"{len(self._waiting)} sequences are queued (--max-queue {self.max_queue})"
                )
            self._waiting.extend(handle.seqs)
            self._cond.notify()
        return handle

    def _matcher(self, spec: SequenceSpec) -> Any:
        """A grammar matcher for spec (None without a grammar); raises structured.GrammarError."""
        if spec.grammar is None:
            return None
        from ember.serve import structured

        if self._grammar_table is None:  # once per engine: the tokenizer as llguidance sees it
            config = getattr(getattr(self.runner, "model", None), "config", None)
            n_vocab = getattr(config, "vocab_size", None) or self.tokenizer.vocab_size
            self._grammar_table = structured.token_table(
                self.tokenizer, n_vocab, self.stop_token_ids
            )
        return structured.Matcher(self._grammar_table, spec.grammar)

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run fn() on the engine thread between two steps; a future of its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            self._jobs.append((fn, fut))
            self._cond.notify()
        return fut

    def begin_shutdown(self, grace: float = 0.0) -> None:
        """Accept nothing new; end queued sequences now and running ones after `grace` s."""
        with self._cond:
            if self._draining_until is None:
                self._draining_until = time.monotonic() + grace
            self._cond.notify()

    def stop(self, timeout: float | None = 10.0) -> None:
        """End every sequence and the worker thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # --- the worker thread ---

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._jobs or self._stopping):
                    self._cond.wait(timeout=1.0)
                jobs, self._jobs = self._jobs, []
                stopping = self._stopping
            for fn, fut in jobs:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # handed to the awaiting handler
                        fut.set_exception(e)
            if stopping:
                self._retire_all("abort")
                return
            try:
                self._reap()
                self._admit()
                if self._running:
                    self._step()
            except Exception:  # a model failure ends these sequences, not the server
                log.exception("engine step failed")
                for seq in list(self._running):
                    self._finish(seq, "error")
            if self.metrics is not None:
                self.metrics.set_sequences(len(self._running), len(self._waiting))

    def _retire_all(self, reason: str) -> None:
        with self._cond:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for seq in waiting + self._running:
            self._finish(seq, reason)

    def _reap(self) -> None:
        """Drop cancelled, timed-out and (when draining) cut-off sequences."""
        now = time.monotonic()
        draining = self._draining_until
        with self._cond:
            keep: collections.deque[Sequence] = collections.deque()
            dropped = []
            for seq in self._waiting:
                reason = self._end_reason(seq, now)
                if reason is None and draining is not None:
                    reason = "abort"
                (dropped.append((seq, reason)) if reason else keep.append(seq))
            self._waiting = keep
        for seq, reason in dropped:
            self._finish(seq, reason, running=False)
        for seq in list(self._running):
            reason = self._end_reason(seq, now)
            if reason is None and draining is not None and now >= draining:
                reason = "abort"
            if reason:
                self._finish(seq, reason)

    @staticmethod
    def _end_reason(seq: Sequence, now: float) -> str | None:
        h = seq.handle
        if h.cancelled:
            return "cancelled"
        if h.deadline is not None and now >= h.deadline:
            return "timeout"
        return None

    def _admit(self) -> None:
        with self._cond:
            while self._waiting and len(self._running) < self.max_running:
                seq = self._waiting.popleft()
                need = len(seq.spec.prompt) + seq.spec.max_tokens
                seq.cache = self.runner.new_cache(need, seq.spec.prompt, self.prefill_chunk)
                seq.fed = getattr(seq.cache, "reused", 0)  # a shared prefix already there
                self._running.append(seq)

    def _step(self) -> None:
        inputs, stepped, sample = [], [], []
        budget = self.prefill_chunk
        for seq in self._running:
            if seq.prefilling:
                start = seq.fed
                end = min(
                    len(seq.spec.prompt), (start // self.prefill_chunk + 1) * self.prefill_chunk
                )
                # a whole chunk or nothing, so chunk boundaries never depend on other requests
                # (the first prefilling sequence always fits: no chunk exceeds the budget)
                if end - start > budget:
                    continue
                budget -= end - start
                tokens = seq.spec.prompt[start:end]
                sample.append(end == len(seq.spec.prompt))
            else:
                tokens = [seq.generated[-1]]
                sample.append(True)
            seq.cache = self.runner.reserve(seq.cache, seq.fed + len(tokens))
            inputs.append(StepInput(tokens, seq.cache))
            stepped.append(seq)
        rows = self.runner.step(inputs)
        now = time.monotonic()
        for seq, inp, row, do_sample in zip(stepped, inputs, rows, sample):
            seq.fed += len(inp.tokens)
            if do_sample:
                self._advance(seq, row, now)

    def _advance(self, seq: Sequence, row: np.ndarray, now: float) -> None:
        """Sample one token for seq from its logits row, stream its text, finish if done."""
        spec = seq.spec
        # the grammar's mask comes first, so penalties, temperature and top-k/p only ever see
        # allowed tokens; logprobs stay those of the raw row
        logits = row if seq.matcher is None else seq.matcher.mask(row)
        tok = seq.sampler(logits, np.asarray(seq.history) if seq.needs_history else None)
        try:
            complete = seq.matcher is not None and seq.matcher.advance(tok)
        except EmberError:  # the grammar refused what its own mask allowed: end this one only
            log.exception("structured output: the grammar failed")
            self._finish(seq, "error")
            return
        info = TokenInfo(tok)
        if spec.logprobs is not None:
            info.logprob, info.top = token_logprobs(row, tok, spec.logprobs)
        seq.generated.append(tok)
        seq.history.append(tok)
        h, m = seq.handle, self.metrics
        if m is not None:
            m.generation_tokens(1)
            if h.first_token_time is None:
                m.observe_ttft(now - h.arrival)
            if seq.last_token_time is not None:
                m.observe_itl(now - seq.last_token_time)
        if h.first_token_time is None:
            h.first_token_time = now
        seq.last_token_time = now
        seq.pending.append(info)
        if tok in self.stop_token_ids and not spec.ignore_eos:
            seq.pending.pop()  # counted, but neither text nor a logprob entry (as OpenAI)
            self._emit(seq, seq.decoder.flush(), final=True)
            self._finish(seq, "stop")
            return
        if self._emit(seq, seq.decoder.put(tok), final=False):
            self._finish(seq, "stop")
        elif complete:  # the JSON is whole: nothing but EOS may follow
            self._emit(seq, seq.decoder.flush(), final=True)
            self._finish(seq, "stop")
        elif len(seq.generated) >= spec.max_tokens:
            self._emit(seq, seq.decoder.flush(), final=True)
            self._finish(seq, "length")

    def _emit(self, seq: Sequence, piece: str, final: bool) -> bool:
        """Add decoded text; send what is safe to send. True when a stop string was hit."""
        seq.text += piece
        keep, hit, hold = _stop_split(seq.text, seq.spec.stop)
        end = len(keep) if (hit or final) else len(keep) - hold
        if end > seq.sent or (seq.pending and (hit or final)):
            seq.handle._put(("token", seq.spec.index, keep[seq.sent : end], seq.pending))
            seq.sent = max(seq.sent, end)
            seq.pending = []
        if hit:
            seq.text = keep
        return hit

    def _finish(self, seq: Sequence, reason: str, running: bool = True) -> None:
        if running and seq in self._running:
            self._running.remove(seq)
        if seq.cache is not None:
            self.runner.release(seq.cache)
        seq.cache = seq.matcher = None
        if reason == "cancelled":
            return
        if seq.pending and reason in ("abort", "timeout", "error"):
            self._emit(seq, seq.decoder.flush(), final=True)
        seq.handle._put(("finish", seq.spec.index, reason, len(seq.generated)))
