"""The log-mel front end against transformers' WhisperFeatureExtractor, WAV reading, resampling."""

from __future__ import annotations

import wave

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank

from ember.errors import FormatError, UnsupportedError
from ember.models.whisper.audio import (
    N_FRAMES,
    load_audio,
    load_wav,
    log_mel_spectrogram,
    mel_filters,
    pad_or_trim,
    resample,
)


@pytest.fixture(scope="module")
def fe():
    return WhisperFeatureExtractor()  # n_fft 400, hop 160, 80 mels, 30 s chunks


def hf_features(fe, audio):
    return fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]


def test_mel_filters_match_transformers_slaney():
    ref = mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=80,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=16000,
        norm="slaney",
        mel_scale="slaney",
    )
    ours = mel_filters(80)
    assert ours.shape == (80, 201)
    np.testing.assert_allclose(ours.T, ref, rtol=1e-10, atol=1e-14)
    ref128 = mel_filter_bank(201, 128, 0.0, 8000.0, 16000, norm="slaney", mel_scale="slaney")
    np.testing.assert_allclose(mel_filters(128).T, ref128, rtol=1e-10, atol=1e-14)


def test_features_match_feature_extractor_on_the_clip(fe, clip):
    ours = log_mel_spectrogram(clip)
    ref = hf_features(fe, clip)
    assert ours.shape == ref.shape == (80, N_FRAMES) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("n", [1, 401, 12345, 16000 * 31 + 7])  # tiny, odd, long (trimmed)
def test_features_match_feature_extractor_on_noise(fe, n):
    rng = np.random.default_rng(n)
    t = np.arange(n) / 16000
    x = (0.05 * rng.standard_normal(n) + 0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    np.testing.assert_allclose(log_mel_spectrogram(x), hf_features(fe, x), atol=1e-4, rtol=0)


def test_silence_is_the_floor(fe):
    x = np.zeros(8000, np.float32)
    ours = log_mel_spectrogram(x)
    np.testing.assert_allclose(ours, -1.5)  # log10(1e-10) = -10 -> (-10 + 4) / 4
    np.testing.assert_allclose(ours, hf_features(fe, x), atol=1e-4)


def test_unpadded_features_and_errors(clip):
    full = log_mel_spectrogram(clip)
    own = log_mel_spectrogram(clip, n_samples=None)
    assert own.shape == (80, clip.size // 160)
    assert pad_or_trim(np.ones(5), 3).shape == (3,) and pad_or_trim(np.ones(2), 4)[-1] == 0
    assert np.isfinite(own).all() and full.max() == pytest.approx(own.max(), abs=1e-3)
    with pytest.raises(UnsupportedError):
        log_mel_spectrogram(np.zeros((2, 100)))
    with pytest.raises(UnsupportedError):
        log_mel_spectrogram(np.zeros(10), n_samples=None)


def write_wav(path, data: np.ndarray, rate: int, width: int) -> None:
    """Write integer PCM (data: (frames, channels) of ints in the width's range)."""
    frames = data.reshape(data.shape[0], -1)
    if width == 1:
        raw = (frames + 128).astype(np.uint8).tobytes()
    elif width == 3:
        v = frames.astype("<i4").reshape(-1)
        raw = np.stack([(v >> s) & 0xFF for s in (0, 8, 16)], -1).astype(np.uint8).tobytes()
    else:
        raw = frames.astype(f"<i{width}").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_load_wav_widths_and_channels(tmp_path, width, channels):
    rng = np.random.default_rng(width * 10 + channels)
    full = 1 << (8 * width - 1)
    ints = rng.integers(-full, full, size=(257, channels))
    p = tmp_path / "x.wav"
    write_wav(p, ints, 8000, width)
    x, rate = load_wav(p)
    assert rate == 8000 and x.dtype == np.float32 and x.shape == (257,)
    np.testing.assert_allclose(x, (ints / full).mean(axis=1), atol=1e-6)


def test_load_wav_rejects_garbage(tmp_path):
    p = tmp_path / "bad.wav"
    p.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(FormatError):
        load_wav(p)
    p.write_bytes(b"not a wav at all")
    with pytest.raises(FormatError):
        load_wav(p)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resample_matches_scipy_and_keeps_tones(rate):
    from scipy.signal import resample_poly

    t = np.arange(rate) / rate
    x = np.sin(2 * np.pi * 440 * t) + 0.3 * np.sin(2 * np.pi * 3000 * t)
    y = resample(x, rate, 16000)
    assert y.shape == (16000,) and y.dtype == np.float32
    n = np.arange(16000) / 16000
    want = np.sin(2 * np.pi * 440 * n) + 0.3 * np.sin(2 * np.pi * 3000 * n)
    assert np.abs(y - want)[200:-200].max() < 1e-3
    g = np.gcd(rate, 16000)
    ref = resample_poly(x, 16000 // g, rate // g)
    assert np.abs(y - ref[: y.size])[200:-200].max() < 5e-3  # scipy is the looser of the two


def test_resample_rejects_aliasing_and_bad_rates():
    t = np.arange(44100) / 44100
    y = resample(np.sin(2 * np.pi * 9000 * t), 44100, 16000)  # above the new Nyquist
    assert np.abs(y[200:-200]).max() < 1e-3
    assert np.array_equal(resample(np.ones(3), 16000, 16000), np.ones(3, np.float32))
    with pytest.raises(UnsupportedError):
        resample(np.ones(3), 0, 16000)


def test_load_audio_resamples_stereo(tmp_path, clip):
    stereo = np.stack([clip, clip], 1)
    up = resample(stereo[:, 0], 16000, 22050)
    p = tmp_path / "s.wav"
    write_wav(p, np.round(np.stack([up, up], 1) * 32767).astype(np.int64), 22050, 2)
    back = load_audio(p)
    assert abs(back.size - clip.size) <= 1
    n = min(back.size, clip.size)
    err = (back[:n] - clip[:n])[100:-100]
    assert np.sqrt(np.mean(err**2)) < 0.02 * np.sqrt(np.mean(clip**2))  # only the top band is cut
