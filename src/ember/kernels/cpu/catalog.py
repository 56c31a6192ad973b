"""Imports every CPU kernel module, so that each registers its kernels (see kernels.registry)."""

from ember.kernels.cpu import (  # noqa: F401
    activation,  # noqa: F401
    attention,  # noqa: F401
    blas,  # noqa: F401
    cached_attention,
    conv,  # noqa: F401
    cross_entropy,  # noqa: F401
    decode_attention,  # noqa: F401  (scaled_dot_product_attention: one query per head)
    gemm,  # noqa: F401
    glu,
    matvec,  # noqa: F401
    norm,  # noqa: F401
    rope,
    special,
)
from ember.kernels.cpu.quant import (  # noqa: F401
    half,
    q4_0,
    q4_1,
    q4_k,
    q5_k,
    q6_k,
    q8_0,
    transposed,
)
