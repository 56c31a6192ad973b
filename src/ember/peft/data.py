"""Fine-tuning data: JSONL records -> token ids with labels on the assistant's tokens only.

A line is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (the chat format of OpenAI and
TRL) or ``{"prompt": ..., "completion": ...}`` (one user turn and its answer). The model's chat
template renders the conversation; only the tokens each assistant turn adds (its text and the
template's end-of-turn) are trained on, the rest get the label -100 (ignored by the loss).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember.errors import EmberError, ShapeError

IGNORE = -100


class DataError(EmberError, ValueError):
    """A record of a fine-tuning file that cannot be used (the message names its line)."""


@dataclass
class Example:
    """One encoded record: its ids, its labels (-100 where no loss), and where it came from."""

    ids: list[int]
    labels: list[int]
    line: int


def read_jsonl(path: str | os.PathLike, on_error: str = "error") -> list[tuple[int, dict]]:
    """(line number, record) of every non-blank line; a bad line raises or, with on_error='skip',
    is reported with a warning and left out."""
    if on_error not in ("error", "skip"):
        raise ValueError(f"on_error must be 'error' or 'skip', got {on_error!r}")
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                _check_record(rec)
            except (json.JSONDecodeError, DataError) as e:
                msg = f"{path}:{n}: {e.msg if isinstance(e, json.JSONDecodeError) else e}"
                if on_error == "error":
                    raise DataError(msg) from None
                warnings.warn(f"skipped {msg}", stacklevel=2)
                continue
            out.append((n, rec))
    if not out:
        raise DataError(f"{path}: no usable records")
    return out


def _check_record(rec) -> None:
    if not isinstance(rec, dict):
        raise DataError(f"expected a JSON object, got {type(rec).__name__}")
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError("'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise DataError(f"messages[{i}] needs a string 'role'")
            if not isinstance(m.get("content"), str):
                raise DataError(f"messages[{i}] needs a string 'content'")
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError("no assistant message to learn from")
    elif "prompt" in rec or "completion" in rec:
        for k in ("prompt", "completion"):
            if not isinstance(rec.get(k), str):
                raise DataError(f"'{k}' must be a string")
    else:
        raise DataError("expected 'messages' or 'prompt' and 'completion'")


def messages_of(rec: dict) -> list[dict]:
    """The conversation of a record (prompt/completion become a user turn and its answer)."""
    if "messages" in rec:
        return [{"role": m["role"], "content": m["content"]} for m in rec["messages"]]
    return [
        {"role": "user", "content": rec["prompt"]},
        {"role": "assistant", "content": rec["completion"]},
    ]


def encode_record(tok, rec: dict, line: int = 0) -> Example:
    """Token ids of the whole rendered conversation, labelled on the assistant turns only."""
    msgs = messages_of(rec)
    ids = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=True)
    labels = [IGNORE] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=True)
        upto = tok.apply_chat_template(msgs[: i + 1], add_generation_prompt=False, tokenize=True)
        if ids[: len(upto)] != upto or upto[: len(before)] != before:
            raise DataError(
                f"line {line}: the chat template does not render this conversation turn by turn "
                "(an earlier turn's tokens change when later ones are added)"
            )
        labels[len(before) : len(upto)] = upto[len(before) :]
    return Example(list(ids), labels, line)


def encode_file(
    tok, path: str | os.PathLike, max_length: int, *, on_error: str = "error",
    on_long: str = "truncate",
) -> list[Example]:  # fmt: skip
    """Every record of a JSONL file, encoded; records over max_length tokens are truncated (with
    a warning), skipped (on_long='skip') or refused (on_long='error')."""
    if on_long not in ("truncate", "skip", "error"):
        raise ValueError(f"on_long must be 'truncate', 'skip' or 'error', got {on_long!r}")
    out = []
    for line, rec in read_jsonl(path, on_error):
        try:
            ex = encode_record(tok, rec, line)
        except DataError as e:
            if on_error == "error":
                raise DataError(f"{path}:{e}") from None
            warnings.warn(f"skipped {path}:{e}", stacklevel=2)
            continue
        if len(ex.ids) > max_length:
            what = f"{path}:{line}: {len(ex.ids)} tokens, more than --max-length {max_length}"
            if on_long == "error":
                raise ShapeError(what)
            if on_long == "skip":
                warnings.warn(f"skipped {what}", stacklevel=2)
                continue
            ex = Example(ex.ids[:max_length], ex.labels[:max_length], line)
            if all(t == IGNORE for t in ex.labels[1:]):
                warnings.warn(
                    f"skipped {what}: no assistant token left after truncation", stacklevel=2
                )
                continue
            warnings.warn(f"truncated {what}", stacklevel=2)
        out.append(ex)
    if not out:
        raise DataError(f"{path}: no usable records")
    return out


def batches(examples: Sequence[Example], batch_size: int, pad_id: int = 0) -> list[tuple]:
    """(ids, labels) int64 Tensors per batch, right-padded (pads are labelled -100)."""
    import ember

    out = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        width = max(len(e.ids) for e in chunk)
        ids = np.full((len(chunk), width), pad_id, np.int64)
        labels = np.full((len(chunk), width), IGNORE, np.int64)
        for r, e in enumerate(chunk):
            ids[r, : len(e.ids)] = e.ids
            labels[r, : len(e.labels)] = e.labels
        out.append((ember.from_numpy(ids), ember.from_numpy(labels)))
    return out


def causal_lm_loss(logits, labels):
    """Mean cross-entropy of each next token whose label is not -100.

    The labels move one place left (the last position gets -100) rather than the logits one
    place right: ``logits[:, :-1]`` would be copied by the reshape of a batch of several rows,
    and its backward would allocate a second logits-sized array to put the gradient back into;
    this way the (batch, seq, vocab) logits are used as they are. The same loss and gradients.
    """
    import ember
    from ember.nn import functional as F

    if logits.ndim != 3 or labels.ndim != 2 or tuple(logits.shape[:2]) != tuple(labels.shape):
        raise ShapeError(
            f"causal_lm_loss: logits (batch, seq, vocab) and labels (batch, seq), got "
            f"{tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    lab = labels.detach().cpu().numpy()
    shifted = np.full(lab.shape, IGNORE, np.int64)
    shifted[:, :-1] = lab[:, 1:]
    v = logits.shape[-1]
    return F.cross_entropy(
        logits.reshape(-1, v),
        ember.from_numpy(shifted.reshape(-1)).to(labels.device),
        ignore_index=IGNORE,
    )


__all__ = [
    "IGNORE",
    "DataError",
    "Example",
    "batches",
    "causal_lm_loss",
    "encode_file",
    "encode_record",
    "messages_of",
    "read_jsonl",
]
