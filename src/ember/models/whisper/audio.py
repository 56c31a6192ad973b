"""Whisper's audio front end in numpy: WAV reading, resampling and the 80-bin log-mel spectrogram.

The spectrogram is Whisper's (and transformers' WhisperFeatureExtractor's): 16 kHz audio padded
or trimmed to 30 s, a centred STFT (reflect padding, periodic Hann window, n_fft 400, hop 160),
power spectrum, Slaney-style mel filters (as librosa's default), log10 clamped to 1e-10 and to
8 below the maximum, then (x + 4) / 4.
"""

from __future__ import annotations

import math
import os
import wave

import numpy as np

from ember.errors import FormatError, UnsupportedError
from ember.threads import blas_single_thread

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a window
STEP_FRAMES = 200  # frames the STFT takes at a time (log_mel_spectrogram)


def hz_to_mel(freq: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    freq = np.asarray(freq, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = freq / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    above = freq >= min_log_hz
    return np.where(
        above, min_log_mel + np.log(np.maximum(freq, min_log_hz) / min_log_hz) / logstep, mels
    )


def mel_to_hz(mels: np.ndarray | float) -> np.ndarray:
    """Inverse of hz_to_mel."""
    mels = np.asarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = mels * f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(mels >= min_log_mel, min_log_hz * np.exp(logstep * (mels - min_log_mel)), freqs)


def mel_filters(
    n_mels: int = 80, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE, fmax: float | None = None
) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangular filters, Slaney-normalised (constant energy per band)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(fmax), n_mels + 2))
    width = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]  # (bins, n_mels + 2)
    down = -slopes[:, :-2] / width[:-1]
    up = slopes[:, 2:] / width[1:]
    fb = np.maximum(0.0, np.minimum(down, up))  # (bins, n_mels)
    fb *= 2.0 / (edges[2:] - edges[:-2])
    return fb.T.copy()


def hann_window(n: int) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default)."""
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    """Zero-pad at the end or cut to exactly length samples."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.shape[-1] >= length:
        return audio[..., :length]
    return np.pad(audio, [(0, 0)] * (audio.ndim - 1) + [(0, length - audio.shape[-1])])


_FILTERS: dict[int, np.ndarray] = {}


def log_mel_spectrogram(
    audio: np.ndarray, n_mels: int = 80, n_samples: int | None = N_SAMPLES
) -> np.ndarray:
    """(n_mels, frames) float32 log-mel features of 16 kHz mono audio.

    n_samples: pad or trim to this many samples first (30 s, 3000 frames, by default);
    None keeps the audio's own length (len // 160 frames).
    """
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise UnsupportedError(
            f"log_mel_spectrogram: expected mono audio (samples,), got {x.shape}"
        )
    if n_samples is not None:
        x = pad_or_trim(x, n_samples)
    if x.size <= N_FFT // 2:
        raise UnsupportedError(f"log_mel_spectrogram: {x.size} samples is too short for an STFT")
    half = N_FFT // 2
    xp = np.pad(x.astype(np.float64), (half, half), mode="reflect")
    n_frames = 1 + (xp.size - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(
        xp, (n_frames, N_FFT), (xp.strides[0] * HOP_LENGTH, xp.strides[0]), writeable=False
    )
    fb = _FILTERS.get(n_mels)
    if fb is None:
        fb = _FILTERS[n_mels] = mel_filters(n_mels)
    window = hann_window(N_FFT)
    n_out = n_frames - 1  # the last frame is dropped
    mel = np.empty((n_mels, n_out))
    # STEP_FRAMES frames at a time, so that each step's arrays stay in cache: whole-window
    # arrays (four of 5-10 MB) took fresh pages from the system on most calls (~1000 page
    # faults, 25-35 ms of a 7 ms computation on this VM). One BLAS thread: the products are small
    # and OpenBLAS's workers, once woken, spin for ~0.1 s afterwards, taking the cores from the
    # encoder that runs next (~50 ms lost).
    with blas_single_thread():
        for f0 in range(0, n_out, STEP_FRAMES):
            f1 = min(n_out, f0 + STEP_FRAMES)
            spec = np.fft.rfft(frames[f0:f1] * window, axis=-1)
            power = spec.real**2 + spec.imag**2
            np.matmul(fb, power.T, out=mel[:, f0:f1])
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


def load_wav(path: str | os.PathLike, mono: bool = True) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], sample_rate) from a PCM WAV file.

    mono: average the channels to (samples,); else keep them, (channels, samples).
    """
    try:
        with wave.open(os.fspath(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            n = w.getnframes()
            raw = w.readframes(n)
    except wave.Error as e:
        raise FormatError(f"{path}: not a PCM WAV file the wave module can read ({e})") from None
    except EOFError:
        raise FormatError(f"{path}: WAV file is truncated") from None
    if channels < 1 or rate <= 0:
        raise FormatError(f"{path}: WAV header has {channels} channels at {rate} Hz")
    usable = len(raw) // (width * channels) * width * channels
    raw = raw[:usable]
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    elif width == 4:
        x = (np.frombuffer(raw, "<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    else:
        raise UnsupportedError(f"{path}: {8 * width}-bit WAV samples are not supported")
    x = x.reshape(-1, channels)
    if not mono:
        return np.ascontiguousarray(x.T, dtype=np.float32), rate
    return (x[:, 0] if channels == 1 else x.mean(axis=1)).astype(np.float32), rate


def resample(
    audio: np.ndarray, orig_sr: int, target_sr: int = SAMPLE_RATE, taps: int = 32
) -> np.ndarray:
    """Polyphase resampling by target_sr / orig_sr with a Kaiser-windowed sinc filter.

    Output sample n sits at input time n * down / up (up/down = the reduced rate ratio); there
    are only `up` distinct fractional offsets, so the filter is tabulated once per phase. The
    cutoff sits just below the lower Nyquist frequency, so downsampling does not alias.
    """
    x = np.asarray(audio, dtype=np.float32)
    if orig_sr <= 0 or target_sr <= 0:
        raise UnsupportedError(
            f"resample: sample rates must be positive, got {orig_sr} -> {target_sr}"
        )
    if orig_sr == target_sr or x.size == 0:
        return x.copy()
    g = math.gcd(orig_sr, target_sr)
    up, down = target_sr // g, orig_sr // g
    cutoff = min(1.0, up / down) * 0.97
    width = int(np.ceil(taps / cutoff))
    offs = np.arange(-width + 1, width + 1)
    frac = np.arange(up) / up  # fractional input offset of each phase
    d = frac[:, None] - offs[None, :]
    r = np.clip(1.0 - (d / width) ** 2, 0.0, None)
    beta = 8.0
    table = cutoff * np.sinc(cutoff * d) * (np.i0(beta * np.sqrt(r)) / np.i0(beta))
    n_out = -(-x.size * up // down)
    xp = np.pad(x.astype(np.float64), (width, width + 1))
    out = np.empty(n_out, np.float32)
    block = max(1, (1 << 21) // offs.size)
    for s in range(0, n_out, block):
        n = np.arange(s, min(n_out, s + block), dtype=np.int64)
        base, phase = np.divmod(n * down, up)
        idx = base[:, None] + (offs + width)[None, :]
        out[s : s + n.size] = np.einsum("ij,ij->i", xp[idx], table[phase])
    return out


def load_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples at sample_rate from a WAV file (resampled when its rate differs)."""
    x, sr = load_wav(path)
    return resample(x, sr, sample_rate) if sr != sample_rate else x


__all__ = [
    "SAMPLE_RATE", "N_FFT", "HOP_LENGTH", "N_SAMPLES", "N_FRAMES", "hz_to_mel", "mel_to_hz",
    "mel_filters", "hann_window", "pad_or_trim", "log_mel_spectrogram", "load_wav", "resample",
    "load_audio",
]  # fmt: skip
