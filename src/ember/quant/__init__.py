"""Quantized weights: GGUF block formats, QTensor, and the kernels that multiply with them."""
