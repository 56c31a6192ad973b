"""The model replicas of ember's Ray Serve application (see ember.integrations._ray_serve).

``_EmberServer`` runs `ember serve`'s own Starlette app and engine; ``_EmbeddingServer`` and
``_VisionServer`` answer /v1/embeddings and /v1/classify, batching concurrent requests with
``@serve.batch``. Each takes one request at a time as (scope, body) through ``asgi`` and
yields the ASGI messages the app sends, with the replica's id and pid added as headers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from ray import serve

from ember.errors import EmberError

REPLICA_HEADER = b"x-ember-replica"
PID_HEADER = b"x-ember-replica-pid"
BATCH_HEADER = "x-ember-batch-requests"  # embed / classify: requests in the batch that answered
LOAD_TIMEOUT_S = 900.0
MAX_IMAGES = 64


# --- the model replicas --------------------------------------------------------------------


def _replica_headers() -> list[tuple[bytes, bytes]]:
    try:
        rid = serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a replica (direct use, tests): no Serve context
        rid = "local"
    return [(REPLICA_HEADER, rid.encode()), (PID_HEADER, str(os.getpid()).encode())]


async def run_asgi(
    app: Any, scope: dict, body: bytes, headers: list[tuple[bytes, bytes]]
) -> AsyncIterator[dict]:
    """Run one request through an ASGI app; yield the messages it sends (headers added).

    The app reads `body` as the whole request; later reads block until the caller goes away
    (the generator is closed or cancelled), when they answer ``http.disconnect``.
    """
    queue: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    fed = False

    async def receive() -> dict:
        nonlocal fed
        if not fed:
            fed = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await queue.put(message)

    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (message := await queue.get()) is not None:
            yield message
        task.result()
    finally:
        if not task.done():
            gone.set()
            task.cancel()


def _load_llm(model: str | None, threads: int | None, embedding_model: str | None):
    """The loader `ember serve` uses (same functions), for one replica."""
    from ember.cli._llm import load
    from ember.models.hub import resolve
    from ember.serve.app import Loaded

    path = resolve(model)

    def load_all() -> Loaded:
        m, tok = load(argparse.Namespace(model=str(path), threads=threads))
        embedder, embed_path = None, None
        if embedding_model is not None:
            from ember.models.sentence import SentenceTransformer

            embedder = SentenceTransformer(embedding_model or None)
            embed_path = embedding_model or "all-MiniLM-L6-v2"
        return Loaded(m, tok, str(path), embedder, embed_path)

    return load_all


class _AppReplica:
    """A replica holding a Starlette app: lifespan entered at start, left at shutdown."""

    app: Any
    state: Any

    async def _start(self, timeout: float = LOAD_TIMEOUT_S) -> None:
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        deadline = time.monotonic() + timeout
        while not self.state.ready:  # a replica takes traffic only once its model is loaded
            if self.state.error is not None:
                raise EmberError(f"the model failed to load: {self.state.error}")
            if time.monotonic() > deadline:
                raise EmberError(f"the model did not load within {timeout:.0f} s")
            await asyncio.sleep(0.05)
        self._headers = _replica_headers()

    async def asgi(self, scope: dict, body: bytes) -> AsyncIterator[dict]:
        """One HTTP request (scope + whole body) through the app: its ASGI messages."""
        async for message in run_asgi(self.app, scope, body, self._headers):
            yield message

    def check_health(self) -> None:
        """Ray Serve's health check: the engine thread must be alive."""
        engine = getattr(self.state, "engine", None)
        thread = getattr(engine, "_thread", None)
        if thread is not None and not thread.is_alive():
            raise EmberError("the engine thread has stopped")

    async def __del__(self) -> None:
        """Graceful shutdown: end running streams, stop the engine."""
        lifespan = getattr(self, "_lifespan", None)
        if lifespan is None:
            return
        self.state.begin_shutdown(0.0)
        await lifespan.__aexit__(None, None, None)


class _EmberServer(_AppReplica):
    """An LLM (and optionally an embedder) served by `ember serve`'s own app and engine."""

    async def __init__(  # type: ignore[misc]  # Ray Serve runs async constructors
        self,
        model: str | None = None,
        config: dict | None = None,
        threads: int | None = None,
        embedding_model: str | None = None,
    ) -> None:
        """Load the model and start the engine (returns once it is ready)."""
        from ember.serve.app import ServeConfig, create_app

        cfg = ServeConfig(
            **{**(config or {}), "api_keys": frozenset((config or {}).get("api_keys", ()))}
        )
        self.app = create_app(_load_llm(model, threads, embedding_model), cfg)
        self.state = self.app.state.server
        await self._start()


# --- batching replicas: embeddings and image classes --------------------------------------


def _small_app(state: Any, routes: list) -> Any:
    """A Starlette app with ember serve's Guard (API keys, request metrics) and error JSON."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    from ember.serve.app import Guard, _http_error, health, list_models, metrics

    routes = [
        *routes,
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})  # type: ignore[dict-item]
    app.state.server = state
    app.add_middleware(Guard, state=state)
    return app


class _Limits:
    """What `_model_cards` reads from a ServerState's limits."""

    def __init__(self, context_length: int) -> None:
        self.context_length = context_length


class _BatchingServer(_AppReplica):
    """Common set-up: the state, the small app, `@serve.batch` settings."""

    def _setup(self, name: str, config: dict | None, context_length: int, routes: list) -> None:
        from ember.serve.app import ServeConfig, ServerState

        cfg = dict(config or {})
        cfg["api_keys"] = frozenset(cfg.get("api_keys", ()))
        self.state = ServerState(ServeConfig(**cfg))
        self.state.model_name = name
        self.state.metrics.model_name = name
        self.state.limits = _Limits(context_length)
        self.state.ready = True
        self.app = _small_app(self.state, routes)
        self._headers = _replica_headers()
        self._lifespan = None


class _EmbeddingServer(_BatchingServer):
    """POST /v1/embeddings from a sentence-transformers folder; requests batched together."""

    async def __init__(  # type: ignore[misc]  # Ray Serve runs async constructors
        self,
        model: str | None = None,
        config: dict | None = None,
        threads: int | None = None,
        max_batch_size: int = 64,
        batch_wait_timeout_s: float = 0.01,
    ) -> None:
        """Load the embedder; set the batch size and wait."""
        from starlette.routing import Route

        import ember
        from ember.models.sentence import SentenceTransformer
        from ember.serve.app import _endpoint, model_name_of

        if threads:
            ember.set_num_threads(threads)
        self.embedder = await asyncio.to_thread(SentenceTransformer, model)
        name = (config or {}).get("served_model_name") or model_name_of(str(self.embedder.path))
        if name == "model":  # the bundled folder is .../all-MiniLM-L6-v2/model
            name = "all-MiniLM-L6-v2"
        self._setup(
            name,
            config,
            self.embedder.max_seq_length,
            [Route("/v1/embeddings", _endpoint(self._embeddings), methods=["POST"])],
        )
        self.batch_sizes: list[int] = []  # requests per batch (the tests read it)
        self.embed_batch.set_max_batch_size(max_batch_size)  # type: ignore[attr-defined]
        self.embed_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)  # type: ignore[attr-defined]

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01)
    async def embed_batch(self, requests: list[list[str]]) -> list[tuple[np.ndarray, int, int]]:
        """Embed the texts of several requests in one encode; each request's share back."""
        self.batch_sizes.append(len(requests))
        texts = [t for r in requests for t in r]
        emb = self.embedder

        def work() -> tuple[np.ndarray, np.ndarray]:
            cu = emb.tokenize(texts)[2]
            return np.asarray(emb.encode(texts)), np.diff(cu)

        vectors, lengths = await asyncio.to_thread(work)
        out, i = [], 0
        for r in requests:
            out.append((vectors[i : i + len(r)], int(lengths[i : i + len(r)].sum()), len(requests)))
            i += len(r)
        return out

    async def _embeddings(self, request: Any) -> Any:
        from ember.serve.app import embedding_request, embedding_response, read_json
        from ember.serve.protocol import json_object

        body = json_object(await read_json(request))
        model, texts, fmt = embedding_request(body, self.state.model_name)
        vectors, n_tokens, together = await self.embed_batch(texts)
        return embedding_response(vectors, n_tokens, model, fmt, {BATCH_HEADER: str(together)})


class _VisionServer(_BatchingServer):
    """POST /v1/classify: base64 images -> top-k labels; requests batched together."""

    async def __init__(  # type: ignore[misc]  # Ray Serve runs async constructors
        self,
        model: str = "efficientnet_lite0",
        weights: str | None = None,
        config: dict | None = None,
        threads: int | None = None,
        max_batch_size: int = 16,
        batch_wait_timeout_s: float = 0.01,
    ) -> None:
        """Load the classifier; set the batch size and wait."""
        from starlette.routing import Route

        import ember
        from ember.models.vision.pipeline import ImageClassifier
        from ember.serve.app import _endpoint

        if threads:
            ember.set_num_threads(threads)
        self.classifier = await asyncio.to_thread(ImageClassifier.load, model, weights)
        name = (config or {}).get("served_model_name") or model
        self._setup(
            name, config, 0, [Route("/v1/classify", _endpoint(self._classify), methods=["POST"])]
        )
        self.batch_sizes: list[int] = []
        self.classify_batch.set_max_batch_size(max_batch_size)  # type: ignore[attr-defined]
        self.classify_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)  # type: ignore[attr-defined]

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def classify_batch(self, requests: list[tuple[list[Any], int]]) -> list[tuple]:
        """Classify the images of several requests in one forward."""
        self.batch_sizes.append(len(requests))
        images = [im for r, _ in requests for im in r]
        top = max(k for _, k in requests)
        rows = await asyncio.to_thread(self.classifier, images, top)
        out, i = [], 0
        for r, k in requests:
            out.append(([row[:k] for row in rows[i : i + len(r)]], len(requests)))
            i += len(r)
        return out

    async def _classify(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        from ember.serve.app import read_json
        from ember.serve.protocol import bad, json_object, unknown_model
        from ember.vision.image import load_image

        body = json_object(await read_json(request))
        model = body.get("model", self.state.model_name)
        if model != self.state.model_name:
            raise unknown_model(model, self.state.model_name)
        images = body.get("input")
        if isinstance(images, str):
            images = [images]
        if not isinstance(images, list) or not images:
            raise bad("'input' must be a base64 image or a non-empty list of them", "input")
        if len(images) > MAX_IMAGES:
            raise bad(f"'input' takes at most {MAX_IMAGES} images, got {len(images)}", "input")
        top = body.get("top", 5)
        if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 20:
            raise bad("'top' must be an integer in [1, 20]", "top")
        decoded = []
        for i, s in enumerate(images):
            if not isinstance(s, str):
                raise bad(f"'input'[{i}] must be a base64 string", "input")
            if s.startswith("data:"):
                s = s.partition(",")[2]
            try:
                decoded.append(load_image(base64.b64decode(s, validate=True)))
            except Exception as e:  # noqa: BLE001 - bad base64 or not an image
                raise bad(f"'input'[{i}] is not a base64-encoded image: {e}", "input") from e
        rows, together = await self.classify_batch((decoded, top))
        data = [
            {
                "index": i,
                "top": [{"index": c, "label": lab, "probability": p} for c, lab, p in row],
            }
            for i, row in enumerate(rows)
        ]
        return JSONResponse(
            {"object": "list", "model": model, "data": data}, headers={BATCH_HEADER: str(together)}
        )
