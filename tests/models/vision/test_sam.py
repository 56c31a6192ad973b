"""SAM against transformers' SamModel and SamProcessor on a tiny random config (tests/.../sam_tiny.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import ember  # noqa: E402
from ember.errors import EmberError, FormatError, ShapeError  # noqa: E402
from ember.models.vision.sam import SamConfig, SamModel, SamVisionConfig  # noqa: E402
from ember.models.vision.segmentation import (  # noqa: E402
    SamPredictor,
    mask_image,
    overlay,
    postprocess_masks,
    preprocess_image,
)
from tests.models.vision.sam_tiny import save_folder, tiny_reference  # noqa: E402

TOL = dict(rtol=0, atol=1e-4)  # absolute: the outputs are of order 1


@pytest.fixture(autouse=True)
def _no_grad():
    with ember.no_grad():
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ref = tiny_reference()
    folder = save_folder(ref, tmp_path_factory.mktemp("sam"))
    return ref, SamModel.from_pretrained(folder), folder


def _np(t) -> np.ndarray:
    return t.detach().numpy() if hasattr(t, "detach") else t.numpy()


def _prompts(b: int = 2, p: int = 3, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor([[1, 0], [1, -10], [0, -1]])[:p].expand(b, p, 2).contiguous()
    xy = torch.rand(b, p, 2, 2, generator=g) * 64
    lo = torch.rand(b, p, 2, generator=g) * 30
    boxes = torch.cat([lo, lo + 5 + torch.rand(b, p, 2, generator=g) * 25], -1)
    masks = torch.randn(b, 1, 32, 32, generator=g) * 3
    return dict(input_points=xy, input_labels=labels, input_boxes=boxes, input_masks=masks)


def test_vision_encoder_matches_transformers(tiny):
    ref, m, _ = tiny
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    want = ref.vision_encoder(x).last_hidden_state
    got = m.get_image_embeddings(x.numpy())
    assert tuple(got.shape) == (2, 16, 8, 8)
    np.testing.assert_allclose(got.numpy(), _np(want), **TOL)


@pytest.mark.parametrize(
    "keys",
    [
        ("input_points", "input_labels"),
        ("input_boxes",),
        ("input_points", "input_labels", "input_boxes"),
        ("input_masks",),
        ("input_points", "input_labels", "input_masks"),
    ],  # fmt: skip
)
def test_prompt_encoder_embeddings_match(tiny, keys):
    ref, m, _ = tiny
    kw = {k: v for k, v in _prompts().items() if k in keys}
    want_sparse, want_dense = ref.get_prompt_embeddings(**kw)
    sparse, dense = m.get_prompt_embeddings(**{k: v.numpy() for k, v in kw.items()})
    if want_sparse is None:
        assert sparse is None
    else:
        assert tuple(sparse.shape) == tuple(want_sparse.shape)
        np.testing.assert_allclose(sparse.numpy(), _np(want_sparse), **TOL)
    np.testing.assert_allclose(dense.numpy(), _np(want_dense), **TOL)


def test_image_wide_positions_and_mask_decoder_match(tiny):
    ref, m, _ = tiny
    pe = ref.get_image_wide_positional_embeddings()
    np.testing.assert_allclose(m.get_image_wide_positional_embeddings().numpy(), _np(pe), **TOL)
    g = torch.Generator().manual_seed(2)
    emb = torch.randn(2, 16, 8, 8, generator=g)
    sparse, dense = ref.get_prompt_embeddings(**{k: v for k, v in _prompts().items()
                                                 if k != "input_masks"})  # fmt: skip
    for multi in (True, False):
        want_m, want_iou = ref.mask_decoder(emb, pe.repeat(2, 1, 1, 1), sparse, dense, multi)
        got_m, got_iou = m.mask_decoder(ember.from_numpy(emb.numpy()), ember.from_numpy(_np(pe)),
                                        ember.from_numpy(_np(sparse)),
                                        ember.from_numpy(_np(dense)), multi)  # fmt: skip
        assert tuple(got_m.shape) == (2, 3, 3 if multi else 1, 32, 32)
        np.testing.assert_allclose(got_m.numpy(), _np(want_m), **TOL)
        np.testing.assert_allclose(got_iou.numpy(), _np(want_iou), **TOL)


@pytest.mark.parametrize("multimask", [True, False])
@pytest.mark.parametrize(
    "keys",
    [("input_points", "input_labels"), ("input_boxes",),
     ("input_points", "input_labels", "input_boxes", "input_masks"), ("input_masks",)],
)  # fmt: skip
def test_whole_model_batch_of_two_matches(tiny, keys, multimask):
    ref, m, _ = tiny
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    kw = {k: v for k, v in _prompts().items() if k in keys}
    want = ref(pixel_values=x, multimask_output=multimask, **kw)
    got = m(pixel_values=x.numpy(), multimask_output=multimask,
            **{k: v.numpy() for k, v in kw.items()})  # fmt: skip
    assert tuple(got.pred_masks.shape) == tuple(want.pred_masks.shape)
    np.testing.assert_allclose(got.pred_masks.numpy(), _np(want.pred_masks), **TOL)
    np.testing.assert_allclose(got.iou_scores.numpy(), _np(want.iou_scores), **TOL)
    # the same from cached image embeddings
    emb = m.get_image_embeddings(x.numpy())
    again = m(image_embeddings=emb, multimask_output=multimask,
              **{k: v.numpy() for k, v in kw.items()})  # fmt: skip
    np.testing.assert_allclose(again.pred_masks.numpy(), got.pred_masks.numpy(), atol=1e-6)


@pytest.mark.parametrize("hw", [(45, 100), (120, 37)])
def test_predictor_matches_sam_processor_on_non_square_images(tiny, hw):
    from transformers import SamProcessor

    ref, _, folder = tiny
    proc = SamProcessor.from_pretrained(folder)
    rng = np.random.default_rng(hw[0])
    img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    h, w = hw
    pts, labels, box = [[w * 0.2, h * 0.3], [w * 0.7, h * 0.9]], [1, 0], [2.0, 3.0, w - 4.5, h - 1]
    inp = proc(images=img, input_points=[[pts]], input_labels=[[labels]],
               input_boxes=[[box]], return_tensors="pt")  # fmt: skip
    pred = SamPredictor.load(folder)
    si = preprocess_image(img, pred.pre)
    assert si.reshaped_size == tuple(inp["reshaped_input_sizes"][0].tolist())
    np.testing.assert_allclose(si.pixel_values, inp["pixel_values"][0].numpy(), atol=1e-6)
    want = ref(**{k: inp[k] for k in ("pixel_values", "input_points", "input_labels",
                                      "input_boxes")})  # fmt: skip
    want_logits = proc.post_process_masks(want.pred_masks, inp["original_sizes"],
                                          inp["reshaped_input_sizes"], binarize=False)[0][0]  # fmt: skip
    masks, scores = pred(img, points=pts, labels=labels, box=box)
    assert masks.shape == (3, h, w) and masks.dtype == np.bool_
    np.testing.assert_allclose(scores, _np(want.iou_scores)[0, 0], **TOL)
    logits = postprocess_masks(pred.low_res_logits, (h, w), si.reshaped_size, pred.pre.pad_size,
                               None)  # fmt: skip
    np.testing.assert_allclose(logits, _np(want_logits), **TOL)
    sure = np.abs(_np(want_logits)) > 1e-3  # pixels on the threshold may flip by rounding
    np.testing.assert_array_equal(masks[sure], _np(want_logits)[sure] > 0)
    single, s1 = pred.predict(points=pts, labels=labels, multimask_output=False)
    assert single.shape == (1, h, w) and s1.shape == (1,)
    refined, _ = pred.predict(points=pts[:1], mask_input=pred.low_res_logits[0])
    assert refined.shape == (3, h, w)
    drawn = overlay(img, masks[0])
    assert drawn.size == (w, h) and mask_image(masks[0]).mode == "L"


def test_sam_vit_b_shapes_and_parameter_count_match_transformers():
    from transformers import SamConfig as TConfig
    from transformers import SamModel as TModel

    with torch.device("meta"):
        ref = TModel(TConfig())  # SAM ViT-H's prompt/decoder, a ViT-B-sized encoder by default
    with ember.device("meta"):
        m = SamModel(SamConfig())
    want = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    want.pop("shared_image_embedding.positional_embedding")
    got = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert got == want
    n = sum(p.numel() for p in m.parameters())
    assert n == sum(p.numel() for p in ref.parameters()) == 93_735_728  # sam-vit-base


def _to_meta_names(sd: dict) -> dict:
    """transformers' SAM names -> Meta segment_anything's (the layout of sam_vit_b_01ec64.pth)."""
    out = {}
    for k, v in sd.items():
        k = k.replace("vision_encoder.", "image_encoder.").replace(".layers.", ".blocks.", 1)
        k = k.replace("image_encoder.patch_embed.projection", "image_encoder.patch_embed.proj")
        for i, name in enumerate(("conv1", "layer_norm1", "conv2", "layer_norm2")):
            k = k.replace(f"image_encoder.neck.{name}.", f"image_encoder.neck.{i}.")
        if k.startswith("mask_decoder.") or k.startswith("prompt_encoder."):
            k = k.replace(".blocks.", ".layers.")
        k = re.sub(r"\.layer_norm([1-4])\.", r".norm\1.", k)
        k = k.replace("layer_norm_final_attn", "norm_final_attn")
        k = k.replace("shared_image_embedding.positional_embedding",
                      "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix")  # fmt: skip
        k = k.replace("prompt_encoder.point_embed.", "prompt_encoder.point_embeddings.")
        for i, name in ((0, "conv1"), (1, "layer_norm1"), (3, "conv2"), (4, "layer_norm2"),
                        (6, "conv3")):  # fmt: skip
            k = k.replace(
                f"prompt_encoder.mask_embed.{name}.", f"prompt_encoder.mask_downscaling.{i}."
            )
        k = k.replace("prompt_encoder.mask_embed.norm1.", "prompt_encoder.mask_downscaling.1.")
        k = k.replace("prompt_encoder.mask_embed.norm2.", "prompt_encoder.mask_downscaling.4.")
        for i, name in ((0, "upscale_conv1"), (1, "upscale_layer_norm"), (3, "upscale_conv2")):
            k = k.replace(f"mask_decoder.{name}.", f"mask_decoder.output_upscaling.{i}.")
        m = re.match(r"(mask_decoder\.(?:output_hypernetworks_mlps\.\d+|iou_prediction_head))"
                     r"\.(proj_in|proj_out|layers\.(\d+))\.(.*)", k)  # fmt: skip
        if m:
            i = (
                0
                if m.group(2) == "proj_in"
                else 2
                if m.group(2) == "proj_out"
                else int(m.group(3)) + 1
            )
            k = f"{m.group(1)}.layers.{i}.{m.group(4)}"
        out[k] = v
    return out


def test_meta_checkpoint_loads_with_its_own_names(tmp_path):
    # heads are not in the shapes: one of 64 channels (the ViT convention ember falls back to
    # off the B/L/H table) in the encoder, 8 in the decoder (every SAM size)
    ref = tiny_reference(
        seed=4,
        vision_config=dict(hidden_size=64, num_attention_heads=1),
        mask_decoder_config=dict(num_attention_heads=8, layer_norm_eps=1e-5),
    )
    meta = _to_meta_names({k: v.detach() for k, v in ref.state_dict().items()})
    assert "image_encoder.blocks.1.norm1.weight" in meta
    assert "mask_decoder.iou_prediction_head.layers.2.weight" in meta
    assert "prompt_encoder.mask_downscaling.6.weight" in meta
    torch.save(meta, tmp_path / "sam_tiny.pth")
    m = SamModel.from_pretrained(tmp_path / "sam_tiny.pth")
    v = m.config.vision_config
    assert (v.hidden_size, v.window_size, v.global_attn_indexes, v.image_size) == (64, 3, [1], 64)
    assert m.config.mask_decoder_config.layer_norm_eps == 1e-5  # Meta's two-way transformer's
    x = torch.randn(1, 3, 64, 64)
    kw = {k: v[:1] for k, v in _prompts().items() if k != "input_masks"}
    want = ref(pixel_values=x, **kw)
    got = m(pixel_values=x.numpy(), **{k: v.numpy() for k, v in kw.items()})
    np.testing.assert_allclose(got.pred_masks.numpy(), _np(want.pred_masks), **TOL)


def test_bad_prompts_and_inputs_are_ember_errors(tiny):
    _, m, folder = tiny
    pred = SamPredictor.load(folder)
    img = np.zeros((40, 50, 3), np.uint8)
    with pytest.raises(ShapeError, match="set_image"):
        SamPredictor(m).predict(points=[(1, 1)])
    pred.set_image(img)
    for kw, match in [
        (dict(points=[(50, 10)]), "outside the 50 x 40 image"),
        (dict(points=[(-1, 10)]), "outside"),
        (dict(points=[(float("nan"), 10)]), "outside"),
        (dict(points=[(1, 2, 3)]), "x, y"),
        (dict(points=[(1, 2)], labels=[1, 0]), "labels"),
        (dict(points=[(1, 2)], labels=[2]), "labels"),
        (dict(box=(10, 10, 5, 20)), "x1 < x2"),
        (dict(box=(0, 0, 51, 20)), "lie in"),
        (dict(box=(0, 0, 5)), "4 numbers"),
        (dict(), "at least one point"),
        (dict(labels=[1]), "at least one"),
        (dict(points=[(1, 1)], mask_input=np.zeros((8, 8))), "mask_input"),
    ]:
        with pytest.raises(ShapeError, match=match):
            pred.predict(**kw)
    p = _prompts(b=1)
    x = np.zeros((1, 3, 64, 64), np.float32)
    for kw, match in [
        (dict(pixel_values=np.zeros((1, 3, 32, 32), np.float32)), "doesn't match"),
        (dict(pixel_values=np.zeros((1, 64, 64), np.float32)), "pixel_values"),
        (dict(pixel_values=x, input_points=p["input_points"].numpy()[0]), "input_points"),
        (dict(pixel_values=x, input_points=p["input_points"].numpy(),
              input_labels=np.ones((1, 3))), "input_labels"),
        (dict(pixel_values=x, input_boxes=np.zeros((1, 4), np.float32)), "input_boxes"),
        (dict(pixel_values=x, input_points=p["input_points"].numpy(),
              input_labels=p["input_labels"].numpy(), input_boxes=np.zeros((1, 2, 4))), "each box"),
        (dict(pixel_values=x, input_masks=np.zeros((1, 1, 16, 16), np.float32)), "input_masks"),
        (dict(pixel_values=x, input_boxes=np.zeros((2, 1, 4), np.float32)), "batch"),
        (dict(input_boxes=np.zeros((1, 1, 4), np.float32)), "exactly one"),
        (dict(image_embeddings=np.zeros((1, 8, 8, 8), np.float32)), "image_embeddings"),
    ]:  # fmt: skip
        with pytest.raises(ShapeError, match=match):
            m(**kw)


def _folder_with(tmp_path, folder, config=None, drop=None, raw=None):
    import shutil

    dst = tmp_path / "bad"
    shutil.copytree(folder, dst)
    if raw is not None:
        (dst / "config.json").write_text(raw)
    elif config is not None:
        d = json.loads((dst / "config.json").read_text())
        for sub, fields in config.items():
            d[sub].update(fields) if isinstance(fields, dict) else d.__setitem__(sub, fields)
        (dst / "config.json").write_text(json.dumps(d))
    if drop:
        from ember.io.safetensors import load_safetensors, save_safetensors

        sd = {k: np.array(v) for k, v in load_safetensors(dst).items() if k != drop}
        save_safetensors(sd, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(raw="{not json"), "not valid JSON"),
        (dict(raw="[1, 2]"), "JSON object"),
        (dict(config={"model_type": "vit"}), "not 'sam'"),
        (dict(config={"vision_config": {"hidden_size": -3}}), "positive integer"),
        (dict(config={"vision_config": {"hidden_size": "big"}}), "positive integer"),
        (dict(config={"vision_config": {"num_attention_heads": 3}}), "multiple of 3"),
        (dict(config={"vision_config": {"global_attn_indexes": [7]}}), "global_attn_indexes"),
        (dict(config={"mask_decoder_config": {"hidden_size": 24}}), "same size"),
        (dict(config={"prompt_encoder_config": {"patch_size": 4}}), "grid"),
        (dict(config={"vision_config": "x"}), "must be an object"),
        (dict(config={"vision_config": {"mlp_dim": 41}}), "does not fit"),
        (dict(drop="mask_decoder.iou_token.weight"), "missing"),
        (dict(drop="shared_image_embedding.positional_embedding"), "positional encoding"),
    ],
)
def test_malformed_folders_are_format_errors(tiny, tmp_path, change, match):
    _, _, folder = tiny
    with pytest.raises(FormatError, match=match):
        SamModel.from_pretrained(_folder_with(tmp_path, folder, **change))


def test_missing_files_are_format_errors(tiny, tmp_path):
    _, _, folder = tiny
    with pytest.raises(FormatError, match="no such SAM folder"):
        SamModel.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="no config.json"):
        SamModel.from_pretrained(tmp_path / "empty")
    bad = _folder_with(tmp_path, folder)
    (bad / "model.safetensors").unlink()
    with pytest.raises(FormatError, match="model.safetensors"):
        SamModel.from_pretrained(bad)
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(EmberError):
        SamModel.from_pretrained(bad)
    (tmp_path / "x.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(FormatError):
        SamModel.from_pretrained(tmp_path / "x.pth")
    tiny_vit = {
        "image_encoder.patch_embed.seq.0.c.weight": torch.zeros(32, 3, 3, 3),
        "prompt_encoder.pe_layer.positional_encoding_gaussian_matrix": torch.zeros(2, 8),
    }
    torch.save(tiny_vit, tmp_path / "mobile_sam.pt")  # MobileSAM: a TinyViT image encoder
    with pytest.raises(FormatError, match="TinyViT encoder is not supported"):
        SamModel.from_pretrained(tmp_path / "mobile_sam.pt")


def test_vision_config_default_mlp_dim():
    assert SamVisionConfig(hidden_size=64, mlp_ratio=2.0).mlp_dim == 128
