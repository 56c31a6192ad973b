"""`ember generate "prompt"`: stream a completion to stdout."""

from __future__ import annotations

import argparse
import sys

from ember.cli._llm import add_model_and_sampling, load, sampling_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("prompt", help="the text to continue")
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    add_model_and_sampling(p)


def run(args) -> int:
    """Generate and stream to stdout."""
    from ember.generation.generate import stream_text

    model, tok = load(args)
    prompt = args.prompt
    add_special = True
    if args.chat:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True
        )
        add_special = False
    for piece in stream_text(
        model,
        tok,
        prompt,
        args.max_tokens,
        sampling_from(args),
        args.stop,
        add_special_tokens=add_special,
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
