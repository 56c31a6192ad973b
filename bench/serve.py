"""Serving under concurrent load: `ember serve` vs llama.cpp's llama-server vs llama-cpp-python.

    python bench/serve.py [--threads 2] [--streams 1 4 8 16] [--tokens 64] [--requests 2] [--rounds 3]
                          [--llama-server PATH] [--engines ember,llama-server,llama-cpp-python]
    python bench/serve.py --soak [--clients 64] [--seconds 120]
    python bench/serve.py --prefix [--requests 3]
    python bench/serve.py --steps [--rounds 3]

Each engine is started on a free loopback port with the bundled SmolLM2 GGUF and the same thread
count, as its users start it (its own defaults otherwise; llama-server with ``-np`` = the most
streams, its continuous-batching slots, or ``--np N``), then driven by N concurrent clients that each send
``--requests`` streamed chat completions (a different question each, temperature 0, ``--tokens``
answer tokens: ``ignore_eos`` where the engine takes it). Reported per engine and N: aggregate
generated tokens/s (all clients' tokens / wall time), time to first token and inter-token latency
(p50 and p99 over all requests). The engines run one after another, never at once; with
``--rounds N`` they alternate N times and the table gives each engine's median run (and best
throughput) per N.

``--prefix``: ember only: time to first token of a chat whose ~500-token system prompt the
server has seen before (its whole prompt chunks reused from a finished request) against one it
has not (a new system prompt each time), median of ``--requests`` each.

``--soak``: ember only, ``--clients`` clients for ``--seconds``: a mix of streamed and plain chat
and completions, malformed bodies, bad parameters, over-long prompts and clients that hang up
mid-stream. Reported: requests/s, tokens/s, latency percentiles, answers by status and kind,
5xx count (must be 0) and the server's RSS before, during and after (it must settle).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
from _common import append  # noqa: E402

QUESTIONS = [
    "What is the capital of France?", "Name three colours of the rainbow.",
    "Why is the sky blue?", "Write a haiku about the sea.", "What is 12 times 12?",
    "Give me a tip for learning to cook.", "What do bees make?", "Describe a cat in one line.",
    "How many days are in a leap year?", "What is the boiling point of water?",
    "Suggest a name for a pet fish.", "What language is spoken in Brazil?",
    "Explain what a CPU does.", "Tell me a fun fact about octopuses.",
    "What is the largest planet?", "How do plants make food?",
]  # fmt: skip


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    """Resident memory of a process, MB (from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Engine:
    """A server process and how to start it."""

    def __init__(self, name: str, cmd: list[str], port: int, model: str, extra: dict) -> None:
        self.name, self.cmd, self.port, self.model, self.extra = name, cmd, port, model, extra
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> None:
        """Start and wait until a chat completion answers."""
        import httpx

        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        self.log = open(f"/tmp/bench-serve-{self.name}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1}  # fmt: skip
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited {self.proc.returncode}; see {self.log.name}"
                )
            try:
                r = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=30)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def engines(args, path: str) -> list[Engine]:
    """The engines asked for, as their users start them."""
    out = []
    names = args.engines.split(",")
    top = max(args.streams)
    py = sys.executable
    if "ember" in names:
        p = free_port()
        cmd = [py, "-m", "ember.cli.main", "serve", "--model", path, "--port", str(p),
               "--threads", str(args.threads), "--max-running", str(top),
               "--log-level", "warning"]  # fmt: skip
        out.append(Engine("ember", cmd, p, "SmolLM2-135M-Instruct.Q4_1", {"ignore_eos": True}))
    if "llama-server" in names:
        exe = args.llama_server or shutil.which("llama-server")
        if exe is None:
            print("llama-server: not found (--llama-server PATH); skipped", file=sys.stderr)
        else:
            p = free_port()
            np_ = args.np or top
            cmd = [exe, "-m", path, "--port", str(p), "-t", str(args.threads), "-np", str(np_),
                   "-c", str(np_ * 512)]  # fmt: skip
            out.append(Engine("llama-server", cmd, p, "smollm2", {"ignore_eos": True}))
    if "llama-cpp-python" in names:
        p = free_port()
        cmd = [py, "-m", "llama_cpp.server", "--model", path, "--port", str(p),
               "--n_threads", str(args.threads), "--n_ctx", "2048"]  # fmt: skip
        out.append(Engine("llama-cpp-python", cmd, p, "smollm2", {}))
    return out


async def one_stream(client, eng: Engine, question: str, tokens: int) -> dict:
    """One streamed chat completion: its tokens, time to first token, gaps between tokens."""
    body = {"model": eng.model, "messages": [{"role": "user", "content": question}],
            "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **eng.extra}  # fmt: skip
    import httpx

    t0 = time.perf_counter()
    stamps, usage = [], None
    for attempt in range(3):  # as the openai client does: retry a connection the server closed
        try:
            async with client.stream("POST", f"{eng.url}/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(
                        f"{eng.name}: HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    )
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    if ev.get("usage"):
                        usage = ev["usage"]
                    for c in ev.get("choices") or []:
                        if (c.get("delta") or {}).get("content"):
                            stamps.append(time.perf_counter())
            break
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            # llama-server (cpp-httplib) closes a keep-alive connection after a few requests;
            # a request sent on it just then gets no response: nothing was generated for it
            if stamps or attempt == 2:
                raise
    n = usage["completion_tokens"] if usage else len(stamps)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"tokens": n, "ttft": stamps[0] - t0 if stamps else float("nan"), "gaps": gaps}


async def load(eng: Engine, streams: int, requests: int, tokens: int) -> dict:
    """`streams` clients, each sending `requests` streamed questions one after another."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:

        async def worker(i: int) -> list[dict]:
            return [
                await one_stream(
                    client, eng, QUESTIONS[(i * requests + j) % len(QUESTIONS)], tokens
                )
                for j in range(requests)
            ]

        t0 = time.perf_counter()
        done = await asyncio.gather(*(worker(i) for i in range(streams)))
        wall = time.perf_counter() - t0
    res = [r for w in done for r in w]
    ttft = sorted(r["ttft"] for r in res)
    gaps = sorted(g for r in res for g in r["gaps"])

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    return {"tok_s": sum(r["tokens"] for r in res) / wall, "ttft50": pct(ttft, 0.5),
            "ttft99": pct(ttft, 0.99), "itl50": pct(gaps, 0.5), "itl99": pct(gaps, 0.99),
            "tokens": sum(r["tokens"] for r in res)}  # fmt: skip


def throughput(args, path: str) -> None:
    """The side-by-side table: ``--rounds`` rounds, the engines alternating within each."""
    load0 = os.getloadavg()[0]
    runs: dict[tuple[str, int], list[dict]] = {}
    failed: dict[str, str] = {}
    names: list[str] = []
    for _ in range(args.rounds):
        for eng in engines(args, path):
            names += [eng.name] if eng.name not in names else []
            if eng.name in failed:
                continue
            try:
                eng.start()
            except RuntimeError as e:
                failed[eng.name] = f"failed to start: {e}"
                continue
            try:
                # warm-up, the same for every engine: two whole answers on one stream, then
                # one short answer per stream at the widest load (first-request costs: compiled
                # kernels loaded, ember's decode graphs captured per batch size)
                try:
                    asyncio.run(load(eng, 1, 2, args.tokens))
                    asyncio.run(load(eng, max(args.streams), 1, 8))
                except Exception as e:  # noqa: BLE001 - as a failed load below
                    failed[eng.name] = f"warm-up failed: {type(e).__name__}: {e}"
                    continue
                for n in args.streams:
                    try:
                        r = asyncio.run(load(eng, n, args.requests, args.tokens))
                    except Exception as e:  # noqa: BLE001 - a peer that fails gets a row saying how
                        failed[eng.name] = f"{n} streams failed: {type(e).__name__}: {e}"
                        break
                    runs.setdefault((eng.name, n), []).append(r)
                    print(eng.name, n, f"{r['tok_s']:.1f} tok/s", flush=True)
            finally:
                eng.stop()
    rows = []
    for name in names:
        if name in failed:
            rows.append(f"| {name} | {failed[name]} | | | | | |")
        base = None
        for n in args.streams:
            rs = runs.get((name, n))
            if not rs:
                continue
            mid = sorted(rs, key=lambda r: r["tok_s"])[len(rs) // 2]  # the median run
            best = max(r["tok_s"] for r in rs)
            base = base or mid["tok_s"]
            rows.append(
                f"| {name} | {n} | {mid['tok_s']:.1f} ({best:.1f}) | {mid['tok_s'] / base:.2f}x | "
                f"{mid['ttft50'] * 1e3:.0f} / {mid['ttft99'] * 1e3:.0f} | "
                f"{mid['itl50'] * 1e3:.1f} / {mid['itl99'] * 1e3:.1f} | {mid['tokens']} |"
            )
    table = (
        "| engine | streams | aggregate tok/s, median (best) | vs 1 stream | TTFT p50 / p99 ms | "
        "ITL p50 / p99 ms | tokens |\n|---|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
    )
    note = (
        f"\n\nBundled SmolLM2-135M-Instruct Q4_1, {args.threads} threads each, streamed chat at "
        f"temperature 0, {args.tokens} answer tokens (ignore_eos where taken), {args.requests} "
        f"requests per client; {args.rounds} rounds, the engines one after another in each (never "
        f"at once), each with its default OpenMP settings; latencies of the median run; load "
        f"average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at the end. llama-server: -np "
        f"{args.np or max(args.streams)}."
    )
    print(table + note)
    if not args.no_save:
        append("Serving: ember serve vs llama-server vs llama-cpp-python (bench/serve.py)",
               table + note)  # fmt: skip


async def soak_client(client, url: str, model: str, stop_at: float, stats: dict) -> None:
    """One soak client: random kinds of requests until stop_at."""
    rng = random.Random(id(stats) ^ int(stop_at * 1e3) ^ random.getrandbits(32))
    chat = f"{url}/v1/chat/completions"
    while time.monotonic() < stop_at:
        kind = rng.choices(
            ["stream", "plain", "completion", "malformed", "bad_param", "too_long", "hangup"],
            [30, 20, 10, 10, 10, 5, 15],
        )[0]
        msg = [{"role": "user", "content": rng.choice(QUESTIONS)}]
        body: dict = {"model": model, "messages": msg, "max_tokens": rng.randint(4, 48)}
        t0 = time.perf_counter()
        status = "ok"
        try:
            if kind == "malformed":
                r = await client.post(
                    chat, content=b'{"model": ', headers={"content-type": "application/json"}
                )
                status = r.status_code
            elif kind == "bad_param":
                r = await client.post(chat, json={**body, "temperature": -3})
                status = r.status_code
            elif kind == "too_long":
                r = await client.post(
                    chat, json={**body, "messages": [{"role": "user", "content": "word " * 20000}]}
                )
                status = r.status_code
            elif kind == "completion":
                r = await client.post(
                    f"{url}/v1/completions",
                    json={
                        "model": model,
                        "prompt": msg[0]["content"],
                        "max_tokens": body["max_tokens"],
                    },
                )
                status = r.status_code
                if status == 200:
                    stats["tokens"] += r.json()["usage"]["completion_tokens"]
            elif kind == "plain":
                r = await client.post(chat, json=body)
                status = r.status_code
                if status == 200:
                    stats["tokens"] += r.json()["usage"]["completion_tokens"]
            else:
                body.update(stream=True, stream_options={"include_usage": True})
                async with client.stream("POST", chat, json=body) as r:
                    status = r.status_code
                    seen = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            ev = json.loads(line[6:])
                            if ev.get("usage"):
                                stats["tokens"] += ev["usage"]["completion_tokens"]
                            seen += 1
                            if kind == "hangup" and seen >= 3:
                                break  # leave mid-stream: the server must free the slot
        except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
            status = type(e).__name__
        stats["latency"].append(time.perf_counter() - t0)
        key = f"{kind} {status}"
        stats["answers"][key] = stats["answers"].get(key, 0) + 1
        stats["requests"] += 1


def soak(args, path: str) -> None:
    """The bounded soak run against ember."""
    import httpx

    eng = engines(argparse.Namespace(**{**vars(args), "engines": "ember"}), path)[0]
    eng.start()
    pid = eng.proc.pid
    rss = {"before": rss_mb(pid), "peak": 0.0}
    stats: dict = {"requests": 0, "tokens": 0, "latency": [], "answers": {}}

    async def run() -> None:
        stop_at = time.monotonic() + args.seconds
        limits = httpx.Limits(max_connections=args.clients + 8)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:

            async def watch() -> None:
                while time.monotonic() < stop_at:
                    rss["peak"] = max(rss["peak"], rss_mb(pid))
                    await asyncio.sleep(1)

            await asyncio.gather(watch(), *(soak_client(client, eng.url, eng.model, stop_at, stats)
                                            for _ in range(args.clients)))  # fmt: skip

    t0 = time.perf_counter()
    try:
        asyncio.run(run())
        wall = time.perf_counter() - t0
        rss["end"] = rss_mb(pid)
        time.sleep(10)
        rss["settled"] = rss_mb(pid)
        health = httpx.get(f"{eng.url}/health", timeout=30).status_code
    finally:
        eng.stop()
    lat = sorted(stats["latency"])
    n5 = sum(v for k, v in stats["answers"].items() if k.split()[-1].startswith("5"))
    errs = sum(v for k, v in stats["answers"].items() if not k.split()[-1].isdigit())
    lines = [
        f"- {args.clients} clients, {args.seconds:.0f} s, {args.threads} threads: "
        f"{stats['requests'] / wall:.2f} requests/s, {stats['tokens'] / wall:.1f} generated tokens/s",
        f"- latency p50 {lat[len(lat) // 2]:.2f} s, p90 {lat[int(0.9 * len(lat))]:.2f} s, "
        f"p99 {lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.2f} s",
        f"- 5xx answers: {n5}; client-side failures (timeouts, resets): {errs}; "
        f"/health after: {health}",
        f"- server RSS MB: before {rss['before']:.0f}, peak {rss['peak']:.0f}, at the end "
        f"{rss['end']:.0f}, 10 s later {rss['settled']:.0f}",
        "- answers by kind and status: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(stats["answers"].items())),
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_save:
        append("Serving soak: ember serve under mixed, hostile load (bench/serve.py --soak)", text)
    if n5:
        sys.exit(f"soak: {n5} answers were 5xx")


def prefix(args, path: str) -> None:
    """TTFT with a repeated ~500-token system prompt vs a new one each time (ember)."""
    import httpx

    eng = engines(argparse.Namespace(**{**vars(args), "engines": "ember"}), path)[0]
    eng.start()
    words = "the server keeps whole prompt chunks of earlier requests and reuses them".split()
    rng = random.Random(0)

    def system(tag: str) -> str:
        return tag + " " + " ".join(rng.choice(words) for _ in range(430))

    async def ttft(sys_prompt: str, q: str) -> tuple[float, int]:
        async with httpx.AsyncClient(timeout=600) as client:
            body = {
                "model": eng.model,
                "max_tokens": 1,
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": sys_prompt},
                    {"role": "user", "content": q},
                ],
            }
            t0 = time.perf_counter()
            r = await client.post(f"{eng.url}/v1/chat/completions", json=body)
            return time.perf_counter() - t0, r.json()["usage"]["prompt_tokens"]

    try:
        shared = system("Rules A.")
        asyncio.run(ttft(shared, "warm-up"))
        cold, warm, n = [], [], 0
        for i in range(args.requests):
            t, n = asyncio.run(ttft(system(f"Rules {i}."), QUESTIONS[i % len(QUESTIONS)]))
            cold.append(t)
            warm.append(asyncio.run(ttft(shared, QUESTIONS[i % len(QUESTIONS)]))[0])
    finally:
        eng.stop()
    c, w = statistics.median(cold), statistics.median(warm)
    text = (
        f"| prompt | TTFT median ms (best) |\n|---|---:|\n"
        f"| new ~{n}-token system prompt (cold) | {c * 1e3:.0f} ({min(cold) * 1e3:.0f}) |\n"
        f"| the same system prompt again (prefix reused) | {w * 1e3:.0f} ({min(warm) * 1e3:.0f}) |"
        f"\n\n{args.requests} of each, alternating, {args.threads} threads; reuse is by whole "
        f"prompt chunks (--prefill-chunk, 256 by default), cold / warm = {c / w:.2f}x; load "
        f"average {os.getloadavg()[0]:.2f} at the end."
    )
    print(text)
    if not args.no_save:
        append("Serving: time to first token with a shared prefix (bench/serve.py --prefix)", text)


def steps(args, path: str) -> None:
    """The engine's model steps without HTTP: 8 chat prompts as one padded forward vs one by
    one, and a decode step of 1 vs 8 rows (median ms of --rounds x 5 calls, in one process)."""
    import statistics as st
    from types import SimpleNamespace

    from ember.cli._llm import chat_ids, load
    from ember.serve.engine import StepInput, StepRunner

    model, tok = load(SimpleNamespace(model=path, threads=args.threads, lora=[]))
    prompts = [chat_ids(tok, [{"role": "user", "content": q}]) for q in QUESTIONS[:8]]

    def prefill(together: bool) -> float:
        r = StepRunner(model, slots=8)
        r.prompts_together = together
        caches = [r.new_cache(len(p) + 8) for p in prompts]
        ins = [StepInput(p, r.reserve(c, len(p))) for p, c in zip(prompts, caches)]
        t = time.perf_counter()
        if together:
            r.step(ins)
        else:
            for i in ins:
                r.step([i])
        return time.perf_counter() - t

    runner = StepRunner(model, slots=8)
    caches = [runner.new_cache(len(p) + 200) for p in prompts]
    for p, c in zip(prompts, caches):
        runner.step([StepInput(p, runner.reserve(c, len(p)))])

    def decode(n: int) -> float:
        ins = [
            StepInput([7], runner.reserve(c, runner.cache.lengths[c.index] + 1)) for c in caches[:n]
        ]
        t = time.perf_counter()
        runner.step(ins)
        return time.perf_counter() - t

    runs = {"together": [], "alone": [], 1: [], 8: []}
    for _ in range(args.rounds):
        for key, fn in (("together", lambda: prefill(True)), ("alone", lambda: prefill(False)),
                        (1, lambda: decode(1)), (8, lambda: decode(8))):  # fmt: skip
            fn()  # warm-up (first calls compile and capture)
            runs[key] += [fn() for _ in range(5)]
    ms = {k: 1e3 * st.median(v) for k, v in runs.items()}
    lengths = [len(p) for p in prompts]
    text = (
        "| step | median ms |\n|---|---:|\n"
        f"| 8 chat prompts ({min(lengths)}-{max(lengths)} tokens), one padded forward | "
        f"{ms['together']:.1f} |\n"
        f"| the same 8 prompts, one forward each | {ms['alone']:.1f} |\n"
        f"| decode step, 1 row | {ms[1]:.2f} |\n| decode step, 8 rows | {ms[8]:.2f} |\n\n"
        f"Bundled SmolLM2-135M-Instruct Q4_1, ember's StepRunner in one process (no HTTP), "
        f"{args.threads} threads, {args.rounds} x 5 calls each after a warm-up; prompts together "
        f"{ms['alone'] / ms['together']:.2f}x faster; load average "
        f"{os.getloadavg()[0]:.2f} at the end."
    )
    print(text)
    if not args.no_save:
        append("Serving: the engine's model steps (bench/serve.py --steps)", text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of all engines, alternating")
    ap.add_argument("--engines", default="ember,llama-server,llama-cpp-python")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary")
    ap.add_argument("--np", type=int, help="llama-server's parallel slots (default: most streams)")
    ap.add_argument("--soak", action="store_true")
    ap.add_argument("--prefix", action="store_true", help="TTFT with a shared prefix (ember)")
    ap.add_argument("--steps", action="store_true", help="the engine's model steps, no HTTP")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args()
    from ember.models.hub import default_model_path

    path = str(default_model_path())
    mode = soak if args.soak else prefix if args.prefix else steps if args.steps else throughput
    mode(args, path)


if __name__ == "__main__":
    main()
