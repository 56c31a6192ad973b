"""torch.onnx exports of ember's zoo models (torch twins / transformers with small configs)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch


def export(
    model, args: tuple, path: Path, names_in, names_out, dynamic=None, opset: int = 17
) -> Path:
    """Export with the TorchScript exporter (no onnxscript needed) and return the path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), args, str(path), dynamo=False, input_names=names_in,
                          output_names=names_out, dynamic_axes=dynamic, opset_version=opset)  # fmt: skip
    return path


def resnet50(tmp: Path, opset: int = 17):
    """A random-weight torchvision-tree ResNet-50 (10 classes) and an input batch of 2."""
    from tests.models.vision.twins import randomize_bn, resnet

    torch.manual_seed(0)
    m = randomize_bn(resnet("resnet50", num_classes=10))
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    dyn = {"x": {0: "b"}, "logits": {0: "b"}}
    return export(
        m, (torch.from_numpy(x),), tmp / "resnet50.onnx", ["x"], ["logits"], dyn, opset
    ), {"x": x}


def mobilenet_v2(tmp: Path, opset: int = 17):
    """A random-weight torchvision-tree MobileNetV2 and an input batch of 2."""
    from tests.models.vision.twins import MobileNetV2, randomize_bn

    torch.manual_seed(0)
    m = randomize_bn(MobileNetV2(num_classes=10))
    x = np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32)
    dyn = {"x": {0: "b"}, "logits": {0: "b"}}
    return export(
        m, (torch.from_numpy(x),), tmp / "mobilenet_v2.onnx", ["x"], ["logits"], dyn, opset
    ), {"x": x}


def vit(tmp: Path, opset: int = 17):
    """A small random transformers ViT classifier and an input batch of 2."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=96, num_labels=7,
                                 attn_implementation="eager")  # fmt: skip
    m = transformers.ViTForImageClassification(cfg).eval()
    x = np.random.default_rng(2).standard_normal((2, 3, 32, 32)).astype(np.float32)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, pixel_values):
            return self.m(pixel_values=pixel_values).logits

    dyn = {"pixel_values": {0: "b"}, "logits": {0: "b"}}
    p = export(
        Wrap(), (torch.from_numpy(x),), tmp / "vit.onnx", ["pixel_values"], ["logits"], dyn, opset
    )
    return p, {"pixel_values": x}


def minilm(tmp: Path, opset: int = 17):
    """The installed all-MiniLM-L6-v2 weights as a transformers BertModel, and a padded batch."""
    import transformers

    from ember.models.sentence import default_model_dir

    m = transformers.BertModel.from_pretrained(
        str(default_model_dir()), attn_implementation="eager"
    )
    rng = np.random.default_rng(3)
    ids = rng.integers(0, m.config.vocab_size, (2, 9)).astype(np.int64)
    mask = np.ones((2, 9), np.int64)
    mask[1, 6:] = 0
    tt = np.zeros((2, 9), np.int64)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state  # fmt: skip

    names = ["input_ids", "attention_mask", "token_type_ids"]
    dyn = {n: {0: "b", 1: "t"} for n in names} | {"last_hidden_state": {0: "b", 1: "t"}}
    args = tuple(torch.from_numpy(a) for a in (ids, mask, tt))
    p = export(Wrap(), args, tmp / "minilm.onnx", names, ["last_hidden_state"], dyn, opset)
    return p, dict(zip(names, (ids, mask, tt)))


def whisper_encoder(tmp: Path, opset: int = 17):
    """A small random transformers Whisper encoder and log-mel features for a batch of 2."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(num_mel_bins=16, d_model=48, encoder_layers=2, encoder_attention_heads=4,
                                     decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=96,
                                     decoder_ffn_dim=96, max_source_positions=50, vocab_size=100, pad_token_id=1,
                                     bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
                                     attn_implementation="eager")  # fmt: skip
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    enc = WhisperEncoder(cfg).eval()
    x = np.random.default_rng(4).standard_normal((2, 16, 100)).astype(np.float32)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = enc

        def forward(self, input_features):
            return self.m(input_features=input_features).last_hidden_state

    dyn = {"input_features": {0: "b"}, "last_hidden_state": {0: "b"}}
    p = export(Wrap(), (torch.from_numpy(x),), tmp / "whisper_encoder.onnx", ["input_features"],
               ["last_hidden_state"], dyn, opset)  # fmt: skip
    return p, {"input_features": x}


MODELS = {"resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "vit": vit, "minilm": minilm,
          "whisper_encoder": whisper_encoder}  # fmt: skip
