"""`ember chat`: an interactive chat with history, streamed answers and a few /commands.

Answers are sampled as ollama samples by default (temperature 0.8, top-k 40, top-p 0.9, repeat
penalty 1.1); `--temperature 0` is greedy. When the conversation outgrows the model's context,
the oldest turns are dropped (the system prompt stays).
"""

from __future__ import annotations

import argparse
import json

from ember.cli._args import existing_file, non_empty, writable_file
from ember.cli._llm import (
    CHAT_SAMPLING,
    DEFAULT_MAX_TOKENS,
    add_model_and_sampling,
    budget,
    chat_ids,
    complete,
    context_of,
    load,
)
from ember.cli._text import describe_error, echo, read_line, read_text_arg, to_json
from ember.errors import EmberError

HELP = """commands:
  /help         this list
  /reset        forget the conversation (the system prompt stays)
  /save FILE    write the conversation to FILE (JSON)
  /load FILE    continue a conversation saved with /save
  /exit         quit (also /quit, /bye, or end of input)"""

ROLES = ("system", "user", "assistant")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register this command's options."""
    p.add_argument(
        "--once",
        metavar="MESSAGE",
        type=non_empty("the --once message"),
        help="ask one question ('-' reads it from stdin), print the answer and exit",
    )
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    add_model_and_sampling(p, CHAT_SAMPLING)


def read_conversation(path: str) -> list[dict]:
    """The messages of a conversation file written by /save (or a bare JSON list of them)."""
    p = existing_file(path, "/load")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise EmberError(f"/load {path!r}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise EmberError(f"/load {path!r}: not JSON ({e})") from None
    messages = doc.get("messages") if isinstance(doc, dict) else doc
    if not isinstance(messages, list):
        raise EmberError(f'/load {path!r}: expected {{"messages": [...]}}')
    for i, m in enumerate(messages):
        if not (
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
        ):
            raise EmberError(
                f'/load {path!r}: message {i} is not {{"role": system|user|assistant, '
                '"content": text}}'
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class Chat:
    """A conversation with one model: its history and how each answer is produced."""

    def __init__(self, model, tok, args, system: str | None) -> None:
        """Start with the system prompt (if any) as the only message."""
        self.model, self.tok, self.args = model, tok, args
        self.base = [{"role": "system", "content": system}] if system is not None else []
        self.history = list(self.base)
        self.context = context_of(model)

    def _fit(self) -> tuple[list[int], int]:
        """(ids of the history, tokens to generate), the oldest turns dropped to make room."""
        ids = chat_ids(self.tok, self.history, self.args.parse_special)
        wanted = self.args.max_tokens or min(DEFAULT_MAX_TOKENS, self.context // 2)
        dropped = 0
        while len(ids) + wanted > self.context:
            first = next(i for i, m in enumerate(self.history) if m["role"] != "system")
            if first == len(self.history) - 1:  # only the new message is left
                break
            del self.history[first]
            dropped += 1
            ids = chat_ids(self.tok, self.history, self.args.parse_special)
        if dropped:
            echo(f"(dropped the {dropped} oldest messages to fit the context)", err=True)
        return ids, budget(self.args.max_tokens, len(ids), self.context)

    def ask(self, message: str) -> str:
        """Stream the answer to `message`, keep both in the history; returns the answer."""
        self.history.append({"role": "user", "content": message})
        try:
            ids, max_tokens = self._fit()
        except EmberError:
            self.history.pop()
            raise
        try:
            c = complete(
                self.model,
                self.tok,
                ids,
                max_tokens,
                self.args,
                write=lambda s: echo(s, text=True, end=""),
            )
        except KeyboardInterrupt:  # Ctrl-C stops this answer; its question is forgotten
            self.history.pop()
            echo()
            raise
        echo()
        if self.args.stats:
            echo(c.stats_line(), err=True)
        self.history.append({"role": "assistant", "content": c.text})
        return c.text

    def command(self, line: str) -> bool:
        """Run a /command; False when it asks to quit."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/help":
            echo(HELP, err=True, text=True)
        elif name in ("/reset", "/clear"):
            self.history = list(self.base)
            echo("(history cleared)", err=True)
        elif name in ("/save", "/load") and not arg:
            raise EmberError(f"{name} needs a file name: {name} FILE")
        elif name == "/save":
            p = writable_file(arg, "/save")
            p.write_text(to_json({"messages": self.history}) + "\n", encoding="utf-8")
            echo(f"(saved {len(self.history)} messages to {p})", err=True)
        elif name == "/load":
            self.history = read_conversation(arg)
            if not any(m["role"] == "system" for m in self.history):
                self.history[:0] = self.base
            echo(f"(loaded {len(self.history)} messages from {arg})", err=True)
        else:
            raise EmberError(f"unknown command {name}; /help lists the commands")
        return True


def run(args) -> int:
    """Chat until end of input or /exit."""
    once = read_text_arg(args.once, "the --once message") if args.once is not None else None
    if once is not None and not once.strip():
        raise EmberError("the --once message is empty")
    system = read_text_arg(args.system, "--system") if args.system is not None else None
    model, tok = load(args)
    chat = Chat(model, tok, args, system)
    if once is not None:
        chat.ask(once)
        return 0
    echo("ember chat: type a message; /help lists the commands, /exit quits.", err=True)
    while True:
        line = read_line("> ")
        if line is None:
            return 0
        msg = line.strip()
        if not msg:
            continue
        try:
            if msg.startswith("/") and not chat.command(msg):
                return 0
            if not msg.startswith("/"):
                chat.ask(msg)
        except (EmberError, OSError) as e:  # one message failed; the conversation goes on
            echo(f"ember chat: error: {describe_error(e)}", err=True)
        except KeyboardInterrupt:  # during an answer: stop it (Ctrl-C at the prompt quits)
            echo("(answer stopped)", err=True)
