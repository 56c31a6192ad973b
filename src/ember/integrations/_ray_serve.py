"""ember on Ray Serve: the `ember serve` app and engine in replicas, behind one ingress.

An application has two deployments, composed with a DeploymentHandle as Ray Serve's model
composition guide does it:

* ``EmberIngress`` (no CPU of its own) is the HTTP ingress (``@serve.ingress``). It reads the
  body (at most ``max_body_bytes`` + 1 bytes, so an oversized one is refused by the replica's
  own check) and passes the request to a model replica through a streaming handle call, then
  relays the replica's ASGI messages to the proxy as they come. A replica that dies before it
  answered is retried on another; one that dies mid-stream ends that server-sent event stream
  with an OpenAI error event and ``data: [DONE]`` (never a hang, never a cut connection).
* ``EmberServer`` (an LLM), ``EmbeddingServer`` (a sentence-transformers folder) or
  ``VisionServer`` (an image classifier) holds the model. ``EmberServer`` runs exactly the app
  ``ember serve`` runs (``ember.serve.app.create_app``: OpenAI routes, API keys, body limits,
  continuous batching in ``Engine``, Prometheus metrics); the other two batch concurrent
  requests with ``@serve.batch`` (``x-ember-batch-requests``: how many shared the batch).
  Every answer carries ``x-ember-replica`` (the Serve replica id) and ``x-ember-replica-pid``.

``serve run ember.integrations.ray:app model=PATH num_replicas=2`` builds one from arguments
(``EmberAppArgs``); ``run_serve_on_ray`` is what ``ember serve --ray`` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, field_validator
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError

from ember.errors import EmberError
from ember.serve.protocol import APIError

REPLICA_HEADER = b"x-ember-replica"
PID_HEADER = b"x-ember-replica-pid"
BATCH_HEADER = "x-ember-batch-requests"  # embed / classify: requests in the batch that answered
APP_NAME = "ember"
LOAD_TIMEOUT_S = 900.0


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

    async def __init__(
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
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
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

    async def __init__(
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
        self.embed_batch.set_max_batch_size(max_batch_size)
        self.embed_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01)
    async def embed_batch(self, requests: list[list[str]]) -> list[tuple[np.ndarray, int, int]]:
        """Embed the texts of several requests in one encode; each request's share back."""
        self.batch_sizes.append(len(requests))
        texts = [t for r in requests for t in r]
        emb = self.embedder

        def work() -> tuple[np.ndarray, np.ndarray]:
            cu = emb.tokenize(texts)[2]
            return emb.encode(texts), np.diff(cu)

        vectors, lengths = await asyncio.to_thread(work)
        out, i = [], 0
        for r in requests:
            out.append((vectors[i : i + len(r)], int(lengths[i : i + len(r)].sum()), len(requests)))
            i += len(r)
        return out

    async def _embeddings(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        from ember.serve.app import _embed_inputs, read_json
        from ember.serve.protocol import bad, json_object, unknown_model

        body = json_object(await read_json(request))
        model = body.get("model", self.state.model_name)
        if model != self.state.model_name:
            raise unknown_model(model, self.state.model_name)
        texts = _embed_inputs(body)
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise bad("'encoding_format' must be 'float' or 'base64'", "encoding_format")
        if body.get("dimensions") is not None:
            raise bad("'dimensions' is not supported by this model", "dimensions", "unsupported")
        vectors, n_tokens, together = await self.embed_batch(texts)
        data = []
        for i, v in enumerate(np.asarray(vectors, np.float32)):
            if fmt == "base64":
                value: Any = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
            else:
                value = v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        return JSONResponse(
            {"object": "list", "data": data, "model": model, "usage": usage},
            headers={BATCH_HEADER: str(together)},
        )


MAX_IMAGES = 64


class _VisionServer(_BatchingServer):
    """POST /v1/classify: base64 images -> top-k labels; requests batched together."""

    async def __init__(
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
        self.classify_batch.set_max_batch_size(max_batch_size)
        self.classify_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

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


# --- the ingress ---------------------------------------------------------------------------


def _error_messages(e: APIError) -> list[dict]:
    import json

    body = json.dumps(e.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
    return [
        {"type": "http.response.start", "status": e.status, "headers": headers},
        {"type": "http.response.body", "body": body, "more_body": False},
    ]


def _sse_error(message: str) -> bytes:
    import json

    err = APIError(502, message, "server_error", code="replica_failed")
    return b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n"


class Forward:
    """The ingress ASGI app: each request to a model replica, its answer relayed back."""

    def __init__(self, backend: Any, max_body_bytes: int = 1 << 20, retries: int = 3) -> None:
        """Forward to `backend` (a DeploymentHandle to a model deployment)."""
        self.backend = backend.options(stream=True)
        self.max_body_bytes, self.retries = max_body_bytes, retries

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """ASGI entry point (http and lifespan)."""
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        body = await self._body(receive)
        await self._relay(self._scope(scope), body, send)

    async def _body(self, receive: Any) -> bytes:
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            parts.append(chunk)
            size += len(chunk)
            if size > self.max_body_bytes or not message.get("more_body", False):
                break  # past the limit: enough for the replica to answer 413
        return b"".join(parts)

    @staticmethod
    def _scope(scope: dict) -> dict:
        """The picklable parts of the scope; the path made relative to the route prefix."""
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": scope.get("http_version", "1.1"),
            "method": scope["method"],
            "scheme": scope.get("scheme", "http"),
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": scope.get("query_string", b""),
            "headers": [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])],
            "client": tuple(scope["client"]) if scope.get("client") else None,
            "server": tuple(scope["server"]) if scope.get("server") else None,
        }

    async def _relay(self, scope: dict, body: bytes, send: Any) -> None:
        for attempt in range(self.retries + 1):
            gen = self.backend.asgi.remote(scope, body)
            started = streaming = done = False
            try:
                async for message in gen:
                    if message["type"] == "http.response.start":
                        started = True
                        ctype = dict(message.get("headers", [])).get(b"content-type", b"")
                        streaming = ctype.startswith(b"text/event-stream")
                    elif message["type"] == "http.response.body":
                        done = not message.get("more_body", False)
                    await send(message)
                if started and not done:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            except BackPressureError:
                err = APIError(
                    429,
                    "every replica is busy; retry later",
                    "rate_limit_error",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": "1"},
                )
                for m in _error_messages(err):
                    await send(m)
                return
            except (RayActorError, ActorUnavailableError) as e:
                if not started and attempt < self.retries:
                    await asyncio.sleep(0.2 * (attempt + 1))  # the router drops a dead replica
                    continue
                await self._failed(send, started, streaming, done, e)
                return
            except Exception as e:  # noqa: BLE001 - any other failure still ends the response
                await self._failed(send, started, streaming, done, e)
                return
            finally:
                gen.cancel()

    @staticmethod
    async def _failed(send: Any, started: bool, streaming: bool, done: bool, e: Exception) -> None:
        if not started:
            err = APIError(503, f"no replica could answer: {type(e).__name__}", "server_error")
            for m in _error_messages(err):
                await send(m)
        elif not done:
            text = "the replica serving this stream failed; retry the request"
            chunk = _sse_error(text) if streaming else b""
            await send({"type": "http.response.body", "body": chunk, "more_body": False})


class _EmberIngress:
    """The HTTP ingress deployment: `Forward` over a handle to the model deployment."""

    def __init__(self, backend: Any, max_body_bytes: int = 1 << 20) -> None:
        """Keep the handle; the app is built by `__serve_build_asgi_app__`."""
        self._app = Forward(backend, max_body_bytes)

    def __serve_build_asgi_app__(self) -> Any:
        """The ASGI app Ray Serve runs (late-bound `@serve.ingress()`)."""
        return self._app


EmberServer = serve.deployment(name="EmberServer", max_ongoing_requests=16)(_EmberServer)
EmbeddingServer = serve.deployment(name="EmbeddingServer", max_ongoing_requests=64)(
    _EmbeddingServer
)
VisionServer = serve.deployment(name="VisionServer", max_ongoing_requests=32)(_VisionServer)
EmberIngress = serve.deployment(
    name="EmberIngress", max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0}
)(serve.ingress()(_EmberIngress))


# --- building an application ---------------------------------------------------------------


class EmberAppArgs(BaseModel):
    """The arguments of `serve run ember.integrations.ray:app key=value ...`."""

    model: str | None = None  # GGUF / HF folder (LLM), sentence-transformers folder, vision name
    task: str = "auto"  # auto, generate, embed, classify
    weights: str | None = None  # checkpoint of a vision model other than efficientnet_lite0
    embedding_model: str | None = None  # also serve /v1/embeddings next to an LLM ("" = bundled)
    num_replicas: int | None = None
    min_replicas: int | None = None  # with max_replicas: autoscaling
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    autoscaling_config: dict | None = None
    max_ongoing_requests: int | None = None
    num_cpus: float = 1.0  # per model replica
    threads: int | None = None  # ember threads per replica (default: num_cpus, at least 1)
    api_keys: list[str] = Field(default_factory=list)
    api_key_file: str | None = None
    max_running: int = 8
    max_queue: int = 64
    max_n: int = 16
    max_body_bytes: int = 1 << 20
    prefill_chunk: int = 256
    timeout: float | None = None
    served_model_name: str | None = None
    max_batch_size: int | None = None  # embed / classify: @serve.batch size
    batch_wait_timeout_s: float = 0.01

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, v: Any) -> Any:
        """`api_keys=a,b` on the `serve run` command line: comma-separated."""
        return [k for k in v.split(",") if k] if isinstance(v, str) else v

    @field_validator("autoscaling_config", mode="before")
    @classmethod
    def _parse_json(cls, v: Any) -> Any:
        """`autoscaling_config={"min_replicas": 1, ...}` on the command line: JSON."""
        import json

        return json.loads(v) if isinstance(v, str) else v


def detect_task(model: str | None) -> str:
    """generate, embed or classify, from what `model` names."""
    from ember.models.vision import MODELS

    if model is not None and model in MODELS:
        return "classify"
    if model is not None:
        p = Path(model)
        if p.is_dir() and ((p / "modules.json").is_file() or (p / "1_Pooling").is_dir()):
            return "embed"
    return "generate"


def _keys(args: EmberAppArgs) -> list[str]:
    keys = [k.strip() for k in args.api_keys if k.strip()]
    if args.api_key_file:
        try:
            text = Path(args.api_key_file).read_text()
        except OSError as e:
            raise EmberError(f"api_key_file {args.api_key_file!r}: {e.strerror}") from e
        keys += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return keys


def deployment_options(args: EmberAppArgs) -> dict:
    """Replica count or autoscaling, max_ongoing_requests and CPUs, as .options() takes them."""
    if args.num_cpus <= 0:
        raise EmberError(f"num_cpus must be > 0, got {args.num_cpus}")
    opts: dict[str, Any] = {"ray_actor_options": {"num_cpus": args.num_cpus}}
    auto = dict(args.autoscaling_config or {})
    if args.min_replicas is not None:
        auto["min_replicas"] = args.min_replicas
    if args.max_replicas is not None:
        auto["max_replicas"] = args.max_replicas
    if args.target_ongoing_requests is not None:
        auto["target_ongoing_requests"] = args.target_ongoing_requests
    if auto:
        if args.num_replicas is not None:
            raise EmberError(
                "give num_replicas or an autoscaling config (min/max_replicas), not both"
            )
        opts["autoscaling_config"] = auto
    else:
        n = 1 if args.num_replicas is None else args.num_replicas
        if n < 1:
            raise EmberError(f"num_replicas must be >= 1, got {n}")
        opts["num_replicas"] = n
    if args.max_ongoing_requests is not None:
        if args.max_ongoing_requests < 1:
            raise EmberError(f"max_ongoing_requests must be >= 1, got {args.max_ongoing_requests}")
        opts["max_ongoing_requests"] = args.max_ongoing_requests
    elif detect_task(args.model) == "generate" and args.task in ("auto", "generate"):
        # room for a full batch plus a queue of the same size in each replica's engine
        opts["max_ongoing_requests"] = 2 * args.max_running
    return opts


def build_app(args: EmberAppArgs | dict | None = None, **kw: Any) -> Any:
    """A Ray Serve application (ingress + model deployment) from EmberAppArgs or keywords."""
    if isinstance(args, dict) or args is None:
        args = EmberAppArgs(**{**(args or {}), **kw})
    elif kw:
        args = args.model_copy(update=kw)
    task = detect_task(args.model) if args.task == "auto" else args.task
    if task not in ("generate", "embed", "classify"):
        raise EmberError(f"task must be auto, generate, embed or classify, got {args.task!r}")
    for name in ("max_running", "max_queue", "max_n", "max_body_bytes", "prefill_chunk"):
        if getattr(args, name) < 1:
            raise EmberError(f"{name} must be >= 1, got {getattr(args, name)}")
    config = {
        "api_keys": _keys(args),
        "max_body_bytes": args.max_body_bytes,
        "max_queue": args.max_queue,
        "max_running": args.max_running,
        "max_n": args.max_n,
        "prefill_chunk": args.prefill_chunk,
        "timeout": args.timeout,
        "served_model_name": args.served_model_name,
    }
    threads = args.threads or max(1, int(args.num_cpus))
    opts = deployment_options(args)
    if task == "generate":
        from ember.models.hub import resolve

        model = str(resolve(args.model))  # fails here, not in every replica
        backend = EmberServer.options(**opts).bind(model, config, threads, args.embedding_model)
    elif task == "embed":
        backend = EmbeddingServer.options(**opts).bind(
            args.model, config, threads, args.max_batch_size or 64, args.batch_wait_timeout_s
        )
    else:
        backend = VisionServer.options(**opts).bind(
            args.model or "efficientnet_lite0",
            args.weights,
            config,
            threads,
            args.max_batch_size or 16,
            args.batch_wait_timeout_s,
        )
    return EmberIngress.bind(backend, args.max_body_bytes)


def app(args: dict) -> Any:
    """The application builder for `serve run ember.integrations.ray:app model=PATH ...`."""
    return build_app(EmberAppArgs(**args))


def run_serve_on_ray(
    model: str | None = None,
    replicas: int = 1,
    num_cpus_per_replica: float = 1.0,
    ray_address: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    max_ongoing_requests: int | None = None,
    embedding_model: str | None = None,
    api_keys: list[str] | tuple[str, ...] = (),
    threads: int | None = None,
    max_running: int = 8,
    max_queue: int = 64,
    max_n: int = 16,
    max_body_bytes: int = 1 << 20,
    prefill_chunk: int = 256,
    timeout: float | None = None,
    served_model_name: str | None = None,
    proxy_location: str = "EveryNode",
    blocking: bool = True,
) -> int:
    """`ember serve --ray`: start or join a Ray cluster, deploy, serve until Ctrl-C or SIGTERM."""
    import signal
    import threading

    import ray

    autoscale = min_replicas is not None or max_replicas is not None
    args = EmberAppArgs(
        model=model,
        num_replicas=None if autoscale else replicas,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        max_ongoing_requests=max_ongoing_requests,
        num_cpus=num_cpus_per_replica,
        threads=threads,
        embedding_model=embedding_model,
        api_keys=list(api_keys),
        max_running=max_running,
        max_queue=max_queue,
        max_n=max_n,
        max_body_bytes=max_body_bytes,
        prefill_chunk=prefill_chunk,
        timeout=timeout,
        served_model_name=served_model_name,
    )
    application = build_app(args)  # checks the arguments before any cluster starts
    if not ray.is_initialized():
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(log_to_driver=False, include_dashboard=False)
    serve.start(http_options={"host": host, "port": port}, proxy_location=proxy_location)
    serve.run(application, name=APP_NAME, route_prefix="/", blocking=False)
    print(f"ember serve --ray: http://{host}:{port}/v1 ({APP_NAME} on Ray Serve)", flush=True)
    if not blocking:
        return 0
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        serve.delete(APP_NAME)
        if not ray_address:
            serve.shutdown()
            ray.shutdown()
    return 0
