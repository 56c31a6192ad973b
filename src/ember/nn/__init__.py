"""ember.nn: Module, Parameter, containers, layers, functional (F), init and utils, as torch.nn."""

from ember.nn import functional, init, utils
from ember.nn.containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from ember.nn.hooks import (
    RemovableHandle,
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from ember.nn.kv_cache import BatchKVCache, CausalMask, KVCache, KVCacheRows
from ember.nn.layers import *  # noqa: F403
from ember.nn.layers import __all__ as _layers_all
from ember.nn.module import Module
from ember.nn.parameter import Buffer, Parameter
from ember.nn.state_dict import StateDictError

__all__ = [
    "Module",
    "Parameter",
    "Buffer",
    "Sequential",
    "ModuleList",
    "ModuleDict",
    "ParameterList",
    "ParameterDict",
    "RemovableHandle",
    "StateDictError",
    "KVCache",
    "BatchKVCache",
    "KVCacheRows",
    "CausalMask",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
    "functional",
    "init",
    "utils",
    *_layers_all,
]
