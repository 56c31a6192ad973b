"""The adapted layers: LoraLinear (a frozen Linear or QLinear plus B @ A per adapter) and
ModulesToSaveWrapper (a trainable copy of a whole module per adapter), with peft's layout."""

from __future__ import annotations

import math
import warnings

import numpy as np

import ember
from ember import nn
from ember.nn import init
from ember.nn.parameter import Parameter
from ember.quant.nn import QEmbedding, QLinear
from ember.quant.qtensor import QTensor


def is_linear(module: nn.Module) -> bool:
    """Whether LoRA can adapt this module (a float nn.Linear or a quantized QLinear)."""
    return isinstance(module, (nn.Linear, QLinear))


def _float_dtype(base: nn.Module):
    w = base.weight
    if (
        isinstance(w, ember.Tensor)
        and w.is_floating_point()
        and w.dtype
        in (
            ember.float32,
            ember.float64,
        )
    ):
        return w.dtype
    return ember.float32  # quantized or 16-bit bases: the adapters train in float32


class LoraLinear(nn.Module):
    """``base_layer(x) + sum_a scaling[a] * lora_B[a](lora_A[a](lora_dropout[a](x)))``.

    The base layer stays frozen and as it is (a QLinear keeps its QTensor: the forward runs the
    quantized kernels, and the gradient to x runs the quantized transposed product). Only the
    adapters' A (r, in) and B (out, r) are Parameters that train.
    """

    def __init__(self, base_layer: nn.Module) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.in_features = base_layer.in_features
        self.out_features = base_layer.out_features
        self.lora_dropout = nn.ModuleDict()
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.r: dict[str, int] = {}
        self.lora_alpha: dict[str, float] = {}
        self.scaling: dict[str, float] = {}
        self.active_adapters: list[str] = []
        self.merged_adapters: list[str] = []
        self.disable_adapters = False
        self._unmerged_qweight: QTensor | None = None  # a quantized base's own blocks while merged

    @property
    def weight(self):
        """The base layer's weight (what code that reads ``layer.weight`` expects)."""
        return self.base_layer.weight

    @property
    def bias(self):
        """The base layer's bias."""
        return self.base_layer.bias

    @property
    def merged(self) -> bool:
        """Whether some adapter is merged into the base weight."""
        return bool(self.merged_adapters)

    def update_layer(
        self, adapter_name: str, r: int, lora_alpha: float, lora_dropout: float, init_lora_weights,
        use_rslora: bool,
    ) -> None:  # fmt: skip
        """Add (or replace) the adapter ``adapter_name`` of rank r."""
        dt = _float_dtype(self.base_layer)
        self.r[adapter_name] = r
        self.lora_alpha[adapter_name] = lora_alpha
        self.scaling[adapter_name] = lora_alpha / math.sqrt(r) if use_rslora else lora_alpha / r
        self.lora_dropout[adapter_name] = (
            nn.Dropout(p=lora_dropout) if lora_dropout > 0 else nn.Identity()
        )
        a = nn.Linear(self.in_features, r, bias=False, dtype=dt)
        b = nn.Linear(r, self.out_features, bias=False, dtype=dt)
        if init_lora_weights is not False:
            if init_lora_weights == "gaussian":
                init.normal_(a.weight, std=1 / r)
            else:
                init.kaiming_uniform_(a.weight, a=math.sqrt(5))
            init.zeros_(b.weight)
        self.lora_A[adapter_name] = a
        self.lora_B[adapter_name] = b
        if not self.active_adapters:
            self.active_adapters = [adapter_name]

    def delete_adapter(self, adapter_name: str) -> None:
        """Drop an adapter (unmerge first if it is merged)."""
        if adapter_name in self.merged_adapters:
            self.unmerge()
        for d in (self.lora_A, self.lora_B, self.lora_dropout):
            if adapter_name in d:
                del d[adapter_name]
        for d in (self.r, self.lora_alpha, self.scaling):
            d.pop(adapter_name, None)
        self.active_adapters = [a for a in self.active_adapters if a != adapter_name]

    def forward(self, x):
        """The base output plus each active (unmerged) adapter's scaled low-rank update."""
        if self.disable_adapters:
            if self.merged:
                self.unmerge()
            return self.base_layer(x)
        out = self.base_layer(x)
        if self.merged:
            return out
        for name in self.active_adapters:
            if name not in self.lora_A:
                continue
            a = self.lora_A[name]
            h = x if x.dtype == a.weight.dtype else x.to(a.weight.dtype)
            delta = self.lora_B[name](a(self.lora_dropout[name](h))) * self.scaling[name]
            out = out + (delta if delta.dtype == out.dtype else delta.to(out.dtype))
        return out

    # ---------------------------------------------------------------- merging
    def get_delta_weight(self, adapter_name: str) -> np.ndarray:
        """``(B @ A) * scaling`` of one adapter, shape (out, in), in the adapters' dtype."""
        a = self.lora_A[adapter_name].weight._data
        b = self.lora_B[adapter_name].weight._data
        return (b @ a) * np.asarray(self.scaling[adapter_name], b.dtype)

    def merge(self, adapter_names: list[str] | None = None) -> None:
        """Add the adapters' updates into the base weight (a quantized one is requantized)."""
        names = [n for n in (adapter_names or self.active_adapters) if n in self.lora_A]
        names = [n for n in names if n not in self.merged_adapters]
        if not names:
            return
        base = self.base_layer
        w = base.weight
        if isinstance(w, QTensor):
            if self._unmerged_qweight is None:
                self._unmerged_qweight = w
            dense = w.dequantize()
            for n in names:
                dense = dense + self.get_delta_weight(n).astype(np.float32)
            base.weight = _requantize(dense, w.qtype)
        else:
            new = w._data
            for n in names:
                new = new + self.get_delta_weight(n).astype(new.dtype, copy=False)
            base.weight = Parameter(ember.from_numpy(new), requires_grad=w.requires_grad)
        self.merged_adapters.extend(names)

    def unmerge(self) -> None:
        """Take every merged adapter's update out of the base weight again."""
        if not self.merged:
            return
        base = self.base_layer
        if self._unmerged_qweight is not None:
            base.weight = self._unmerged_qweight  # the original blocks, exactly
            self._unmerged_qweight = None
        else:
            w = base.weight
            new = w._data
            for n in reversed(self.merged_adapters):
                if n in self.lora_A:
                    new = new - self.get_delta_weight(n).astype(new.dtype, copy=False)
            base.weight = Parameter(ember.from_numpy(new), requires_grad=w.requires_grad)
        self.merged_adapters = []

    def extra_repr(self) -> str:
        """Features and adapters."""
        ranks = ", ".join(f"{k}: r={v}" for k, v in self.r.items())
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, adapters=[{ranks}]"
        )


def _requantize(dense: np.ndarray, qtype: str):
    from ember.quant.formats import QUANTIZE_TYPES

    if qtype in QUANTIZE_TYPES:
        warnings.warn(
            f"merging a LoRA adapter into a {qtype} weight requantizes it (rounding error)",
            stacklevel=4,
        )
        return QTensor.from_float(dense, qtype)
    warnings.warn(
        f"ember cannot quantize to {qtype}: the merged weight is kept in float32", stacklevel=4
    )
    return Parameter(ember.from_numpy(dense.astype(np.float32)), requires_grad=False)


def trainable_copy(module: nn.Module) -> nn.Module:
    """A float copy of a module whose parameters train (quantized layers are dequantized)."""
    import copy

    if isinstance(module, QLinear):
        out = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
        out.weight = Parameter(ember.from_numpy(module.weight.dequantize()))
        if module.bias is not None:
            out.bias = Parameter(ember.from_numpy(np.array(module.bias._data, np.float32)))
        return out
    if isinstance(module, QEmbedding):
        out = nn.Embedding(module.num_embeddings, module.embedding_dim, module.padding_idx)
        out.weight = Parameter(ember.from_numpy(module.weight.dequantize()))
        return out
    out = copy.deepcopy(module)
    out.__dict__.pop("forward", None)  # an instance-level fast path (stacked linears) stays behind
    out.requires_grad_(True)
    return out


class ModulesToSaveWrapper(nn.Module):
    """peft's wrapper for ``modules_to_save``: the frozen original and a trained copy per adapter."""

    def __init__(self, module: nn.Module, adapter_name: str) -> None:
        super().__init__()
        self.original_module = module
        self.modules_to_save = nn.ModuleDict()
        self.active_adapters: list[str] = []
        self.disable_adapters = False
        self.update(adapter_name)

    def update(self, adapter_name: str) -> None:
        """Add a trainable copy of the original for this adapter."""
        self.modules_to_save[adapter_name] = trainable_copy(self.original_module)
        if not self.active_adapters:
            self.active_adapters = [adapter_name]

    @property
    def active_module(self) -> nn.Module:
        """The module the forward runs: the active adapter's copy, or the original."""
        if self.disable_adapters:
            return self.original_module
        for n in self.active_adapters:
            if n in self.modules_to_save:
                return self.modules_to_save[n]
        return self.original_module

    @property
    def weight(self):
        """The active module's weight."""
        return self.active_module.weight

    def forward(self, *args, **kwargs):
        """The active module's forward."""
        return self.active_module(*args, **kwargs)
