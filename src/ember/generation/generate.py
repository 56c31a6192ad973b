"""The generate loop: batched prefill, cached decode, samplers, stop tokens/strings, streaming.

The token loop (``generate_tokens``, and ``generate_ids`` behind ``model.generate``) lives below
the models in ``ember.nn.generation`` and is re-exported here; this module adds the text side:
tokenizers, stop strings and streaming.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ember.nn.generation import generate_ids, generate_tokens
from ember.nn.sampling import SamplingParams

__all__ = ["generate", "generate_ids", "generate_tokens", "stream_text"]


def _stop_split(text: str, stops: Sequence[str]) -> tuple[str, bool, int]:
    """(text to keep, hit a stop string, chars to hold back because they may start one)."""
    for s in stops:
        i = text.find(s)
        if i >= 0:
            return text[:i], True, 0
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return text, False, hold


def stream_text(
    model,
    tokenizer,
    prompt: str | Sequence[int],
    max_new_tokens: int = 128,
    sampling: SamplingParams | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] | None = None,
    add_special_tokens: bool = True,
    truncate: bool = False,
    parse_special: bool = False,
) -> Iterator[str]:
    """Yield pieces of generated text as they come (never half a character, never a stop string).

    A str prompt is user text: control-token strings in it stay text unless
    `parse_special=True` (a `ChatPrompt` from `apply_chat_template` keeps its scaffolding).
    """
    ids = (
        tokenizer.encode(prompt, add_special_tokens=add_special_tokens, parse_special=parse_special)
        if isinstance(prompt, str)
        else list(prompt)
    )
    stops_ids = tokenizer.eos_token_ids if stop_token_ids is None else stop_token_ids
    dec = tokenizer.stream(skip_special_tokens=True)
    text, sent = "", 0
    for (tok,) in generate_tokens(
        model, ids, max_new_tokens, sampling, stops_ids, truncate=truncate
    ):
        if tok is None or tok in stops_ids:
            break
        text += dec.put(tok)
        keep, hit, hold = _stop_split(text, stop)
        end = len(keep) if hit else len(keep) - hold
        if end > sent:
            yield keep[sent:end]
            sent = end
        if hit:
            return
    text += dec.flush()
    keep, _, _ = _stop_split(text, stop)
    if len(keep) > sent:
        yield keep[sent:]


def generate(
    model,
    tokenizer,
    prompt: str | Sequence[str],
    max_new_tokens: int = 128,
    sampling: SamplingParams | None = None,
    stop: Sequence[str] = (),
    *,
    parse_special: bool = False,
    **kwargs,
) -> str | list[str]:
    """Generate the continuation of one prompt (a str) or of several (a list of str, batched).

    Control-token strings in the prompts are text unless `parse_special=True`.
    """
    if isinstance(prompt, str):
        return "".join(
            stream_text(
                model,
                tokenizer,
                prompt,
                max_new_tokens,
                sampling,
                stop,
                parse_special=parse_special,
                **kwargs,
            )
        )
    batch = [tokenizer.encode(p, parse_special=parse_special) for p in prompt]
    stops_ids = set(tokenizer.eos_token_ids)
    outs: list[list[int]] = [[] for _ in batch]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for step in generate_tokens(
        model, batch, max_new_tokens, sampling, stops_ids, pad_token_id=pad, **kwargs
    ):
        for i, t in enumerate(step):
            if t is not None and t not in stops_ids:
                outs[i].append(t)
    texts = [tokenizer.decode(o, skip_special_tokens=True) for o in outs]
    return [_stop_split(t, stop)[0] for t in texts]
