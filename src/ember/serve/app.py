"""The ASGI application: OpenAI routes, API keys, body limits, health, metrics.

`create_app(load)` returns a Starlette app that starts listening at once and loads the model on
a background thread (`GET /health` answers 503 until it is ready). Routes:

    POST /v1/chat/completions   POST /v1/completions   POST /v1/embeddings
    GET  /v1/models             GET  /v1/models/{id}   GET  /health   GET /metrics
    POST /tokenize              POST /detokenize       GET  /  (the chat page)

With API keys set, every /v1 route and /tokenize, /detokenize need `Authorization: Bearer KEY`
(checked before the body is read); /health, /metrics and the chat page stay open, as in vLLM.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import importlib.resources
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ember.serve.completions import EventStream, collect, submit
from ember.serve.engine import Engine, ShuttingDown, StepRunner
from ember.serve.metrics import Metrics
from ember.serve.protocol import (
    APIError,
    ModelLimits,
    bad,
    chat_messages,
    json_object,
    parse_chat,
    parse_completion,
    unknown_model,
)

log = logging.getLogger("ember.serve")

PROTECTED = ("/v1/", "/tokenize", "/detokenize")
MAX_EMBED_INPUTS = 2048


@dataclass
class ServeConfig:
    """Server settings (the `ember serve` flags)."""

    api_keys: frozenset[str] = frozenset()
    max_body_bytes: int = 1 << 20
    max_queue: int = 64
    max_running: int = 8
    max_n: int = 16
    prefill_chunk: int = 256
    timeout: float | None = None
    served_model_name: str | None = None
    # the LoRA adapters applied to the model at load ({"path", "scale"} each; /v1/models shows them)
    adapters: tuple[dict, ...] = ()


@dataclass
class Loaded:
    """What the loader returns: the causal LM, its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    path: str
    embedder: Any = None
    embedder_path: str | None = None


@dataclass
class ServerState:
    """The app's state: loading status, then the engine and the model's limits."""

    config: ServeConfig
    metrics: Metrics = field(default_factory=Metrics)
    ready: bool = False
    error: str | None = None
    engine: Engine | None = None
    tokenizer: Any = None
    limits: ModelLimits | None = None
    model_name: str = ""
    embedder: Any = None
    embed_name: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def begin_shutdown(self, grace: float = 0.0) -> None:
        """Refuse new work; end running sequences after `grace` seconds (SIGTERM)."""
        if self.engine is not None:
            self.engine.begin_shutdown(grace)


def model_name_of(path: str) -> str:
    """The id a model is served as: its file name without .gguf, or its folder's name."""
    p = Path(path)
    return p.stem if p.suffix.lower() == ".gguf" else p.name


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), e.status, headers=e.headers)


def _ready(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    if not state.ready:
        msg = "the model is still loading" if state.error is None else "the model failed to load"
        raise APIError(503, msg, "server_error", code="unavailable", headers={"Retry-After": "1"})
    return state


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request) -> Any:
    """The request body as JSON, refused with 413 past --max-body-bytes and 400 if malformed."""
    limit = request.app.state.server.config.max_body_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"the body is {length} bytes; this server takes at most {limit}")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the body is over {limit} bytes, the most this server takes")
        parts.append(chunk)
    try:
        return json.loads(b"".join(parts), parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the body is not valid JSON: {e}") from e


def _endpoint(fn: Callable) -> Callable:
    """Turn APIError (and unexpected failures) into OpenAI error JSON."""

    async def wrapped(request: Request) -> Any:
        try:
            return await fn(request)
        except APIError as e:
            return _error(e)
        except Exception:
            log.exception("error handling %s", request.url.path)
            return _error(APIError(500, "internal server error", "server_error"))

    wrapped.__name__ = fn.__name__
    return wrapped


# --- generation --------------------------------------------------------------------------------


async def _generate(request: Request, kind: str) -> Any:
    state = _ready(request)
    body = await read_json(request)
    parse = parse_chat if kind == "chat" else parse_completion
    req = parse(body, state.limits)
    handle = submit(state.engine, req, state.metrics)
    if req.stream:
        return EventStream(handle, req, kind, state.tokenizer, state.metrics)
    result = await collect(request.receive, handle, req, kind, state.tokenizer, state.metrics)
    if result is None:  # the client left; nobody reads this
        return Response(status_code=499)
    return JSONResponse(result)


@_endpoint
async def chat_completions(request: Request) -> Any:
    """POST /v1/chat/completions."""
    return await _generate(request, "chat")


@_endpoint
async def completions(request: Request) -> Any:
    """POST /v1/completions."""
    return await _generate(request, "completion")


# --- embeddings --------------------------------------------------------------------------------


def _embed_inputs(body: dict) -> list[str]:
    x = body.get("input")
    if isinstance(x, str):
        x = [x]
    if not isinstance(x, list) or not x:
        raise bad("'input' must be a string or a non-empty list of strings", "input")
    if not all(isinstance(s, str) for s in x):
        raise bad("'input' must be strings (token id input is not supported)", "input")
    if any(not s for s in x):
        raise bad("'input' must not contain empty strings", "input")
    if len(x) > MAX_EMBED_INPUTS:
        raise bad(f"'input' takes at most {MAX_EMBED_INPUTS} strings, got {len(x)}", "input")
    return x


def embedding_request(body: dict, served: str) -> tuple[str, list[str], str]:
    """An /v1/embeddings body checked: (model, input texts, encoding format), or an APIError."""
    model = body.get("model", served)
    if model != served:
        raise unknown_model(model, served)
    texts = _embed_inputs(body)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    if body.get("dimensions") is not None:
        raise bad("'dimensions' is not supported by this model", "dimensions", "unsupported")
    return model, texts, fmt


def embedding_response(
    vectors: Any, n_tokens: int, model: str, fmt: str, headers: dict | None = None
) -> JSONResponse:
    """OpenAI's embeddings list: one float list (or base64 little-endian float32) per input."""
    data = []
    for i, v in enumerate(np.asarray(vectors, np.float32)):
        if fmt == "base64":
            value: Any = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
        else:
            value = v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    body = {"object": "list", "data": data, "model": model, "usage": usage}
    return JSONResponse(body, headers=headers)


@_endpoint
async def embeddings(request: Request) -> Any:
    """POST /v1/embeddings (when an embedding model is loaded)."""
    import asyncio

    state = _ready(request)
    body = json_object(await read_json(request))
    if state.embedder is None:
        raise APIError(
            404,
            "no embedding model is loaded (start the server with --embedding-model)",
            param="model",
            code="model_not_found",
        )
    model, texts, fmt = embedding_request(body, state.embed_name)
    emb = state.embedder

    def work() -> tuple[np.ndarray, int]:
        n_tokens = int(emb.tokenize(texts)[2][-1])
        return emb.encode(texts), n_tokens

    try:
        vectors, n_tokens = await asyncio.wrap_future(state.engine.call(work))
    except ShuttingDown as e:
        raise APIError(503, "the server is shutting down", "server_error") from e
    return embedding_response(vectors, n_tokens, model, fmt)


# --- small routes ------------------------------------------------------------------------------


def _model_cards(state: ServerState) -> list[dict]:
    cards = []
    if state.ready:
        cards.append(
            {
                "id": state.model_name,
                "object": "model",
                "created": state.created,
                "owned_by": "ember",
                "max_model_len": state.limits.context_length,
                **({"adapters": list(state.config.adapters)} if state.config.adapters else {}),
            }
        )
        if state.embed_name is not None:
            cards.append(
                {
                    "id": state.embed_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "ember",
                }
            )
    return cards


@_endpoint
async def list_models(request: Request) -> Any:
    """GET /v1/models."""
    state = _ready(request)
    return JSONResponse({"object": "list", "data": _model_cards(state)})


@_endpoint
async def get_model(request: Request) -> Any:
    """GET /v1/models/{id}."""
    state = _ready(request)
    wanted = request.path_params["model"]
    for card in _model_cards(state):
        if card["id"] == wanted:
            return JSONResponse(card)
    raise unknown_model(wanted, state.model_name)


async def health(request: Request) -> Any:
    """GET /health: 200 when the model is loaded, 503 while loading (or if loading failed)."""
    state: ServerState = request.app.state.server
    if state.ready:
        return JSONResponse({"status": "ok"})
    if state.error is not None:
        return JSONResponse({"status": "error", "message": state.error}, 503)
    return JSONResponse({"status": "loading"}, 503)


async def metrics(request: Request) -> Any:
    """GET /metrics: Prometheus text."""
    state: ServerState = request.app.state.server
    if state.engine is not None:
        state.metrics.set_sequences(state.engine.num_running, state.engine.num_waiting)
    return PlainTextResponse(
        state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


@functools.cache
def _chat_page() -> tuple[str, str]:
    """static/chat.html and its Content-Security-Policy (its inline script and style by hash)."""
    page = importlib.resources.files("ember.serve").joinpath("static", "chat.html")
    html = page.read_text(encoding="utf-8")

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.S)
        digests = (hashlib.sha256(b.encode("utf-8")).digest() for b in bodies)
        return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests)

    csp = (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    return html, csp


async def chat_page(request: Request) -> Any:
    """GET /: the chat page (no data in it, so no API key needed)."""
    html, csp = _chat_page()
    headers = {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return HTMLResponse(html, headers=headers)


@_endpoint
async def tokenize(request: Request) -> Any:
    """POST /tokenize: {"prompt": str} or {"messages": [...]} -> token ids (vLLM's shape)."""
    state = _ready(request)
    body = json_object(await read_json(request))
    model = body.get("model", state.model_name)
    if model != state.model_name:
        raise unknown_model(model, state.model_name)
    tok = state.tokenizer
    if "messages" in body:
        add_gen = body.get("add_generation_prompt", True)
        if not isinstance(add_gen, bool):
            raise bad("'add_generation_prompt' must be a boolean", "add_generation_prompt")
        messages = chat_messages(body)
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=add_gen)
        except Exception as e:
            raise bad(f"the chat template refused these messages: {e}", "messages") from e
        ids = tok.encode(text, add_special_tokens=False)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad("'prompt' must be a string (or give 'messages')", "prompt")
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise bad("'add_special_tokens' must be a boolean", "add_special_tokens")
        # a raw prompt, like a completion's: control tokens parsed (llama-server, vLLM)
        ids = tok.encode(prompt, add_special_tokens=add_special, parse_special=True)
    return JSONResponse(
        {"tokens": ids, "count": len(ids), "max_model_len": state.limits.context_length}
    )


@_endpoint
async def detokenize(request: Request) -> Any:
    """POST /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
    state = _ready(request)
    body = json_object(await read_json(request))
    ids = body.get("tokens")
    vocab = state.limits.vocab_size
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in ids
    ):
        raise bad("'tokens' must be a list of token ids", "tokens")
    if any(not 0 <= t < vocab for t in ids):
        raise bad(f"'tokens' has ids outside [0, {vocab})", "tokens")
    return JSONResponse({"prompt": state.tokenizer.decode(ids)})


# --- middleware --------------------------------------------------------------------------------


class Guard:
    """ASGI middleware: API-key check before anything is read, and requests counted by status."""

    ENDPOINTS = frozenset(
        (
            "/",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
            "/health",
            "/metrics",
            "/tokenize",
            "/detokenize",
        )
    )

    def __init__(self, app: Any, state: ServerState) -> None:
        """Wrap `app`."""
        self.app, self.state = app, state

    def _authorized(self, scope: dict) -> bool:
        keys = self.state.config.api_keys
        if not keys or not scope["path"].startswith(PROTECTED):
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        return any(hmac.compare_digest(token.strip().encode(), k.encode()) for k in keys)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """Check, pass on, count."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in self.ENDPOINTS else "other"
        if path.startswith("/v1/models/"):
            endpoint = "/v1/models"
        status = {"code": 500}

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if not self._authorized(scope):
                err = APIError(
                    401,
                    "a valid API key is needed: send 'Authorization: Bearer KEY'",
                    "authentication_error",
                    code="invalid_api_key",
                )
                await _error(err)(scope, receive, counting_send)
                return
            await self.app(scope, receive, counting_send)
        finally:
            self.state.metrics.request(endpoint, status["code"])


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return _error(APIError(exc.status_code, str(exc.detail), code=None))


# --- the app -----------------------------------------------------------------------------------


def _load_into(
    state: ServerState, load: Callable[[], Loaded], on_error: Callable[[str], None] | None
) -> None:
    try:
        loaded = load()
        tok = loaded.tokenizer
        runner = StepRunner(loaded.model, slots=state.config.max_running)
        name = state.config.served_model_name or model_name_of(loaded.path)
        state.metrics.model_name = name
        state.limits = ModelLimits(
            name=name,
            context_length=runner.context_length,
            max_n=state.config.max_n,
            encode=lambda s: tok.encode(s, add_special_tokens=False),
            # completion prompts get the tokenizer's special tokens (bos where the model has one)
            # and, as llama-server's and vLLM's, their control tokens parsed; chat messages are
            # text, only the template's scaffolding gives control ids (render_chat's ChatPrompt)
            encode_prompt=lambda s: tok.encode(s, add_special_tokens=True, parse_special=True),
            render_chat=lambda m: tok.apply_chat_template(m, add_generation_prompt=True),
            vocab_size=tok.vocab_size,
        )
        engine = Engine(
            runner,
            tok,
            max_running=state.config.max_running,
            max_queue=state.config.max_queue,
            prefill_chunk=state.config.prefill_chunk,
            timeout=state.config.timeout,
            metrics=state.metrics,
        )
        engine.start()
        state.tokenizer, state.model_name, state.engine = tok, name, engine
        if loaded.embedder is not None:
            state.embedder = loaded.embedder
            state.embed_name = model_name_of(loaded.embedder_path or "embeddings")
        state.ready = True
        log.info("ember serve: %s ready", name)
    except Exception as e:  # reported by /health; the command exits
        log.exception("loading the model failed")
        state.error = f"{type(e).__name__}: {e}"
        if on_error is not None:
            on_error(state.error)


def create_app(
    load: Callable[[], Loaded],
    config: ServeConfig | None = None,
    on_load_error: Callable[[str], None] | None = None,
) -> Starlette:
    """The server app; `load()` runs on a background thread once the app starts."""
    state = ServerState(config or ServeConfig())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        t = threading.Thread(
            target=_load_into, args=(state, load, on_load_error), name="ember-load", daemon=True
        )
        t.start()
        try:
            yield
        finally:
            if state.engine is not None:
                state.engine.stop()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/", chat_page, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    app.state.server = state
    app.add_middleware(Guard, state=state)
    return app
