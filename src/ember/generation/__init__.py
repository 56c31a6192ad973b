"""Text generation: tokenizers, chat templates, streaming, KV cache, samplers, the generate loop."""
