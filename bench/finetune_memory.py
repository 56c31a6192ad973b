"""Peak resident memory of QLoRA fine-tuning against inference, on the same quantized model.

Each side runs in a fresh process (so neither inherits the other's heap), on the bundled
SmolLM2-135M-Instruct Q4_1 GGUF unless --model says another:

- inference: load, then ``--steps`` full-sequence forwards of one (1, --seq) batch, no grad;
- fine-tuning: load, ``get_peft_model`` (LoRA r=--rank on --targets; the base weights stay
  Q4_1 QTensors), AdamW, ``--steps`` forward + backward + step on the same batch; once keeping
  every layer's activations, once with gradient checkpointing (each decoder layer keeps only its
  input and is recomputed in backward, ``ember.peft.prepare_model_for_kbit_training``). The loss
  is ``ember.peft.data.causal_lm_loss(logits, ids)``, the one ``ember finetune`` trains with:
  every next token of the batch. A last row runs the same loss written by hand as
  ``F.cross_entropy(logits[0, :-1], ids[0, 1:])`` (what this bench ran before), whose
  backward puts the gradient back into a second logits-sized array.

Peak RSS is the kernel's high-water mark (VmHWM). No timings are reported. Prints a markdown
table; --append adds it to bench/RESULTS.md.

    .venv/bin/python bench/finetune_memory.py [--seq 128] [--steps 3] [--rank 8] [--append]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(args) -> dict:
    """Run one side in this process; returns its memory figures."""
    import numpy as np

    import ember
    from ember.models import AutoModelForCausalLM
    from ember.nn import functional as F

    ember.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    loaded = _status_mb("VmRSS")
    vocab = model.config.vocab_size
    ids = ember.tensor(np.random.default_rng(0).integers(0, vocab, (1, args.seq)))
    extra = {}
    if args.child == "inference":
        model.eval()
        with ember.no_grad():
            for _ in range(args.steps):
                model(ids)
    else:
        from ember.peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
        from ember.peft.data import causal_lm_loss

        if args.child in ("finetune_ckpt", "finetune_ckpt_sliced"):
            prepare_model_for_kbit_training(model)

        pm = get_peft_model(
            model,
            LoraConfig(
                r=args.rank, lora_alpha=2 * args.rank, target_modules=args.targets.split(",")
            ),
        )
        trainable, total = pm.get_nb_trainable_parameters()
        extra = {"trainable": trainable, "total": total}
        params = [p for p in pm.parameters() if p.requires_grad]
        opt = ember.optim.AdamW(params, lr=1e-4)
        for _ in range(args.steps):
            logits = pm(ids)
            if args.child == "finetune_ckpt_sliced":
                loss = F.cross_entropy(logits[0, :-1], ids[0, 1:])
            else:
                loss = causal_lm_loss(logits, ids)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del logits, loss
        quantized = sum(
            type(m.base_layer.weight).__name__ == "QTensor" for _, m in pm.base_model.lora_layers()
        )
        extra["adapted_layers_still_quantized"] = quantized
    return {"after_load_mb": loaded, "peak_mb": _status_mb("VmHWM"), **extra}


def main() -> None:
    """Run both sides in subprocesses and print (and maybe append) the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a .gguf or HF folder (default: bundled SmolLM2)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default=TARGETS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--append", action="store_true", help="append the table to bench/RESULTS.md")
    p.add_argument(
        "--child",
        choices=["inference", "finetune", "finetune_ckpt", "finetune_ckpt_sliced"],
        help=argparse.SUPPRESS,
    )
    args = p.parse_args()
    if args.model is None:
        from ember.models.hub import default_model_path

        args.model = str(default_model_path())
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = {}
    for side in ("inference", "finetune", "finetune_ckpt", "finetune_ckpt_sliced"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--model", args.model,
               "--seq", str(args.seq), "--steps", str(args.steps), "--rank", str(args.rank),
               "--targets", args.targets, "--threads", str(args.threads)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows[side] = json.loads(out.strip().splitlines()[-1])
    inf, ft, ck = rows["inference"], rows["finetune"], rows["finetune_ckpt"]
    sl = rows["finetune_ckpt_sliced"]
    table = "\n".join(
        [
            f"model: {os.path.basename(args.model)}; batch 1 x {args.seq} tokens, {args.steps} "
            f"steps; LoRA r={args.rank} on {args.targets} ({ft['trainable']:,} trainable of "
            f"{ft['total']:,}; {ft['adapted_layers_still_quantized']} adapted layers still "
            "quantized)",
            "",
            "| run | RSS after load (MiB) | peak RSS (MiB) |",
            "| --- | ---: | ---: |",
            f"| inference (no grad) | {inf['after_load_mb']:.0f} | {inf['peak_mb']:.0f} |",
            f"| QLoRA fine-tuning | {ft['after_load_mb']:.0f} | {ft['peak_mb']:.0f} "
            f"({ft['peak_mb'] / inf['peak_mb']:.2f}x) |",
            f"| QLoRA fine-tuning, gradient checkpointing | {ck['after_load_mb']:.0f} | "
            f"{ck['peak_mb']:.0f} ({ck['peak_mb'] / inf['peak_mb']:.2f}x) |",
            f"| the same, loss as `cross_entropy(logits[0, :-1], ids[0, 1:])` | "
            f"{sl['after_load_mb']:.0f} | {sl['peak_mb']:.0f} "
            f"({sl['peak_mb'] / inf['peak_mb']:.2f}x) |",
        ]
    )
    print(table)
    if args.append:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _common import append

        append("QLoRA fine-tuning memory vs inference (bench/finetune_memory.py)", table)


if __name__ == "__main__":
    main()
