"""ember: a minimalist machine-learning framework with a PyTorch-shaped API and no PyTorch."""

import builtins as _builtins

from ember import errors
from ember import memory as _memory
from ember.autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from ember.device import Device, cuda_if_available
from ember.device import Device as device
from ember.dtypes import DType as dtype
from ember.dtypes import (
    bfloat16,
    bool_,
    double,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    float64,
    get_default_dtype,
    half,
    int8,
    int16,
    int32,
    int64,
    long,
    promote_types,
    result_type,
    set_default_dtype,
    short,
    uint8,
)
from ember.ops import *  # noqa: F403
from ember.ops import cast, linalg, to_device
from ember.tensor import Size, Tensor
from ember.threads import get_num_threads, set_num_threads

_memory.keep_freed_memory()  # freed activations stay for the next pass (EMBER_MALLOC)

bool = bool_  # noqa: A001  (torch.bool)
float = float32  # noqa: A001  (torch.float)
int = int32  # noqa: A001  (torch.int)

__version__ = "0.1.0"

# Sub-packages and names imported on first use (``ember.nn.Linear``, ``from ember import nn``,
# ``import ember.nn`` all work), so ``import ember`` costs little more than numpy does.
_LAZY = {
    "nn": "ember.nn",
    "optim": "ember.optim",
    "data": "ember.data",
    "utils": "ember.utils",
    "train": "ember.train",
    "models": "ember.models",
    "quant": "ember.quant",
    "io": "ember.io",
    "generation": "ember.generation",
    "serialization": "ember.serialization",
}
_LAZY_ATTRS = {
    "save": "ember.serialization",
    "load": "ember.serialization",
    "save_file": "ember.serialization",
    "load_file": "ember.serialization",
}


def __getattr__(name: str):
    """Import the sub-packages (nn, optim, data, file formats, models) on first use."""
    import importlib

    if name in _LAZY:
        return importlib.import_module(_LAZY[name])
    if name in _LAZY_ATTRS:
        value = getattr(importlib.import_module(_LAZY_ATTRS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ember' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, the lazily imported ones included (for completion and dir())."""
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_ATTRS))


def is_tensor(obj) -> _builtins.bool:
    """Whether obj is an ember Tensor."""
    return isinstance(obj, Tensor)


class cuda:  # noqa: N801  (mirrors torch.cuda)
    """torch.cuda look-alike: ember has no CUDA backend installed."""

    @staticmethod
    def is_available() -> _builtins.bool:
        """Always False here."""
        return False

    @staticmethod
    def device_count() -> _builtins.int:
        """Always 0 here."""
        return 0
