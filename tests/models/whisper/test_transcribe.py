"""End to end: the committed espeak-ng clip through tiny.en, the prompt, and `ember transcribe`."""

from __future__ import annotations

import numpy as np
import pytest

from ember.cli.main import main
from ember.errors import UnsupportedError
from ember.generation.whisper import (
    DecodingOptions,
    SpecialTokens,
    compression_ratio,
    decode_tokens,
    encode_window,
    transcribe,
)
from ember.models.whisper import log_mel_spectrogram
from ember.models.whisper.audio import resample

from .conftest import CLIP, CLIP_TEXT, words
from .test_audio import write_wav

MAIN_WORDS = ["hello", "world", "this", "test", "speech"]


def recognised(text: str, ratio: float = 0.8) -> bool:
    """The main words are there and most of the sentence's words are."""
    got, want = words(text), words(CLIP_TEXT)
    return all(w in got for w in MAIN_WORDS) and sum(w in got for w in want) >= ratio * len(want)


def test_greedy_transcript(whisper, clip):
    model, tok = whisper
    res = transcribe(model, tok, clip)
    assert recognised(res.text), res.text
    assert res.tokens[-1] != 50256 and all(t < 50256 for t in res.tokens)  # no specials, no stamps
    assert res.audio_seconds == pytest.approx(clip.size / 16000)
    assert len(res.segments) == 1 and res.segments[0].start == 0.0
    assert {"features", "encode", "decode", "total"} <= set(res.timings)


def test_temperature_sampling_is_seeded(whisper, clip):
    model, tok = whisper
    st = SpecialTokens(tok, model.config.vocab_size)
    cross = encode_window(model, log_mel_spectrogram(clip))
    opts = DecodingOptions()
    a, lp_a = decode_tokens(model, cross, st, opts, temperature=0.4, seed=1)
    b, lp_b = decode_tokens(model, cross, st, opts, temperature=0.4, seed=1)
    assert a == b and lp_a == lp_b
    assert recognised(tok.decode(a), ratio=0.6), tok.decode(a)
    greedy, lp_g = decode_tokens(model, cross, st, opts)
    assert tok.decode(greedy).strip() == CLIP_TEXT.replace("ember", "Ember")
    assert -1.0 < lp_g < 0 and lp_a < 0  # mean log-probabilities per token (openai: > -1)


def test_prompts():
    class Tok:  # token ids of Whisper's multilingual vocabulary
        ids = {"<|endoftext|>": 50257, "<|startoftranscript|>": 50258, "<|en|>": 50259,
               "<|de|>": 50261, "<|translate|>": 50358, "<|transcribe|>": 50359,
               "<|notimestamps|>": 50363}  # fmt: skip

        def token_to_id(self, t):
            return self.ids.get(t)

    multi = SpecialTokens(Tok(), 51865)
    assert multi.prompt(None, "transcribe", False) == [50258, 50259, 50359, 50363]
    assert multi.prompt("de", "translate", True) == [50258, 50261, 50358]
    assert multi.timestamp_begin == 50364
    with pytest.raises(UnsupportedError):
        multi.prompt("xx", "transcribe", False)


def test_english_only_prompt(whisper):
    _, tok = whisper
    st = SpecialTokens(tok, 51864)
    assert not st.multilingual
    assert st.prompt(None, "transcribe", False) == [50257, 50362]  # sot, notimestamps
    assert st.prompt("en", "transcribe", True) == [50257]
    assert st.timestamp_begin == 50363
    with pytest.raises(UnsupportedError):
        st.prompt("de", "transcribe", False)
    assert compression_ratio("ab" * 200) > 2.4 > compression_ratio("Hello world.")


def test_cli_transcribe(capsys):
    assert main(["transcribe", str(CLIP)]) == 0
    out = capsys.readouterr().out
    assert recognised(out), out


def test_cli_resamples_stereo_and_prints_timestamps(tmp_path, clip, capsys):
    up = resample(clip, 16000, 44100)
    pcm = np.round(np.stack([up, 0.5 * up], 1) * 32767).astype(np.int64)
    p = tmp_path / "stereo44k.wav"
    write_wav(p, pcm, 44100, 2)
    assert main(["transcribe", str(p), "--timestamps", "-v"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("[00:00.") and "->" in cap.out
    assert recognised(cap.out), cap.out
    assert "real-time factor" in cap.err


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"nope")
    assert main(["transcribe", str(bad)]) == 1
    assert "error" in capsys.readouterr().err


def test_long_audio_is_decoded_window_by_window(whisper, clip):
    model, tok = whisper
    gap = np.zeros(16000 * 27, np.float32)
    x = np.concatenate([clip, gap, clip, gap[: 16000 * 2], clip])  # ~43 s: two windows
    res = transcribe(model, tok, x, timestamps=True)
    assert words(res.text).count("hello") == 3, res.text
    assert res.tokens[0] >= 50363  # a window starts with a timestamp token
    ends = [s.end for s in res.segments]
    assert all(s.start < s.end for s in res.segments) and ends == sorted(ends)
    assert res.segments[0].start < 1.0 and res.segments[-1].start >= 30.0
    assert 40.0 <= res.segments[-1].end <= x.size / 16000 + 0.5


def test_loaded_encoder_runs_on_packed_weights_and_matches_the_plain_one(whisper, clip):
    import numpy as np

    from ember.kernels.cpu import gemm as G
    from ember.models.whisper import (
        WhisperForConditionalGeneration,
        default_model_dir,
        log_mel_spectrogram,
    )

    model, _ = whisper
    fc1 = model.model.encoder.layers[0].fc1.weight.numpy()
    if G.microkernels_available():
        assert G.packed_panels(fc1) is not None
    assert G.packed_panels(model.model.decoder.layers[0].fc1.weight.numpy()) is None
    plain = WhisperForConditionalGeneration.from_pretrained(default_model_dir())
    mel = log_mel_spectrogram(clip[:16000])[None]
    got, want = model.encode(mel).numpy(), plain.encode(mel).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
