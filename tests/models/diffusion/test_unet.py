"""ember's UNet2DConditionModel against diffusers' on tiny random configs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from ember.errors import FormatError, ShapeError, UnsupportedError
from ember.models.diffusion import UNet2DConditionConfig, UNet2DConditionModel
from tests.models.diffusion.tiny import UNET, randomize

# SD 2.x's shape: linear projections, per-block heads, two transformer layers, three levels
SD2_LIKE = dict(
    UNET,
    block_out_channels=(8, 16, 16),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    attention_head_dim=(2, 4, 4),
    use_linear_projection=True,
    transformer_layers_per_block=2,
    layers_per_block=(1, 2, 1),
)


@pytest.fixture(scope="module", params=["sd1", "sd2"])
def pair(request, tmp_path_factory):
    from diffusers import UNet2DConditionModel as Ref

    torch.manual_seed(0)
    ref = Ref(**(UNET if request.param == "sd1" else SD2_LIKE)).eval()
    randomize(ref, 5)
    folder = tmp_path_factory.mktemp(f"unet_{request.param}")
    ref.save_pretrained(folder)
    return UNet2DConditionModel.from_pretrained(folder), ref


def test_names_are_diffusers(pair):
    model, ref = pair
    assert set(model.state_dict()) == set(ref.state_dict())
    names = set(model.state_dict())
    for name in (
        "conv_in.weight", "time_embedding.linear_1.weight", "down_blocks.0.resnets.0.conv1.weight",
        "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight",
        "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj.weight",
        "mid_block.attentions.0.proj_in.weight", "up_blocks.1.resnets.1.conv_shortcut.weight",
        "up_blocks.0.upsamplers.0.conv.weight", "conv_norm_out.weight", "conv_out.bias",
    ):  # fmt: skip
        assert name in names, name


@pytest.mark.parametrize(
    "hw, t",
    [((8, 8), [981, 1]), ((6, 10), [500.5, 7.25]), ((5, 7), 999), ((9, 4), [0, 640])],
)
def test_output_matches_diffusers(pair, hw, t):
    """Square, non-square, and sides that are not a multiple of 2**levels (up-sampled to the skip's size)."""
    model, ref = pair
    rng = np.random.default_rng(sum(hw))
    x = rng.standard_normal((2, 4, *hw)).astype(np.float32)
    ctx = rng.standard_normal((2, 7, 16)).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.from_numpy(x), torch.tensor(t), torch.from_numpy(ctx)).sample.numpy()
    got = model(x, np.array(t), ctx).numpy()
    assert got.shape == want.shape == x.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(want).max() > 0.5  # not a vanishing signal


def test_bad_inputs(pair):
    model, _ = pair
    x, ctx = np.zeros((2, 4, 8, 8), np.float32), np.zeros((2, 7, 16), np.float32)
    with pytest.raises(ShapeError, match=r"sample must be \(batch, 4, height, width\)"):
        model(np.zeros((2, 3, 8, 8), np.float32), 1, ctx)
    with pytest.raises(ShapeError, match="encoder_hidden_states"):
        model(x, 1, np.zeros((2, 7, 15), np.float32))
    with pytest.raises(ShapeError, match="encoder_hidden_states"):
        model(x, 1, np.zeros((1, 7, 16), np.float32))
    with pytest.raises(ShapeError, match="3 timesteps for a batch of 2"):
        model(x, [1, 2, 3], ctx)


BAD_CONFIGS = [
    (
        {"down_block_types": ["SimpleCrossAttnDownBlock2D", "DownBlock2D"]},
        UnsupportedError,
        "down block",
    ),  # fmt: skip
    ({"up_block_types": ["UpBlock2D", "AttnUpBlock2D"]}, UnsupportedError, "up block"),
    ({"mid_block_type": "UNetMidBlock2DSimpleCrossAttn"}, UnsupportedError, "mid block"),
    ({"addition_embed_type": "text_time"}, UnsupportedError, "SDXL"),
    ({"time_cond_proj_dim": 256}, UnsupportedError, "time_cond_proj_dim"),
    ({"block_out_channels": [8, 2**40]}, FormatError, "block_out_channels"),
    ({"block_out_channels": [8, 16, 32]}, FormatError, "has 2 blocks"),
    ({"block_out_channels": [8, 18]}, FormatError, "multiple of norm_num_groups"),
    ({"layers_per_block": 10**6}, FormatError, "layers_per_block"),
    ({"attention_head_dim": 3}, FormatError, "do not split"),
    ({"cross_attention_dim": 24}, ShapeError, "does not fit"),
    ({"block_out_channels": [12, 16]}, ShapeError, "does not fit"),
    ({"norm_num_groups": "4"}, FormatError, "norm_num_groups"),
    ({"down_block_types": 7}, FormatError, "malformed config"),
]


@pytest.mark.parametrize("change, err, match", BAD_CONFIGS)
def test_bad_configs_are_refused(sd, tmp_path, change, err, match):
    folder = tmp_path / "unet"
    shutil.copytree(sd[0] / "unet", folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(err, match=match):
        UNet2DConditionModel.from_pretrained(folder)


def test_missing_weights_and_fp16_variant(pair, tmp_path):
    from safetensors.numpy import load_file, save_file

    model, _ = pair
    folder = tmp_path / "unet"
    folder.mkdir()
    shutil.copy(f"{model.source}/config.json", folder)
    with pytest.raises(FormatError, match="no diffusion_pytorch_model.safetensors"):
        UNet2DConditionModel.from_pretrained(folder)
    weights = load_file(f"{model.source}/diffusion_pytorch_model.safetensors")
    half = {k: v.astype(np.float16) for k, v in weights.items()}
    save_file(half, str(folder / "diffusion_pytorch_model.fp16.safetensors"))
    m16 = UNet2DConditionModel.from_pretrained(folder)
    assert m16.conv_in.weight.dtype.name == "float32"
    np.testing.assert_array_equal(m16.conv_in.weight.numpy(), half["conv_in.weight"].astype(np.float32))  # fmt: skip
    del half["conv_out.bias"]
    save_file(half, str(folder / "diffusion_pytorch_model.fp16.safetensors"))
    with pytest.raises(FormatError, match="missing 1 tensors"):
        UNet2DConditionModel.from_pretrained(folder)


def test_config_defaults_are_sd15():
    cfg = UNet2DConditionConfig()
    assert cfg.heads == [8, 8, 8, 8] and cfg.per_block("cross_attention_dim") == [768] * 4
    with pytest.raises(FormatError, match="expected a JSON object"):
        UNet2DConditionConfig.from_dict([1, 2])
