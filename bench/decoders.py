"""Decode speed of every LLM family (Llama, Gemma, Gemma 2, Phi-3, GPT-2) across ember source trees.

    python bench/decoders.py --tree before=/work/base/src --tree after=/work/main/src
        [--tokens 64] [--threads 2] [--repeat 3] [--torch] [--no-record] [--workdir DIR]

Five random-weight float32 models of the same size (hidden 768, 8 layers, 12 heads of 64, vocab
32000; MLP 2048 gated, GPT-2's 3072 ungated, the same weight count) are written once by
transformers as Hugging Face folders (safetensors) under --workdir. Each (model, tree) runs in
its own process with PYTHONPATH=<tree>: AutoModelForCausalLM.from_pretrained(folder), a warm-up,
then generate_tokens() (the generate loop's public entry point in every tree): a fixed 32-token
prompt, --tokens greedy tokens with the KV cache. Rounds alternate the trees (reversed every
other round); the table shows best and median over --repeat rounds and the ratio to the first
tree. A tree that fails on a model gets a row saying why; the others go on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from _common import append, blas_info  # noqa: E402

PROMPT_LEN = 32
SIZE = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=8, num_attention_heads=12)
GATED = dict(SIZE, intermediate_size=2048, num_key_value_heads=12, head_dim=64)
CONFIGS = {  # name -> (transformers config class, model class, config kwargs)
    "llama": ("LlamaConfig", "LlamaForCausalLM", GATED),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", GATED),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(GATED, query_pre_attn_scalar=64)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(GATED, pad_token_id=0, eos_token_id=2)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=32000, n_embd=768, n_layer=8, n_head=12, n_inner=3072,
                  bos_token_id=0, eos_token_id=0)),
}  # fmt: skip
INTERESTING_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                     "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")  # fmt: skip


def prompt_ids() -> list[int]:
    """The same 32 token ids for every model and engine."""
    import numpy as np

    return np.random.default_rng(0).integers(1, 32000, PROMPT_LEN).tolist()


def model_dir(workdir: Path, name: str) -> Path:
    """The model's folder, written by transformers the first time (named by a hash of its config)."""
    cfg_cls, model_cls, kw = CONFIGS[name]
    key = hashlib.sha1(json.dumps([cfg_cls, model_cls, kw], sort_keys=True).encode()).hexdigest()
    path = workdir / f"{name}-{key[:8]}"
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        return path
    import torch
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).float().eval()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(path)
    return path


def child_ember(folder: str, tokens: int, threads: int) -> dict:
    import ember
    from ember.generation.generate import generate_tokens
    from ember.models import AutoModelForCausalLM

    ember.set_num_threads(threads)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder)
    load = time.perf_counter() - t
    ids = prompt_ids()
    list(generate_tokens(model, ids, 4))  # compile / load numba's cache, pack the weights

    def run():
        return (s[0] for s in generate_tokens(model, ids, tokens))

    out = _timed(run)
    import numba

    try:
        layer = f"{numba.threading_layer()} layer"
    except ValueError:  # no parallel kernel ran
        layer = "no parallel kernel ran"
    return {**out, "load_s": load, "engine": ember.__file__, "blas": blas_info(),
            "openmp": f"numba {numba.__version__}, {layer}, {numba.get_num_threads()} threads"}  # fmt: skip


def child_torch(folder: str, tokens: int, threads: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(threads)
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    load = time.perf_counter() - t
    ids = torch.tensor([prompt_ids()])

    def step(n):
        with torch.no_grad():
            out = model(ids, use_cache=True)
            for i in range(n):
                tok = out.logits[:, -1:].argmax(-1)
                yield int(tok)
                if i < n - 1:
                    out = model(tok, past_key_values=out.past_key_values, use_cache=True)

    list(step(4))
    out = _timed(lambda: step(tokens))
    return {**out, "load_s": load, "engine": f"torch {torch.__version__}", "blas": blas_info(),
            "openmp": f"torch {torch.get_num_threads()} intra-op threads"}  # fmt: skip


def _timed(run) -> dict:
    """Prefill = prompt to the first token; decode = the tokens after it (wall and process CPU)."""
    wall, cpu, toks = [time.perf_counter()], [time.process_time()], []
    for tok in run():
        toks.append(int(tok))
        wall.append(time.perf_counter())
        cpu.append(time.process_time())
    n = len(toks) - 1
    return {"prefill_tok_s": PROMPT_LEN / (wall[1] - wall[0]),
            "decode_tok_s": n / (wall[-1] - wall[1]),
            "decode_cpu_ms": 1e3 * (cpu[-1] - cpu[1]) / n, "tokens": toks}  # fmt: skip


def run_child(engine: str, tree: str | None, folder: Path, a) -> tuple[dict | None, str | None]:
    """(result, None) from one child process, or (None, why it gave none)."""
    env = {**os.environ, "TQDM_DISABLE": "1"}  # each engine's own thread and OpenMP defaults
    env.pop("PYTHONPATH", None)
    if tree:
        env["PYTHONPATH"] = tree
    cmd = [sys.executable, __file__, "--child", engine, str(folder), "--tokens", str(a.tokens),
           "--threads", str(a.threads)]  # fmt: skip
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    except subprocess.TimeoutExpired:
        return None, "timed out after 30 min"
    lines = r.stdout.strip().splitlines()
    if r.returncode == 0 and lines:
        res = json.loads(lines[-1])
        if tree and not os.path.realpath(res["engine"]).startswith(os.path.realpath(tree)):
            return None, f"imported ember from {res['engine']}, not from {tree}"
        return res, None
    err = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    why = err[-1] if err else f"exit status {r.returncode}, no output"
    return None, why.replace("|", "/")[:160]


def cpu_summary() -> str:
    """CPU model name and the SIMD flags that pick kernels, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), "unknown CPU")  # fmt: skip
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                  if ln.startswith("flags")), [])  # fmt: skip
    have = [f for f in INTERESTING_FLAGS if f in flags]
    return f"{name}, {os.cpu_count()} cores, flags: {' '.join(have) or '-'}"


def _cell(xs: list[float], fmt: str) -> str:
    """Best (median)."""
    return f"{max(xs):{fmt}} ({statistics.median(xs):{fmt}})"


def _ratio(xs: list[float], ref: list[float]) -> str:
    """Best over best (median over median)."""
    med = statistics.median(xs) / statistics.median(ref)
    return f"{max(xs) / max(ref):.2f}x ({med:.2f}x)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                    help="an ember source tree (the folder holding ember/); repeatable")  # fmt: skip
    ap.add_argument("--models", default=",".join(CONFIGS), help="comma-separated subset")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens decoded")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="rounds")
    ap.add_argument("--torch", action="store_true", help="transformers' decode as a reference")
    ap.add_argument("--workdir", default="/tmp/ember-bench-decoders", help="model folder cache")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "FOLDER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        fn = {"ember": child_ember, "torch": child_torch}[a.child[0]]
        print(json.dumps(fn(a.child[1], a.tokens, a.threads)))
        return
    trees = [t.split("=", 1) for t in a.tree] or [["current", None]]
    engines = [(n, "ember", p) for n, p in trees] + [("torch", "torch", None)] * a.torch
    models = a.models.split(",")
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    folders = {m: model_dir(workdir, m) for m in models}
    load0 = os.getloadavg()
    res = {(m, e[0]): [] for m in models for e in engines}
    failed, info = {}, {}
    for r in range(a.repeat):
        order = engines if r % 2 == 0 else engines[::-1]
        for m in models:
            for name, engine, tree in order:
                if (m, name) in failed:
                    continue
                out, why = run_child(engine, tree, folders[m], a)
                if why:
                    failed[(m, name)] = why
                    print(f"{m} / {name}: FAILED: {why}", file=sys.stderr)
                    continue
                res[(m, name)].append(out)
                info.setdefault(name, out)
                print(f"round {r + 1} {m} / {name}: decode {out['decode_tok_s']:.1f} tok/s, "
                      f"prefill {out['prefill_tok_s']:.0f} tok/s", file=sys.stderr)  # fmt: skip
    load1 = os.getloadavg()
    base = trees[0][0]
    lines = [f"| model | tree | decode tok/s | prefill tok/s | decode vs {base} | "
             f"prefill vs {base} | decode CPU ms/token | same tokens as {base} |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for m in models:
        ref = res[(m, base)]
        for name, _, _ in engines:
            runs = res[(m, name)]
            if not runs:
                why = failed.get((m, name), "no runs")
                lines.append(f"| {m} | {name} | failed: {why} | - | - | - | - | - |")
                continue
            dec = [o["decode_tok_s"] for o in runs]
            pre = [o["prefill_tok_s"] for o in runs]
            cpu = min(o["decode_cpu_ms"] for o in runs)
            vs_d = vs_p = same = "-"
            if ref and name != base:
                vs_d = _ratio(dec, [o["decode_tok_s"] for o in ref])
                vs_p = _ratio(pre, [o["prefill_tok_s"] for o in ref])
                t0, t1 = ref[0]["tokens"], runs[0]["tokens"]
                k = next((i for i, (x, y) in enumerate(zip(t0, t1)) if x != y), len(t0))
                same = f"{k}/{len(t0)}"
            lines.append(f"| {m} | {name} | {_cell(dec, '.1f')} | {_cell(pre, '.0f')} | "
                         f"{vs_d} | {vs_p} | {cpu:.0f} | {same} |")  # fmt: skip
    sizes = "; ".join(f"{m}: {folders[m].name}" for m in models)
    per_tree = "\n".join(f"- {n}: {o['engine']}; BLAS {o['blas']}; {o['openmp']}; "
                         f"load {o['load_s']:.2f} s" for n, o in info.items())  # fmt: skip
    table = "\n".join(lines) + (
        f"\n\nRandom-weight float32 models from transformers (hidden 768, 8 layers, 12 heads of "
        f"64, vocab 32000, MLP 2048 gated / GPT-2 3072), folders under {workdir} ({sizes}); "
        f"prompt {PROMPT_LEN} tokens, {a.tokens} greedy tokens with the KV cache, {a.threads} "
        f"threads, each engine's default OpenMP settings, one process per (model, tree) per round, best "
        f"(median) of {a.repeat} rounds; prefill = prompt / time to the first token, decode = "
        f"the tokens after it; CPU ms/token: the child's CPU time (all threads) per decoded "
        f"token, least of the rounds. CPU: {cpu_summary()}. Load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load0)} at start, "
        f"{'/'.join(f'{x:.1f}' for x in load1)} at the end.\n\n{per_tree}"
    )
    print(table)
    if not a.no_record:
        append("LLM decoders across ember trees (bench/decoders.py)", table)


if __name__ == "__main__":
    main()
