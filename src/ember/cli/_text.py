"""Terminal-safe output and strict UTF-8 input for every `ember` command.

Names, metadata, labels and generated text come from files, and a file can hold escape
sequences (colours, cursor moves, OSC 52 clipboard writes, bidi overrides). Everything the CLI
prints goes through `echo`, which shows such characters as visible escapes (``\\x1b``,
``\\u202e``) instead of sending them to the terminal.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any, TextIO

from ember.errors import EmberError

# C0 and C1 controls, DEL, bidi marks/overrides/isolates, line/paragraph separators, and lone
# surrogates (bytes that were not UTF-8, decoded with surrogateescape)
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_UNSAFE_TEXT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff]"
)


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(value: Any) -> str:
    """`str(value)` on one line: every control or bidi character shown as an escape."""
    return _UNSAFE.sub(_escape, str(value))


def safe_text(value: Any) -> str:
    """Like `safe`, but keeps newlines and tabs (for generated or transcribed text)."""
    return _UNSAFE_TEXT.sub(_escape, str(value))


def echo(
    line: Any = "",
    *,
    err: bool = False,
    text: bool = False,
    end: str = "\n",
    file: TextIO | None = None,
) -> None:
    """Print one escaped line to stdout (stderr with err=True); text=True keeps newlines/tabs."""
    out = file if file is not None else (sys.stderr if err else sys.stdout)
    out.write((safe_text(line) if text else safe(line)) + end)
    out.flush()


def to_json(obj: Any) -> str:
    """One line of ASCII JSON (controls and non-ASCII escaped; NaN and infinities as null)."""
    try:
        return json.dumps(obj, ensure_ascii=True, allow_nan=False, default=_json_default)
    except ValueError:  # a non-finite float somewhere
        return json.dumps(_finite(obj), ensure_ascii=True, allow_nan=False, default=_json_default)


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (bytes, bytearray)):
        return o.decode("utf-8", "backslashreplace")
    if isinstance(o, (tuple, set, frozenset)):
        return list(o)
    return str(o)


def describe_error(e: BaseException) -> str:
    """The one-line message of an error (an OSError as 'FILE: reason')."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename is not None else e.strerror
    if isinstance(e, MemoryError):
        return f"out of memory{f' ({e})' if str(e) else ''}"
    return str(e) or type(e).__name__


def check_utf8(value: str, what: str) -> str:
    """`value` unchanged, or an EmberError when it holds bytes that were not valid UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start : e.end].encode("utf-8", "surrogateescape")
        raise EmberError(
            f"{what} is not valid UTF-8 (bytes {bad!r} at character {e.start})"
        ) from None
    return value


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EmberError(
            f"{what} is not valid UTF-8 (byte {data[e.start : e.start + 1]!r} at offset {e.start})"
        ) from None


def read_stdin(what: str = "stdin") -> str:
    """All of stdin, decoded as strict UTF-8."""
    buf = getattr(sys.stdin, "buffer", None)
    if buf is not None:
        return _decode(buf.read(), what)
    return check_utf8(sys.stdin.read(), what)


def read_line(prompt: str = "") -> str | None:
    """One line of stdin without its newline (None at EOF); a prompt is shown on a terminal."""
    if sys.stdin.isatty():
        try:
            return check_utf8(input(prompt), "the line typed")
        except EOFError:
            return None
        except UnicodeDecodeError:
            raise EmberError("the line typed is not valid UTF-8") from None
    buf = getattr(sys.stdin, "buffer", None)
    raw = buf.readline() if buf is not None else sys.stdin.readline()
    if not raw:
        return None
    line = _decode(raw, "a line of stdin") if isinstance(raw, bytes) else raw
    return check_utf8(line.rstrip("\r\n"), "a line of stdin")


def read_text_arg(value: str, what: str) -> str:
    """A text argument, or all of stdin when it is '-' (one trailing newline dropped)."""
    if value == "-":
        text = read_stdin(f"{what} read from stdin")
        return text.removesuffix("\n").removesuffix("\r")
    return check_utf8(value, what)
