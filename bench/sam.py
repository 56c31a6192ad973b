"""SAM: ember vs transformers' SamModel (torch) on random weights, image encoder and mask decoder.

Two configs: the tests' tiny one (64 x 64 input, 8 x 8 grid) and SAM ViT-B's (SamConfig()'s
default encoder: 768 wide, 12 layers, windows of 14 and 4 global layers, 1024 x 1024 input, 64 x 64
grid). transformers builds the model with every parameter drawn at a scale where it matters,
saves it with save_pretrained, and ember loads that folder. Timed: the image encoder on one
preprocessed image, and the prompt encoder + mask decoder on its cached embeddings for one point
(multimask). Each engine runs one untimed call, then --repeat timed calls in a block (see
_race); the median and best of the timed calls are printed with each side's ratio and the largest
output difference. The tiny config is a per-op overhead figure: run it with --threads 1 on a
shared machine, where a 2-thread parallel region waits for a descheduled worker on every op.
Nothing is appended to bench/RESULTS.md.

    .venv/bin/python bench/sam.py [--threads 2] [--repeat 3] [--only tiny|vit-b]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402


def _configs() -> dict:
    from tests.models.vision.sam_tiny import TINY

    return {"tiny": TINY, "vit-b": {}}


def _race(fns: dict, repeat: int) -> tuple[dict, dict]:
    """Times (name -> list of seconds) and last outputs: each fn's calls in a block of their own.

    Alternating engines call by call costs both: numba's and torch's OpenMP workers spin after
    each parallel region and take the cores from the other side (the tiny config ran 5-100x
    slower on both sides that way).
    """
    times = {n: [] for n in fns}
    outs = {}
    for name, fn in fns.items():
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            outs[name] = fn()
            if i:
                times[name].append(time.perf_counter() - t0)
    return times, outs


def _row(what: str, times: dict, diff: float) -> str:
    e, t = times["ember"], times["torch"]
    return (f"| {what} | {statistics.median(e) * 1e3:.1f} ({min(e) * 1e3:.1f}) | "
            f"{statistics.median(t) * 1e3:.1f} ({min(t) * 1e3:.1f}) | "
            f"{statistics.median(e) / statistics.median(t):.2f}x | {diff:.1e} |")  # fmt: skip


def _one(name: str, cfg: dict, repeat: int) -> list[str]:
    """The table rows of one config."""
    import torch
    from tests.models.vision.sam_tiny import randomize
    from transformers import SamConfig
    from transformers import SamModel as TorchSam

    import ember
    from ember.models.vision.sam import SamModel

    ref = randomize(TorchSam(SamConfig(**cfg)).eval())
    size = ref.config.vision_config.image_size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    pts = (rng.random((1, 1, 1, 2)) * size).astype(np.float32)
    labels = np.ones((1, 1, 1), np.int64)
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        t0 = time.perf_counter()
        em = SamModel.from_pretrained(d)
        t_load = time.perf_counter() - t0
    xt = torch.from_numpy(x)

    def torch_encode():
        with torch.no_grad():
            return ref.get_image_embeddings(xt).numpy()

    def ember_encode():
        with ember.no_grad():
            return em.get_image_embeddings(x).numpy()

    times, outs = _race({"ember": ember_encode, "torch": torch_encode}, repeat)
    enc_diff = float(np.abs(outs["ember"] - outs["torch"]).max())
    emb = outs["torch"]
    embt, pt, lt = torch.from_numpy(emb), torch.from_numpy(pts), torch.from_numpy(labels)

    def torch_decode():
        with torch.no_grad():
            o = ref(image_embeddings=embt, input_points=pt, input_labels=lt)
        return o.pred_masks.numpy()

    def ember_decode():
        with ember.no_grad():
            o = em(image_embeddings=emb, input_points=pts, input_labels=labels)
        return o.pred_masks.numpy()

    dtimes, douts = _race({"ember": ember_decode, "torch": torch_decode}, repeat)
    dec_diff = float(np.abs(douts["ember"] - douts["torch"]).max())
    scale = float(np.abs(douts["torch"]).max())
    v = ref.config.vision_config
    label = f"{name} ({v.hidden_size} wide, {v.num_hidden_layers} layers, {size} px)"
    return [
        _row(f"{label} image encoder", times, enc_diff),
        _row(f"{label} prompt + mask decoder (max logit {scale:.0f})", dtimes, dec_diff),
        f"| {label} ember load | {t_load * 1e3:.0f} ms | | | |",
    ]


def main() -> None:
    """Run both configs and print one table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=("tiny", "vit-b"))
    args = ap.parse_args()

    from _common import set_threads

    set_threads(args.threads)
    rows = []
    for name, cfg in _configs().items():
        if not args.only or name == args.only:
            rows += _one(name, cfg, args.repeat)
    print(f"SAM, random weights, {args.threads} threads, {args.repeat} timed calls each")
    print("| step | ember median (best) ms | torch median (best) ms | ember / torch | max diff |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
