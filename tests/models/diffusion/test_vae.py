"""ember's AutoencoderKL against diffusers' on a tiny random config."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models.diffusion import AutoencoderKL
from ember.models.diffusion._layers import rename_old_attention
from tests.models.diffusion.tiny import VAE, randomize

THREE_LEVELS = dict(VAE, block_out_channels=(8, 16, 16), down_block_types=("DownEncoderBlock2D",) * 3,
                    up_block_types=("UpDecoderBlock2D",) * 3, layers_per_block=2)  # fmt: skip


@pytest.fixture(scope="module", params=["two", "three"])
def pair(request, tmp_path_factory):
    from diffusers import AutoencoderKL as Ref

    torch.manual_seed(0)
    ref = Ref(**(VAE if request.param == "two" else THREE_LEVELS)).eval()
    randomize(ref, 7)
    folder = tmp_path_factory.mktemp(f"vae_{request.param}")
    ref.save_pretrained(folder)
    return AutoencoderKL.from_pretrained(folder), ref


def test_names_are_diffusers(pair):
    model, ref = pair
    assert set(model.state_dict()) == set(ref.state_dict())
    names = set(model.state_dict())
    for name in ("post_quant_conv.weight", "decoder.mid_block.attentions.0.to_q.weight",
                 "decoder.mid_block.attentions.0.group_norm.weight", "decoder.up_blocks.0.upsamplers.0.conv.weight",
                 "encoder.down_blocks.0.downsamplers.0.conv.weight", "quant_conv.bias"):  # fmt: skip
        assert name in names, name


@pytest.mark.parametrize("hw", [(4, 4), (3, 5)])
def test_decode_and_encode_match_diffusers(pair, hw):
    model, ref = pair
    rng = np.random.default_rng(hw[1])
    z = rng.standard_normal((2, 4, *hw)).astype(np.float32)
    f = model.scale_factor
    img = rng.uniform(-1, 1, (2, 3, hw[0] * f, hw[1] * f)).astype(np.float32)
    with torch.no_grad():
        want = ref.decode(torch.from_numpy(z)).sample.numpy()
        post = ref.encode(torch.from_numpy(img)).latent_dist
    got = model.decode(z).numpy()
    assert got.shape == want.shape == (2, 3, hw[0] * f, hw[1] * f)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    mean, logvar = model.encode(img)
    np.testing.assert_allclose(mean.numpy(), post.mean.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(logvar.numpy(), post.logvar.numpy(), atol=1e-4, rtol=0)


def test_decoder_only_and_old_attention_names(pair, tmp_path):
    from safetensors.numpy import load_file, save_file

    model, _ = pair
    weights = load_file(f"{model.source}/diffusion_pytorch_model.safetensors")
    old = {}
    for k, v in weights.items():  # diffusers < 0.14 wrote query/key/value/proj_attn, 1x1 convs
        for new, was in ((".to_q.", ".query."), (".to_k.", ".key."), (".to_v.", ".value."), (".to_out.0.", ".proj_attn.")):  # fmt: skip
            if new in k:
                k, v = k.replace(new, was), (v[:, :, None, None] if v.ndim == 2 else v)
        old[k] = v
    assert any(".proj_attn." in k for k in old)
    renamed = rename_old_attention(old)
    assert set(renamed) == set(weights)
    folder = tmp_path / "vae"
    folder.mkdir()
    shutil.copy(f"{model.source}/config.json", folder)
    save_file(old, str(folder / "diffusion_pytorch_model.safetensors"))
    dec = AutoencoderKL.from_pretrained(folder, decoder_only=True)
    assert not hasattr(dec, "encoder")
    z = np.random.default_rng(0).standard_normal((1, 4, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(dec.decode(z).numpy(), model.decode(z).numpy())
    with pytest.raises(UnsupportedError, match="decoder-only"):
        dec.encode(np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(ShapeError, match=r"latents must be \(batch, 4, h, w\)"):
        dec.decode(np.zeros((1, 3, 4, 4), np.float32))


@pytest.mark.parametrize(
    "change, err, match",
    [
        (
            {"up_block_types": ["UpDecoderBlock2D", "AttnUpDecoderBlock2D"]},
            UnsupportedError,
            "AttnUpDecoderBlock2D",
        ),  # fmt: skip
        ({"block_out_channels": [8, 1 << 20]}, FormatError, "block_out_channels"),
        ({"latent_channels": 0}, FormatError, "latent_channels"),
        ({"act_fn": "tanh"}, UnsupportedError, "act_fn"),
        ({"latent_channels": 8}, ShapeError, "does not fit"),
        ({"scaling_factor": -1}, FormatError, "scaling_factor"),
        ({"block_out_channels": 64}, FormatError, "malformed config"),
    ],
)
def test_bad_configs(sd, tmp_path, change, err, match):
    folder = tmp_path / "vae"
    shutil.copytree(sd[0] / "vae", folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(err, match=match):
        AutoencoderKL.from_pretrained(folder)
