"""`ember imagine "prompt" -o out.png --model FOLDER`: text to image with Stable Diffusion."""

from __future__ import annotations

import argparse
import time

from ember.cli._args import existing_dir, finite_float, int_at_least, writable_file
from ember.cli._progress import add_progress_flag, bar
from ember.cli._text import echo, read_text_arg
from ember.errors import EmberError

NO_MODEL = (
    "--model FOLDER is required (ember ships no Stable Diffusion weights): {layout}; "
    "e.g. a diffusers save_pretrained() of stable-diffusion-v1-5 or a distilled SD"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("prompt", help="what to draw ('-' reads it from stdin)")
    p.add_argument("-o", "--output", required=True, help="the PNG (or any Pillow format) to write")
    p.add_argument("--model", help="a diffusers Stable Diffusion folder (model_index.json, ...)")
    p.add_argument("--steps", type=int_at_least(1), default=25, help="denoising steps (default 25)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="noise seed (default 0)")
    p.add_argument(
        "--guidance",
        type=finite_float(0.0, 50.0),
        default=7.5,
        help="classifier-free guidance scale; <= 1 turns it off (default 7.5)",
    )
    p.add_argument("--negative-prompt", default=None, help="what to steer away from")
    p.add_argument(
        "--scheduler",
        choices=("ddim", "euler"),
        default=None,
        help="sampler (default: the folder's when it is DDIM or Euler, else DDIM)",
    )
    size = int_at_least(8)
    p.add_argument("--height", type=size, help="pixels, a multiple of 8 (default: the model's)")
    p.add_argument("--width", type=size, help="pixels, a multiple of 8 (default: the model's)")
    p.add_argument("--threads", type=int_at_least(1), help="CPU threads (default: all cores)")
    p.add_argument(
        "--no-optimize",
        action="store_true",
        help="skip packing the weights: about half the memory, slower steps",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="timings on stderr")
    add_progress_flag(p)


def run(args: argparse.Namespace) -> int:
    """Check the arguments, load the folder, denoise, decode and save the image."""
    import ember
    from ember.models.diffusion.pipeline import LAYOUT, StableDiffusionPipeline

    prompt = read_text_arg(args.prompt, "the prompt")
    negative = None if args.negative_prompt is None else read_text_arg(args.negative_prompt, "--negative-prompt")  # fmt: skip
    out = writable_file(args.output, "-o")
    if args.model is None:
        raise EmberError(NO_MODEL.format(layout=LAYOUT))
    for name in ("height", "width"):
        v = getattr(args, name)
        if v is not None and v % 8:
            raise EmberError(f"--{name} must be a multiple of 8, got {v}")
    try:
        from PIL import Image
    except ImportError:
        raise EmberError("writing the image needs Pillow: pip install 'ember[vision]'") from None
    folder = existing_dir(args.model, "--model")
    if args.threads:
        ember.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pipe = StableDiffusionPipeline.from_pretrained(
        folder, scheduler=args.scheduler, optimize=not args.no_optimize
    )
    t_load = time.perf_counter() - t0
    progress = bar(args.steps, desc="denoising", unit="step", enabled=args.progress)
    t0 = time.perf_counter()
    try:
        result = pipe(
            prompt, negative_prompt=negative, height=args.height, width=args.width,
            num_inference_steps=args.steps, guidance_scale=args.guidance, seed=args.seed,
            callback=lambda i, n: progress.update(1),
        )  # fmt: skip
    finally:
        progress.close()
    t_run = time.perf_counter() - t0
    (image,) = result.images
    Image.fromarray(image).save(out)
    h, w = image.shape[:2]
    echo(f"{w}x{h} image, {args.steps} steps, seed {args.seed} -> {args.output}")
    if args.verbose:
        echo(f"load {t_load:.2f} s, generate {t_run:.2f} s ({t_run / args.steps:.2f} s/step)", err=True)  # fmt: skip
    return 0
