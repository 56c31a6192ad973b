"""Imports every CPU kernel module, so that each registers its kernels (see kernels.registry)."""

from ember.kernels.cpu import norm  # noqa: F401
from ember.kernels.cpu import attention  # noqa: F401
from ember.kernels.cpu import activation  # noqa: F401
from ember.kernels.cpu import cached_attention, glu, rope  # noqa: F401
