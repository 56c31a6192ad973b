"""Structured output: JSON decoding constrained token by token with llguidance.

`grammar_for(kind, schema)` turns a `response_format` into an llguidance grammar (checked, no
tokenizer needed); `token_table(tokenizer, n_vocab, eos_ids)` builds llguidance's view of an
ember tokenizer once per model (about half a second for a 49k vocabulary, then cached); and a
`Matcher` follows one sequence: `mask(logits)` sets every token the grammar forbids next to
-inf, `advance(token)` consumes the sampled token and says when the JSON is complete.

llguidance is imported here only, and only when a request asks for structured output.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from ember.errors import EmberError

# Compact separators and no free whitespace by default: a small model given the choice tends to
# pad JSON with newlines until max_tokens. A schema's "x-guidance" key overrides these.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_lock = threading.Lock()
_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class GrammarError(EmberError):
    """A response_format that cannot be turned into a grammar (bad or unsupported schema)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:
        raise GrammarError(
            "structured output needs the llguidance package: pip install 'ember[serve]'"
        ) from e
    return llguidance


def available() -> bool:
    """Whether the grammar library is installed."""
    try:
        _llguidance()
    except GrammarError:
        return False
    return True


def grammar_for(kind: str, schema: dict | None = None) -> str:
    """The llguidance grammar for `json_object` (any object) or `json_schema` (`schema`)."""
    llg = _llguidance()
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind != "json_schema":
        raise GrammarError(f"unknown structured output type {kind!r}")
    if not isinstance(schema, dict):
        raise GrammarError(f"the schema must be a JSON object, got {type(schema).__name__}")
    try:
        text = json.dumps(schema, allow_nan=False)
        grammar = llg.LLMatcher.grammar_from_json_schema(text, defaults=_JSON_OPTIONS)
    except (TypeError, ValueError) as e:
        raise GrammarError(f"the schema is not valid JSON: {e}") from e
    error = llg.LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(f"the schema cannot be used for structured output: {error}")
    return grammar


def token_table(tokenizer: Any, n_vocab: int, eos_ids: Iterable[int]) -> Any:
    """llguidance's `LLTokenizer` for an ember tokenizer: built once per model, then cached."""
    llg = _llguidance()
    eos = sorted({int(i) for i in eos_ids})
    key = (int(n_vocab), tuple(eos))
    with _lock:
        per_tok = _tables.setdefault(tokenizer, {})
        table = per_tok.get(key)
        if table is None:
            backend = getattr(tokenizer, "backend", tokenizer)  # ember Tokenizer or tokenizers'
            table = llg.LLTokenizer(backend.to_str(), n_vocab=int(n_vocab), eos_token=eos or None)
            per_tok[key] = table
    return table


class Matcher:
    """One sequence's position in its grammar: masks logits, consumes sampled tokens."""

    def __init__(self, table: Any, grammar: str) -> None:
        """A matcher at the start of `grammar` (from `grammar_for`) over `table`."""
        llg = _llguidance()
        self._m = llg.LLMatcher(table, grammar, log_level=0)
        if self._m.is_error():
            raise GrammarError(f"the schema cannot be used: {self._m.get_error()}")
        self.n_vocab = int(table.vocab_size)

    def allowed(self) -> np.ndarray:
        """A bool array over the vocabulary: the tokens the grammar allows next."""
        bits = np.frombuffer(self._m.compute_bitmask(), np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.n_vocab].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` with every token the grammar forbids next set to -inf."""
        allowed = self.allowed()
        n = logits.shape[-1]
        if allowed.size < n:  # logits wider than the tokenizer (padded embeddings)
            allowed = np.concatenate([allowed, np.zeros(n - allowed.size, bool)])
        return np.where(allowed[:n], logits, np.float32(-np.inf)).astype(logits.dtype, copy=False)

    def advance(self, token: int) -> bool:
        """Consume `token`; True when the grammar is complete (nothing but EOS may follow)."""
        if not self._m.consume_token(int(token)):
            raise GrammarError(f"the grammar refused token {token}: {self._m.get_error()}")
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        """Whether the output so far is a complete match (it may still go on)."""
        return self._m.is_accepting()
