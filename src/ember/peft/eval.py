"""Held-out scoring for fine-tuning: greedy exact match of the assistant's answer.

A record (the format of ``ember.peft.data``) is split at its last assistant turn: the turns
before it, rendered with the model's chat template and its generation prompt, are the prompt;
that turn's text is the reference. The model answers greedily; a record counts when the answer
ends (an end-of-turn / end-of-sequence token) within a few tokens past the reference's length
and its text, stripped of surrounding whitespace, equals the reference's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ember.peft.data import DataError, messages_of, read_jsonl

SLACK = 8  # tokens the answer may run past the reference's length before it is cut off


@dataclass
class ExactMatch:
    """The score of one pass over held-out records, with every answer."""

    hits: int
    total: int
    seconds: float
    answers: list[str] = field(default_factory=list)
    matched: list[bool] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        """Share of records answered exactly (0 to 1)."""
        return self.hits / self.total if self.total else 0.0

    def summary(self) -> dict:
        """accuracy, hits, total and seconds, for a metrics file."""
        return {
            "exact_match": self.accuracy,
            "hits": self.hits,
            "total": self.total,
            "seconds": round(self.seconds, 3),
        }


def split_record(rec: dict) -> tuple[list[dict], str]:
    """(the turns before the last assistant turn, that turn's text) of a record."""
    msgs = messages_of(rec)
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None:
        raise DataError("no assistant message to score against")
    if last == 0:
        raise DataError("the assistant turn has no prompt before it")
    return msgs[:last], msgs[last]["content"]


def read_eval_file(path: str | os.PathLike, on_error: str = "error") -> list[dict]:
    """The records of a held-out JSONL file (each checked by ``split_record``)."""
    out = []
    for line, rec in read_jsonl(path, on_error):
        try:
            split_record(rec)
        except DataError as e:
            raise DataError(f"{path}:{line}: {e}") from None
        out.append(rec)
    return out


def exact_match(
    model, tok, records: Sequence[dict], *, batch_size: int = 16, slack: int = SLACK
) -> ExactMatch:
    """Greedy answers to each record's prompt, scored by exact match with its reference."""
    from ember.autograd import no_grad
    from ember.generation.generate import generate_tokens

    start = time.perf_counter()
    stops = sorted(tok.eos_token_ids)
    jobs = []
    for rec in records:
        prompt, ref = split_record(rec)
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        jobs.append((list(ids), ref.strip(), len(tok.encode(ref, add_special_tokens=False))))
    order = sorted(range(len(jobs)), key=lambda i: len(jobs[i][0]))  # less padding per batch
    answers: list[str] = [""] * len(jobs)
    matched = [False] * len(jobs)
    pad = getattr(tok, "pad_token_id", None)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with no_grad():
            for b in range(0, len(order), batch_size):
                rows = order[b : b + batch_size]
                budget = max(jobs[i][2] for i in rows) + slack
                out: list[list[int]] = [[] for _ in rows]
                ended = [False] * len(rows)
                steps = generate_tokens(
                    model, [jobs[i][0] for i in rows], budget, stop_token_ids=stops,
                    pad_token_id=pad if pad is not None else 0,
                )  # fmt: skip
                for step in steps:
                    for r, t in enumerate(step):
                        if t is None or ended[r]:
                            continue
                        if t in tok.eos_token_ids:
                            ended[r] = True
                        else:
                            out[r].append(t)
                for r, i in enumerate(rows):
                    answers[i] = tok.decode(out[r], skip_special_tokens=True).strip()
                    matched[i] = ended[r] and answers[i] == jobs[i][1]
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    return ExactMatch(sum(matched), len(jobs), time.perf_counter() - start, answers, matched)


__all__ = ["SLACK", "ExactMatch", "exact_match", "read_eval_file", "split_record"]
