"""Incremental detokenization for streaming generated text.

`StreamDecoder` takes token ids one at a time and returns the text they add. A character whose
UTF-8 bytes span several tokens is held back until it is complete, and the pieces joined equal
`tokenizer.decode(all_ids)` exactly once `flush()` has returned the tail.

How: the text of a new token is the difference between decoding a short window of recent ids
with and without it. The window starts at the last point where text was emitted, so decoders
that treat the first token specially (the SentencePiece leading-space strip, WordPiece's "no
space before the first word") see the same context as in a full decode. Text is held while it
ends in U+FFFD (an incomplete character) or, for byte-fallback vocabularies, while the last id
is a `<0xNN>` byte token, whose group of bytes is decoded as one (special tokens skipped in
decoding do not end such a group, so they wait too).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class _Decodes(Protocol):
    """What StreamDecoder needs from a tokenizer."""

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str: ...


class StreamDecoder:
    """Feed token ids one at a time; get text pieces that never split a character."""

    def __init__(self, tokenizer: _Decodes, *, skip_special_tokens: bool = False) -> None:
        """Stream-decode with `tokenizer.decode`."""
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # Ids after which no text can be final yet: byte-fallback tokens, and (when skipped)
        # special tokens, which add nothing and may sit inside a run of byte tokens.
        hold = set(getattr(tokenizer, "_hold_ids", ()))
        if skip_special_tokens:
            hold |= set(getattr(tokenizer, "all_special_ids", ()))
        self._hold = frozenset(hold)
        self._ids: list[int] = []  # ids from the window start on
        self._prefix = 0  # window start: ids before it are context already emitted
        self._read = 0  # ids before this have been emitted

    def put(self, token_id: int) -> str:
        """Add one id; return the text it completes ('' while a character is incomplete)."""
        token_id = int(token_id)
        self._ids.append(token_id)
        if token_id in self._hold:
            return ""
        return self._emit(final=False)

    def extend(self, ids: Iterable[int]) -> str:
        """Add several ids; return the text they complete."""
        return "".join(self.put(i) for i in ids)

    def flush(self) -> str:
        """Return all text still held back (an incomplete character comes out as U+FFFD)."""
        return self._emit(final=True)

    def reset(self) -> None:
        """Forget all ids, to start a new stream."""
        self._ids, self._prefix, self._read = [], 0, 0

    def _emit(self, final: bool) -> str:
        """Emit the text of ids past the read offset, if it is complete (or `final`)."""
        if self._read == len(self._ids):
            return ""
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], skip_special_tokens=self._skip)
        text = decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if not final and (len(text) <= len(before) or text.endswith("\ufffd")):
            return ""
        if not text.startswith(before):  # not expected for any decoder ember builds
            if not final:
                return ""
            common = 0
            while common < min(len(text), len(before)) and text[common] == before[common]:
                common += 1
            before = before[:common]
        piece = text[len(before) :]
        # Slide the window: the ids just emitted become the context for the next ones.
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        return piece
