"""BERT-family text encoders: BERT, MiniLM, BGE, E5, GTE (and RoBERTa-style position ids).

Module and parameter names follow Hugging Face's ``BertModel`` (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query``, ...), so a checkpoint's state dict loads as is; the
``bert.`` prefix of task checkpoints (``BertForMaskedLM`` and friends) is stripped on load.

The layers take a batch in one of two layouts, and ``forward`` picks one:

- padded: (batch, seq, hidden) with a key-padding mask and ``F.scaled_dot_product_attention``,
  as Hugging Face computes it (padding positions included). Used when a gradient is recorded or
  attention dropout is on.
- packed: the real tokens only, one (tokens, hidden) matrix with ``cu_seqlens`` marking where
  each sequence starts, and ``F.varlen_attn`` (attention within each sequence): padding costs
  nothing. Used otherwise (inference); ``forward_packed`` takes such input directly. Padding
  positions of ``last_hidden_state`` are zeros there; real tokens match.

Both are the same ops; their kernels (attention, layer norm, GELU) are picked by the ops.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

import ember
from ember import nn
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.nn import functional as F

# hidden_act (config.json) -> the ember activation
_ACTS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert")


@dataclass
class BertConfig:
    """Hyper-parameters, with Hugging Face's config.json names."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    model_type: str = "bert"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.hidden_act not in _ACTS:
            raise UnsupportedError(
                f"hidden_act {self.hidden_act!r} is not supported; known: {', '.join(_ACTS)}"
            )
        if self.position_embedding_type != "absolute":
            raise UnsupportedError(
                f"position_embedding_type {self.position_embedding_type!r} is not supported "
                "(only 'absolute')"
            )
        if self.model_type not in MODEL_TYPES:
            raise UnsupportedError(
                f"model_type {self.model_type!r} is not a BERT-family encoder "
                f"({', '.join(MODEL_TYPES)})"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ShapeError(
                f"hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )

    @property
    def head_dim(self) -> int:
        """Features per attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def position_offset(self) -> int | None:
        """RoBERTa numbers positions from pad_token_id + 1 and skips padding; BERT from 0."""
        return None if self.model_type == "bert" else self.pad_token_id

    @classmethod
    def from_dict(cls, d: dict) -> BertConfig:
        """Build from a config.json dict (unknown keys go to ``extra``)."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names and k != "extra"}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)


@dataclass
class BertOutput:
    """What ``BertModel`` returns (Hugging Face's BaseModelOutputWithPooling, indexable)."""

    last_hidden_state: ember.Tensor
    pooler_output: ember.Tensor | None = None

    def __getitem__(self, i: int):
        return (self.last_hidden_state, self.pooler_output)[i]


def _act(x: ember.Tensor, name: str) -> ember.Tensor:
    kind = _ACTS[name]
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return F.relu(x) if kind == "relu" else F.silu(x)


class BertEmbeddings(nn.Module):
    """Sum of word, position and token-type embeddings, then LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, position_ids) -> ember.Tensor:
        """(batch, seq) ids -> (batch, seq, hidden)."""
        x = self.word_embeddings(input_ids)
        x = x + self.position_embeddings(position_ids)
        x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention projections (query, key, value) and the attention itself."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(self, x: ember.Tensor, mask: ember.Tensor | None, packed=None) -> ember.Tensor:
        """x (batch, seq, hidden), mask bool (batch, 1, 1, seq) with True = attend, or None.

        packed: (cu_seqlens, max_seqlen) when x is (tokens, hidden), sequences end to end.
        """
        if packed is not None:
            n = x.shape[0]
            q, k, v = (
                lin(x).view(n, self.num_heads, self.head_dim)
                for lin in (self.query, self.key, self.value)
            )
            cu, longest = packed
            o = F.varlen_attn(q, k, v, cu, cu, longest, longest)
            return o.reshape(n, self.num_heads * self.head_dim)
        b, t, _ = x.shape
        q, k, v = (
            lin(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
            for lin in (self.query, self.key, self.value)
        )
        p = self.dropout_p if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return o.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)


class BertSelfOutput(nn.Module):
    """Attention output projection, dropout, residual and LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, h: ember.Tensor, residual: ember.Tensor) -> ember.Tensor:
        """LayerNorm(residual + dropout(dense(h)))."""
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    """Self-attention followed by its output block (Hugging Face nests them this way)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: ember.Tensor, mask: ember.Tensor | None, packed=None) -> ember.Tensor:
        """Post-norm attention block."""
        return self.output(self.self(x, mask, packed), x)


class BertIntermediate(nn.Module):
    """Feed-forward expansion and activation."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = cfg.hidden_act

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """act(dense(x))."""
        return _act(self.dense(x), self.act)


class BertLayerOutput(nn.Module):
    """Feed-forward contraction, dropout, residual and LayerNorm (HF's ``BertOutput``)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, h: ember.Tensor, residual: ember.Tensor) -> ember.Tensor:
        """LayerNorm(residual + dropout(dense(h)))."""
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    """One post-norm encoder block: attention, then feed-forward."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertLayerOutput(cfg)

    def forward(self, x: ember.Tensor, mask: ember.Tensor | None, packed=None) -> ember.Tensor:
        """x (batch, seq, hidden), or (tokens, hidden) when packed -> same shape."""
        x = self.attention(x, mask, packed)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    """The stack of encoder blocks."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(cfg) for _ in range(cfg.num_hidden_layers)])

    def forward(self, x: ember.Tensor, mask: ember.Tensor | None, packed=None) -> ember.Tensor:
        """Run every block (packed: (cu_seqlens, max_seqlen) of a (tokens, hidden) x)."""
        for layer in self.layer:
            x = layer(x, mask, packed)
        return x


class BertPooler(nn.Module):
    """tanh(dense(first token's hidden state))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: ember.Tensor) -> ember.Tensor:
        """(batch, seq, hidden) -> (batch, hidden)."""
        return F.tanh(self.dense(x[:, 0]))


def _array(x, dtype=np.int64) -> np.ndarray | None:
    """ids/masks given as a Tensor, an array or nested lists -> a 2-d numpy array."""
    if x is None:
        return None
    a = x.numpy(force=True) if isinstance(x, ember.Tensor) else np.asarray(x)
    a = a.astype(dtype, copy=False)
    return a[None] if a.ndim == 1 else a


class BertModel(nn.Module):
    """A BERT-family encoder: ``model(input_ids, attention_mask)`` -> ``BertOutput``."""

    config_class = BertConfig

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None

    # --- inputs -------------------------------------------------------------------------------

    def _inputs(self, input_ids, attention_mask, token_type_ids, position_ids):
        """Numpy (batch, seq) ids, mask (bool), token types and positions, checked."""
        cfg = self.config
        ids = _array(input_ids)
        if ids.ndim != 2:
            raise ShapeError(f"BertModel: input_ids must be (batch, seq), got {ids.shape}")
        b, t = ids.shape
        mask = np.ones((b, t), bool) if attention_mask is None else _array(attention_mask, bool)
        tt = np.zeros((b, t), np.int64) if token_type_ids is None else _array(token_type_ids)
        for name, a in (("attention_mask", mask), ("token_type_ids", tt)):
            if a.shape != (b, t):
                raise ShapeError(
                    f"BertModel: {name} of shape {a.shape} does not match input_ids {ids.shape}"
                )
        if position_ids is not None:
            pos = np.broadcast_to(_array(position_ids), (b, t))
        elif cfg.position_offset is not None:  # RoBERTa: pad + 1 + index among real tokens
            real = ids != cfg.pad_token_id
            pos = np.cumsum(real, axis=1) * real + cfg.position_offset
        else:
            pos = np.broadcast_to(np.arange(t), (b, t))
        self._check_ranges(ids, tt, pos, t)
        return ids, mask, tt, pos

    # --- forward ------------------------------------------------------------------------------

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None
    ) -> BertOutput:
        """Encode a (batch, seq) batch; attention_mask 1/True marks real tokens, 0 padding."""
        ids, mask, tt, pos = self._inputs(input_ids, attention_mask, token_type_ids, position_ids)
        if self._padded():
            amask = None if mask.all() else ember.from_numpy(mask[:, None, None, :].copy())
            x = self.embeddings(
                ember.from_numpy(ids),
                ember.from_numpy(tt),
                ember.from_numpy(np.ascontiguousarray(pos)),
            )
            x = self.encoder(x, amask)
        else:  # padding removed: the real tokens packed, then put back in their places
            b, t = mask.shape
            real = mask.reshape(-1)
            flat = np.flatnonzero(real)
            cu = np.zeros(b + 1, np.int64)
            np.cumsum(mask.sum(axis=1), out=cu[1:])
            x = self._encode_packed(ids.reshape(-1)[flat], pos.reshape(-1)[flat],
                                    tt.reshape(-1)[flat], cu)  # fmt: skip
            if len(flat) < b * t:  # padding rows read a zero row appended to x
                where = np.full(b * t, len(flat), np.int64)
                where[flat] = np.arange(len(flat))
                x = F.pad(x, (0, 0, 0, 1))[ember.from_numpy(where)]
            x = x.reshape(b, t, -1)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BertOutput(x, pooled)

    def _padded(self) -> bool:
        """Whether to run on the padded grid: a gradient is recorded, or attention dropout."""
        if self.training and self.config.attention_probs_dropout_prob > 0:
            return True
        return ember.is_grad_enabled() and any(p.requires_grad for p in self.parameters())

    def _encode_packed(self, ids, pos, tt, cu) -> ember.Tensor:
        """Hidden states (tokens, hidden) of packed sequences: sequence b is rows cu[b]:cu[b+1]."""
        x = self.embeddings(ember.from_numpy(ids), ember.from_numpy(tt), ember.from_numpy(pos))
        return self.encoder(x, None, (cu, int(np.diff(cu).max(initial=0))))

    def forward_packed(self, input_ids, cu_seqlens, token_type_ids=None) -> ember.Tensor:
        """Hidden states (tokens, hidden) of sequences packed end to end, no padding anywhere.

        input_ids: 1-d, every sequence's tokens one after the other; sequence b is
        ``input_ids[cu_seqlens[b]:cu_seqlens[b + 1]]``. Differentiable; attention dropout is not
        applied (the packed attention has none), so training with it needs ``forward``.
        """
        cfg = self.config
        ids = _array(input_ids).reshape(-1)
        cu = _array(cu_seqlens).reshape(-1)
        if cu.size < 1 or cu[0] != 0 or cu[-1] != ids.size or (np.diff(cu) < 0).any():
            raise ShapeError(
                f"forward_packed: cu_seqlens must rise from 0 to len(input_ids)={ids.size}, "
                f"got {cu.tolist()[:8]}"
            )
        tt = np.zeros_like(ids) if token_type_ids is None else _array(token_type_ids).reshape(-1)
        if tt.shape != ids.shape:
            raise ShapeError(
                f"forward_packed: token_type_ids {tt.shape} do not match input_ids {ids.shape}"
            )
        n = np.diff(cu)
        pos = np.arange(ids.size) - np.repeat(cu[:-1], n)
        if cfg.position_offset is not None:
            pos += cfg.position_offset + 1
        self._check_ranges(ids, tt, pos, int(n.max(initial=0)))
        return self._encode_packed(ids, pos, tt, cu)

    def _check_ranges(self, ids, tt, pos, t: int) -> None:
        cfg = self.config
        if pos.size and pos.max() >= cfg.max_position_embeddings:
            raise ShapeError(
                f"BertModel: a sequence of {t} tokens needs positions beyond "
                f"max_position_embeddings={cfg.max_position_embeddings}; truncate the input"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
            raise ShapeError(f"BertModel: token ids must lie in [0, {cfg.vocab_size})")
        if tt.size and (tt.min() < 0 or tt.max() >= cfg.type_vocab_size):
            raise ShapeError(f"BertModel: token_type_ids must lie in [0, {cfg.type_vocab_size})")

    # --- loading ------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype=None) -> BertModel:
        """Load a Hugging Face folder (config.json + safetensors), weights memory-mapped."""
        from ember.io import load_safetensors_dir

        p = Path(path)
        if not (p.is_dir() and (p / "config.json").is_file()):
            raise FormatError(
                f"{path}: expected a directory with config.json and model.safetensors"
            )
        cfg = BertConfig.from_dict(json.loads((p / "config.json").read_text()))
        weights = checkpoint_weights(load_safetensors_dir(p), cfg.model_type)
        model = cls.from_weights(cfg, weights, dtype)
        model.source = str(p)
        return model

    @classmethod
    def from_weights(cls, config: BertConfig, weights: dict, dtype=None) -> BertModel:
        """Build on the meta device and assign arrays named as in ``state_dict`` (no copy)."""
        from ember.models._weights import assign_weights

        has_pooler = "pooler.dense.weight" in weights
        with ember.device("meta"):
            model = cls(config, add_pooling_layer=has_pooler)
        assign_weights(model, weights, dtype)
        return model.eval()


def checkpoint_weights(weights: dict, model_type: str = "bert") -> dict:
    """Keep the encoder's tensors of a checkpoint, named as ``BertModel`` names them.

    Drops a leading ``bert.``/``roberta.``/``model.`` prefix, task heads (``cls.*``, ``lm_head.*``,
    ``classifier.*``) and the ``position_ids`` buffer older checkpoints carry.
    """
    prefixes = ("bert.", "roberta.", "model.", model_type.replace("-", "_") + ".")
    tops = ("embeddings.", "encoder.", "pooler.")
    out = {}
    for name, value in weights.items():
        for pre in prefixes:
            if name.startswith(pre) and name[len(pre) :].startswith(tops):
                name = name[len(pre) :]
                break
        if not name.startswith(tops) or name.endswith("position_ids"):
            continue
        out[_legacy_name(name)] = value
    if not out:
        raise FormatError("checkpoint holds no BERT encoder tensors (embeddings.*, encoder.*)")
    return out


def _legacy_name(name: str) -> str:
    """Old TF-converted checkpoints name LayerNorm parameters gamma/beta."""
    if "LayerNorm." in name:
        return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias"
        )
    return name
