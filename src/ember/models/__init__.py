"""The model zoo: one file per architecture family, plus auto.py (file -> class)."""

from ember.models.auto import AutoModelForCausalLM
from ember.models.llama import LlamaConfig, LlamaForCausalLM

__all__ = ["AutoModelForCausalLM", "LlamaConfig", "LlamaForCausalLM"]
