"""LLM inference: ember vs PyTorch (transformers, float32 from the same GGUF) vs llama.cpp, one run.

    python bench/llm.py [--prompt-tokens 128] [--new-tokens 64] [--threads 2]

The model is the bundled SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0). ember runs the quantized
weights directly; transformers dequantizes them to float32 (it has no quantized CPU kernels);
llama.cpp (llama-cpp-python, optional) runs them quantized. Greedy decoding, same prompt ids.
"""

from __future__ import annotations

import argparse
import os
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
    with ember.no_grad():
        t = time.perf_counter()
        model(ember.tensor([ids]), logits_to_keep=1)
        prefill = time.perf_counter() - t
    t = time.perf_counter()
    n = sum(1 for _ in generate_tokens(model, ids, new))
    total = time.perf_counter() - t
    return load, len(ids) / prefill, (n - 1) / max(total - prefill, 1e-9)


def run_torch(path, ids, new, threads):
    import torch
    import transformers

    torch.set_num_threads(threads)
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    load = time.perf_counter() - t
    x = torch.tensor([ids])
    with torch.no_grad():
        model.generate(x[:, :8], max_new_tokens=4, do_sample=False)
        t = time.perf_counter()
        model(x)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        out = model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        total = time.perf_counter() - t
    n = out.shape[1] - len(ids)
    return load, len(ids) / prefill, (n - 1) / max(total - prefill, 1e-9)


def run_llamacpp(path, ids, new, threads):
    from llama_cpp import Llama

    t = time.perf_counter()
    llm = Llama(str(path), n_ctx=len(ids) + new + 8, n_threads=threads, verbose=False)
    load = time.perf_counter() - t
    llm.eval(ids[:8])
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(new - 1):
        tok = llm.sample(temp=0.0)
        llm.eval([tok])
    decode = time.perf_counter() - t
    return load, len(ids) / prefill, (new - 1) / decode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from ember.models.hub import default_model_path

    path = default_model_path()
    ids = [(i * 7919) % 40000 + 100 for i in range(a.prompt_tokens)]
    rows = [("ember", run_ember(path, ids, a.new_tokens, a.threads))]
    rows.append(("torch (transformers, f32)", run_torch(path, ids, a.new_tokens, a.threads)))
    try:
        rows.append(("llama.cpp (llama-cpp-python)", run_llamacpp(path, ids, a.new_tokens, a.threads)))
    except ImportError:
        rows.append(("llama.cpp (not installed)", None))
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
