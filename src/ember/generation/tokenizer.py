"""Text tokenizers for ember's language models, built on the `tokenizers` library.

`Tokenizer` wraps a `tokenizers.Tokenizer` and adds what generation needs: the special tokens
(bos/eos/unk/pad), the set of token ids that end a generation, the chat template, and a
streaming detokenizer. It is built from a `tokenizer.json`, from a Hugging Face model directory,
or from a GGUF file's metadata, which has no tokenizer.json: there the vocabulary, merges, token
types and the pre-tokenizer name are turned into the `tokenizers` pipeline that llama.cpp's own
tokenizer implements, so ember and llama.cpp give the same ids for the same file.

    tok = Tokenizer.from_pretrained("path/to/model")   # a folder, a GGUF file or tokenizer.json
    ids = tok.encode("Hello")
    text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    batch = tok(["a b", "c"], padding=True)           # input_ids + attention_mask, as transformers

Control tokens. Text is user text: `encode` tokenizes `<|im_start|>`, `<s>`, `[INST]` ... as the
characters they are (llama.cpp's `parse_special=false`, `tokenizers`' `encode_special_tokens`),
so a message cannot forge a turn. Only a chat template's own scaffolding becomes control ids:
`apply_chat_template` returns a `ChatPrompt` that remembers which control-token strings came from
the conversation. `parse_special=True` parses control tokens everywhere (transformers' default).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.generation.chat import ChatPrompt

if TYPE_CHECKING:
    from ember.generation.streaming import StreamDecoder

# GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1, 2, 3, 4, 5, 6,
)  # fmt: skip

# Tokens that end a turn or a text in the chat formats ember knows (the list llama.cpp uses to
# find end-of-generation tokens by their text).
END_OF_TURN_TOKENS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<|eom_id|>", "<EOT>", "_<EOT>", "<end_of_utterance>", "<|return|>", "<|call|>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)  # fmt: skip
# These end a document, so they stop generation whether or not the chat template names them.
_END_OF_TEXT_TOKENS = ("<|endoftext|>", "<|end_of_text|>")

_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")

# --- GGUF pre-tokenizers: llama.cpp's `tokenizer.ggml.pre` names and the regexes it splits with.
# Each regex splits every piece the previous one produced (matches and gaps both kept).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd"
    "\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4"
    "\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
    "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
    "\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "digits-gpt2": (r"\p{N}", _GPT2),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "deepseek-llm": (
        "[\r\n]",
        rf"\s?[{_DEEPSEEK_LETTERS}]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "deepseek-v3": (
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "bloom": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", r"\p{N}"),
    "tekken": (_TEKKEN,),
    "gpt-4o": (_GPT4O,),
    "seed-coder": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
}
# name -> (split set, ignore_merges, add_bos default); names as llama.cpp spells them.
_PRE_TYPES: dict[str, tuple[str, bool, bool]] = {}
for _names, _entry in (
    ("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", ("llama3", True, True)),
    ("dbrx smaug-bpe glm4 chatglm-bpe", ("llama3", False, False)),
    ("deepseek-llm", ("deepseek-llm", False, False)),
    ("deepseek-coder", ("deepseek-coder", False, False)),
    ("deepseek-v3 hunyuan-dense", ("deepseek-v3", False, False)),
    ("falcon", ("falcon", False, False)),
    (
        "starcoder refact command-r smollm codeshell exaone minerva-7b",
        ("digits-gpt2", False, False),
    ),
    (
        "gpt2 gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum jina-v1-en"
        " jina-v2-code roberta-bpe mpt olmo jais trillion granite-docling exaone4",
        ("gpt2", False, False),
    ),
    ("qwen2 deepseek-r1-qwen kormo megrez stablelm2 hunyuan grok-2", ("qwen2", False, False)),
    ("poro-chat bloom gpt3-finnish", ("bloom", False, False)),
    ("viking", ("viking", False, False)),
    ("tekken", ("tekken", True, True)),
    ("gpt-4o llama4 minimax-m2", ("gpt-4o", False, False)),
    ("seed-coder", ("seed-coder", False, False)),
    ("bailingmoe bailingmoe2 llada-moe", ("bailingmoe", False, False)),
    ("default", ("default", False, False)),
):
    for _name in _names.split():
        _PRE_TYPES[_name] = _entry
# Known to llama.cpp, but split by hand-written code there that no regex here reproduces.
_UNSUPPORTED_PRE = frozenset({"kimi-k2", "afmoe", "superbpe", "chameleon"})


def _byte_level_pre_tokenizer(
    splits: Sequence[str], vocab: Mapping[str, int]
) -> pre_tokenizers.PreTokenizer:
    """Split on each regex in turn (keeping matches and gaps), then map bytes to BPE symbols.

    A byte whose symbol is not in the vocabulary yields no token in llama.cpp but still stops
    merges across it, so it is cut out of the word (`tokenizers` would drop it and merge over).
    """
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    missing = [c for c in pre_tokenizers.ByteLevel.alphabet() if c not in vocab]
    if missing:
        pattern = "[" + "".join(f"\\x{{{ord(c):04x}}}" for c in sorted(missing)) + "]"
        steps.append(pre_tokenizers.Split(Regex(pattern), behavior="removed"))
    return pre_tokenizers.Sequence(steps)


def _strings(value: Any, key: str) -> list[str]:
    """A metadata array of strings (str or UTF-8 bytes) as a list of str."""
    if value is None:
        raise FormatError(f"GGUF tokenizer metadata has no {key!r}")
    return [v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v for v in value]


def _numbers(value: Any) -> list:
    """A metadata array of numbers (list, tuple or numpy array) as a Python list."""
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _text_backend(backend: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A twin of `backend` that encodes special tokens' strings as text (model shared, no copy)."""
    twin = tokenizers.Tokenizer(backend.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        value = getattr(backend, part)
        if value is not None:
            setattr(twin, part, value)
    added = backend.get_added_tokens_decoder()
    for _, token in sorted(added.items()):
        (twin.add_special_tokens if token.special else twin.add_tokens)([token])
    if twin.get_added_tokens_decoder() != added:  # ids beyond the model's vocabulary, with gaps
        twin = tokenizers.Tokenizer.from_str(backend.to_str())
    twin.encode_special_tokens = True
    return twin


def _id_rows(ids: Any) -> list:
    """Token ids (list, numpy array, ember Tensor, nested) as Python ints/lists."""
    if hasattr(ids, "numpy") and callable(ids.numpy):
        ids = ids.numpy()
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return ids


class BatchEncoding(dict):
    """What calling a tokenizer returns: a dict (`input_ids`, `attention_mask`) with attributes."""

    def __getattr__(self, name: str) -> Any:
        """`enc.input_ids` is `enc["input_ids"]`."""
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece/llama.cpp merging by the merged token's score.

    llama.cpp joins the adjacent pair whose concatenation is the highest-scoring token. Every
    way to cut a token into two tokens becomes a merge, ranked by that token's score.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for index in sorted(vocab.values(), key=lambda i: (-scores[i], i)):
        token = tokens[index]
        for cut in range(1, len(token)):
            left = token[:cut]
            if left in vocab and token[cut:] in vocab:
                merges.append((left, token[cut:]))
    return merges


class Tokenizer:
    """A text tokenizer: `tokenizers.Tokenizer` plus special tokens and a chat template."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        unk_token: str | None = None,
        pad_token: str | None = None,
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_template: str | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        """Wrap `backend`; `add_bos_token`/`add_eos_token` replace its post-processor if given."""
        self._backend = backend
        # ember's encode never truncates or pads: that is the caller's decision.
        backend.no_truncation()
        backend.no_padding()
        self.bos_token, self.eos_token = bos_token, eos_token
        self.unk_token, self.pad_token = unk_token, pad_token
        self._chat_template = chat_template
        self.padding_side = "right"  # transformers' default; set "left" for batched generation
        if add_bos_token is not None or add_eos_token is not None:
            self._set_post_processor(bool(add_bos_token), bool(add_eos_token))
        self._text = _text_backend(backend)
        self._control = tuple(
            t.content for t in backend.get_added_tokens_decoder().values() if t.special
        )
        extra = {int(i) for i in eos_token_ids}
        if self.eos_token_id is not None:
            extra.add(self.eos_token_id)
        # End-of-turn tokens stop generation when the template uses them; end-of-text always.
        template, special = chat_template or "", self._special_ids()
        for text in END_OF_TURN_TOKENS:
            tid = backend.token_to_id(text)
            if tid in special and (text in template or text in _END_OF_TEXT_TOKENS):
                extra.add(tid)
        self._eos_token_ids = frozenset(extra)
        self._init_decode_helpers()

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> Tokenizer:
        """Load a `tokenizer.json`; keyword arguments are passed to `Tokenizer(...)`."""
        try:
            backend = tokenizers.Tokenizer.from_file(os.fspath(path))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise FormatError(f"cannot read tokenizer file {os.fspath(path)!r}: {e}") from e
        return cls(backend, **kwargs)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, *, pre_tokenizer: str | None = None) -> Tokenizer:
        """The tokenizer stored in a GGUF file's metadata (the tensors are not read)."""
        from ember.io.gguf import open_gguf

        with open_gguf(path) as f:
            metadata = f.metadata
        return cls.from_gguf_metadata(metadata, pre_tokenizer=pre_tokenizer)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> Tokenizer:
        """Load a model folder (tokenizer.json + configs, or one GGUF), a GGUF file or a JSON file."""
        path = os.fspath(path)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                magic = f.read(4)
            if magic == b"GGUF":
                return cls.from_gguf(path)
            return cls.from_file(path)
        if not os.path.isdir(path):
            raise FormatError(
                f"{path}: no such file or folder (expected a GGUF file, a tokenizer.json or a "
                "folder with tokenizer.json)"
            )
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            ggufs = sorted(n for n in os.listdir(path) if n.endswith(".gguf"))
            if len(ggufs) == 1:
                return cls.from_gguf(os.path.join(path, ggufs[0]))
            if ggufs:
                raise FormatError(
                    f"{path!r} has no tokenizer.json and {len(ggufs)} GGUF files "
                    f"({', '.join(ggufs)}); pass the GGUF file to load"
                )
        return cls._from_folder(path)

    @classmethod
    def _from_folder(cls, directory: str) -> Tokenizer:
        """A Hugging Face model directory: tokenizer.json plus its config files."""

        def read(name: str) -> dict:
            path = os.path.join(directory, name)
            if not os.path.isfile(path):
                return {}
            with open(path, encoding="utf-8") as f:
                try:
                    return json.load(f)
                except json.JSONDecodeError as e:
                    raise FormatError(f"{path} is not valid JSON: {e}") from e

        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            raise FormatError(f"no tokenizer.json in {directory!r} (ember needs the fast format)")
        config = {**read("special_tokens_map.json"), **read("tokenizer_config.json")}

        def token(name: str) -> str | None:
            value = config.get(name)
            return value.get("content") if isinstance(value, dict) else value

        template = config.get("chat_template")
        jinja_path = os.path.join(directory, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                template = f.read()
        elif template is None:
            template = read("chat_template.json").get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default", next(iter(named.values()), None))
        eos_ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            value = read(name).get("eos_token_id")
            eos_ids += value if isinstance(value, list) else [] if value is None else [value]
        # bos/eos are added by tokenizer.json's post-processor; like transformers, ignore the
        # config's add_bos_token/add_eos_token when a tokenizer.json is present.
        tok = cls.from_file(
            path,
            bos_token=token("bos_token"),
            eos_token=token("eos_token"),
            unk_token=token("unk_token"),
            pad_token=token("pad_token"),
            chat_template=template,
            eos_token_ids=eos_ids,
        )
        if config.get("padding_side") in ("left", "right"):
            tok.padding_side = config["padding_side"]
        return tok

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], *, pre_tokenizer: str | None = None
    ) -> Tokenizer:
        """Build the tokenizer a GGUF file describes, from its metadata key/value pairs.

        Supports `tokenizer.ggml.model` 'gpt2' (byte-level BPE; the split regexes are chosen by
        `tokenizer.ggml.pre`, or by `pre_tokenizer` if given) and 'llama' (SentencePiece-style
        vocabulary with scores, `<0xNN>` byte fallback and the ▁ space prefix). As in llama.cpp,
        a file without a `pre` name gets the 'default' regexes (with a warning) and an unknown
        name is refused (UnsupportedError), since a wrong split gives plausible but wrong ids.
        """
        model = metadata.get("tokenizer.ggml.model")
        tokens = _strings(metadata.get("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens")
        n = len(tokens)
        types = _numbers(metadata.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * n))
        if len(types) != n:
            raise FormatError(f"GGUF token_type has {len(types)} entries for {n} tokens")
        for i, t in enumerate(tokens):  # llama.cpp renames empty tokens the same way
            if not t:
                tokens[i] = f"[EMPTY_{i}]"
        if model == "gpt2":
            backend, add_bos = cls._gguf_bpe(metadata, tokens, pre_tokenizer)
            defaults = {"bos": 11, "eos": 11, "unk": None}  # llama.cpp's, for files without
        elif model == "llama":
            backend, add_bos = cls._gguf_spm(metadata, tokens, types)
            defaults = {"bos": 1, "eos": 2, "unk": 0}
        else:
            raise UnsupportedError(
                f"GGUF tokenizer.ggml.model {model!r} is not supported (ember reads 'gpt2' and "
                "'llama' vocabularies)"
            )
        special = [TOKEN_CONTROL, TOKEN_UNKNOWN]
        backend.add_special_tokens(
            [
                AddedToken(t, normalized=False, special=True)
                for t, k in zip(tokens, types)
                if k in special
            ]
        )
        backend.add_tokens(
            [
                AddedToken(t, normalized=False, special=False)
                for t, k in zip(tokens, types)
                if k == TOKEN_USER_DEFINED
            ]
        )

        def token_of(key: str, default: int | None) -> str | None:
            tid = metadata.get(f"tokenizer.ggml.{key}_token_id", default)
            return tokens[int(tid)] if tid is not None and 0 <= int(tid) < n else None

        eog = [metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
        return cls(
            backend,
            bos_token=token_of("bos", defaults["bos"]),
            eos_token=token_of("eos", defaults["eos"]),
            unk_token=token_of("unknown", defaults["unk"]),
            pad_token=token_of("padding", None),
            add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos)),
            add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
            chat_template=metadata.get("tokenizer.chat_template"),
            eos_token_ids=[int(i) for i in eog if i is not None and 0 <= int(i) < n],
        )

    @staticmethod
    def _gguf_bpe(
        metadata: Mapping[str, Any], tokens: list[str], pre_tokenizer: str | None
    ) -> tuple[tokenizers.Tokenizer, bool]:
        """Byte-level BPE (`tokenizer.ggml.model` 'gpt2') with llama.cpp's pre-tokenizer."""
        pre = pre_tokenizer or metadata.get("tokenizer.ggml.pre")
        if not pre:
            warnings.warn(
                "GGUF file names no pre-tokenizer; using llama.cpp's 'default' regexes",
                stacklevel=3,
            )
            pre = "default"
        if pre not in _PRE_TYPES:
            known = "" if pre in _UNSUPPORTED_PRE else f" (known: {', '.join(sorted(_PRE_TYPES))})"
            raise UnsupportedError(
                f"GGUF pre-tokenizer {pre!r} is not supported{known}; pass pre_tokenizer=NAME "
                "to split like a known one"
            )
        split, ignore_merges, add_bos = _PRE_TYPES[pre]
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = []
        for line in _strings(metadata.get("tokenizer.ggml.merges"), "tokenizer.ggml.merges"):
            left, sep, right = line.partition(" ")  # like llama.cpp; tokens have no spaces
            if sep and left in vocab and right in vocab and left + right in vocab:
                merges.append((left, right))
        bpe = models.BPE(vocab, merges, ignore_merges=ignore_merges)
        backend = tokenizers.Tokenizer(bpe)
        backend.pre_tokenizer = _byte_level_pre_tokenizer(_SPLITS[split], vocab)
        backend.decoder = decoders.ByteLevel()
        return backend, add_bos

    @staticmethod
    def _gguf_spm(
        metadata: Mapping[str, Any], tokens: list[str], types: list[int]
    ) -> tuple[tokenizers.Tokenizer, bool]:
        """SentencePiece-style BPE (`tokenizer.ggml.model` 'llama'), merging by token score."""
        scores = _numbers(metadata.get("tokenizer.ggml.scores", [0.0] * len(tokens)))
        if len(scores) != len(tokens):
            raise FormatError(f"GGUF scores has {len(scores)} entries for {len(tokens)} tokens")
        vocab = {t: i for i, t in enumerate(tokens)}
        unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 0)
        unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
        bpe = models.BPE(
            vocab, _spm_merges(tokens, scores), unk_token=unk, fuse_unk=True, byte_fallback=True
        )
        backend = tokenizers.Tokenizer(bpe)
        prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
        # Prepend per text segment: llama.cpp adds the space to the text at the start and to
        # the text after each special token.
        steps = [normalizers.Prepend("\u2581")] if prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
        chain = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if prefix:
            chain.append(decoders.Strip(" ", 1, 0))
        backend.decoder = decoders.Sequence(chain)
        return backend, True

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        """Make encode(add_special_tokens=True) add bos and/or eos, as transformers does."""

        def usable(token: str | None, wanted: bool) -> bool:
            return wanted and token is not None and self._backend.token_to_id(token) is not None

        bos, eos = self.bos_token, self.eos_token
        add_bos, add_eos = usable(bos, add_bos), usable(eos, add_eos)
        single = f"{bos}:0 " * add_bos + "$A:0" + f" {eos}:0" * add_eos
        pair = single + f" {bos}:1" * add_bos + " $B:1" + f" {eos}:1" * add_eos
        special = [
            (t, self._backend.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on
        ]
        self._backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special
        )

    def _special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special."""
        return frozenset(
            i for i, t in self._backend.get_added_tokens_decoder().items() if t.special
        )

    def _init_decode_helpers(self) -> None:
        """Precompute what decode and streaming need to know about the decoder."""
        decoder = self._backend.decoder
        text = decoder.__getstate__().decode("utf-8") if decoder is not None else ""
        byte_level = '"ByteLevel"' in text
        # ByteLevel maps the characters of an added token to bytes; llama.cpp outputs an added
        # token as written. Those whose text that mapping would garble are decoded verbatim.
        self._verbatim: dict[int, tuple[str, bool]] = {}
        if byte_level:
            for i, t in self._backend.get_added_tokens_decoder().items():
                if not t.content.isascii():
                    self._verbatim[i] = (t.content, t.special)
        self._hold_ids: frozenset[int] = frozenset()
        if '"ByteFallback"' in text:
            vocab = self._backend.get_vocab(with_added_tokens=False)
            self._hold_ids = frozenset(
                i for t, i in vocab.items() if t.startswith("<0x") and _BYTE_TOKEN.match(t)
            )

    # --- encoding and decoding ----------------------------------------------------------------

    def encode(
        self, text: str, add_special_tokens: bool = True, *, parse_special: bool = False
    ) -> list[int]:
        """Token ids of `text`; `add_special_tokens` adds bos/eos as the model's config says.

        Control-token strings in `text` are text unless `parse_special=True`; in a `ChatPrompt`
        (what `apply_chat_template` returns) the template's own are parsed, the user's are not.
        """
        return self._encode(text, add_special_tokens, parse_special).ids

    def _encode(self, text: str, add_special_tokens: bool, parse_special: bool) -> Any:
        """The `tokenizers.Encoding` of `text`, post-processed (bos/eos) if asked."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        spans = text.text_spans if isinstance(text, ChatPrompt) else None
        if parse_special or spans == ():
            return self._backend.encode(str(text), add_special_tokens=add_special_tokens)
        if spans is None:
            return self._text.encode(text, add_special_tokens=add_special_tokens)
        enc = self._split_encoding(str(text), spans)
        return self._backend.post_process(enc, None, add_special_tokens)

    def _split_encoding(self, text: str, spans: Sequence[tuple[int, int]]) -> Any:
        """Encoding of `text` with control tokens parsed except where they overlap `spans`.

        As in llama.cpp, the text is cut at the accepted control tokens and each piece between
        them is tokenized on its own (with control-token strings as text).
        """
        special = self._special_ids()
        found = self._backend.encode(text, add_special_tokens=False)
        parts, cut = [], 0
        for tid, (start, end) in zip(found.ids, found.offsets):
            if tid not in special or any(a < end and start < b for a, b in spans):
                continue
            if start > cut:
                parts.append(self._text.encode(text[cut:start], add_special_tokens=False))
            parts.append(self._backend.encode(text[start:end], add_special_tokens=False))
            cut = end
        if cut < len(text):
            parts.append(self._text.encode(text[cut:], add_special_tokens=False))
        return tokenizers.Encoding.merge(parts, growing_offsets=True)

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True, *, parse_special: bool = False
    ) -> list[list[int]]:
        """Token ids of each text (plain texts are encoded in parallel by `tokenizers`)."""
        texts = list(texts)
        if parse_special or any(isinstance(t, ChatPrompt) for t in texts):
            return [self.encode(t, add_special_tokens, parse_special=parse_special) for t in texts]
        encodings = self._text.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def __call__(
        self,
        text: str | Sequence[str],
        *,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str = False,
        max_length: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        return_attention_mask: bool = True,
        parse_special: bool = False,
    ) -> BatchEncoding:
        """Encode a text or a batch as transformers' tokenizers do: input_ids and attention_mask.

        `padding` True/'longest' pads to the longest row, 'max_length' to `max_length`, with the
        pad token on `padding_side` (default `self.padding_side`); `truncation` cuts rows to
        `max_length` keeping bos/eos; `return_tensors` 'np' or 'ember' gives 2-D arrays.
        """
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("a tokenizer takes a str or a list of str")
        pad_to = self._pad_target(padding, max_length)
        side = self.padding_side if padding_side is None else padding_side
        if side not in ("left", "right"):
            raise UnsupportedError(f"padding_side must be 'left' or 'right', got {side!r}")
        if truncation not in (False, None, "do_not_truncate") and max_length is not None:
            keep = max_length
            if add_special_tokens and self._backend.post_processor is not None:
                keep -= self._backend.post_processor.num_special_tokens_to_add(False)
            if keep < 0:
                raise ShapeError(f"max_length={max_length} leaves no room for bos/eos")
        else:
            keep = None
        rows = []
        for t in texts:
            enc = self._encode(t, False, parse_special)
            if keep is not None:
                enc.truncate(keep)
            rows.append(self._backend.post_process(enc, None, add_special_tokens).ids)
        masks = [[1] * len(r) for r in rows]
        if pad_to is not None:
            if self.pad_token_id is None:
                raise ShapeError(
                    "cannot pad: this tokenizer has no pad token (set tok.pad_token = "
                    "tok.eos_token, as with transformers)"
                )
            width = max(map(len, rows), default=0) if pad_to == "longest" else pad_to
            for r, m in zip(rows, masks):
                n = max(width - len(r), 0)
                if side == "left":
                    r[:0], m[:0] = [self.pad_token_id] * n, [0] * n
                else:
                    r += [self.pad_token_id] * n
                    m += [0] * n
        out = BatchEncoding(input_ids=rows)
        if return_attention_mask:
            out["attention_mask"] = masks
        if return_tensors is not None:
            for k, v in out.items():
                out[k] = self._as_tensor(v, return_tensors, k)
        elif single:
            for k, v in out.items():
                out[k] = v[0]
        return out

    @staticmethod
    def _pad_target(padding: bool | str, max_length: int | None) -> int | str | None:
        """'longest', a width, or None (no padding) for transformers' `padding` argument."""
        if padding in (False, None, "do_not_pad"):
            return None
        if padding is True or padding == "longest":
            return "longest"
        if padding == "max_length":
            if max_length is None:
                raise ShapeError("padding='max_length' needs max_length=N")
            return int(max_length)
        raise UnsupportedError(
            f"padding={padding!r} is not supported (True, 'longest', 'max_length' or False)"
        )

    @staticmethod
    def _as_tensor(rows: list[list[int]], kind: str, key: str) -> Any:
        """Rows as a 2-D int64 numpy array ('np') or ember Tensor ('ember')."""
        import numpy as np

        if kind not in ("np", "ember"):
            raise UnsupportedError(
                f"return_tensors={kind!r} is not supported: ember returns 'np' (numpy) or "
                "'ember' tensors"
            )
        if len({len(r) for r in rows}) > 1:
            raise ShapeError(
                f"{key} rows have different lengths {sorted({len(r) for r in rows})}; pass "
                "padding=True to make a tensor"
            )
        array = np.array(rows, dtype=np.int64).reshape(len(rows), -1)
        if kind == "np":
            return array
        import ember

        return ember.from_numpy(array)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` (a list, numpy array or Tensor); invalid UTF-8 becomes U+FFFD."""
        ids = _id_rows(ids)
        ids = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
        if not self._verbatim or self._verbatim.keys().isdisjoint(ids):
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        parts, run = [], []
        for i in ids:
            if i in self._verbatim:
                parts.append(self._backend.decode(run, skip_special_tokens=skip_special_tokens))
                content, special = self._verbatim[i]
                parts.append("" if special and skip_special_tokens else content)
                run = []
            else:
                run.append(i)
        parts.append(self._backend.decode(run, skip_special_tokens=skip_special_tokens))
        return "".join(parts)

    def decode_batch(
        self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False
    ) -> list[str]:
        """Text of each id sequence."""
        return [self.decode(ids, skip_special_tokens) for ids in _id_rows(batch)]

    def batch_decode(
        self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = False
    ) -> list[str]:
        """Text of each row of ids (a list of lists, 2-D array or Tensor), as in transformers."""
        return self.decode_batch(sequences, skip_special_tokens)

    def stream(self, skip_special_tokens: bool = False) -> StreamDecoder:
        """An incremental detokenizer: feed ids one at a time, get text that never splits a char."""
        from ember.generation.streaming import StreamDecoder

        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (added tokens included), or None."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token string of an id, or None."""
        return self._backend.id_to_token(int(token_id))

    def get_vocab(self) -> dict[str, int]:
        """The vocabulary, added tokens included, as {token: id}."""
        return self._backend.get_vocab(with_added_tokens=True)

    # --- chat ---------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        parse_special: bool = False,
        **kwargs: Any,
    ) -> ChatPrompt | list[int]:
        """Render a conversation with the model's chat template (ChatML if it has none).

        The result is a `ChatPrompt` (a str): encoding it parses the template's control tokens
        but keeps those written in messages, tools and documents as text, unless
        `parse_special=True`. With `tokenize=True` the prompt is encoded without adding special
        tokens, since the template writes them itself. Extra keyword arguments become template
        variables.
        """
        from ember.generation.chat import CHATML_TEMPLATE, render_chat_template

        template = chat_template or self._chat_template or CHATML_TEMPLATE
        variables = {**self.special_tokens_map, **kwargs}
        text = render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            literal_tokens=() if parse_special else self._control,
            **variables,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    # --- properties ---------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (it parses control tokens; `encode` uses a twin
        built at construction, sharing its model, for text, so add tokens before wrapping)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of tokens, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        """Same as `vocab_size`."""
        return self.vocab_size

    @property
    def bos_token_id(self) -> int | None:
        """Id of the beginning-of-sequence token, or None."""
        return None if self.bos_token is None else self._backend.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        """Id of the end-of-sequence token, or None."""
        return None if self.eos_token is None else self._backend.token_to_id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        """Id of the unknown token, or None."""
        return None if self.unk_token is None else self._backend.token_to_id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        """Id of the padding token, or None."""
        return None if self.pad_token is None else self._backend.token_to_id(self.pad_token)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a generation: eos, the config's extra ones, end-of-turn tokens."""
        return self._eos_token_ids

    @property
    def all_special_ids(self) -> frozenset[int]:
        """Ids of all special tokens (removed by `decode(..., skip_special_tokens=True)`)."""
        return self._special_ids()

    @property
    def chat_template(self) -> str | None:
        """The model's own chat template (jinja2 source), or None."""
        return self._chat_template

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """{'bos_token': ..., 'eos_token': ..., ...} for the tokens that are set."""
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def __repr__(self) -> str:
        """Short summary: vocabulary size and special tokens."""
        specials = ", ".join(f"{k}={v!r}" for k, v in self.special_tokens_map.items())
        return f"Tokenizer(vocab_size={self.vocab_size}, {specials})"
