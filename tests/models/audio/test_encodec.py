"""ember's EnCodec against transformers' EncodecModel, loaded from the folder it saves."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import ember
from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models.audio import EncodecModel
from ember.models.audio.encodec import fold_weight_norm
from tests.models.audio.tiny import TINY, TINY_48K, save_tiny

LENGTHS = (1, 97, 1001)  # shorter than a pad; not a multiple of the hop; several chunks


@pytest.fixture(scope="module", params=["24k", "48k"])
def pair(request, tmp_path_factory):
    """(ember's model, transformers' model) with the same random weights."""
    kw = TINY if request.param == "24k" else TINY_48K
    folder = tmp_path_factory.mktemp(f"encodec_{request.param}")
    hf = save_tiny(folder, **kw)
    return EncodecModel.from_pretrained(folder), hf


def _audio(model, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.3 * rng.standard_normal((1, model.config.audio_channels, n))).astype(np.float32)


def test_state_dict_names_are_transformers(pair):
    model, hf = pair
    ours = set(model.state_dict())
    theirs = {
        k.replace(".parametrizations.weight.original1", ".weight")
        for k in hf.state_dict()
        if not k.endswith((".original0", "inited", "cluster_size", "embed_avg"))
    }
    assert ours == theirs
    assert "encoder.layers.0.conv.weight" in ours and "quantizer.layers.1.codebook.embed" in ours


@pytest.mark.parametrize("n", LENGTHS)
def test_encoder_codes_and_audio_match_transformers(pair, n):
    model, hf = pair
    x = _audio(model, n, seed=n)
    bw = model.config.target_bandwidths[-1]
    with torch.no_grad():
        ref = hf.encode(torch.from_numpy(x), bandwidth=bw)
        ref_audio = hf.decode(
            ref.audio_codes, ref.audio_scales, last_frame_pad_length=ref.last_frame_pad_length
        )[0].numpy()
        ref_hidden = hf.encoder(torch.from_numpy(x)).numpy()
    with ember.no_grad():
        hidden = model.encoder(ember.tensor(x)).numpy()
    np.testing.assert_allclose(hidden, ref_hidden, atol=1e-4, rtol=1e-4)
    enc = model.encode(x, bandwidth=bw)
    assert enc.audio_codes.dtype == ember.int64
    np.testing.assert_array_equal(enc.audio_codes.numpy(), ref.audio_codes.numpy())
    assert enc.last_frame_pad_length == ref.last_frame_pad_length
    for ours, theirs in zip(enc.audio_scales, ref.audio_scales, strict=True):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5)
    audio = model.decode(enc.audio_codes, enc.audio_scales, enc.last_frame_pad_length).numpy()
    assert audio.shape == ref_audio.shape
    np.testing.assert_allclose(audio, ref_audio, atol=1e-4)
    np.testing.assert_allclose(model(x, bandwidth=bw).numpy(), ref_audio[..., :n], atol=1e-4)


def test_bandwidth_picks_the_number_of_codebooks(pair):
    model, hf = pair
    x = _audio(model, 200, seed=1)
    for bw in model.config.target_bandwidths:
        with torch.no_grad():
            ref = hf.encode(torch.from_numpy(x), bandwidth=bw).audio_codes.numpy()
        ours = model.encode(x, bandwidth=bw).audio_codes.numpy()
        assert ours.shape[2] == hf.quantizer.get_num_quantizers_for_bandwidth(bw)
        np.testing.assert_array_equal(ours, ref)
    assert model.encode(x).audio_codes.shape[2] == 1  # default: the smallest bandwidth
    with pytest.raises(UnsupportedError, match="bandwidth 3.0 is not one of"):
        model.encode(x, bandwidth=3.0)


def test_variants_match_transformers(tmp_path):
    """Non-causal, time group norm, identity shortcut, zero padding, partial right trim, batch 2."""
    for i, extra in enumerate(
        [
            dict(
                use_causal_conv=False,
                norm_type="time_group_norm",
                use_conv_shortcut=False,
                pad_mode="constant",
                num_residual_layers=2,
                upsampling_ratios=[3, 2],
            ),
            dict(trim_right_ratio=0.5, kernel_size=5, last_kernel_size=3, residual_kernel_size=5),
        ]
    ):
        folder = tmp_path / str(i)
        hf = save_tiny(folder, **{**TINY, **extra})
        model = EncodecModel.from_pretrained(folder)
        x = np.random.default_rng(i).standard_normal((2, 1, 251)).astype(np.float32)
        with torch.no_grad():
            ref = hf(torch.from_numpy(x), bandwidth=10.0)
        np.testing.assert_array_equal(
            model.encode(x, bandwidth=10.0).audio_codes.numpy(), ref.audio_codes.numpy()
        )
        np.testing.assert_allclose(
            model(x, bandwidth=10.0).numpy(), ref.audio_values.numpy(), atol=1e-4
        )


def test_weight_g_v_checkpoints_load_the_same(pair, tmp_path):
    """Older checkpoints spell weight norm weight_g / weight_v; plain weights load too."""
    model, _ = pair
    src = model.source
    old = {}
    for k, v in load_file(f"{src}/model.safetensors").items():
        k = k.replace(".parametrizations.weight.original0", ".weight_g")
        old[k.replace(".parametrizations.weight.original1", ".weight_v")] = v
    assert any(k.endswith(".weight_g") for k in old)
    save_file(old, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(model.config.extra | _fields(model)))
    again = EncodecModel.from_pretrained(tmp_path)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[k].numpy(), v.numpy())
    plain = fold_weight_norm(old)
    assert not any("weight_g" in k or "weight_v" in k or "embed_avg" in k for k in plain)
    np.testing.assert_array_equal(
        plain["encoder.layers.0.conv.weight"],
        model.state_dict()["encoder.layers.0.conv.weight"].numpy(),
    )


def _fields(model) -> dict:
    from dataclasses import asdict

    d = asdict(model.config)
    d.pop("extra")
    return d


def test_bad_inputs_raise_ember_errors(pair, tmp_path):
    model, _ = pair
    c = model.config.audio_channels
    with pytest.raises(ShapeError, match="expected audio"):
        model.encode(np.zeros((1, c + 1, 100), np.float32))
    with pytest.raises(ShapeError, match="expected audio"):
        model.encode(np.zeros((1, c, 0), np.float32))
    with pytest.raises(ShapeError, match="codes must be"):
        model.decode(np.zeros((1, 4), np.int64))
    with pytest.raises(ShapeError, match="codebooks given"):
        model.decode(np.zeros((1, 1, model.config.num_quantizers + 1, 3), np.int64))
    with pytest.raises(FormatError, match="config.json"):
        EncodecModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "encodec"}')
    with pytest.raises(FormatError, match="no .safetensors"):
        EncodecModel.from_pretrained(tmp_path)
    g_only = {"encoder.layers.0.conv.weight_g": np.ones((4, 1, 1), np.float32)}
    with pytest.raises(FormatError, match="needs both"):
        fold_weight_norm(g_only)
