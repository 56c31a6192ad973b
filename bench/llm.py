"""LLM inference: ember vs PyTorch (transformers, float32 from the same GGUF) vs llama.cpp, one run.

    python bench/llm.py [--prompt-tokens 128] [--new-tokens 64] [--threads 2] [--repeat 3]
        [--gguf FILE | --tinyllama [DIR]] [--engines ember,torch,torch_bf16,llamacpp]

The model is the bundled SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0), or ``--gguf FILE``, or with
``--tinyllama`` every file of bench/tinyllama.py (TinyLlama-1.1B's configuration, random
weights: bf16, Q8_0/Q4_0/Q4_K by ember's converter and by llama.cpp's quantizer, Q5_K_M by
llama.cpp's; written into DIR the first time), one table per file. ember runs the quantized weights directly;
transformers dequantizes them to float32 (``torch``; it has no quantized CPU kernels) or
bfloat16 (``torch_bf16``); llama.cpp
(llama-cpp-python, the `bench` extra) runs them quantized. Greedy decoding, same prompt ids,
each engine in its own process (their OpenMP runtimes never mix) with its own default thread
and OpenMP settings, as its users run it; an engine that fails or crashes gets a row that says
why.

Each engine warms up on the full prompt, then generates ``--repeat`` times; the table shows the
best run (least disturbed by other jobs on a shared machine) and the process CPU time per
decoded token of that run (all threads; with --threads 1 it is the single-thread cost, which
waiting for a busy core does not inflate), and the engine process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import append, blas_info  # noqa: E402


def _stamps(step, n_new: int) -> tuple[list[float], list[float], list[int]]:
    """Wall and CPU time stamps: before the prompt, then after each new token; the tokens."""
    wall, cpu, toks = [time.perf_counter()], [time.process_time()], []
    for tok in step(n_new):
        toks.append(int(tok))
        wall.append(time.perf_counter())
        cpu.append(time.process_time())
    return wall, cpu, toks


def _best(runs: list) -> dict:
    """The run with the fastest decode; prefill from the run with the fastest prefill."""

    def rate(r):
        wall, cpu, _ = r
        return (len(wall) - 2) / (wall[-1] - wall[1])

    best = max(runs, key=rate)
    wall, cpu, toks = best
    prefill = min(r[0][1] - r[0][0] for r in runs)
    n = len(wall) - 2
    return {"prefill_s": prefill, "decode_tok_s": rate(best),
            "decode_cpu_ms": 1e3 * (cpu[-1] - cpu[1]) / n, "tokens": toks}  # fmt: skip


def run_ember(path, ids, new, threads, repeat):
    import ember
    from ember.generation.generate import generate_tokens
    from ember.models import AutoModelForCausalLM

    ember.set_num_threads(threads)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path)
    load = time.perf_counter() - t

    def step(n):
        return (s[0] for s in generate_tokens(model, ids, n))

    list(step(2))  # compile / load numba's cache, stack the fused weights
    out = _best([_stamps(step, new) for _ in range(repeat)])
    return {**out, "load_s": load, "version": ember.__version__, "blas": blas_info()}


def run_torch(path, ids, new, threads, repeat, dtype="float32"):
    import torch
    import transformers

    torch.set_num_threads(threads)
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)
    ).eval()
    load = time.perf_counter() - t

    def step(n):
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True)
            for i in range(n):
                tok = out.logits[:, -1:].argmax(-1)
                yield int(tok)
                if i < n - 1:
                    out = model(tok, past_key_values=out.past_key_values, use_cache=True)

    list(step(2))
    out = _best([_stamps(step, new) for _ in range(repeat)])
    version = f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads)"
    return {**out, "load_s": load, "version": version, "blas": blas_info()}


def run_llamacpp(path, ids, new, threads, repeat, safe=False):
    import llama_cpp
    from llama_cpp import Llama

    if safe:  # no extra buffer types (AMX, repacked weights): see --llamacpp-safe
        import llama_cpp.llama_cpp as api

        defaults = api.llama_model_default_params

        def params():
            p = defaults()
            p.use_extra_bufts = False
            return p

        api.llama_model_default_params = params
    t = time.perf_counter()
    llm = Llama(str(path), n_ctx=len(ids) + new + 8, n_threads=threads, n_threads_batch=threads,
                verbose=False)  # fmt: skip
    load = time.perf_counter() - t

    def step(n):
        llm.reset()
        llm.eval(ids)
        for i in range(n):
            tok = llm.sample(temp=0.0)
            yield tok
            if i < n - 1:
                llm.eval([tok])

    list(step(2))
    out = _best([_stamps(step, new) for _ in range(repeat)])
    version = f"llama-cpp-python {llama_cpp.__version__}" + (", no extra buffer types" * safe)
    return {**out, "load_s": load, "version": version, "blas": "ggml (own kernels)"}


def run_torch_bf16(path, ids, new, threads, repeat):
    return run_torch(path, ids, new, threads, repeat, dtype="bfloat16")


ENGINES = {
    "ember": run_ember,
    "torch": run_torch,
    "torch_bf16": run_torch_bf16,
    "llamacpp": run_llamacpp,
}
NAMES = {
    "ember": "ember",
    "torch": "torch eager (transformers, f32)",
    "torch_bf16": "torch eager (transformers, bf16)",
    "llamacpp": "llama.cpp (llama-cpp-python)",
}


def _run(cmd: list[str], env: dict) -> tuple[dict | None, str | None]:
    """(result, None) from an engine's process, or (None, why it gave none)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "timed out after 30 min"
    out = r.stdout.strip().splitlines()
    if r.returncode == 0 and out:
        try:
            return json.loads(out[-1]), None
        except json.JSONDecodeError:
            pass
    return None, _failure(r)


def _failure(r: subprocess.CompletedProcess) -> str:
    """Why an engine's process gave no result, in a few words."""
    if r.returncode < 0:
        try:
            return f"crashed: {signal.Signals(-r.returncode).name}"
        except ValueError:
            return f"killed by signal {-r.returncode}"
    lines = [ln.strip() for ln in r.stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit status {r.returncode}, no output"
    return last.replace("|", "/")[:120]


PROMPT = (
    "The lighthouse keeper climbed the spiral stairs at dusk, as he had every evening for "
    "thirty years. From the top he could see the fishing boats returning to the harbour, the "
    "gulls circling the cliffs and, far out to sea, the grey line of an approaching storm. He "
    "lit the lamp, wound the clockwork that turned the great lens, and wrote in the log: "
)


def prompt_ids(path, n: int) -> list[int]:
    """n token ids of an English text (repeated as needed), the same for every engine."""
    from ember.generation.tokenizer import Tokenizer
    from ember.io import open_gguf

    tok = Tokenizer.from_gguf_metadata(open_gguf(path).metadata)
    ids = tok.encode(PROMPT, add_special_tokens=False)
    return (ids * (n // len(ids) + 1))[:n]


def describe(path) -> str:
    """The file's name, its general.name and the types of its matrices."""
    from collections import Counter

    from ember.io import open_gguf

    f = open_gguf(path)
    types = Counter(t.qtype for t in f.tensors.values() if len(t.shape) == 2)
    mix = " + ".join(f"{q} x{n}" for q, n in types.most_common())
    return f"{os.path.basename(path)} ({f.metadata.get('general.name', '?')}; matrices {mix})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset")
    ap.add_argument("--no-save", action="store_true", help="print the table only")
    ap.add_argument("--llamacpp-safe", action="store_true",
                    help="llama.cpp without extra buffer types (tried by itself after a crash)")  # fmt: skip
    ap.add_argument("--gguf", help="a GGUF file instead of the bundled model")
    ap.add_argument("--tinyllama", nargs="?", const="/tmp/ember-tinyllama", metavar="DIR",
                    help="every bench/tinyllama.py file (written into DIR when missing)")  # fmt: skip
    ap.add_argument("--engine", choices=list(ENGINES), help="(internal) run one engine, print JSON")
    a = ap.parse_args()
    if a.tinyllama:
        from pathlib import Path

        from tinyllama import make_files

        for f in make_files(Path(a.tinyllama), ["Q8_0", "Q4_0", "Q4_K", "Q5_K"]):
            bench_file(f, a)
        return
    from ember.models.hub import default_model_path

    bench_file(a.gguf or default_model_path(), a)


def bench_file(path, a) -> None:
    """One table: every engine on one GGUF file."""
    from pathlib import Path

    path = Path(path)
    ids = prompt_ids(path, a.prompt_tokens)
    if a.engine:
        kw = {"safe": True} if a.engine == "llamacpp" and a.llamacpp_safe else {}
        out = ENGINES[a.engine](path, ids, a.new_tokens, a.threads, a.repeat, **kw)
        import resource

        out["rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
        print(json.dumps(out))
        return
    load0 = os.getloadavg()[0]
    rows, notes = [], []
    for eng in a.engines.split(","):
        cmd = [sys.executable, __file__, "--engine", eng, "--prompt-tokens", str(a.prompt_tokens),
               "--new-tokens", str(a.new_tokens), "--threads", str(a.threads),
               "--repeat", str(a.repeat), "--gguf", str(path)]  # fmt: skip
        env = {**os.environ, "TQDM_DISABLE": "1"}  # each engine's own OpenMP defaults
        res, why = _run(cmd + ["--llamacpp-safe"] * a.llamacpp_safe, env)
        if eng == "llamacpp" and why and why.startswith("crashed") and not a.llamacpp_safe:
            first = why
            res, why = _run(cmd + ["--llamacpp-safe"], env)
            if why:
                why = f"{first}; without extra buffer types: {why}"
            else:
                notes.append(f"llama.cpp {first} with its default buffer types (AMX on this "
                             "CPU); the row is its run without extra buffer types.")  # fmt: skip
        if why:
            print(f"{eng}: {why}", file=sys.stderr)
        rows.append((eng, res, why))
    load1 = os.getloadavg()[0]
    ember_res = next((r for e, r, _ in rows if e == "ember" and r), None)
    lines = [
        "| engine | load s | prefill tok/s | decode tok/s | decode CPU ms/token | "
        "decode vs ember | same tokens as ember | peak RSS GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for eng, r, why in rows:
        if r is None:
            lines.append(f"| {NAMES[eng]} (not available: {why}) | - | - | - | - | - | - | - |")
            continue
        vs = f"{r['decode_tok_s'] / ember_res['decode_tok_s']:.2f}x" if ember_res else "-"
        same = "-"
        if ember_res:
            a_t, b_t = ember_res["tokens"], r["tokens"]
            k = next((i for i, (x, y) in enumerate(zip(a_t, b_t)) if x != y), len(a_t))
            same = f"{k}/{len(a_t)}"
        lines.append(
            f"| {NAMES[eng]} | {r['load_s']:.2f} | {a.prompt_tokens / r['prefill_s']:.0f} | "
            f"{r['decode_tok_s']:.1f} | {r['decode_cpu_ms']:.1f} | {vs} | {same} | "
            f"{r['rss_gb']:.2f} |"
        )
    table = "\n".join(lines)
    versions = "; ".join(f"{NAMES[e]}: {r['version']}, BLAS {r['blas']}" for e, r, _ in rows if r)
    omp = " ".join(
        f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith(("OMP_", "GOMP_"))
    )
    table += (
        f"\n\n{describe(path)}, prompt {a.prompt_tokens} tokens, "
        f"{a.new_tokens} new tokens, greedy, {a.threads} threads, best of {a.repeat} runs after "
        f"a warm-up; prefill = prompt / time to the first token. Load average {load0:.1f} at "
        f"start, {load1:.1f} at the end ({os.cpu_count()} cores). Same tokens: how many of the "
        f"first generated tokens equal ember's. Each engine's default OpenMP settings (set in "
        f"this shell: {omp or 'none'}).{''.join(' ' + n for n in notes)}\n\n{versions}"
    )
    print(table)
    if not a.no_save:
        append(f"LLM generation: {os.path.basename(path)} (bench/llm.py)", table)


if __name__ == "__main__":
    main()
