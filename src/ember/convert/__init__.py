"""Model conversion between GGUF files and Hugging Face folders, in the layouts their own tools use.

`gguf_to_hf` writes a folder that transformers loads as is (q/k rows in Hugging Face's order,
tokenizer.json, tokenizer_config.json, generation_config.json); `hf_to_gguf` writes a GGUF that
llama.cpp loads (architecture metadata, llama.cpp's tensor names and q/k permutation, the
vocabulary). Both refuse what they cannot write faithfully with a FormatError/UnsupportedError.
"""

from ember.convert.to_gguf import QuantizeReport, hf_to_gguf, requantize_gguf
from ember.convert.to_hf import gguf_to_hf

__all__ = ["QuantizeReport", "gguf_to_hf", "hf_to_gguf", "requantize_gguf"]
