"""Tokenizers across formats: GGUF's `tokenizer.ggml.*` metadata <-> a Hugging Face tokenizer.json.

GGUF -> folder: ember already rebuilds a GGUF vocabulary as a `tokenizers` pipeline (the one
llama.cpp's tokenizer implements), so tokenizer.json is that pipeline written out, and
tokenizer_config.json / generation_config.json carry the special tokens and the chat template.

folder -> GGUF: a byte-level BPE tokenizer.json becomes a 'gpt2' vocabulary (tokens, merges, token
types) and a byte-fallback ▁ one a 'llama' (SentencePiece-style) vocabulary with scores from the
merge ranks. llama.cpp picks its split regexes by the `tokenizer.ggml.pre` name, so the name is
found by trying each known one and keeping the first whose ids equal the tokenizer.json's on a
probe text; when none does, or the tokenizer has another model, the conversion is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ember.errors import FormatError, UnsupportedError
from ember.io._common import read_json_object

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# Text that tells split regexes apart: contractions in both cases, digit runs of several lengths,
# whitespace runs and newlines, punctuation runs, accents, CJK, an emoji.
PROBE_TEXT = (
    "Hello world! It's I'VE we'll they'd don't... 1 12 123 1234 12345 3.14159 1,000,000\n"
    "\n\n  two  spaces   three\t\ttabs \r\n end.  \n"
    "naïve café Ünïcödé straße Ελληνικά Русский 東京タワー 서울 🚀🔥 ((x)) [a]{b} <c> a+b=c "
    "$100 @user #tag ~tilde ^caret |pipe `code` __init__ self.x_y-z\n"
    "    def f(x):\n        return x**2  # comment\n"
)

# names tried first, in this order, for each split set (the ones common models carry)
_PRE_PREFERRED = ("llama-bpe", "qwen2", "smollm", "gpt-2", "tekken", "gpt-4o", "default")


# --- GGUF -> Hugging Face files -------------------------------------------------------------------


def hf_tokenizer_files(metadata: Mapping[str, Any], context_length: int | None) -> dict[str, Any]:
    """{'tokenizer.json': str, 'tokenizer_config.json': dict, 'generation_config.json': dict}."""
    from ember.generation.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_metadata(metadata)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    config.update(tok.special_tokens_map)
    if context_length:
        config["model_max_length"] = int(context_length)
    if tok.chat_template:
        config["chat_template"] = tok.chat_template
    gen: dict[str, Any] = {}
    if tok.bos_token_id is not None:
        gen["bos_token_id"] = tok.bos_token_id
    eos = sorted(tok.eos_token_ids, key=lambda i: (i != tok.eos_token_id, i))
    if eos:
        gen["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if tok.pad_token_id is not None:
        gen["pad_token_id"] = tok.pad_token_id
    return {
        "tokenizer.json": tok.backend.to_str(pretty=True),
        "tokenizer_config.json": config,
        "generation_config.json": gen,
    }


# --- Hugging Face folder -> GGUF metadata ---------------------------------------------------------


def _token_content(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _merges(model: dict) -> list[str]:
    out = []
    for m in model.get("merges", []):
        if isinstance(m, str):
            out.append(m)
        elif isinstance(m, (list, tuple)) and len(m) == 2:
            out.append(f"{m[0]} {m[1]}")
        else:
            raise FormatError(f"tokenizer.json: merge {m!r} is not a pair")
        if out[-1].count(" ") != 1:
            raise UnsupportedError(
                f"tokenizer.json: merge {out[-1]!r} holds a space; a GGUF merge list cannot"
            )
    return out


def _kinds(pipeline: Any) -> set[str]:
    """Every component type named anywhere in a tokenizer.json section."""
    found: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("type"), str):
                found.add(x["type"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(pipeline)
    return found


def gguf_tokenizer_metadata(folder: Path, vocab_size: int) -> dict[str, Any]:
    """The `tokenizer.*` GGUF metadata of a Hugging Face folder's tokenizer (checked by encoding)."""
    import tokenizers

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FormatError(
            f"{folder}: no tokenizer.json; a GGUF needs the vocabulary (llama.cpp cannot load one "
            "without it)"
        )
    text = path.read_text(encoding="utf-8")
    try:
        spec = json.loads(text)
        reference = tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise FormatError(f"{path}: cannot be read as a tokenizer ({e})") from None
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise UnsupportedError(
            f"{path}: tokenizer model {model.get('type')!r} cannot be written as a GGUF "
            "vocabulary (ember writes BPE ones: byte-level 'gpt2' and byte-fallback 'llama')"
        )
    added = spec.get("added_tokens") or []
    ids = {int(i): t for t, i in model["vocab"].items()}
    special = {int(a["id"]) for a in added if a.get("special")}
    user = {int(a["id"]) for a in added if not a.get("special")}
    for a in added:
        ids[int(a["id"])] = a["content"]
    outside = sorted(i for i in ids if not 0 <= i < vocab_size)
    if outside:
        raise FormatError(
            f"{path}: token id {outside[-1]} is outside the model's vocabulary of {vocab_size} "
            "(config.json vocab_size, the embedding rows)"
        )
    n = vocab_size
    tokens = [ids.get(i, f"[PAD{i}]") for i in range(n)]
    types = [
        CONTROL if i in special else USER_DEFINED if i in user else NORMAL if i in ids else UNUSED
        for i in range(n)
    ]
    pieces = _kinds(spec.get("pre_tokenizer")) | _kinds(spec.get("decoder"))
    merges = _merges(model)
    meta: dict[str, Any] = {}
    if "ByteLevel" in pieces and not model.get("byte_fallback"):
        meta["tokenizer.ggml.model"] = "gpt2"
    elif model.get("byte_fallback") and ("Metaspace" in pieces or "Replace" in pieces):
        meta["tokenizer.ggml.model"] = "llama"
        rank = {}
        for r, m in enumerate(merges):
            rank.setdefault(m.replace(" ", "", 1), r)
        meta["tokenizer.ggml.scores"] = [
            -float(rank.get(t, len(merges))) if types[i] == NORMAL else 0.0
            for i, t in enumerate(tokens)
        ]
        unk = model.get("unk_token")
        for i, t in enumerate(tokens):  # byte and unknown tokens, added or not
            if types[i] != UNUSED and _BYTE_TOKEN.fullmatch(t):
                types[i] = BYTE
            elif t == unk:
                types[i] = UNKNOWN
        normalizer = json.dumps(spec.get("normalizer"))
        pre = spec.get("pre_tokenizer") or {}
        meta["tokenizer.ggml.add_space_prefix"] = '"Prepend"' in normalizer or pre.get(
            "prepend_scheme", "never"
        ) in ("first", "always")
    else:
        raise UnsupportedError(
            f"{path}: a BPE tokenizer with {sorted(pieces) or 'no'} pre-tokenizer/decoder steps "
            "matches no GGUF vocabulary type (byte-level 'gpt2' or byte-fallback 'llama')"
        )
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = types
    if meta["tokenizer.ggml.model"] == "gpt2":
        meta["tokenizer.ggml.merges"] = merges
    config = {
        **read_json_object(folder / "special_tokens_map.json", {}),
        **read_json_object(folder / "tokenizer_config.json", {}),
    }
    by_text = {t: i for i, t in enumerate(tokens)}
    for key, gguf_key in (
        ("bos_token", "bos"),
        ("eos_token", "eos"),
        ("unk_token", "unknown"),
        ("pad_token", "padding"),
    ):
        tid = by_text.get(_token_content(config.get(key)) or "")
        if tid is not None:
            meta[f"tokenizer.ggml.{gguf_key}_token_id"] = tid
    if "tokenizer.ggml.eos_token_id" not in meta:
        eos = read_json_object(folder / "generation_config.json", {}).get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) and eos else eos
        if isinstance(eos, int) and 0 <= eos < n:
            meta["tokenizer.ggml.eos_token_id"] = eos
    probe = reference.encode("a", add_special_tokens=True).ids
    bare = reference.encode("a", add_special_tokens=False).ids
    bos, eos = (meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos"))
    meta["tokenizer.ggml.add_bos_token"] = bos is not None and probe[:1] == [bos] != bare[:1]
    meta["tokenizer.ggml.add_eos_token"] = eos is not None and probe[-1:] == [eos] != bare[-1:]
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default", next(iter(named.values()), None))
    if isinstance(template, str) and template:
        meta["tokenizer.chat_template"] = template
    if meta["tokenizer.ggml.model"] == "gpt2":
        meta["tokenizer.ggml.pre"] = _find_pre(meta, reference, path, spec)
    else:
        _check_same_ids(meta, reference, path)
    return meta


def _ember_ids(meta: Mapping[str, Any], pre: str | None = None) -> list[int]:
    import warnings

    from ember.generation.tokenizer import Tokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = Tokenizer.from_gguf_metadata(meta, pre_tokenizer=pre)
    return tok.encode(PROBE_TEXT, add_special_tokens=False)


def _check_same_ids(meta: Mapping[str, Any], reference: Any, path: Path) -> None:
    want = reference.encode(PROBE_TEXT, add_special_tokens=False).ids
    if _ember_ids(meta) != want:
        raise UnsupportedError(
            f"{path}: the GGUF vocabulary built from it tokenizes differently from the "
            "tokenizer.json itself, so it is not written"
        )


def _split_patterns(pre_tokenizer: Any) -> tuple[str, ...]:
    """The regexes of the 'isolated' Split steps of a tokenizer.json pre-tokenizer, in order."""
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer]) if pre_tokenizer else []
    return tuple(
        st["pattern"]["Regex"]
        for st in steps
        if isinstance(st, dict)
        and st.get("type") == "Split"
        and st.get("behavior") == "Isolated"
        and isinstance(st.get("pattern"), dict)
        and "Regex" in st["pattern"]
    )


def _find_pre(meta: Mapping[str, Any], reference: Any, path: Path, spec: dict) -> str:
    """The llama.cpp pre-tokenizer name whose splits give the tokenizer.json's ids.

    Names whose regexes are the tokenizer.json's own (a folder ember wrote) are tried first.
    """
    from ember.generation.tokenizer import _PRE_TYPES, _SPLITS

    want = reference.encode(PROBE_TEXT, add_special_tokens=False).ids
    seen: set[tuple] = set()
    own = _split_patterns(spec.get("pre_tokenizer"))
    order = [n for n in _PRE_PREFERRED if n in _PRE_TYPES] + sorted(_PRE_TYPES)
    order = [n for n in order if _SPLITS[_PRE_TYPES[n][0]] == own] + order
    for name in order:
        split, ignore_merges, _ = _PRE_TYPES[name]
        if (split, ignore_merges) in seen:
            continue
        seen.add((split, ignore_merges))
        if _ember_ids(meta, name) == want:
            return name
    raise UnsupportedError(
        f"{path}: no llama.cpp pre-tokenizer splits text as this tokenizer.json does (tried "
        f"{len(seen)}), so a GGUF of it would tokenize differently; not written"
    )
