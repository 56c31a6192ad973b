"""The decoder's captured steps (DecoderSteps: one-token steps replayed as a StepGraph) against
plain forwards, bitwise."""

from __future__ import annotations

import numpy as np
import pytest

from ember import config
from ember.generation.whisper import DecoderSteps, encode_window
from ember.models.whisper import log_mel_spectrogram
from ember.threads import blas_single_thread

from .test_model import IDS


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


def test_replayed_steps_equal_plain_forwards_bitwise(whisper, crosses):
    model = whisper[0]
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
