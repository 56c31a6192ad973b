"""Chat and text completions: submit a checked request to the engine, answer in OpenAI's shape.

A non-streaming request waits for every choice and returns one JSON object; a streaming one
is a server-sent event stream (`data: {chunk}` lines, `data: [DONE]` last). Either way the
request is cancelled in the engine the moment the client disconnects.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from ember.serve.engine import Engine, QueueFull, RequestHandle, SequenceSpec, ShuttingDown
from ember.serve.protocol import APIError, GenerationRequest, bad
from ember.serve.structured import GrammarError

# finish reasons the engine reports that end a request with an error instead of a result
_ERRORS = {
    "timeout": (408, "the request ran past the server's --timeout", "timeout_error", "timeout"),
    "error": (500, "the model failed while generating", "server_error", None),
}


def submit(engine: Engine, req: GenerationRequest, metrics: Any) -> RequestHandle:
    """Queue every choice of `req` (n per prompt; choice j's seed is seed + j)."""
    specs = []
    for i, (prompt, max_tokens) in enumerate(zip(req.prompts, req.max_tokens)):
        for j in range(req.n):
            seed = None if req.sampling.seed is None else req.sampling.seed + j
            specs.append(
                SequenceSpec(
                    prompt,
                    max_tokens,
                    replace(req.sampling, seed=seed),
                    req.stop,
                    req.logprobs,
                    i * req.n + j,
                    req.ignore_eos,
                    req.grammar,
                )
            )
    try:
        handle = engine.submit(specs)
    except GrammarError as e:  # the schema compiled, but not against this model's tokenizer
        raise bad(str(e), "response_format") from e
    except QueueFull as e:
        raise APIError(
            429,
            f"the server is busy ({e}); retry later",
            "rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": "1"},
        ) from e
    except ShuttingDown as e:
        raise APIError(
            503, "the server is shutting down", "server_error", code="unavailable"
        ) from e
    if metrics is not None:
        metrics.prompt_tokens(sum(len(p) for p in req.prompts))
    return handle


class _Choices:
    """Per-choice text, token infos, finish reason and token counts, filled from engine events."""

    def __init__(self, n: int) -> None:
        self.text = [""] * n
        self.tokens: list[list] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.count = [0] * n

    def add(self, event: tuple) -> None:
        kind, idx = event[0], event[1]
        if kind == "token":
            self.text[idx] += event[2]
            self.tokens[idx] += event[3]
        else:
            self.finish[idx], self.count[idx] = event[2], event[3]

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finish)

    def error(self) -> APIError | None:
        for f in self.finish:
            if f in _ERRORS:
                status, message, type_, code = _ERRORS[f]
                return APIError(status, message, type_, code=code)
        return None


def usage(req: GenerationRequest, completion_tokens: int) -> dict:
    """OpenAI's usage object (each prompt counted once, however many choices it has)."""
    prompt = sum(len(p) for p in req.prompts)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def _chat_logprobs(tok: Any, infos: list) -> dict:
    def entry(token_id: int, lp: float) -> dict:
        s = tok.decode([token_id])
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return {
        "content": [
            {**entry(t.id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top]}
            for t in infos
        ]
    }


def _completion_logprobs(tok: Any, infos: list, offset: int = 0) -> dict:
    tokens, offsets = [], []
    for t in infos:
        s = tok.decode([t.id])
        offsets.append(offset)
        offset += len(s)
        tokens.append(s)
    return {
        "tokens": tokens,
        "token_logprobs": [t.logprob for t in infos],
        "top_logprobs": [{tok.decode([i]): lp for i, lp in t.top} for t in infos],
        "text_offset": offsets,
    }


async def _next_event(handle: RequestHandle, gone: asyncio.Future) -> tuple | None:
    """The handle's next event, or None when the client went away first."""
    get = asyncio.ensure_future(handle.queue.get())
    await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    if get.done():
        return get.result()
    get.cancel()
    return None


async def _disconnected(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def collect(
    receive: Any, handle: RequestHandle, req: GenerationRequest, kind: str, tok: Any, metrics: Any
) -> dict | None:
    """Wait for every choice; the response object (None when the client disconnected)."""
    total = len(req.prompts) * req.n
    choices = _Choices(total)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        while not choices.done:
            event = await _next_event(handle, gone)
            if event is None:
                return None
            choices.add(event)
    finally:
        gone.cancel()
        handle.cancel()
    err = choices.error()
    if err is not None:
        raise err
    if metrics is not None:
        metrics.observe_e2e(time.monotonic() - handle.arrival)
    created = int(time.time())
    out = []
    for i in range(total):
        lp = None
        if req.logprobs is not None:
            lp = (_chat_logprobs if kind == "chat" else _completion_logprobs)(
                tok, choices.tokens[i]
            )
        c: dict = {"index": i, "logprobs": lp, "finish_reason": choices.finish[i]}
        if kind == "chat":
            c["message"] = {"role": "assistant", "content": choices.text[i]}
        else:
            c["text"] = choices.text[i]
        out.append(c)
    return {
        "id": f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": created,
        "model": req.model,
        "choices": out,
        "usage": usage(req, sum(choices.count)),
        "system_fingerprint": None,
    }


def _sse(obj: Any) -> bytes:
    return (
        b"data: "
        + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        + b"\n\n"
    )


async def stream_events(
    handle: RequestHandle,
    req: GenerationRequest,
    kind: str,
    tok: Any,
    metrics: Any,
    gone: asyncio.Future,
) -> AsyncIterator[bytes]:
    """The SSE byte chunks of a streaming response, ending with `data: [DONE]`."""
    total = len(req.prompts) * req.n
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    offsets = [0] * total

    def chunk(choices: list[dict]) -> bytes:
        c: dict = {"id": rid, "object": obj, "created": created, "model": req.model}
        c["choices"] = choices
        if req.include_usage:
            c["usage"] = None
        return _sse(c)

    if kind == "chat":
        for i in range(total):
            delta = {"role": "assistant", "content": ""}
            yield chunk([{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
    choices = _Choices(total)
    while not choices.done:
        event = await _next_event(handle, gone)
        if event is None:
            return
        choices.add(event)
        idx = event[1]
        if event[0] == "token":
            _, _, text, infos = event
            lp = None
            if req.logprobs is not None:
                if kind == "chat":
                    lp = _chat_logprobs(tok, infos)
                else:
                    lp = _completion_logprobs(tok, infos, offsets[idx])
            offsets[idx] += len(text)
            if kind == "chat":
                c = {"index": idx, "delta": {"content": text}, "logprobs": lp}
            else:
                c = {"index": idx, "text": text, "logprobs": lp}
            yield chunk([{**c, "finish_reason": None}])
        else:
            reason = event[2]
            if reason in _ERRORS:
                status, message, type_, code = _ERRORS[reason]
                yield _sse(APIError(status, message, type_, code=code).body())
                yield b"data: [DONE]\n\n"
                return
            if kind == "chat":
                c = {"index": idx, "delta": {}, "logprobs": None}
            else:
                c = {"index": idx, "text": "", "logprobs": None}
            yield chunk([{**c, "finish_reason": reason}])
    if metrics is not None:
        metrics.observe_e2e(time.monotonic() - handle.arrival)
    if req.include_usage:
        last = {"id": rid, "object": obj, "created": created, "model": req.model}
        last |= {"choices": [], "usage": usage(req, sum(choices.count))}
        yield _sse(last)
    yield b"data: [DONE]\n\n"


class EventStream:
    """An ASGI response streaming SSE; a client that leaves cancels the request at once."""

    def __init__(
        self, handle: RequestHandle, req: GenerationRequest, kind: str, tok: Any, metrics: Any
    ) -> None:
        """Stream `handle`'s events as `kind` ('chat' or 'completion') chunks."""
        self.handle, self.req, self.kind, self.tok, self.metrics = handle, req, kind, tok, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Send the stream; stop (and cancel the request) when the client disconnects."""
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            events = stream_events(self.handle, self.req, self.kind, self.tok, self.metrics, gone)
            async for data in events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the connection broke while sending
            pass
        finally:
            gone.cancel()
            self.handle.cancel()
