"""LoRA training tokens/s: ember (QLoRA on the quantized GGUF) vs torch + peft (float32), same run.

Both sides fine-tune the bundled SmolLM2-135M-Instruct (unless --model names another GGUF) with
LoRA r=--rank on every linear layer of the decoder, AdamW, on the same random (--batch, --seq)
token batches:

- ember: the base weights stay Q4_1 QTensors (the forward runs the quantized kernels, the
  backward of x @ W_q^T the transposed quantized product), loss ``causal_lm_loss``;
- torch + peft: transformers loads the same GGUF (dequantized to float32, as
  ``from_pretrained(gguf_file=...)`` does), ``peft.get_peft_model``, loss from ``labels``.

Each engine runs in a process of its own (their OpenMP/numba pools would fight), one warm-up
step, then --steps timed steps; processes alternate engine by engine for --repeat rounds.
Tokens/s = batch * seq / step time; the median and best are reported with the ratio, and the
table goes to bench/RESULTS.md with the command and the load average. ``--busy N`` runs N
processes spinning on a core (``while True: pass``) for the whole measurement: how each engine
copes with a machine it shares.

    .venv/bin/python bench/finetune_speed.py [--seq 128] [--batch 4] [--steps 4] [--repeat 2]
                                             [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _batches(vocab: int, args) -> list:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, (args.batch, args.seq)) for _ in range(args.steps + 1)]


def run_ember(args) -> list[float]:
    """Seconds of each timed step, ember QLoRA."""
    import ember
    from ember.models import AutoModelForCausalLM
    from ember.peft import LoraConfig, get_peft_model
    from ember.peft.data import causal_lm_loss

    ember.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=TARGETS)
    pm = get_peft_model(model, cfg)
    opt = ember.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-4)
    times = []
    for ids in _batches(model.config.vocab_size, args):
        t = time.perf_counter()
        x = ember.tensor(ids)
        loss = causal_lm_loss(pm(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return times[1:]


def run_torch(args) -> list[float]:
    """Seconds of each timed step, transformers + peft on the dequantized float32 model."""
    import torch
    import transformers

    from peft import LoraConfig, get_peft_model

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    folder, name = os.path.split(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, torch_dtype=torch.float32
    )
    cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=TARGETS)
    pm = get_peft_model(model, cfg)
    pm.train()
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-4)
    times = []
    for ids in _batches(model.config.vocab_size, args):
        t = time.perf_counter()
        x = torch.from_numpy(ids)
        loss = pm(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return times[1:]


def main() -> None:
    """Alternate the engines' processes, print the table, append it to bench/RESULTS.md."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--busy", type=int, default=0, help="processes spinning on a core meanwhile")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--engine", choices=["ember", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        from ember.models.hub import default_model_path

        args.model = str(default_model_path())
    if args.engine:
        print(json.dumps((run_ember if args.engine == "ember" else run_torch)(args)))
        return
    load0 = os.getloadavg()[0]
    times: dict[str, list[float]] = {"ember": [], "torch": []}
    spin = [sys.executable, "-c", "while True: pass"]
    busy = [subprocess.Popen(spin) for _ in range(args.busy)]
    try:
        for _ in range(args.repeat):
            for engine in times:
                cmd = [sys.executable, __file__, "--engine", engine, "--model", args.model]
                cmd += [f"--{k}={getattr(args, k)}" for k in ("seq", "batch", "steps", "rank")]
                cmd += [f"--threads={args.threads}"]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                times[engine] += json.loads(out.strip().splitlines()[-1])
    finally:
        for b in busy:
            b.kill()
            b.wait()
    tok = args.batch * args.seq
    med = {k: tok / statistics.median(v) for k, v in times.items()}
    best = {k: tok / min(v) for k, v in times.items()}
    from _common import blas_info

    lines = [
        "| engine | training tokens/s, median (best) | step ms, median | vs torch + peft |",
        "|---|---:|---:|---:|",
    ]
    for k, label in (("ember", "ember QLoRA (Q4_1 base)"), ("torch", "torch + peft (float32)")):
        ms = statistics.median(times[k]) * 1e3
        lines.append(
            f"| {label} | {med[k]:.0f} ({best[k]:.0f}) | {ms:.0f} | {med[k] / med['torch']:.2f}x |"
        )
    lines += [
        "",
        f"{os.path.basename(args.model)}, LoRA r={args.rank} (alpha {2 * args.rank}) on "
        f"{', '.join(TARGETS)}, AdamW, batch {args.batch} x {args.seq} tokens, {args.threads} "
        f"threads, {args.steps} timed steps after a warm-up, {args.repeat} alternating rounds of "
        f"one process per engine. Load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} "
        f"at the end"
        + (f", with {args.busy} process(es) spinning on a core throughout" if args.busy else "")
        + f". Each engine's default OpenMP settings. BLAS: {blas_info()}.",
    ]
    table = "\n".join(lines)
    print(table)
    if not args.no_append:
        from _common import append

        append("LoRA training speed: ember QLoRA vs torch + peft (bench/finetune_speed.py)", table)


if __name__ == "__main__":
    main()
