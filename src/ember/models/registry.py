"""model_type (config.json) -> model class."""

from ember.models.gemma import GemmaForCausalLM
from ember.models.llama import LlamaForCausalLM

CAUSAL_LM = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "smollm": LlamaForCausalLM,
    "gemma": GemmaForCausalLM,
    "gemma2": GemmaForCausalLM,
}
