"""Whisper transcription (a generation loop over ember.models.whisper): the special-token prompt, greedy/temperature sampling, timestamps, long audio.

The prompt is ``<|startoftranscript|>`` then, for multilingual models, the language and task
tokens, then ``<|notimestamps|>`` unless timestamps are requested (tiny.en:
``<|startoftranscript|><|notimestamps|>``). Each 30 s window is encoded once; its
cross-attention keys/values are projected once, and the decoder's self-attention keys/values
are cached, so a step costs one token's worth of decoder work. Logit rules follow openai/whisper:
suppressed tokens, a blank/EOT ban on the first step, and the timestamp pairing rules.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

import ember
from ember import config
from ember.errors import FormatError, UnsupportedError
from ember.generation.sampling import Sampler, SamplingParams
from ember.models.whisper.audio import (
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    log_mel_spectrogram,
)
from ember.nn.graph import StepGraph
from ember.threads import blas_single_thread

LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th "
    "ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr "
    "pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt "
    "haw ln ha ba jw su yue"
).split()
TIME_PRECISION = 0.02  # seconds per timestamp token (two mel frames)


@dataclass
class DecodingOptions:
    """How to decode: greedy by default, English transcription, no timestamps."""

    temperature: float | tuple[float, ...] = 0.0
    language: str | None = None
    task: str = "transcribe"
    timestamps: bool = False
    max_new_tokens: int = 224
    seed: int | None = None
    suppress_blank: bool = True
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    max_initial_timestamp: float = 1.0

    def temperatures(self) -> tuple[float, ...]:
        """The temperatures to try, in order (a fallback list when several are given)."""
        t = self.temperature
        return tuple(float(x) for x in t) if isinstance(t, (tuple, list)) else (float(t),)


@dataclass
class Segment:
    """A stretch of text with its time span (seconds from the start of the audio)."""

    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)


@dataclass
class TranscriptionResult:
    """What transcribe() returns: the text, segments, and the time spent."""

    text: str
    segments: list[Segment]
    language: str
    tokens: list[int]
    audio_seconds: float
    timings: dict[str, float] = field(default_factory=dict)


class SpecialTokens:
    """Whisper's special token ids, read from the tokenizer (timestamps follow <|notimestamps|>)."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        def tid(tok: str) -> int | None:
            return tokenizer.token_to_id(tok)

        self.eot = tid("<|endoftext|>")
        self.sot = tid("<|startoftranscript|>")
        self.translate = tid("<|translate|>")
        self.transcribe = tid("<|transcribe|>")
        self.sot_lm = tid("<|startoflm|>")
        self.sot_prev = tid("<|startofprev|>")
        self.no_speech = tid("<|nospeech|>") or tid("<|nocaptions|>")
        self.no_timestamps = tid("<|notimestamps|>")
        if None in (self.eot, self.sot, self.no_timestamps):
            raise UnsupportedError("tokenizer lacks Whisper's special tokens")
        self.timestamp_begin = self.no_timestamps + 1
        self.vocab_size = vocab_size
        self.multilingual = vocab_size >= 51865
        self.languages = {c: tid(f"<|{c}|>") for c in LANGUAGES if tid(f"<|{c}|>") is not None}

    def prompt(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """The decoder's start sequence."""
        ids = [self.sot]
        if self.multilingual:
            lang = self.languages.get(language or "en")
            if lang is None:
                raise UnsupportedError(f"unknown language {language!r}")
            if task not in ("transcribe", "translate"):
                raise UnsupportedError(f"task must be 'transcribe' or 'translate', got {task!r}")
            ids += [lang, self.transcribe if task == "transcribe" else self.translate]
        elif task != "transcribe" or language not in (None, "en"):
            raise UnsupportedError("this model is English-only: it can only transcribe English")
        if not timestamps:
            ids.append(self.no_timestamps)
        return ids

    def suppressed(self, config_ids) -> np.ndarray:
        """Token ids never to emit: the model's list plus the task/control tokens."""
        ids = set(config_ids or ())
        ids |= {self.sot, self.translate, self.transcribe, self.sot_lm, self.sot_prev}
        if self.no_speech is not None:
            ids.add(self.no_speech)
        ids.discard(None)
        return np.array(sorted(i for i in ids if 0 <= i < self.vocab_size), dtype=np.int64)


def compression_ratio(text: str) -> float:
    """len(text) / len(zlib(text)): high values mean repetitive output."""
    raw = text.encode("utf-8")
    return len(raw) / max(1, len(zlib.compress(raw)))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x[np.isfinite(x)].max()
    return x - m - np.log(np.exp(x - m).sum())


def _token_logprob(logits: np.ndarray, tok: int) -> float:
    """log softmax(logits)[tok] (float64 sums; -inf entries count for nothing)."""
    m = float(logits.max())
    if not np.isfinite(m):
        return float(_log_softmax(logits)[tok])
    lse = m + float(np.log(np.exp(logits - np.float32(m)).sum(dtype=np.float64)))
    return float(logits[tok]) - lse


def _timestamp_rules(
    logits: np.ndarray, gen: list[int], st: SpecialTokens, max_initial: int
) -> None:
    """openai/whisper's ApplyTimestampRules, in place on one row of logits."""
    tb = st.timestamp_begin
    logits[st.no_timestamps] = -np.inf
    last_ts = len(gen) >= 1 and gen[-1] >= tb
    penult_ts = len(gen) < 2 or gen[-2] >= tb
    if last_ts:
        if penult_ts:  # a pair closed: text (or EOT) next
            logits[tb:] = -np.inf
        else:  # a lone timestamp: another timestamp or EOT next
            logits[: st.eot] = -np.inf
    stamps = [t for t in gen if t >= tb]
    if stamps:  # never go back in time
        floor = stamps[-1] if (last_ts and not penult_ts) else stamps[-1] + 1
        logits[tb:floor] = -np.inf
    if not gen:  # start with a timestamp no later than max_initial
        logits[:tb] = -np.inf
        logits[tb + max_initial + 1 :] = -np.inf
    lp = _log_softmax(logits)
    ts_mass = np.logaddexp.reduce(lp[tb:])
    if ts_mass > lp[:tb].max():
        logits[:tb] = -np.inf


def encode_window(model, mel: np.ndarray) -> list:
    """The cross-attention keys/values of one (n_mels, frames) window (encoder run once)."""
    return model.cross_kv(model.encode(mel[None]))


class DecoderSteps:
    """A model's decoder steps on buffers of their own: a prompt runs as a plain forward, each
    one-token step as a captured ``ember.nn.graph.StepGraph``, replayed without Python dispatch.

    The graph reads the cross-attention keys/values from buffers that ``start`` copies a
    window's into, the self-attention keys/values from one KV cache, and the position from an
    int64 array the attention op reads when it runs: nothing else changes from one step to the
    next (the model's ``decode_body`` contract). One capture serves every window of the same
    length. ``EMBER_GRAPHS=0`` runs every step as a plain forward.
    """

    def __init__(self, model, max_len: int | None = None) -> None:
        self.model = model
        self.cache = model.new_cache(1, max_len)
        self.cross: list | None = None
        self.graph: StepGraph | None = None
        self._past = np.zeros(1, np.int64)

    def start(self, cross: list) -> None:
        """Begin decoding a window (or try it again): its cross keys/values in, the cache empty."""
        shapes = [(tuple(k.shape), tuple(v.shape)) for k, v in cross]
        if self.cross is None or shapes != [
            (tuple(k.shape), tuple(v.shape)) for k, v in self.cross
        ]:
            self.cross = [
                (ember.from_numpy(np.array(k.numpy(), np.float32, order="C")),
                 ember.from_numpy(np.array(v.numpy(), np.float32, order="C")))
                for k, v in cross
            ]  # fmt: skip
            self.graph = StepGraph(self._body) if config.GRAPHS else None
        else:
            for (kb, vb), (k, v) in zip(self.cross, cross):
                if kb is not k:
                    np.copyto(kb.numpy(), k.numpy())
                    np.copyto(vb.numpy(), v.numpy())
        self.cache.reset()

    def _body(self, x, past):
        return self.model.decode_body(x, self.cross, past.numpy(), self.cache)

    def __call__(self, ids: list[int]) -> np.ndarray:
        """The last new position's logits (vocab,) after feeding ids; the cache moves past them."""
        model, cache = self.model, self.cache
        if self.graph is None or len(ids) != 1:
            return model.decode(np.array([ids]), self.cross, cache).numpy()[0, -1]
        x = model.decode_inputs(np.array([ids]), cache.pos)
        self._past[0] = cache.pos
        out = self.graph(x, ember.from_numpy(self._past))
        cache.advance(1)
        return out.numpy()[0, -1]


def detect_language(model, cross: list, st: SpecialTokens) -> str:
    """The most likely language code after <|startoftranscript|> (multilingual models)."""
    if not st.languages:
        return "en"
    logits = model.decode(np.array([[st.sot]]), cross).numpy()[0, -1]
    codes = list(st.languages)
    return codes[int(np.argmax(logits[[st.languages[c] for c in codes]]))]


def decode_tokens(
    model,
    cross: list,
    st: SpecialTokens,
    opts: DecodingOptions,
    temperature: float = 0.0,
    seed: int | None = None,
    steps: DecoderSteps | None = None,
) -> tuple[list[int], float]:
    """Decode one encoded window: (generated tokens without EOT, mean log-prob per token).

    steps: the ``DecoderSteps`` to run them on (transcribe passes one for all its windows);
    None: a new one.
    """
    cfg = model.config
    prompt = st.prompt(opts.language, opts.task, opts.timestamps)
    limit = min(opts.max_new_tokens, cfg.max_target_positions - len(prompt))
    if steps is None:
        steps = DecoderSteps(model, len(prompt) + limit)
    steps.start(cross)
    suppress = st.suppressed(cfg.suppress_tokens)
    begin = np.array([i for i in (cfg.begin_suppress_tokens or (220, st.eot)) if i < st.vocab_size])
    sampler = Sampler(SamplingParams(temperature=temperature, seed=seed))
    max_initial = int(round(opts.max_initial_timestamp / TIME_PRECISION))
    gen: list[int] = []
    total_lp = 0.0
    ids = prompt
    with blas_single_thread():  # one-row products: threads only add sync cost
        for _ in range(limit):
            logits = np.asarray(steps(ids), np.float32)  # a fresh array: ours to edit
            logits[suppress] = -np.inf
            if not gen and opts.suppress_blank:
                logits[begin] = -np.inf
            if opts.timestamps:
                _timestamp_rules(logits, gen, st, max_initial)
            else:
                logits[st.timestamp_begin :] = -np.inf
            tok = sampler(logits)
            total_lp += _token_logprob(logits, tok)
            if tok == st.eot:
                break
            gen.append(tok)
            ids = [tok]
    return gen, total_lp / (len(gen) + 1)


def _segments(tokens: list[int], st: SpecialTokens, tokenizer, offset: float) -> list[Segment]:
    """Split timestamped tokens into segments (a trailing open segment ends at its last stamp)."""
    tb = st.timestamp_begin
    segs, cur, start = [], [], None
    for t in tokens:
        if t >= tb:
            stamp = offset + (t - tb) * TIME_PRECISION
            if start is None:
                start = stamp
            elif cur:
                segs.append(Segment(start, stamp, tokenizer.decode(cur), cur))
                cur, start = [], None
            else:
                start = stamp
        else:
            cur.append(t)
    if cur:
        segs.append(
            Segment(
                start if start is not None else offset, start or offset, tokenizer.decode(cur), cur
            )
        )
    return segs


def transcribe(
    model,
    tokenizer,
    audio: np.ndarray,
    sample_rate: int = SAMPLE_RATE,
    options: DecodingOptions | None = None,
    **kwargs,
) -> TranscriptionResult:
    """Speech to text for mono audio of any length (30 s windows, decoded one after another).

    kwargs override fields of options (temperature=, timestamps=, language=, ...).
    """
    from ember.models.whisper.audio import resample

    opts = options or DecodingOptions()
    unknown = set(kwargs) - {f.name for f in fields(DecodingOptions)}
    if unknown:
        raise TypeError(f"transcribe: unknown options {sorted(unknown)}")
    opts = replace(opts, **kwargs)
    t0 = time.perf_counter()
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1) if x.shape[1] <= 8 else x.mean(axis=0)
    if sample_rate != SAMPLE_RATE:
        x = resample(x, sample_rate, SAMPLE_RATE)
    st = SpecialTokens(tokenizer, model.config.vocab_size)
    n_mels = model.config.num_mel_bins
    timings = {"features": 0.0, "encode": 0.0, "decode": 0.0}
    segments: list[Segment] = []
    all_tokens: list[int] = []
    steps = DecoderSteps(model)  # one capture of the decoder's step for every window
    seek = 0  # in samples
    while seek < max(1, x.size):
        t = time.perf_counter()
        chunk = x[seek : seek + N_SAMPLES]
        mel = log_mel_spectrogram(chunk, n_mels)
        timings["features"] += time.perf_counter() - t
        t = time.perf_counter()
        cross = encode_window(model, mel)
        if st.multilingual and opts.language is None:
            opts = replace(opts, language=detect_language(model, cross, st))
        timings["encode"] += time.perf_counter() - t
        t = time.perf_counter()
        tokens: list[int] = []
        for i, temp in enumerate(opts.temperatures()):
            seed = None if opts.seed is None else opts.seed + i
            tokens, avg_lp = decode_tokens(model, cross, st, opts, temp, seed, steps)
            text = tokenizer.decode([tok for tok in tokens if tok < st.eot])
            too_rep = (
                opts.compression_ratio_threshold is not None
                and compression_ratio(text) > opts.compression_ratio_threshold
            )
            too_unlikely = opts.logprob_threshold is not None and avg_lp < opts.logprob_threshold
            if not (too_rep or too_unlikely):
                break
        timings["decode"] += time.perf_counter() - t
        offset = seek / SAMPLE_RATE
        advance = N_SAMPLES
        if opts.timestamps:
            segs = _segments(tokens, st, tokenizer, offset)
            stamps = [tok for tok in tokens if tok >= st.timestamp_begin]
            ends_pair = len(tokens) >= 2 and tokens[-1] >= st.timestamp_begin > tokens[-2]
            if stamps and chunk.size == N_SAMPLES and not ends_pair and len(segs) > 1:
                # the last segment may be cut: drop it and restart from its start
                last = segs.pop()
                advance = max(HOP_LENGTH, int(round((last.start - offset) * SAMPLE_RATE)))
                keep = len(tokens) - len(last.tokens) - 1
                tokens = tokens[: max(0, keep)]
            for s in segs:
                s.end = min(
                    s.end if s.end > s.start else offset + chunk.size / SAMPLE_RATE, offset + 30.0
                )
        else:
            text = tokenizer.decode([tok for tok in tokens if tok < st.eot])
            segs = (
                [Segment(offset, offset + chunk.size / SAMPLE_RATE, text, tokens)] if tokens else []
            )
        segments.extend(segs)
        all_tokens.extend(tokens)
        seek += advance
    text = "".join(s.text for s in segments).strip()
    timings["total"] = time.perf_counter() - t0
    lang = opts.language or "en"
    return TranscriptionResult(text, segments, lang, all_tokens, x.size / SAMPLE_RATE, timings)


__all__ = [
    "DecodingOptions", "Segment", "TranscriptionResult", "SpecialTokens", "encode_window",
    "DecoderSteps", "decode_tokens", "load_whisper", "quantize_decoder", "detect_language",
    "transcribe", "compression_ratio", "N_FRAMES",
]  # fmt: skip


def load_whisper(path: str | os.PathLike | None = None, quantize: str | None = None):
    """(model, tokenizer) from a CTranslate2 or HF Whisper folder (default: bundled tiny.en).

    quantize: a block format ("q8_0") for the decoder's weights (``quantize_decoder``).
    """
    from ember.generation.tokenizer import Tokenizer
    from ember.models.whisper import WhisperForConditionalGeneration, default_model_dir

    d = Path(path) if path is not None else default_model_dir()
    folder = d if d.is_dir() else d.parent
    if not (folder / "tokenizer.json").is_file():
        raise FormatError(f"{folder}: no tokenizer.json next to the Whisper weights")
    model = WhisperForConditionalGeneration.from_pretrained(d)
    if quantize is not None:
        quantize_decoder(model, quantize)
    _optimize_encoder(model)
    return model, Tokenizer.from_file(folder / "tokenizer.json")


# the decoder's linears that run once per window on every encoder frame, not once per token
_PER_WINDOW = ("encoder_attn.k_proj", "encoder_attn.v_proj")


def quantize_decoder(model, qtype: str = "q8_0"):
    """The weights of every product a decoder step runs, in a block format, in place.

    That is each layer's self-attention q/k/v/out, cross-attention q/out, fc1, fc2 and the
    output projection (a quantized copy of the tied token embedding, which stays float for
    lookups): their one-row products then run the integer kernels (Q8_0, Q4_0, Q4_1:
    ``kernels.cpu.quant._idot``). The encoder and the cross-attention key/value projections
    (1500 rows per window) stay float32 on the packed GEMM: ember has no integer kernel for
    products of many rows, and a Q8_0 encoder, dequantized tile by tile, took 165 ms a window
    against 110 ms in float32 here. Returns the model.
    """
    from ember.quant import quantize

    qt = qtype.lower()
    if qt.upper() not in ("Q8_0", "Q4_0", "Q4_1"):
        raise UnsupportedError(f"quantize: {qtype!r} is not one of q8_0, q4_0, q4_1")
    quantize(model.model.decoder, qt, skip=_PER_WINDOW)
    quantize(model, qt, skip=("model.",))  # proj_out: the only linear outside model.*
    return model


def _optimize_encoder(model) -> None:
    """The encoder through ember.inference (its linears' weights packed for the packed GEMM).

    Then every product of the encoder (convs, linears, attention) runs on numba's threads: with
    its linears on BLAS, OpenBLAS's workers kept spinning on the cores for ~0.1 s after each
    call, through the attention kernel that followed. The decoder keeps BLAS: its one-row
    products run single-threaded (``blas_single_thread``) between Python-level steps.
    """
    from ember.inference import optimize_for_inference

    enc = model.model.encoder
    model.model.encoder = optimize_for_inference(enc, inplace=True)
