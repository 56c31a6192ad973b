"""What merging a LoRA adapter into quantized weights does to it (accuracy only, no timings).

On the bundled SmolLM2-135M-Instruct Q4_1 (or --model), an adapter applied unmerged (exact:
``scale * B(A(x)) * alpha / r`` in float32 beside the quantized kernels) is compared with the
same adapter merged into the weights (``merge_adapter()``: each adapted weight dequantized, the
update added, requantized to its block type). Reported per adapter:

- effect: |unmerged - base|, how far the adapter moves the logits;
- merge error: |merged - unmerged|, how far requantizing moves them from the exact adapted model;
- their ratio, and at how many positions the top token of merged and unmerged agree.

The adapters: random (seeded) r=8 on every linear layer, B at a few magnitudes, and --adapter
DIR_OR_GGUF for a trained one (e.g. examples/finetune_lora.py's). Prints a markdown table.

    .venv/bin/python bench/lora_merge.py [--adapter finetune-example/adapter.gguf]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import numpy as np  # noqa: E402

import ember  # noqa: E402
from ember.models import AutoModelForCausalLM  # noqa: E402
from ember.models.hub import resolve  # noqa: E402
from ember.peft import LoraConfig, get_peft_model, load_adapter  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _logits(model, ids: np.ndarray) -> np.ndarray:
    with ember.no_grad():
        return model(ember.tensor(ids)).numpy()[0]


def _random_adapter(path, std: float, seed: int):
    model = AutoModelForCausalLM.from_pretrained(path)
    pm = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=ALL, init_lora_weights=False)
    )
    rng = np.random.default_rng(seed)
    for k, p in pm.named_parameters():
        if "lora_" in k:
            s = std if "lora_B" in k else p.shape[1] ** -0.5
            p._data = (rng.standard_normal(p.shape) * s).astype(np.float32)
    return pm.eval()


def _row(name: str, pm, base: np.ndarray, ids: np.ndarray) -> str:
    exact = _logits(pm, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "requantizes it (rounding error)": that is measured
        pm.merge_adapter()
    merged = _logits(pm, ids)
    pm.unmerge_adapter()
    effect = float(np.linalg.norm(exact - base))
    err = float(np.linalg.norm(merged - exact))
    agree = float(np.mean(merged.argmax(-1) == exact.argmax(-1)))
    return f"| {name} | {effect:.1f} | {err:.1f} | {err / effect:.2f} | {agree:.0%} |"


def main() -> None:
    """Measure and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="GGUF file or folder (default: the bundled SmolLM2 Q4_1)")
    p.add_argument("--adapter", help="also a trained adapter (peft folder or LoRA GGUF)")
    p.add_argument("--tokens", type=int, default=64, help="prompt length (random ids)")
    args = p.parse_args()
    path = resolve(args.model)
    ids = np.random.default_rng(0).integers(100, 40000, (1, args.tokens))
    base = _logits(AutoModelForCausalLM.from_pretrained(path), ids)
    print(f"{path.name}, logits at {args.tokens} positions of a random prompt\n")
    print("| adapter | effect | merge error | error / effect | top-1 agree |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for std in (0.002, 0.01, 0.05):
        name = f"random r=8 all-linear, B std {std}"
        print(_row(name, _random_adapter(path, std, 0), base, ids), flush=True)
    if args.adapter:
        pm = load_adapter(AutoModelForCausalLM.from_pretrained(path), args.adapter)
        print(_row(os.path.basename(args.adapter.rstrip("/")), pm, base, ids))


if __name__ == "__main__":
    main()
