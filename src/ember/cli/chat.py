"""`ember chat`: an interactive chat with history, /reset and streamed answers."""

from __future__ import annotations

import argparse
import sys
import time

from ember.cli._llm import add_model_and_sampling, load, sampling_from


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument("--once", metavar="MESSAGE", help="ask one question, print the answer and exit")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--stats", action="store_true", help="print tokens/s after each answer")
    add_model_and_sampling(p)


def answer(model, tok, history: list[dict], args, out=None) -> str:
    """Stream the assistant's reply to the conversation so far; returns it."""
    from ember.generation.generate import stream_text

    out = out or sys.stdout
    prompt = tok.apply_chat_template(history, add_generation_prompt=True)
    pieces, t0 = [], time.perf_counter()
    for piece in stream_text(
        model,
        tok,
        prompt,
        args.max_tokens,
        sampling_from(args),
        args.stop,
        add_special_tokens=False,
    ):
        pieces.append(piece)
        out.write(piece)
        out.flush()
    out.write("\n")
    text = "".join(pieces)
    if args.stats:
        n = len(tok.encode(text, add_special_tokens=False))
        print(f"[{n} tokens, {n / (time.perf_counter() - t0):.1f} tokens/s]", file=sys.stderr)
    return text


def run(args) -> int:
    """Chat until EOF or /exit."""
    model, tok = load(args)
    base = [{"role": "system", "content": args.system}] if args.system else []
    history = list(base)
    if args.once:
        history.append({"role": "user", "content": args.once})
        print(f"> {args.once}")
        answer(model, tok, history, args)
        return 0
    print("ember chat: type a message; /reset clears the history, /exit quits.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        msg = line.strip()
        if not msg:
            continue
        if msg in ("/exit", "/quit"):
            return 0
        if msg == "/reset":
            history = list(base)
            print("(history cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": msg})
        history.append({"role": "assistant", "content": answer(model, tok, history, args)})
