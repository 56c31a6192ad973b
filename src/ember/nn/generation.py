"""The decode loop under ``model.generate``: batched prefill, cached decode, samplers, stop ids.

It needs only tensors, ``ember.nn.kv_cache`` and the samplers (``ember.nn.sampling``), so it sits
below the models: a causal LM inherits ``GenerationMixin`` for transformers' ``generate``.
The public home of ``generate_tokens`` / ``generate_ids`` is the generation package's
``generate`` module, which re-exports them and adds the text side (tokenizers, stop strings,
streaming).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

import ember
from ember.errors import ShapeError, UnsupportedError
from ember.nn.graph import DecodeGraphs
from ember.nn.kv_cache import KVCache
from ember.nn.sampling import Sampler, SamplingParams


def _as_batch(prompts) -> tuple[list[list[int]], bool]:
    if len(prompts) and isinstance(prompts[0], (int, np.integer)):
        return [list(map(int, prompts))], True
    return [list(map(int, p)) for p in prompts], False


def _fit_context(
    batch: list[list[int]], max_new: int, limit: int, truncate: bool
) -> list[list[int]]:
    longest = max(len(p) for p in batch)
    if longest + max_new <= limit:
        return batch
    if not truncate:
        raise ShapeError(
            f"prompt of {longest} tokens + max_new_tokens={max_new} exceeds the model's context of "
            f"{limit} tokens; shorten the prompt, lower max_new_tokens, or pass truncate=True "
            "(drops the oldest prompt tokens)"
        )
    keep = limit - max_new
    if keep <= 0:
        raise ShapeError(
            f"max_new_tokens={max_new} alone exceeds the model's context of {limit} tokens"
        )
    return [p[-keep:] for p in batch]


def generate_tokens(
    model,
    prompts: Sequence[int] | Sequence[Sequence[int]],
    max_new_tokens: int = 128,
    sampling: SamplingParams | None = None,
    stop_token_ids: Sequence[int] = (),
    truncate: bool = False,
    pad_token_id: int = 0,
) -> Iterator[list[int | None]]:
    """Yield, per step, one new token id per prompt (None once that prompt has stopped)."""
    params = sampling or SamplingParams()
    batch, _ = _as_batch(prompts)
    if any(len(p) == 0 for p in batch):
        raise ShapeError("generate: every prompt needs at least one token")
    cfg = model.config
    limit = int(getattr(cfg, "max_position_embeddings", 1 << 30))
    batch = _fit_context(batch, max_new_tokens, limit, truncate)
    b = len(batch)
    plen = max(len(p) for p in batch)
    ids = np.full((b, plen), pad_token_id, np.int64)
    mask = np.zeros((b, plen + max_new_tokens), bool)
    for i, p in enumerate(batch):
        ids[i, plen - len(p) :] = p
        mask[i, plen - len(p) : plen] = True
    padded = any(len(p) != plen for p in batch)
    cache = KVCache(
        cfg.num_hidden_layers, b, cfg.num_key_value_heads, plen + max_new_tokens, cfg.head_dim
    )
    samplers = [
        Sampler(
            SamplingParams(
                **{**params.__dict__, "seed": None if params.seed is None else params.seed + i}
            )
        )
        for i in range(b)
    ]
    history = [list(p) for p in batch]
    stops = set(int(s) for s in stop_token_ids)
    alive = [True] * b
    decode = DecodeGraphs(model, logits_to_keep=1)  # one-token steps, captured and replayed
    with ember.no_grad():
        logits = model(
            ember.from_numpy(ids),
            attention_mask=mask[:, :plen] if padded else None,
            cache=cache,
            logits_to_keep=1,
        )
        for step in range(max_new_tokens):
            rows = logits.numpy()[:, -1, :].astype(np.float32, copy=False)
            out: list[int | None] = []
            for i in range(b):
                if not alive[i]:
                    out.append(None)
                    continue
                tok = samplers[i](
                    rows[i], np.asarray(history[i]) if _needs_history(params) else None
                )
                history[i].append(tok)
                if tok in stops:
                    alive[i] = False
                out.append(tok)
            yield out
            if not any(alive) or step == max_new_tokens - 1:
                return
            nxt = np.array([[t if t is not None else pad_token_id] for t in out], np.int64)
            mask[:, plen + step] = True
            if padded:
                logits = model(
                    ember.from_numpy(nxt),
                    attention_mask=mask[:, : plen + step + 1],
                    cache=cache,
                    logits_to_keep=1,
                )
            else:
                logits = decode(nxt, cache)


def _needs_history(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)


# transformers' defaults, used by `generate_ids` where the caller passes nothing: 20 new tokens
# (within the context), top-k 50 when sampling.
_HF_NEW_TOKENS, _HF_TOP_K = 20, 50


def _ids_2d(value, name: str) -> np.ndarray:
    """A (batch, t) int64 array from a Tensor, numpy array or (nested) list."""
    if isinstance(value, ember.Tensor):
        value = value.numpy()
    array = np.asarray(value)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ShapeError(f"generate: {name} should be (batch, length), got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer) and array.dtype != bool:
        raise ShapeError(f"generate: {name} should hold integers, got {array.dtype}")
    return array.astype(np.int64, copy=False)


def _id_list(value) -> list[int]:
    """eos_token_id as a list: None, an int, or a list of ints."""
    if value is None:
        return []
    if isinstance(value, (int, np.integer)):
        return [int(value)]
    return [int(v) for v in value]


def generate_ids(
    model,
    input_ids,
    attention_mask=None,
    *,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    num_beams: int = 1,
    seed: int | None = None,
) -> ember.Tensor:
    """transformers' `model.generate(input_ids, ...)`: (batch, prompt + new) int64 ids.

    `max_new_tokens` (or `max_length`, prompt included) defaults to 20 new tokens. Greedy
    unless `do_sample=True` (then temperature 1, top-k 50, as transformers' defaults);
    rows that reach an eos id are filled with `pad_token_id` (default: the config's, else the
    first eos) until every row is done. `attention_mask` (or, without one, the pad id found in
    the prompt) marks left padding. `seed` makes sampling repeatable.
    """
    ids = _ids_2d(input_ids, "input_ids")
    b, width = ids.shape
    if b == 0 or width == 0:
        raise ShapeError(f"generate: input_ids of shape {ids.shape} has no tokens to continue")
    if num_beams != 1:
        raise UnsupportedError(f"generate: beam search (num_beams={num_beams}) is not supported")
    cfg = model.config
    eos = _id_list(eos_token_id if eos_token_id is not None else getattr(cfg, "eos_token_id", None))
    pad = pad_token_id if pad_token_id is not None else getattr(cfg, "pad_token_id", None)
    if attention_mask is not None:
        mask = _ids_2d(attention_mask, "attention_mask").astype(bool)
        if mask.shape != ids.shape:
            raise ShapeError(
                f"generate: attention_mask shape {mask.shape} differs from input_ids {ids.shape}"
            )
    elif pad is not None and pad not in eos and (ids == pad).any():
        mask = ids != pad  # as transformers infers it
    else:
        mask = np.ones_like(ids, dtype=bool)
    if pad is None:
        pad = eos[0] if eos else 0
    if max_new_tokens is None and max_length is not None:
        max_new_tokens = max_length - width
        if max_new_tokens < 1:
            raise ShapeError(
                f"generate: max_length={max_length} leaves no room after the {width}-token "
                "prompt; pass max_new_tokens"
            )
    elif max_new_tokens is None:
        limit = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        max_new_tokens = max(min(_HF_NEW_TOKENS, limit - width), 1)
    if max_new_tokens < 1:
        raise ShapeError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    penalty = 1.0 if repetition_penalty is None else repetition_penalty
    if do_sample:
        temperature = 1.0 if temperature is None else temperature
        if not temperature > 0:
            raise ValueError(f"generate: do_sample needs temperature > 0, got {temperature}")
        params = SamplingParams(
            temperature=temperature,
            top_k=_HF_TOP_K if top_k is None else top_k,
            top_p=1.0 if top_p is None else top_p,
            min_p=0.0 if min_p is None else min_p,
            repetition_penalty=penalty,
            seed=seed,
        )
    else:
        params = SamplingParams(repetition_penalty=penalty)
    prompts = [row[keep].tolist() for row, keep in zip(ids, mask)]
    if any(not p for p in prompts):
        raise ShapeError("generate: a row of attention_mask has no real token")
    steps = [
        [pad if t is None else t for t in step]
        for step in generate_tokens(model, prompts, max_new_tokens, params, eos, pad_token_id=pad)
    ]
    new = np.array(steps, np.int64).reshape(len(steps), b).T
    return ember.from_numpy(np.ascontiguousarray(np.concatenate([ids, new], axis=1)))


class GenerationMixin:
    """transformers' ``generate`` on a causal LM.

    The class needs a ``config`` (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``,
    optionally ``max_position_embeddings``, ``eos_token_id``, ``pad_token_id``) and a forward
    ``(ids, attention_mask=, cache=, logits_to_keep=)`` returning (batch, t, vocab) logits.
    """

    def generate(self, input_ids, attention_mask=None, **kwargs) -> ember.Tensor:
        """transformers' `generate`: prompt + new ids, (batch, length); see `generate_ids`."""
        return generate_ids(self, input_ids, attention_mask, **kwargs)
