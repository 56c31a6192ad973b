"""The decoder's captured steps (DecoderSteps: one-token steps replayed as a StepGraph) against
plain forwards, bitwise, in float32 and with Q8_0 decoder weights; and the quantized model."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import config
from ember.cli.main import main
from ember.generation.whisper import DecoderSteps, encode_window, load_whisper, transcribe
from ember.models.whisper import log_mel_spectrogram
from ember.nn import Linear
from ember.quant import QLinear
from ember.threads import blas_single_thread

from .conftest import CLIP, CLIP_TEXT, words
from .test_model import IDS


@pytest.fixture(scope="module")
def quantized():
    """(model, tokenizer) of the bundled tiny.en with Q8_0 decoder weights."""
    return load_whisper(quantize="q8_0")


@pytest.fixture(scope="module")
def crosses(whisper, clip):
    """Two windows' cross-attention keys/values: the clip, and the clip a second later."""
    model, _ = whisper
    late = np.concatenate([np.zeros(16000, np.float32), clip])
    return [encode_window(model, log_mel_spectrogram(a)) for a in (clip, late)]


def _plain(model, cross, ids: list[int]) -> list[np.ndarray]:
    """Each step's last logits by model.decode: the prompt, then one token at a time."""
    cache = model.new_cache(1, 40)
    out = [model.decode(np.array([ids[:2]]), cross, cache).numpy()[0, -1].copy()]
    for t in ids[2:]:
        out.append(model.decode(np.array([[t]]), cross, cache).numpy()[0, -1].copy())
    return out


@pytest.mark.parametrize("which", ["float32", "q8_0"])
def test_replayed_steps_equal_plain_forwards_bitwise(which, whisper, quantized, crosses):
    model = whisper[0] if which == "float32" else quantized[0]
    steps = DecoderSteps(model, 40)
    if not config.GRAPHS:
        pytest.skip("EMBER_GRAPHS=0")
    with blas_single_thread():  # as decode_tokens runs its steps
        for cross in crosses:  # a second window: its keys/values copied in, no new capture
            steps.start(cross)
            got = [steps(IDS[:2]).copy()] + [steps([t]).copy() for t in IDS[2:]]
            want = _plain(model, steps.cross, IDS)
            for i, (g, w) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(g, w, err_msg=f"step {i}")
            assert steps.cache.pos == len(IDS)
    assert steps.graph.captures == 1 and steps.graph.replays == 2 * (len(IDS) - 2) - 1
    # the window's keys and values are the encoder's, head by head
    k, v = crosses[1][0]
    np.testing.assert_array_equal(steps.cross[0][0].numpy(), k.numpy())
    assert k.numpy().flags.c_contiguous and tuple(v.shape) == (1, 6, 1500, 64)
    # teacher forcing through the captured steps still reads the transcript
    assert [int(np.argmax(x)) for x in got[:-1]] == IDS[2:]


def test_without_graphs_every_step_is_a_plain_forward(monkeypatch, whisper, crosses):
    model, _ = whisper
    monkeypatch.setattr(config, "GRAPHS", False)
    steps = DecoderSteps(model, 40)
    steps.start(crosses[0])
    assert steps.graph is None
    got = [steps(IDS[:2]).copy()] + [steps([t]).copy() for t in IDS[2:6]]
    for g, w in zip(got, _plain(model, steps.cross, IDS[:6])):
        np.testing.assert_array_equal(g, w)


def test_quantized_decoder_weights_and_transcript(whisper, quantized, clip):
    model, tok = quantized
    layer = model.model.decoder.layers[0]
    for m in (layer.self_attn.q_proj, layer.self_attn.out_proj, layer.encoder_attn.q_proj,
              layer.fc1, layer.fc2, model.proj_out):  # fmt: skip
        assert isinstance(m, QLinear) and m.weight.qtype == "Q8_0"
    # once per window on 1500 frames: float (no integer kernel for many rows)
    for m in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj,
              model.model.encoder.layers[0].fc1):  # fmt: skip
        assert type(m) is Linear
    emb = model.model.decoder.embed_tokens.weight
    assert emb.dtype == ember.float32  # lookups stay float; the head is a Q8_0 copy of it
    np.testing.assert_array_equal(emb.numpy(), whisper[0].model.decoder.embed_tokens.weight.numpy())
    res = transcribe(model, tok, clip)
    assert words(res.text) == words(CLIP_TEXT), res.text
    with pytest.raises(ember.errors.UnsupportedError):
        load_whisper(quantize="q6_k")


def test_cli_quantize(capsys):
    assert main(["transcribe", str(CLIP), "--quantize", "q8_0", "-v"]) == 0
    cap = capsys.readouterr()
    assert words(cap.out) == words(CLIP_TEXT), cap.out
    assert "decoder weights in Q8_0" in cap.err
