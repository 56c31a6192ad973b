"""Imports every CPU kernel module, so that each registers its kernels (see kernels.registry)."""

from ember.kernels.cpu import (  # noqa: F401
    activation,  # noqa: F401
    attention,  # noqa: F401
    blas,  # noqa: F401
    cached_attention,
    conv,  # noqa: F401
    cross_entropy,  # noqa: F401
    gemm,  # noqa: F401
    glu,
    norm,  # noqa: F401
    rope,
    special,
)
from ember.kernels.cpu.quant import q4_0, q4_1, q4_k, q5_k, q6_k, q8_0, transposed  # noqa: F401
