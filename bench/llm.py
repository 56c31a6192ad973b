"""LLM inference: ember vs PyTorch (transformers, float32 from the same GGUF) vs llama.cpp, one run.

    python bench/llm.py [--prompt-tokens 128] [--new-tokens 64] [--threads 2]

The model is the bundled SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0). ember runs the quantized
weights directly; transformers dequantizes them to float32 (it has no quantized CPU kernels);
llama.cpp (llama-cpp-python, optional) runs them quantized. Greedy decoding, same prompt ids.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import append  # noqa: E402


def run_ember(path, ids, new, threads):
    import ember
    from ember.generation.generate import generate_tokens
    from ember.models import AutoModelForCausalLM

    ember.set_num_threads(threads)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path)
    load = time.perf_counter() - t
    list(generate_tokens(model, ids[:8], 4))  # compile / warm caches
    stamps = [time.perf_counter()]
    for _ in generate_tokens(model, ids, new):
        stamps.append(time.perf_counter())
    return _rates(load, len(ids), stamps)


def _rates(load, n_prompt, stamps):
    """(load s, prefill tok/s = prompt / time to first token, decode tok/s after the first)."""
    prefill = stamps[1] - stamps[0]
    decode = (len(stamps) - 2) / (stamps[-1] - stamps[1])
    return load, n_prompt / prefill, decode


def run_torch(path, ids, new, threads):
    import torch
    import transformers

    torch.set_num_threads(threads)
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    load = time.perf_counter() - t

    def gen(prompt, n):
        stamps = [time.perf_counter()]
        with torch.no_grad():
            out = model(torch.tensor([prompt]), use_cache=True)
            for _ in range(n):
                tok = out.logits[:, -1:].argmax(-1)
                stamps.append(time.perf_counter())
                out = model(tok, past_key_values=out.past_key_values, use_cache=True)
        return stamps

    gen(ids[:8], 4)
    return _rates(load, len(ids), gen(ids, new))


def run_llamacpp(path, ids, new, threads):
    from llama_cpp import Llama

    t = time.perf_counter()
    llm = Llama(str(path), n_ctx=len(ids) + new + 8, n_threads=threads, verbose=False)
    load = time.perf_counter() - t
    llm.eval(ids[:8])
    llm.reset()
    stamps = [time.perf_counter()]
    llm.eval(ids)
    for _ in range(new):
        tok = llm.sample(temp=0.0)
        stamps.append(time.perf_counter())
        llm.eval([tok])
    return _rates(load, len(ids), stamps)


ENGINES = {"ember": run_ember, "torch": run_torch, "llamacpp": run_llamacpp}
NAMES = {"ember": "ember", "torch": "torch (transformers, f32)", "llamacpp": "llama.cpp (llama-cpp-python)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", choices=list(ENGINES), help="(internal) run one engine, print JSON")
    a = ap.parse_args()
    from ember.models.hub import default_model_path

    path = default_model_path()
    ids = [(i * 7919) % 40000 + 100 for i in range(a.prompt_tokens)]
    if a.engine:  # each engine in its own process: their OpenMP runtimes do not mix
        print(json.dumps(ENGINES[a.engine](path, ids, a.new_tokens, a.threads)))
        return
    rows = []
    for eng in ENGINES:
        cmd = [sys.executable, __file__, "--engine", eng, "--prompt-tokens", str(a.prompt_tokens),
               "--new-tokens", str(a.new_tokens), "--threads", str(a.threads)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
        ok = r.returncode == 0 and r.stdout.strip()
        if not ok:
            print(f"{eng}: {r.stderr.strip().splitlines()[-1:] or r.returncode}", file=sys.stderr)
        rows.append((NAMES[eng] if ok else f"{NAMES[eng]} (not available)", json.loads(r.stdout.strip().splitlines()[-1]) if ok else None))
    e = rows[0][1]
    lines = ["| engine | load s | prefill tok/s | decode tok/s | decode vs ember |", "|---|---|---|---|---|"]
    for name, r in rows:
        if r is None:
            lines.append(f"| {name} | - | - | - | - |")
            continue
        lines.append(f"| {name} | {r[0]:.2f} | {r[1]:.0f} | {r[2]:.1f} | {r[2] / e[2]:.2f}x |")
    table = "\n".join(lines)
    table += f"\n\nSmolLM2-135M-Instruct Q4_1 GGUF, prompt {a.prompt_tokens} tokens, {a.new_tokens} new tokens, greedy, {a.threads} threads."
    print(table)
    append("LLM generation: SmolLM2-135M (bench/llm.py)", table)


if __name__ == "__main__":
    main()
