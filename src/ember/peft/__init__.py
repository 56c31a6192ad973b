"""LoRA and QLoRA adapters with peft's vocabulary and files (``LoraConfig``, ``get_peft_model``).

A frozen model (float, or quantized with its weights kept as QTensors) gets low-rank adapters on
the layers ``target_modules`` names; only the adapters train. ``save_pretrained`` writes the
files peft reads, ``PeftModel.from_pretrained`` reads the ones peft writes, and
``save_gguf_adapter`` / ``load_gguf_adapter`` the LoRA GGUF files llama.cpp reads.
``load_adapter(model, path, scale)`` puts either kind on a model for inference (``--lora``).
"""

from ember.peft.adapters import load_adapter
from ember.peft.checkpoint import enable_gradient_checkpointing, prepare_model_for_kbit_training
from ember.peft.config import LoraConfig, PeftConfigError
from ember.peft.files import get_peft_model_state_dict, set_peft_model_state_dict
from ember.peft.gguf import load_gguf_adapter, save_gguf_adapter
from ember.peft.layer import LoraLinear, ModulesToSaveWrapper
from ember.peft.model import LoraModel, PeftModel, get_peft_model

__all__ = [
    "LoraConfig",
    "LoraLinear",
    "LoraModel",
    "ModulesToSaveWrapper",
    "PeftConfigError",
    "PeftModel",
    "enable_gradient_checkpointing",
    "get_peft_model",
    "get_peft_model_state_dict",
    "load_adapter",
    "load_gguf_adapter",
    "prepare_model_for_kbit_training",
    "save_gguf_adapter",
    "set_peft_model_state_dict",
]
