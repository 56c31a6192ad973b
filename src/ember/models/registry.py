"""model_type (config.json) -> model class."""

from ember.models.gemma import GemmaForCausalLM
from ember.models.gpt2 import GPT2LMHeadModel
from ember.models.llama import LlamaForCausalLM
from ember.models.phi3 import Phi3ForCausalLM

CAUSAL_LM = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "smollm": LlamaForCausalLM,
    "gemma": GemmaForCausalLM,
    "gemma2": GemmaForCausalLM,
    "phi3": Phi3ForCausalLM,
    "gpt2": GPT2LMHeadModel,
}
