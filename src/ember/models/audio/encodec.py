"""EnCodec: a SEANet convolutional encoder/decoder around a residual vector quantizer.

Module and parameter names are transformers' EncodecModel's (``encoder.layers.N.conv``,
``decoder.layers.N.lstm``, ``quantizer.layers.N.codebook.embed``), so its folder (config.json +
model.safetensors) loads as is. Weight norm is folded into plain conv weights at load time:
both spellings transformers writes (``weight_g``/``weight_v`` and
``parametrizations.weight.original0``/``original1``) give ``weight = g * v / ||v||``, the norm
taken over every dim but the first.

Encoding turns audio (batch, channels, samples) into codes (frames, batch, codebooks, steps):
one frame for the whole clip when the config has no ``chunk_length_s`` (the 24 kHz model),
else overlapping chunks, each normalised by its RMS ``scale`` when ``normalize`` is set (the
48 kHz model); decoding overlap-adds the chunks with a triangular fade.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

import ember
from ember import nn
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.nn import functional as F
from ember.tensor import Tensor


@dataclass
class EncodecConfig:
    """Hyper-parameters with transformers' EncodecConfig field names (defaults: encodec_24khz)."""

    target_bandwidths: list = field(default_factory=lambda: [1.5, 3.0, 6.0, 12.0, 24.0])
    sampling_rate: int = 24000
    audio_channels: int = 1
    normalize: bool = False
    chunk_length_s: float | None = None
    overlap: float | None = None
    hidden_size: int = 128
    num_filters: int = 32
    num_residual_layers: int = 1
    upsampling_ratios: list = field(default_factory=lambda: [8, 5, 4, 2])
    norm_type: str = "weight_norm"
    kernel_size: int = 7
    last_kernel_size: int = 7
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "reflect"
    compress: int = 2
    num_lstm_layers: int = 2
    trim_right_ratio: float = 1.0
    codebook_size: int = 1024
    codebook_dim: int | None = None
    use_conv_shortcut: bool = True
    model_type: str = "encodec"
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.codebook_dim is None:
            self.codebook_dim = self.hidden_size
        if self.norm_type not in ("weight_norm", "time_group_norm"):
            raise UnsupportedError(
                f"EnCodec norm_type must be 'weight_norm' or 'time_group_norm', got {self.norm_type!r}"
            )
        if self.codebook_size < 1 or self.codebook_size & (self.codebook_size - 1):
            raise FormatError(
                f"EnCodec codebook_size must be a power of 2, got {self.codebook_size}"
            )
        if not self.use_causal_conv and self.trim_right_ratio != 1.0:
            raise FormatError("EnCodec trim_right_ratio != 1.0 needs use_causal_conv")
        if self.audio_channels not in (1, 2):
            raise FormatError(f"EnCodec audio_channels must be 1 or 2, got {self.audio_channels}")

    @classmethod
    def from_dict(cls, d: dict) -> EncodecConfig:
        """Build from a config.json-style dict; unknown keys go to ``extra``."""
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in d.items() if k in names and k != "extra"}
        known["extra"] = {k: v for k, v in d.items() if k not in names}
        return cls(**known)

    @property
    def chunk_length(self) -> int | None:
        """Samples per chunk, or None when the whole clip is one frame."""
        if self.chunk_length_s is None:
            return None
        return int(self.chunk_length_s * self.sampling_rate)

    @property
    def chunk_stride(self) -> int | None:
        """Samples between the starts of two chunks."""
        if self.chunk_length_s is None or self.overlap is None:
            return None
        return max(1, int((1.0 - self.overlap) * self.chunk_length))

    @property
    def hop_length(self) -> int:
        """Samples per code step (the product of the up-sampling ratios)."""
        return int(np.prod(self.upsampling_ratios))

    @property
    def frame_rate(self) -> int:
        """Code steps per second."""
        return math.ceil(self.sampling_rate / self.hop_length)

    @property
    def codebook_nbits(self) -> int:
        """Bits per code."""
        return math.ceil(math.log2(self.codebook_size))

    @property
    def num_quantizers(self) -> int:
        """Codebooks in the residual quantizer (enough for the largest bandwidth)."""
        bits_per_s = self.frame_rate * self.codebook_nbits
        return int(1000 * self.target_bandwidths[-1] // bits_per_s)

    def num_quantizers_for(self, bandwidth: float | None) -> int:
        """Codebooks used at a bandwidth in kbps (all of them for None or <= 0)."""
        if bandwidth is None or bandwidth <= 0.0:
            return self.num_quantizers
        bw_per_q = math.log2(self.codebook_size) * self.frame_rate
        return int(max(1, math.floor(bandwidth * 1000 / bw_per_q)))


def _pad1d(x: Tensor, left: int, right: int, mode: str) -> Tensor:
    """F.pad on the last dim; reflect-padding a signal shorter than the pad zero-extends it first."""
    if mode != "reflect":
        return F.pad(x, (left, right), mode=mode)
    length = x.shape[-1]
    extra = max(left, right) - length + 1 if length <= max(left, right) else 0
    if extra:
        x = F.pad(x, (0, extra))
    out = F.pad(x, (left, right), mode="reflect")
    return out[..., : out.shape[-1] - extra] if extra else out


class EncodecConv1d(nn.Module):
    """Conv1d with causal (all on the left) or centred padding, so the output has ceil(L/stride) steps."""

    def __init__(
        self, cfg: EncodecConfig, cin: int, cout: int, kernel_size: int, stride: int = 1,
        dilation: int = 1,
    ) -> None:  # fmt: skip
        super().__init__()
        self.causal, self.pad_mode = cfg.use_causal_conv, cfg.pad_mode
        self.conv = nn.Conv1d(cin, cout, kernel_size, stride, dilation=dilation)
        if cfg.norm_type == "time_group_norm":
            self.norm = nn.GroupNorm(1, cout)
        self.stride = stride
        self.effective_kernel = (kernel_size - 1) * dilation + 1
        self.padding_total = self.effective_kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        """Pad, convolve, and group-normalise when the config says so."""
        length = x.shape[-1]
        steps = -(-(length - self.effective_kernel + self.padding_total) // self.stride)
        extra = steps * self.stride + self.effective_kernel - self.padding_total - length
        if self.causal:
            left, right = self.padding_total, extra
        else:
            right = self.padding_total // 2
            left, right = self.padding_total - right, right + extra
        x = self.conv(_pad1d(x, left, right, self.pad_mode))
        return self.norm(x) if hasattr(self, "norm") else x


class EncodecConvTranspose1d(nn.Module):
    """ConvTranspose1d that trims its kernel - stride surplus (on the right when causal)."""

    def __init__(
        self, cfg: EncodecConfig, cin: int, cout: int, kernel_size: int, stride: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel_size, stride)
        if cfg.norm_type == "time_group_norm":
            self.norm = nn.GroupNorm(1, cout)
        total = kernel_size - stride
        right = math.ceil(total * cfg.trim_right_ratio) if cfg.use_causal_conv else total // 2
        self.trim = (total - right, right)

    def forward(self, x: Tensor) -> Tensor:
        """Up-sample, normalise when asked, trim."""
        x = self.conv(x)
        if hasattr(self, "norm"):
            x = self.norm(x)
        left, right = self.trim
        return x[..., left : x.shape[-1] - right]


class EncodecLSTM(nn.Module):
    """A multi-layer LSTM over the time axis of (batch, channels, time), plus its input."""

    def __init__(self, cfg: EncodecConfig, dim: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(dim, dim, cfg.num_lstm_layers)

    def forward(self, x: Tensor) -> Tensor:
        """(b, c, t) -> (b, c, t)."""
        seq = x.permute(2, 0, 1)
        return (self.lstm(seq)[0] + seq).permute(1, 2, 0)


class EncodecResnetBlock(nn.Module):
    """SEANet residual block: ELU, k-conv to dim/compress, ELU, 1-conv back; plus a shortcut."""

    def __init__(self, cfg: EncodecConfig, dim: int, dilations: tuple[int, int]) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                EncodecConv1d(cfg, dim, hidden, cfg.residual_kernel_size, dilation=dilations[0]),
                nn.ELU(),
                EncodecConv1d(cfg, hidden, dim, 1, dilation=dilations[1]),
            ]
        )
        self.shortcut = EncodecConv1d(cfg, dim, dim, 1) if cfg.use_conv_shortcut else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """shortcut(x) + block(x)."""
        h = x
        for layer in self.block:
            h = layer(h)
        return self.shortcut(x) + h


class EncodecEncoder(nn.Module):
    """SEANet encoder: conv, then per ratio residual blocks and a strided conv, LSTM, ELU, conv."""

    def __init__(self, cfg: EncodecConfig) -> None:
        super().__init__()
        nf = cfg.num_filters
        layers: list[nn.Module] = [EncodecConv1d(cfg, cfg.audio_channels, nf, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * nf
            for j in range(cfg.num_residual_layers):
                layers.append(EncodecResnetBlock(cfg, dim, (cfg.dilation_growth_rate**j, 1)))
            layers += [nn.ELU(), EncodecConv1d(cfg, dim, dim * 2, ratio * 2, stride=ratio)]
            scale *= 2
        layers += [
            EncodecLSTM(cfg, scale * nf),
            nn.ELU(),
            EncodecConv1d(cfg, scale * nf, cfg.hidden_size, cfg.last_kernel_size),
        ]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, channels, samples) -> (batch, hidden_size, ceil(samples / hop_length))."""
        for layer in self.layers:
            x = layer(x)
        return x


class EncodecDecoder(nn.Module):
    """SEANet decoder: conv, LSTM, then per ratio a transposed conv and residual blocks, ELU, conv."""

    def __init__(self, cfg: EncodecConfig) -> None:
        super().__init__()
        nf = cfg.num_filters
        scale = 2 ** len(cfg.upsampling_ratios)
        layers: list[nn.Module] = [
            EncodecConv1d(cfg, cfg.hidden_size, scale * nf, cfg.kernel_size),
            EncodecLSTM(cfg, scale * nf),
        ]
        for ratio in cfg.upsampling_ratios:
            dim = scale * nf
            layers += [
                nn.ELU(),
                EncodecConvTranspose1d(cfg, dim, dim // 2, ratio * 2, stride=ratio),
            ]
            for j in range(cfg.num_residual_layers):
                layers.append(EncodecResnetBlock(cfg, dim // 2, (cfg.dilation_growth_rate**j, 1)))
            scale //= 2
        layers += [nn.ELU(), EncodecConv1d(cfg, nf, cfg.audio_channels, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, hidden_size, steps) -> (batch, channels, steps * hop_length)."""
        for layer in self.layers:
            x = layer(x)
        return x


class EncodecEuclideanCodebook(nn.Module):
    """One codebook: (codebook_size, codebook_dim) vectors, looked up by nearest Euclidean distance."""

    def __init__(self, cfg: EncodecConfig) -> None:
        super().__init__()
        self.embed = nn.Parameter(
            ember.zeros(cfg.codebook_size, cfg.codebook_dim), requires_grad=False
        )


class EncodecVectorQuantization(nn.Module):
    """One quantizer stage on (batch, dim, steps) vectors."""

    def __init__(self, cfg: EncodecConfig) -> None:
        super().__init__()
        self.codebook = EncodecEuclideanCodebook(cfg)

    def encode(self, x: Tensor) -> Tensor:
        """(b, dim, t) -> (b, t) indices of the nearest codebook entries."""
        b, d, t = x.shape
        flat = x.permute(0, 2, 1).reshape(b * t, d)
        embed = self.codebook.embed
        # the reference's expression, term for term, so that near ties resolve the same way
        dist = -(
            flat.pow(2).sum(1, keepdim=True)
            - 2 * (flat @ embed.t())
            + embed.pow(2).sum(1).unsqueeze(0)
        )
        return dist.argmax(dim=-1).reshape(b, t)

    def decode(self, codes: Tensor) -> Tensor:
        """(b, t) indices -> (b, dim, t) vectors."""
        return F.embedding(codes, self.codebook.embed).permute(0, 2, 1)


class EncodecResidualVectorQuantizer(nn.Module):
    """Residual VQ: each stage quantizes what the stages before it left."""

    def __init__(self, cfg: EncodecConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [EncodecVectorQuantization(cfg) for _ in range(cfg.num_quantizers)]
        )

    def encode(self, x: Tensor, num_quantizers: int) -> Tensor:
        """(b, dim, t) -> (num_quantizers, b, t) codes."""
        residual, codes = x, []
        for layer in self.layers[:num_quantizers]:
            idx = layer.encode(residual)
            residual = residual - layer.decode(idx)
            codes.append(idx)
        return ember.stack(codes)

    def decode(self, codes: Tensor) -> Tensor:
        """(q, b, t) codes -> (b, dim, t): the sum of each stage's vectors."""
        out = None
        for i in range(codes.shape[0]):
            v = self.layers[i].decode(codes[i])
            out = v if out is None else out + v
        return out


@dataclass
class EncodecEncoding:
    """What encode gives: codes (frames, batch, codebooks, steps), per-frame scales, last pad."""

    audio_codes: Tensor
    audio_scales: list
    last_frame_pad_length: int = 0


class EncodecModel(nn.Module):
    """The EnCodec codec: ``encode`` audio to codes, ``decode`` codes to audio."""

    def __init__(self, config: EncodecConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = EncodecEncoder(config)
        self.decoder = EncodecDecoder(config)
        self.quantizer = EncodecResidualVectorQuantizer(config)
        self.source = None

    def _audio(self, x) -> Tensor:
        t = x if isinstance(x, Tensor) else ember.tensor(np.asarray(x, dtype=np.float32))
        if t.ndim == 1:
            t = t.reshape(1, 1, -1)
        elif t.ndim == 2:
            t = t.unsqueeze(0)
        c = self.config.audio_channels
        if t.ndim != 3 or t.shape[1] != c or t.shape[-1] == 0:
            raise ShapeError(
                f"EnCodec: expected audio (batch, {c}, samples) with samples > 0, got {tuple(t.shape)}"
            )
        return t

    def _encode_frame(self, x: Tensor, nq: int) -> tuple[Tensor, Tensor | None]:
        scale = None
        if self.config.normalize:
            mono = x.sum(1, keepdim=True) / x.shape[1]
            scale = mono.pow(2).mean(-1, keepdim=True).sqrt() + 1e-8
            x = x / scale
            scale = scale.reshape(-1, 1)
        codes = self.quantizer.encode(self.encoder(x), nq)
        return codes.transpose(0, 1), scale

    def encode(self, audio, bandwidth: float | None = None) -> EncodecEncoding:
        """Codes of audio (batch, channels, samples); bandwidth in kbps (default: the smallest)."""
        cfg = self.config
        bw = cfg.target_bandwidths[0] if bandwidth is None else bandwidth
        if bw not in cfg.target_bandwidths:
            raise UnsupportedError(
                f"EnCodec: bandwidth {bw} is not one of this model's {list(cfg.target_bandwidths)}"
            )
        nq = cfg.num_quantizers_for(bw)
        x = self._audio(audio)
        n = x.shape[-1]
        chunk = cfg.chunk_length or n
        stride = cfg.chunk_stride if cfg.chunk_length else n
        frames, scales = [], []
        with ember.no_grad():
            for off in range(0, n, stride):
                codes, scale = self._encode_frame(x[..., off : off + chunk], nq)
                frames.append(codes)
                scales.append(scale)
            pad = frames[0].shape[-1] - frames[-1].shape[-1]
            if pad > 0:
                frames[-1] = F.pad(frames[-1], (0, pad))
            return EncodecEncoding(ember.stack(frames), scales, pad)

    def _decode_frame(self, codes: Tensor, scale) -> Tensor:
        out = self.decoder(self.quantizer.decode(codes.transpose(0, 1)))
        if scale is not None:
            out = out * scale.reshape(-1, 1, 1)
        return out

    def decode(
        self, audio_codes, audio_scales=None, last_frame_pad_length: int = 0,
        length: int | None = None,
    ) -> Tensor:  # fmt: skip
        """Audio (batch, channels, samples) from codes (frames, batch, codebooks, steps).

        audio_scales: one (batch, 1) scale or None per frame; length: cut the audio to this many
        samples (the input's length: the decoder rounds up to whole code steps).
        """
        cfg = self.config
        codes = (
            audio_codes
            if isinstance(audio_codes, Tensor)
            else ember.tensor(np.asarray(audio_codes, dtype=np.int64))
        )
        if codes.ndim != 4 or codes.shape[0] == 0 or codes.shape[2] == 0:
            raise ShapeError(
                f"EnCodec: codes must be (frames, batch, codebooks, steps), got {tuple(codes.shape)}"
            )
        if codes.shape[2] > cfg.num_quantizers:
            raise ShapeError(
                f"EnCodec: {codes.shape[2]} codebooks given, the model has {cfg.num_quantizers}"
            )
        scales = list(audio_scales) if audio_scales is not None else [None] * codes.shape[0]
        if len(scales) != codes.shape[0]:
            raise ShapeError(f"EnCodec: {len(scales)} scales for {codes.shape[0]} frames")
        if cfg.chunk_length is None and codes.shape[0] != 1:
            raise ShapeError(f"EnCodec: this model takes one frame of codes, got {codes.shape[0]}")
        outs = []
        with ember.no_grad():
            for i in range(codes.shape[0]):
                frame = codes[i]
                if i == codes.shape[0] - 1 and last_frame_pad_length > 0:
                    frame = frame[..., : frame.shape[-1] - last_frame_pad_length]
                s = scales[i]
                if s is not None and not isinstance(s, Tensor):
                    s = ember.tensor(np.asarray(s, dtype=np.float32))
                outs.append(self._decode_frame(frame, s))
            audio = (
                outs[0] if cfg.chunk_length is None else _overlap_add(outs, cfg.chunk_stride or 1)
            )
        if length is not None and length < audio.shape[-1]:
            audio = audio[..., :length]
        return audio

    def forward(self, audio, bandwidth: float | None = None) -> Tensor:
        """Encode then decode, cut to the input's length."""
        enc = self.encode(audio, bandwidth)
        n = self._audio(audio).shape[-1]
        return self.decode(enc.audio_codes, enc.audio_scales, enc.last_frame_pad_length, n)

    # --- loading

    @classmethod
    def from_state_dict(cls, config: EncodecConfig | dict, weights: dict, dtype=None):
        """Build on the meta device and take transformers-named weights (weight norm folded)."""
        from ember.models._weights import assign_weights

        cfg = config if isinstance(config, EncodecConfig) else EncodecConfig.from_dict(config)
        with ember.device("meta"):
            model = cls(cfg)
        assign_weights(model, fold_weight_norm(weights), dtype)
        return model.eval()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike):
        """A transformers EncodecModel folder: config.json and model.safetensors (or shards)."""
        from ember.io import load_safetensors

        p = Path(path)
        if not (p / "config.json").is_file():
            raise FormatError(f"{path}: expected an EnCodec folder with config.json")
        try:
            cfg = json.loads((p / "config.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FormatError(f"{p / 'config.json'}: not valid JSON ({e})") from None
        if cfg.get("model_type", "encodec") != "encodec":
            raise FormatError(f"{path}: config.json is a {cfg.get('model_type')!r}, not EnCodec")
        if not any(p.glob("*.safetensors")):
            raise FormatError(f"{path}: no .safetensors weights in the folder")
        model = cls.from_state_dict(cfg, load_safetensors(p))
        model.source = str(p)
        return model


_TRAINING_STATE = ("codebook.inited", "codebook.cluster_size", "codebook.embed_avg")


def fold_weight_norm(weights: dict) -> dict:
    """Checkpoint arrays with each weight-norm (g, v) pair replaced by g * v / ||v|| (dim 0 kept).

    The codebooks' k-means training state (inited, cluster_size, embed_avg) is dropped.
    """
    out, pairs = {}, {}
    for name, value in weights.items():
        if name.endswith(_TRAINING_STATE):
            continue
        for g_suffix, v_suffix in (
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
            (".weight_g", ".weight_v"),
        ):
            for i, suffix in enumerate((g_suffix, v_suffix)):
                if name.endswith(suffix):
                    pairs.setdefault(name[: -len(suffix)], [None, None])[i] = value
                    break
            else:
                continue
            break
        else:
            out[name] = value
    for prefix, (g, v) in pairs.items():
        if g is None or v is None:
            raise FormatError(f"{prefix}: weight norm needs both its g and v tensors")
        v64 = np.asarray(v, dtype=np.float64)
        g64 = np.asarray(g, dtype=np.float64)
        norm = np.sqrt((v64**2).sum(axis=tuple(range(1, v64.ndim)), keepdims=True))
        if g64.size != v64.shape[0]:
            raise FormatError(
                f"{prefix}: weight norm g has {g64.size} values for {v64.shape[0]} rows"
            )
        out[prefix + ".weight"] = (v64 * (g64.reshape(norm.shape) / norm)).astype(np.float32)
    return out


def _overlap_add(frames: list[Tensor], stride: int) -> Tensor:
    """Sum frames placed stride apart, each weighted by a triangle peaking mid-frame, / the weights."""
    n = frames[0].shape[-1]
    total = stride * (len(frames) - 1) + frames[-1].shape[-1]
    t = np.linspace(0.0, 1.0, n + 2, dtype=np.float32)[1:-1]
    weight = (0.5 - np.abs(t - 0.5)).astype(np.float32)
    sum_weight = np.zeros(total, np.float32)
    out = None
    for i, frame in enumerate(frames):
        off, m = i * stride, frame.shape[-1]
        sum_weight[off : off + m] += weight[:m]
        part = F.pad(frame * ember.tensor(weight[:m]), (off, total - off - m))
        out = part if out is None else out + part
    if sum_weight.min() == 0:
        raise ShapeError("EnCodec: the chunks leave gaps (overlap-add weight 0)")
    return out / ember.tensor(sum_weight)


__all__ = [
    "EncodecConfig", "EncodecModel", "EncodecEncoding", "EncodecEncoder", "EncodecDecoder",
    "EncodecResidualVectorQuantizer", "fold_weight_norm",
]  # fmt: skip
