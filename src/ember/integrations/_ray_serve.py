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

import asyncio
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError

from ember.errors import EmberError
from ember.integrations._ray_replicas import (
    _EmbeddingServer,
    _EmberServer,
    _VisionServer,
    run_asgi,
)
from ember.serve.protocol import APIError

__all__ = ["run_asgi"]
APP_NAME = "ember"


# --- the ingress ---------------------------------------------------------------------------


def _error_messages(e: APIError) -> list[dict]:

    body = json.dumps(e.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
    return [
        {"type": "http.response.start", "status": e.status, "headers": headers},
        {"type": "http.response.body", "body": body, "more_body": False},
    ]


def _sse_error(message: str) -> bytes:

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
        if not ray_address:  # the local cluster goes with its Serve controller (serve.shutdown()
            ray.shutdown()  # first could wait forever on the controller's graceful shutdown)
    return 0
