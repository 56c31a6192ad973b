"""`ember serve`: an OpenAI-compatible server (chat, completions, embeddings) on uvicorn.

ember serve                                     # bundled SmolLM2 on 127.0.0.1:8000
ember serve --model m.gguf --port 9000 --api-key secret --embedding-model
ember serve --lora adapter.gguf:0.8 --lora peft-adapter-dir       # LoRA adapters on the model
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from ember.cli._args import existing_dir, existing_file, finite_float, int_at_least
from ember.cli._llm import add_lora
from ember.cli._text import echo
from ember.errors import EmberError

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "--model",
        metavar="PATH",
        help="GGUF file or Hugging Face folder (default: the bundled SmolLM2-135M-Instruct)",
    )
    add_lora(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on (default 127.0.0.1)",
    )
    p.add_argument("--port", type=int, default=8000, metavar="N", help="port (default 8000)")
    p.add_argument(
        "--threads",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="CPU threads (default: all cores)",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 routes (repeatable)",
    )
    p.add_argument("--api-key-file", metavar="FILE", help="API keys, one per line (# comments)")
    p.add_argument(
        "--embedding-model",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="serve /v1/embeddings from this sentence-transformers folder "
        "(the flag alone: the bundled all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--served-model-name", metavar="NAME", help="the model id clients use (default: file name)"
    )
    p.add_argument(
        "--max-running",
        type=int,
        default=8,
        metavar="N",
        help="sequences generated at once (default 8)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        metavar="N",
        default=64,
        help="sequences waiting for a slot before requests get 429 (default 64)",
    )
    p.add_argument(
        "--max-n", type=int, default=16, metavar="N", help="most choices per request (default 16)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        default=1 << 20,
        help="largest request body; larger ones get 413 (default 1 MiB)",
    )
    p.add_argument(
        "--timeout",
        type=finite_float(0.0, low_open=True),
        default=None,
        metavar="S",
        help="end a generation request S seconds after it arrived (default: no limit)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        metavar="N",
        default=256,
        help="prompt tokens fed per step; long prompts go in chunks (default 256)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=finite_float(0.0),
        default=5.0,
        metavar="S",
        help="on SIGTERM, let running streams go on for S seconds before ending them (default 5)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    ray = p.add_argument_group("Ray Serve (the 'ray' extra)")
    ray.add_argument(
        "--ray", action="store_true", help="serve through Ray Serve: replicas behind Ray's proxy"
    )
    ray.add_argument(
        "--replicas",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="model replicas (default 1)",
    )
    ray.add_argument("--min-replicas", type=int_at_least(0), metavar="N", help="autoscaling floor")
    ray.add_argument("--max-replicas", type=int_at_least(1), metavar="N", help="autoscaling cap")
    ray.add_argument(
        "--max-ongoing-requests",
        type=int_at_least(1),
        metavar="N",
        help="per replica (Ray Serve's)",
    )
    ray.add_argument(
        "--num-cpus-per-replica",
        type=finite_float(0.0, low_open=True),
        default=1.0,
        metavar="C",
        help="CPUs each replica reserves (default 1)",
    )
    ray.add_argument("--ray-address", metavar="ADDR", help="join this cluster (default: start one)")


def api_keys(args) -> frozenset[str]:
    """The keys from --api-key and --api-key-file."""
    keys = [k.strip() for k in args.api_key if k.strip()]
    if args.api_key_file:
        try:
            text = existing_file(args.api_key_file, "--api-key-file").read_text()
        except UnicodeDecodeError:
            raise EmberError(f"--api-key-file {args.api_key_file!r} is not UTF-8 text") from None
        except OSError as e:
            raise EmberError(f"--api-key-file {args.api_key_file!r}: {e.strerror}") from e
        keys += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        if not keys:
            raise EmberError(f"--api-key-file {args.api_key_file!r} holds no keys")
    return frozenset(keys)


def _check(args) -> None:
    for name in ("max_running", "max_queue", "max_n", "max_body_bytes", "prefill_chunk"):
        if getattr(args, name) < 1:
            raise EmberError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.timeout is not None and args.timeout <= 0:
        raise EmberError(f"--timeout must be > 0, got {args.timeout}")
    if not 0 <= args.port <= 65535:
        raise EmberError(f"--port must be in [0, 65535], got {args.port}")
    if args.ray and args.lora:
        raise EmberError(
            "--lora is not supported with --ray yet; serve the adapted model without --ray"
        )


class _Formatter(logging.Formatter):
    """The log's format; an ember error (a bad file or adapter) is its message, no traceback,
    unless --debug (the command's last line says what failed)."""

    def __init__(self, fmt: str, debug: bool) -> None:
        super().__init__(fmt)
        self.debug = debug

    def formatException(self, ei) -> str:
        """The traceback, or nothing for an EmberError without --debug."""
        if not self.debug and isinstance(ei[1], EmberError):
            return ""
        return super().formatException(ei)


def run(args) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    _check(args)
    keys = api_keys(args)
    if args.ray:
        from ember.integrations.ray import run_serve_on_ray

        return run_serve_on_ray(
            args.model, args.replicas, args.num_cpus_per_replica, args.ray_address,
            args.host, args.port, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            max_ongoing_requests=args.max_ongoing_requests, embedding_model=args.embedding_model,
            api_keys=sorted(keys), threads=args.threads, max_running=args.max_running,
            max_queue=args.max_queue, max_n=args.max_n, max_body_bytes=args.max_body_bytes,
            prefill_chunk=args.prefill_chunk, timeout=args.timeout,
            served_model_name=args.served_model_name,
        )  # fmt: skip
    try:
        import uvicorn

        from ember.serve.app import Loaded, ServeConfig, create_app
    except ImportError as e:
        raise EmberError(
            f"ember serve needs the 'serve' extra ({e.name} is missing): pip install 'ember[serve]'"
        ) from e
    from ember.cli._llm import check_loras, load
    from ember.models.hub import resolve

    model_path = resolve(args.model)  # fails now, not on the loading thread
    check_loras(args.lora)  # the files (whether they fit the model is known once it loads)
    if args.embedding_model:
        existing_dir(args.embedding_model, "--embedding-model")

    def load_all() -> Loaded:
        model, tok = load(args)
        embedder, embed_path = None, None
        if args.embedding_model is not None:
            from ember.models.sentence import SentenceTransformer

            embedder = SentenceTransformer(args.embedding_model or None)
            embed_path = args.embedding_model or DEFAULT_EMBEDDER
        return Loaded(model, tok, str(model_path), embedder, embed_path)

    config = ServeConfig(
        api_keys=keys,
        max_body_bytes=args.max_body_bytes,
        max_queue=args.max_queue,
        max_running=args.max_running,
        max_n=args.max_n,
        prefill_chunk=args.prefill_chunk,
        timeout=args.timeout,
        served_model_name=args.served_model_name,
        adapters=tuple(a.describe() for a in args.lora),
    )
    failed: list[str] = []

    def on_load_error(message: str) -> None:
        failed.append(message)
        server.should_exit = True

    app = create_app(load_all, config, on_load_error)
    state = app.state.server

    class Server(uvicorn.Server):
        """uvicorn's server; a signal first tells the engine to wind down its streams."""

        def handle_exit(self, sig, frame) -> None:
            state.begin_shutdown(args.shutdown_grace)
            super().handle_exit(sig, frame)

    logging.getLogger("ember.serve").setLevel(args.log_level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter("%(levelname)s:     %(message)s", args.debug))
    logging.getLogger("ember.serve").addHandler(handler)
    server = Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            lifespan="on",
            timeout_graceful_shutdown=int(args.shutdown_grace) + 5,
        )
    )
    # uvicorn re-raises the signal it caught once it has shut down, under the handler that was
    # there before it: SIGTERM's is made a no-op so that a clean shutdown exits 0
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        echo(f"ember serve: error: the model failed to load: {failed[0]}", err=True)
        return 1
    return 0
