"""CLIP's byte-level BPE tokenizer from a diffusers ``tokenizer/`` folder, on the `tokenizers` library.

A Stable Diffusion folder keeps CLIP's vocabulary as ``vocab.json`` + ``merges.txt`` (words end in
``</w>``), with ``special_tokens_map.json`` and ``tokenizer_config.json`` naming the start, end and
padding tokens and ``model_max_length`` (77). Text is NFC-normalised, runs of whitespace become
one space, it is lower-cased, split into contractions, letter runs, single digits and punctuation
runs, and each piece is byte-level BPE-encoded. ``encode`` pads and truncates to a fixed length
as diffusers' pipelines ask for (``padding="max_length", truncation=True``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

from ember.errors import FormatError
from ember.io._common import read_json_object

# CLIP's pre-tokenizer: contractions, letter runs, single digits, runs of other non-space symbols
_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"


def _special(config: dict, name: str, default: str) -> str:
    value = config.get(name, default)
    if isinstance(value, dict):
        value = value.get("content", default)
    return value if isinstance(value, str) else default


class CLIPTokenizer:
    """Text -> fixed-length rows of CLIP token ids (start, text, end, padding)."""

    def __init__(self, backend: tokenizers.Tokenizer, bos_token: str, eos_token: str,
                 pad_token: str, model_max_length: int = 77) -> None:  # fmt: skip
        """Wrap a `tokenizers.Tokenizer` that maps text to ids without special tokens."""
        self.backend = backend
        ids = {}
        for role, tok in (("bos", bos_token), ("eos", eos_token), ("pad", pad_token)):
            tid = backend.token_to_id(tok)
            if tid is None:
                raise FormatError(
                    f"CLIP tokenizer: the {role} token {tok!r} is not in the vocabulary"
                )
            ids[role] = tid
        self.bos_token_id, self.eos_token_id, self.pad_token_id = ids["bos"], ids["eos"], ids["pad"]
        if model_max_length < 2:
            raise FormatError(f"CLIP tokenizer: model_max_length {model_max_length} leaves no room")
        self.model_max_length = model_max_length

    @classmethod
    def from_files(cls, vocab: str | os.PathLike, merges: str | os.PathLike, **kw) -> CLIPTokenizer:
        """Build from CLIP's vocab.json and merges.txt; keyword arguments go to ``__init__``."""
        try:
            table = json.loads(Path(vocab).read_text(encoding="utf-8"))
            lines = Path(merges).read_text(encoding="utf-8").splitlines()
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FormatError(f"CLIP tokenizer: cannot read {vocab} / {merges} ({e})") from None
        if not isinstance(table, dict) or not all(isinstance(v, int) for v in table.values()):
            raise FormatError(f"{vocab}: expected a JSON object of token -> id")
        pairs = []
        for n, line in enumerate(lines, 1):
            if not line.strip() or (n == 1 and line.startswith("#version")):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise FormatError(f"{merges}:{n}: expected two symbols, got {line[:60]!r}")
            pairs.append((parts[0], parts[1]))
        unk = kw.get("eos_token", "<|endoftext|>")
        backend = tokenizers.Tokenizer(
            models.BPE(table, pairs, unk_token=unk, end_of_word_suffix="</w>", fuse_unk=False)
        )
        backend.normalizer = normalizers.Sequence(
            [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
        )
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT), behavior="removed", invert=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
        backend.decoder = decoders.ByteLevel()
        # as in transformers, the special tokens' text in a prompt is that token (SD 2.x's "!" too)
        roles = ("bos_token", "eos_token", "pad_token")
        specials = list(dict.fromkeys(t for t in (kw.get(r) for r in roles) if t in table))
        backend.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in specials])
        return cls(backend, **kw)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> CLIPTokenizer:
        """A diffusers ``tokenizer/`` folder: vocab.json + merges.txt (or tokenizer.json) + configs."""
        p = Path(path)
        config = {
            **read_json_object(p / "special_tokens_map.json", {}),
            **read_json_object(p / "tokenizer_config.json", {}),
        }
        kw = dict(
            bos_token=_special(config, "bos_token", "<|startoftext|>"),
            eos_token=_special(config, "eos_token", "<|endoftext|>"),
            pad_token=_special(config, "pad_token", "<|endoftext|>"),
        )
        length = config.get("model_max_length", 77)
        # transformers writes a huge number when the length is unknown: CLIP's is 77
        kw["model_max_length"] = length if isinstance(length, int) and 0 < length <= 1 << 16 else 77  # fmt: skip
        if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
            return cls.from_files(p / "vocab.json", p / "merges.txt", **kw)
        if (p / "tokenizer.json").is_file():
            try:
                backend = tokenizers.Tokenizer.from_file(str(p / "tokenizer.json"))
            except Exception as e:  # tokenizers raises a bare Exception on a bad file
                raise FormatError(f"{p / 'tokenizer.json'}: cannot be read ({e})") from None
            backend.post_processor = None
            backend.no_truncation()
            backend.no_padding()
            return cls(backend, **kw)
        raise FormatError(f"{p}: expected CLIP's vocab.json and merges.txt (or a tokenizer.json)")

    def tokenize(self, text: str) -> list[int]:
        """The text's ids, without start/end tokens, untruncated."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode(self, texts: str | list[str], max_length: int | None = None) -> np.ndarray:
        """(len(texts), max_length) int64 ids: start, text (truncated), end, then padding."""
        n = self.model_max_length if max_length is None else max_length
        rows = []
        for text in [texts] if isinstance(texts, str) else list(texts):
            ids = [self.bos_token_id] + self.tokenize(text)[: n - 2] + [self.eos_token_id]
            rows.append(ids + [self.pad_token_id] * (n - len(ids)))
        return np.array(rows, dtype=np.int64).reshape(len(rows), n)

    def decode(self, ids) -> str:
        """Text of ids (start, end and padding dropped)."""
        skip = {self.bos_token_id, self.eos_token_id, self.pad_token_id}
        text = self.backend.decode([int(i) for i in ids if int(i) not in skip])
        return text.replace("</w>", " ").strip()


__all__ = ["CLIPTokenizer"]
