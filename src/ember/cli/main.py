"""`ember` entry point: dispatches to the sub-command modules.

Every failure ends with one line on stderr, ``ember <command>: error: ...``, and a non-zero
exit: 2 for a bad command line, 1 for anything else. ``--debug`` prints the traceback first.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from ember.errors import EmberError

COMMANDS = {
    "generate": "Generate text from a prompt (bundled SmolLM2 by default).",
    "chat": "Chat interactively (history, /reset, /save, /load, streaming).",
    "info": "Show a model's architecture, parameters, quantization and memory.",
    "convert": "Convert model files: pt/pth/bin -> safetensors, folder/safetensors <-> GGUF, GGUF -> GGUF.",
    "inspect": "Show a model file's format, metadata, tensor table, dtypes and sizes.",
    "embed": "Sentence embeddings of texts or stdin lines (bundled all-MiniLM-L6-v2 by default).",
    "transcribe": "Speech to text from a WAV file with Whisper (bundled tiny.en by default).",
    "codec": "EnCodec audio codes: `codec encode in.wav out.npz`, `codec decode in.npz out.wav`.",
    "classify": "Classify images: top-5 ImageNet labels (bundled EfficientNet-Lite0 by default).",
    "detect": "Detect objects in images with YOLOv8 (COCO boxes, printed and drawn).",
    "segment": "Segment the object at a point or in a box with SAM; the mask as a PNG.",
    "imagine": "Text to image with Stable Diffusion (a diffusers folder; DDIM or Euler).",
    "serve": "An OpenAI-compatible server: chat, completions, embeddings (the 'serve' extra).",
    "finetune": "LoRA / QLoRA fine-tuning on JSONL chat or prompt/completion records.",
    "list": "List the bundled models and where they are installed.",
}

DEBUG_HELP = "print the full traceback of an error"


class UsageError(Exception):
    """A command line argparse refused: (prog, message)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised (one line, printed by `main`) instead of exiting."""

    def error(self, message: str):
        """Raise the usage error instead of printing usage and exiting."""
        raise UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered."""
    import ember

    parser = Parser(prog="ember", description="ember: run, convert and serve models on the CPU.")
    parser.add_argument("--version", action="version", version=f"ember {ember.__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # also accepted after the command; SUPPRESS keeps it from resetting the global one
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        importlib.import_module(f"ember.cli.{name}").add_arguments(p)
    return parser


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def _fail(prog: str, message: str, status: int = 1) -> int:
    from ember.cli._text import echo

    echo(f"{prog}: error: {message}", err=True)
    return status


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so that the exit's flush stays silent."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _lenient_stdout() -> None:
    """Characters stdout's encoding lacks (an ASCII locale) become escapes, not an error."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdout, "errors", None) == "strict":
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            pass


def main(argv: list[str] | None = None) -> int:
    """Run the ember command line; returns the exit status."""
    from ember.cli._text import check_utf8, describe_error

    _lenient_stdout()
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"ember {_command_of(argv) or ''}".strip()
    try:
        for i, a in enumerate(argv, 1):
            check_utf8(a, f"argument {i}")
    except EmberError as e:
        return _fail(prog, str(e), 2)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        where = e.prog if e.prog != "ember" else prog
        return _fail(where, f"{e.message} (see '{where} --help')", 2)
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    if not args.command:
        build_parser().print_help()
        return 2
    prog = f"ember {args.command}"
    try:
        return importlib.import_module(f"ember.cli.{args.command}").run(args) or 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except (EmberError, OSError, MemoryError) as e:
        if args.debug:
            traceback.print_exc()
        return _fail(prog, describe_error(e))
    except Exception as e:  # noqa: BLE001 - the CLI reports every failure as one line
        if args.debug:
            traceback.print_exc()
            return _fail(prog, f"{type(e).__name__}: {describe_error(e)}")
        return _fail(
            prog,
            f"unexpected {type(e).__name__}: {describe_error(e)} "
            f"(run 'ember --debug {args.command} ...' for the traceback)",
        )


if __name__ == "__main__":
    sys.exit(main())
