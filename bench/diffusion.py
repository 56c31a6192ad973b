"""Stable Diffusion (random weights): ember vs diffusers (torch), one UNet step and a whole pipeline.

diffusers builds a random StableDiffusionPipeline of the chosen --size (``small``: SD 1.x's
layout, four levels, narrower, 256 px; ``tiny``: the tests' config; ``sd15``: the real
860M-parameter UNet shape at --height/--width, slow on a small CPU), saves it with
save_pretrained, and ember loads that folder. Both run one UNet call on the CFG batch (2
latents) and the whole pipeline (--steps DDIM steps, guidance 7.5, VAE decode to a uint8 image
on both sides) from the same starting latents; engines take turns, one untimed call each
first, and the median and best of --repeat timed calls are printed with their ratio, the
outputs' largest difference (UNet output; image in uint8 levels) and, from one more untimed
run, the final latents'.
--profile prints where ember's UNet time goes (cProfile, by function); --no-optimize loads
ember's pipeline without optimize_for_inference. Nothing is appended to bench/RESULTS.md.
On a shared 2-core machine use --threads 1 (and --clock cpu): two threads per engine on cores
that other processes also use make both sides' times swing by 5-10x from call to call.

    .venv/bin/python bench/diffusion.py [--size small] [--steps 10] [--threads 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

SIZES = {
    "small": dict(
        unet=dict(block_out_channels=(64, 128, 256, 256), cross_attention_dim=256, sample_size=32,
                  attention_head_dim=8, layers_per_block=2),
        vae=dict(block_out_channels=(32, 64, 128, 128), layers_per_block=2, norm_num_groups=32,
                 down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4),
        text=dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_hidden_layers=4),
    ),
    "sd15": dict(
        unet=dict(cross_attention_dim=768, sample_size=64),
        vae=dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32,
                 down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4),
        text=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12),
    ),
}  # fmt: skip


def build(folder: Path, size: str):
    """Save a random pipeline of the given size into folder; returns diffusers' pipeline."""
    from tests.models.diffusion import tiny

    if size == "tiny":
        return tiny.save_pipeline(folder)
    cfg = SIZES[size]
    return tiny.save_pipeline(folder, unet=cfg["unet"], vae={**tiny.VAE, **cfg["vae"]}, text=cfg["text"], max_tokens=77)  # fmt: skip


def main() -> None:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("tiny", "small", "sd15"), default="small")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="where ember's UNet time goes")
    ap.add_argument("--no-optimize", action="store_true", help="no optimize_for_inference")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: process CPU time (with --threads 1, steady on a machine others share)",
    )
    args = ap.parse_args()

    import torch
    from _common import set_threads

    import ember
    from ember.models.diffusion import StableDiffusionPipeline

    set_threads(args.threads)
    with tempfile.TemporaryDirectory() as d:
        ref = build(Path(d), args.size)
        ref.set_progress_bar_config(disable=True)
        t0 = time.perf_counter()
        pipe = StableDiffusionPipeline.from_pretrained(d, optimize=not args.no_optimize)
        t_load = time.perf_counter() - t0
    h, w = args.height or pipe.default_size()[0], args.width or pipe.default_size()[1]
    f = pipe.vae_scale_factor
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((1, 4, h // f, w // f)).astype(np.float32)
    x2 = np.concatenate([lat, lat])
    ctx = rng.standard_normal((2, pipe.tokenizer.model_max_length, pipe.text_encoder.config.hidden_size)).astype(np.float32)  # fmt: skip
    prompt, kw = "a photo of an astronaut riding a horse on mars", dict(height=h, width=w, num_inference_steps=args.steps, guidance_scale=7.5)  # fmt: skip

    def unet_ember():
        with ember.no_grad():
            return pipe.unet(x2, 981, ctx).numpy()

    def unet_torch():
        with torch.no_grad():
            return ref.unet(torch.from_numpy(x2), 981, torch.from_numpy(ctx)).sample.numpy()

    def pipe_ember():  # both sides decode: the images, as uint8
        return pipe(prompt, latents=lat, **kw).images.astype(np.float32)

    def pipe_torch():
        with torch.no_grad():
            img = ref(prompt, latents=torch.from_numpy(lat), output_type="np", **kw).images
        return np.round(img * 255.0).astype(np.float32)

    def latents_diff() -> tuple[float, float]:
        with torch.no_grad():
            want = ref(prompt, latents=torch.from_numpy(lat), output_type="latent", **kw).images.numpy()  # fmt: skip
        got = pipe(prompt, latents=lat, output_type="latent", **kw).latents
        return float(np.abs(got - want).max()), float(np.abs(want).max())

    if args.profile:
        import cProfile
        import pstats

        unet_ember()
        prof = cProfile.Profile()
        prof.runcall(unet_ember)
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = []
    for what, engines, repeat in (("UNet call (CFG batch 2)", {"ember": unet_ember, "torch": unet_torch}, args.repeat),
                                  (f"pipeline, {args.steps} DDIM steps + decode", {"ember": pipe_ember, "torch": pipe_torch}, max(1, args.repeat - 1))):  # fmt: skip
        times = {n: [] for n in engines}
        outs = {}
        for i in range(repeat + 1):
            for name, fn in engines.items():
                t0 = clock()
                outs[name] = fn()
                if i:
                    times[name].append(clock() - t0)
        diff = float(np.abs(outs["ember"] - outs["torch"]).max())
        rows.append((what, times, diff, float(np.abs(outs["torch"]).max())))
    lat_diff, lat_top = latents_diff()
    n_params = sum(p.numel() for p in pipe.unet.parameters())
    print(f"Stable Diffusion '{args.size}' (UNet {n_params / 1e6:.1f}M parameters, random weights), "
          f"{w}x{h} px ({w // f}x{h // f} latents), {args.threads} threads, "
          f"{'not ' if args.no_optimize else ''}optimized, {args.clock} clock; ember load {t_load * 1e3:.0f} ms")  # fmt: skip
    print("| what | ember median (best) s | torch median (best) s | ember / torch | max abs diff (max abs) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for what, times, diff, top in rows:
        e, t = times["ember"], times["torch"]
        print(f"| {what} | {statistics.median(e):.3f} ({min(e):.3f}) | {statistics.median(t):.3f} "
              f"({min(t):.3f}) | {statistics.median(e) / statistics.median(t):.2f}x | {diff:.1e} ({top:.1f}) |")  # fmt: skip
    print(f"final latents (output_type='latent', untimed): max abs diff {lat_diff:.1e} (max abs {lat_top:.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
