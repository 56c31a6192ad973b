"""`ember` entry point: dispatches to the sub-command modules."""

from __future__ import annotations

import argparse
import importlib
import sys

from ember.errors import EmberError

COMMANDS = {
    "generate": "Generate text from a prompt (bundled SmolLM2 by default).",
    "chat": "Chat interactively (history, /reset, streaming).",
    "info": "Show a model's architecture, parameters, quantization and memory.",
    "convert": "Convert model files: pt/pth/bin -> safetensors, safetensors <-> GGUF, GGUF -> folder.",
    "inspect": "Show a model file's format, metadata, tensor table, dtypes and sizes.",
    "embed": "Sentence embeddings of texts or stdin lines (bundled all-MiniLM-L6-v2 by default).",
    "transcribe": "Speech to text from a WAV file with Whisper (bundled tiny.en by default).",
    "classify": "Classify images: top-5 ImageNet labels (bundled EfficientNet-Lite0 by default).",
    "serve": "An OpenAI-compatible server: chat, completions, embeddings (the 'serve' extra).",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="ember", description="ember: run, convert and serve models on the CPU."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(f"ember.cli.{name}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ember command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return importlib.import_module(f"ember.cli.{args.command}").run(args) or 0
    except EmberError as e:
        print(f"ember {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
