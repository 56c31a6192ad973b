"""Imports every CPU kernel module, so that each registers its kernels (see kernels.registry)."""

from ember.kernels.cpu import norm  # noqa: F401
from ember.kernels.cpu import gemm  # noqa: F401
from ember.kernels.cpu import conv  # noqa: F401
from ember.kernels.cpu import attention  # noqa: F401
from ember.kernels.cpu import activation  # noqa: F401
from ember.kernels.cpu import cached_attention, glu, rope  # noqa: F401
from ember.kernels.cpu.quant import q8_0, q4_0, q4_1, q4_k, q5_k, q6_k  # noqa: F401
