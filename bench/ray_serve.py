"""Aggregate serving throughput on Ray Serve with 1 and 2 replicas (1 CPU each), same load.

    python bench/ray_serve.py [--streams 8] [--tokens 32] [--requests 2] [--replicas 1 2]
                              [--no-direct] [--no-save]

Starts a local Ray (``ray.init``, as many CPUs as the most replicas, a small object store),
deploys ``ember.integrations.ray`` with N replicas of the bundled SmolLM2 GGUF (``num_cpus=1``,
one ember thread each, Serve's proxy on a free loopback port), waits until every replica has
answered, then drives it with ``--streams`` concurrent clients, each sending ``--requests``
streamed chat completions of ``--tokens`` tokens (temperature 0, ``ignore_eos``), exactly as
bench/serve.py drives `ember serve`. Unless ``--no-direct``, the same load also goes to a plain
`ember serve --threads 1` (no Ray) first, so the table shows what the Ray hops cost. Reported:
aggregate generated tokens/s, the speed-up over 1 replica, TTFT and inter-token latency p50 /
p99, and how the requests spread over the replicas. docs/distributed.md projects from it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
from _common import append  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_serve", HERE / "serve.py")
bench_serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_serve)

MODEL = "SmolLM2-135M-Instruct.Q4_1"


async def spread(url: str, n: int) -> collections.Counter:
    """Which replica answered each of n small concurrent chats (x-ember-replica)."""
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with httpx.AsyncClient(timeout=600) as c:
        rs = await asyncio.gather(
            *(c.post(f"{url}/v1/chat/completions", json=body) for _ in range(n))
        )
    return collections.Counter(r.headers.get("x-ember-replica", "?") for r in rs)


def row(name: str, n: int, r: dict, base: float, spread_txt: str) -> str:
    """One table row."""
    return (
        f"| {name} | {n} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | "
        f"{r['ttft50'] * 1e3:.0f} / {r['ttft99'] * 1e3:.0f} | "
        f"{r['itl50'] * 1e3:.1f} / {r['itl99'] * 1e3:.1f} | {r['tokens']} | {spread_txt} |"
    )


def run_ray(args, path: str, rows: list[str]) -> None:
    """Each replica count in turn on one local Ray."""
    import ray
    from ray import serve

    from ember.integrations.ray import build_app

    ray.init(
        num_cpus=max(args.replicas),
        include_dashboard=False,
        object_store_memory=100 * 1024 * 1024,
        log_to_driver=False,
    )
    port = bench_serve.free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    url = f"http://127.0.0.1:{port}"
    eng = SimpleNamespace(name="ray", url=url, model=MODEL, extra={"ignore_eos": True})
    base = None
    try:
        for n in args.replicas:
            app = build_app(
                model=path, num_replicas=n, num_cpus=1, threads=1, max_running=args.streams
            )
            t0 = time.perf_counter()
            serve.run(app, name="bench", route_prefix="/")
            seen: collections.Counter = collections.Counter()
            while len(seen) < n:  # every replica warm (first answers pay the JIT cache load)
                seen |= asyncio.run(spread(url, 2 * n))
            print(f"{n} replica(s) up and warm in {time.perf_counter() - t0:.0f} s", flush=True)
            asyncio.run(bench_serve.load(eng, n, 1, 8))  # warm-up
            r = asyncio.run(bench_serve.load(eng, args.streams, args.requests, args.tokens))
            counts = asyncio.run(spread(url, 4 * args.streams))
            base = base or r["tok_s"]
            rows.append(
                row(
                    f"Ray Serve, {n} replica(s)",
                    args.streams,
                    r,
                    base,
                    " / ".join(str(c) for c in sorted(counts.values(), reverse=True)),
                )
            )
            print(rows[-1], flush=True)
            serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()


def run_direct(args, path: str, rows: list[str]) -> float:
    """The same load on `ember serve --threads 1` (no Ray)."""
    p = bench_serve.free_port()
    cmd = [sys.executable, "-m", "ember.cli.main", "serve", "--model", path, "--port", str(p),
           "--threads", "1", "--max-running", str(args.streams), "--log-level", "warning"]  # fmt: skip
    eng = bench_serve.Engine("ember", cmd, p, MODEL, {"ignore_eos": True})
    eng.start()
    try:
        asyncio.run(bench_serve.load(eng, 1, 1, 8))
        r = asyncio.run(bench_serve.load(eng, args.streams, args.requests, args.tokens))
    finally:
        eng.stop()
    rows.append(row("ember serve, 1 thread (no Ray)", args.streams, r, r["tok_s"], "-"))
    print(rows[-1], flush=True)
    return r["tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=8, help="concurrent clients")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-direct", action="store_true", help="skip the no-Ray row")
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ember.models.hub import default_model_path

    path = str(default_model_path())
    rows: list[str] = []
    load0 = os.getloadavg()[0]
    if not args.no_direct:
        run_direct(args, path, rows)
    run_ray(args, path, rows)
    table = (
        "| server | streams | aggregate tok/s | vs first row of its kind | TTFT p50 / p99 ms | "
        "ITL p50 / p99 ms | tokens | requests per replica |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|\n" + "\n".join(rows)
    )
    note = (
        f"\n\nBundled SmolLM2-135M-Instruct Q4_1; each Ray replica num_cpus=1 and 1 ember thread "
        f"on one local Ray node with {max(args.replicas)} CPUs; {args.streams} concurrent "
        f"streamed chats, {args.requests} per client, {args.tokens} tokens each (ignore_eos); "
        f"the spread column counts {4 * args.streams} one-token chats after the run. "
        f"Load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at the end "
        f"({os.cpu_count()} cores)."
    )
    print(table + note)
    if not args.no_save:
        append("Ray Serve: aggregate throughput with 1 and 2 replicas (bench/ray_serve.py)",
               table + note)  # fmt: skip


if __name__ == "__main__":
    main()
