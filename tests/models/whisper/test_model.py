"""ember's Whisper against transformers' WhisperForConditionalGeneration with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperConfig as HFConfig
from transformers import WhisperForConditionalGeneration as HFWhisper

import ember
from ember.models.whisper import WhisperConfig, WhisperForConditionalGeneration, log_mel_spectrogram
from ember.threads import blas_single_thread

TINY_EN = dict(
    vocab_size=51864,
    num_mel_bins=80,
    d_model=384,
    encoder_layers=4,
    decoder_layers=4,
    encoder_attention_heads=6,
    decoder_attention_heads=6,
    encoder_ffn_dim=1536,
    decoder_ffn_dim=1536,
    max_source_positions=1500,
    max_target_positions=448,
)
# <|startoftranscript|><|notimestamps|> Hello world, this is a test of the Ember speech recognizer.
IDS = [50257, 50362, 18435, 995, 11, 428, 318, 257, 1332, 286, 262, 33216, 4046, 3018, 7509, 13]


def to_hf(model, cfg: dict):
    """A transformers model holding ember's weights (its state_dict keys are the same)."""
    hf = HFWhisper(HFConfig(**cfg)).eval()
    sd = {k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()}
    hf.load_state_dict(sd, strict=True)
    return hf


@pytest.fixture(scope="module")
def pair(whisper):
    model, _ = whisper
    return model, to_hf(model, TINY_EN)


@pytest.fixture(scope="module")
def features(clip):
    return log_mel_spectrogram(clip)[None]


def test_state_dict_names_are_transformers(pair):
    model, hf = pair
    ours = model.state_dict()
    assert set(ours) == set(hf.state_dict())
    assert "model.encoder.layers.3.self_attn.q_proj.weight" in ours
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight  # tied


@pytest.fixture(scope="module")
def encoded(pair, features):
    """(ember's, transformers') encoder outputs for the clip: one run each."""
    model, hf = pair
    with torch.no_grad():
        ref = hf.model.encoder(torch.from_numpy(features)).last_hidden_state
    return model.encode(features), ref


def test_encoder_matches_transformers(encoded):
    ours, ref = encoded
    assert tuple(ours.shape) == tuple(ref.shape) == (1, 1500, 384)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-4, rtol=1e-4)


def test_decoder_logits_match_transformers(pair, encoded):
    model, hf = pair
    enc, ref_enc = encoded
    ids = np.array([IDS])
    ours = model.decode(ids, model.cross_kv(enc)).numpy()
    with torch.no_grad():
        out = hf.model.decoder(input_ids=torch.tensor(ids), encoder_hidden_states=ref_enc)
        ref = hf.proj_out(out.last_hidden_state).numpy()
    assert ours.shape == ref.shape == (1, len(IDS), 51864)
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
    # greedy argmax of each position reproduces the transcript (teacher forcing)
    assert ours[0, 1:-1].argmax(-1).tolist() == IDS[2:]


def test_kv_cache_steps_equal_the_full_pass(pair, encoded):
    model, _ = pair
    cross = model.cross_kv(encoded[0])
    full = model.decode(np.array([IDS]), cross).numpy()
    cache = model.new_cache(1, 32)
    with blas_single_thread():  # as decoding runs its steps
        steps = [model.decode(np.array([IDS[:3]]), cross, cache).numpy()]
        for t in IDS[3:]:
            steps.append(model.decode(np.array([[t]]), cross, cache).numpy())
    assert cache.pos == len(IDS)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-4, rtol=1e-4)
    k, v = cross[0]
    assert tuple(k.shape) == tuple(v.shape) == (1, 6, 1500, 64)


SMALL = dict(
    vocab_size=101,
    num_mel_bins=13,
    d_model=48,
    encoder_layers=2,
    decoder_layers=3,
    encoder_attention_heads=3,
    decoder_attention_heads=4,
    encoder_ffn_dim=72,
    decoder_ffn_dim=56,
    max_source_positions=37,
    max_target_positions=21,
)


def small_hf():
    """A randomly initialised transformers Whisper of awkward sizes."""
    torch.manual_seed(0)
    special = dict(pad_token_id=1, bos_token_id=2, eos_token_id=2, decoder_start_token_id=3)
    hf = HFWhisper(HFConfig(**SMALL, **special)).eval()
    with torch.no_grad():  # non-zero k/v/q biases and norms, so every parameter matters
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf


@pytest.mark.parametrize("frames", [74, 40])  # the full window, and a shorter input
def test_random_small_config_matches_transformers(frames):
    cfg = SMALL
    hf = small_hf()
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    model = WhisperForConditionalGeneration.from_state_dict(WhisperConfig.from_dict(cfg), sd)
    rng = np.random.default_rng(frames)
    x = rng.standard_normal((2, 13, frames)).astype(np.float32)
    ids = rng.integers(0, 101, (2, 9))
    enc = model.encode(x).numpy()
    logits = model(x, ids).numpy()
    with torch.no_grad():
        if frames == 74:
            ref_enc = hf.model.encoder(torch.from_numpy(x)).last_hidden_state.numpy()
            np.testing.assert_allclose(enc, ref_enc, atol=1e-5, rtol=1e-4)
        else:  # transformers insists on a full window: feed our encoder output to its decoder
            ref_enc = torch.from_numpy(enc)
        out = hf.model.decoder(
            input_ids=torch.from_numpy(ids), encoder_hidden_states=torch.as_tensor(ref_enc)
        )
        ref = hf.proj_out(out.last_hidden_state).numpy()
    assert enc.shape == (2, frames // 2, 48)
    np.testing.assert_allclose(logits, ref, atol=1e-5, rtol=1e-4)


def test_hf_folder_from_save_pretrained(tmp_path):
    hf = small_hf()
    hf.save_pretrained(tmp_path)  # config.json + model.safetensors (proj_out tied, not stored)
    model = WhisperForConditionalGeneration.from_pretrained(tmp_path)
    assert model.config.d_model == 48 and model.config.decoder_layers == 3
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 13, 74)).astype(np.float32)
    ids = rng.integers(0, 101, (1, 5))
    with torch.no_grad():
        ref = hf(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(ids))
    np.testing.assert_allclose(model(x, ids).numpy(), ref.logits.numpy(), atol=1e-5, rtol=1e-4)
    with pytest.raises(ember.errors.FormatError):
        WhisperForConditionalGeneration.from_pretrained(tmp_path / "nothing")


def test_input_checks(whisper):
    model, _ = whisper
    with pytest.raises(ember.errors.ShapeError):
        model.encode(np.zeros((1, 80, 3002), np.float32))
    with pytest.raises(ember.errors.ShapeError):
        model.encode(np.zeros((1, 64, 3000), np.float32))
    cross = model.cross_kv(model.encode(np.zeros((1, 80, 20), np.float32)))
    with pytest.raises(ember.errors.ShapeError):
        model.decode(np.zeros((1, 449), np.int64), cross)


def test_language_detection_on_a_random_multilingual_model():
    from ember.generation.whisper import SpecialTokens, detect_language, encode_window

    class Tok:  # multilingual vocabulary layout: <|endoftext|> 50257, languages from 50259
        ids = {"<|endoftext|>": 50257, "<|startoftranscript|>": 50258, "<|en|>": 50259,
               "<|zh|>": 50260, "<|de|>": 50261, "<|transcribe|>": 50359,
               "<|notimestamps|>": 50363}  # fmt: skip

        def token_to_id(self, t):
            return self.ids.get(t)

    cfg = WhisperConfig(
        vocab_size=51865, num_mel_bins=8, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=8,
        decoder_ffn_dim=8, max_source_positions=6, max_target_positions=8,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    with ember.device("meta"):
        shapes = {
            k: tuple(v.shape) for k, v in WhisperForConditionalGeneration(cfg).state_dict().items()
        }
    sd = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    model = WhisperForConditionalGeneration.from_state_dict(cfg, sd)
    st = SpecialTokens(Tok(), cfg.vocab_size)
    assert st.multilingual and set(st.languages) == {"en", "zh", "de"}
    cross = encode_window(model, rng.standard_normal((8, 12)).astype(np.float32))
    logits = model.decode(np.array([[50258]]), cross).numpy()[0, -1]
    want = ["en", "zh", "de"][int(np.argmax(logits[[50259, 50260, 50261]]))]
    assert detect_language(model, cross, st) == want
