"""`ember generate "prompt"`: stream a completion to stdout.

As ollama's generate does, the prompt is sent as the user's turn of the model's chat template
when the model has one (so an instruct model answers it); --raw sends the text as it is.
"""

from __future__ import annotations

import argparse

from ember.cli._llm import (
    add_model_and_sampling,
    budget,
    chat_ids,
    complete,
    context_of,
    load,
    text_ids,
)
from ember.cli._text import echo, read_text_arg, to_json
from ember.errors import EmberError


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("prompt", help="the prompt; '-' reads it from stdin")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as it is, without the model's chat template",
    )
    mode.add_argument(
        "--chat",
        action="store_true",
        help="always use a chat template (ChatML when the model has none); "
        "the default uses the model's own when it has one",
    )
    p.add_argument("--system", metavar="TEXT", help="system prompt (with the chat template)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (text, token counts, timings) instead of streaming",
    )
    add_model_and_sampling(p)


def run(args) -> int:
    """Generate and stream to stdout."""
    from ember.models.hub import resolve

    prompt = read_text_arg(args.prompt, "the prompt")
    if not prompt:
        raise EmberError("the prompt is empty")
    if args.system is not None and args.raw:
        raise EmberError("--system needs the chat template; drop --raw")
    system = read_text_arg(args.system, "--system") if args.system is not None else None
    model, tok = load(args)
    templated = args.chat or (not args.raw and tok.chat_template is not None)
    if templated:
        messages = [{"role": "system", "content": system}] if system is not None else []
        ids = chat_ids(tok, [*messages, {"role": "user", "content": prompt}], args.parse_special)
    else:
        if system is not None:
            raise EmberError("--system needs a chat template and this model has none; use --chat")
        ids = text_ids(tok, prompt, args.parse_special)
    if not ids:
        raise EmberError("the prompt encodes to no tokens")
    max_tokens = budget(args.max_tokens, len(ids), context_of(model))
    if args.json:
        c = complete(model, tok, ids, max_tokens, args)
        echo(
            to_json(
                {
                    "model": str(resolve(args.model)),
                    "prompt": prompt,
                    "chat_template": templated,
                    **({"adapters": [a.describe() for a in args.lora]} if args.lora else {}),
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "usage": {
                        "prompt_tokens": c.prompt_tokens,
                        "completion_tokens": c.completion_tokens,
                    },
                    "timings": c.timings(),
                }
            )
        )
    else:
        c = complete(model, tok, ids, max_tokens, args, write=lambda s: echo(s, text=True, end=""))
        echo()
    if args.stats:
        echo(c.stats_line(), err=True)
    return 0
