"""Activation layers (module forms of ember.nn.functional's activations)."""

from __future__ import annotations

from ember.nn import functional as F
from ember.nn.layers._common import empty_param
from ember.nn.module import Module
from ember.tensor import Tensor


class _Inplace(Module):
    """An activation with an inplace flag."""

    _fn = None

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """Apply the activation."""
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        """'inplace=True' when set."""
        return "inplace=True" if self.inplace else ""


class ReLU(_Inplace):
    """max(x, 0)."""

    _fn = staticmethod(F.relu)


class SiLU(_Inplace):
    """x * sigmoid(x)."""

    _fn = staticmethod(F.silu)


class Mish(_Inplace):
    """x * tanh(softplus(x))."""

    _fn = staticmethod(F.mish)


class Hardswish(_Inplace):
    """x * relu6(x + 3) / 6."""

    _fn = staticmethod(F.hardswish)


class Hardsigmoid(_Inplace):
    """relu6(x + 3) / 6."""

    _fn = staticmethod(F.hardsigmoid)


class SELU(_Inplace):
    """Scaled ELU with the self-normalising constants."""

    _fn = staticmethod(F.selu)


class Hardtanh(Module):
    """clamp(x, min_val, max_val)."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise ValueError("max_val must be greater than min_val")

    def forward(self, input: Tensor) -> Tensor:
        """hardtanh(input)."""
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        """min_val, max_val and inplace."""
        inplace_str = ", inplace=True" if self.inplace else ""
        return f"min_val={self.min_val}, max_val={self.max_val}{inplace_str}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        """'inplace=True' when set."""
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    """Gaussian error linear unit ('none' or 'tanh' approximation)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        """gelu(input)."""
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        """approximate."""
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    """1 / (1 + exp(-x))."""

    def forward(self, input: Tensor) -> Tensor:
        """sigmoid(input)."""
        return F.sigmoid(input)


class Tanh(Module):
    """tanh(x)."""

    def forward(self, input: Tensor) -> Tensor:
        """tanh(input)."""
        return F.tanh(input)


class LogSigmoid(Module):
    """log(sigmoid(x))."""

    def forward(self, input: Tensor) -> Tensor:
        """logsigmoid(input)."""
        return F.logsigmoid(input)


class Softsign(Module):
    """x / (1 + |x|)."""

    def forward(self, input: Tensor) -> Tensor:
        """softsign(input)."""
        return F.softsign(input)


class Tanhshrink(Module):
    """x - tanh(x)."""

    def forward(self, input: Tensor) -> Tensor:
        """tanhshrink(input)."""
        return F.tanhshrink(input)


class _Dim(Module):
    """An activation along one dim."""

    _fn = None

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        """Apply along dim."""
        return type(self)._fn(input, self.dim)

    def extra_repr(self) -> str:
        """dim."""
        return f"dim={self.dim}"


class Softmax(_Dim):
    """exp(x) / sum(exp(x)) along dim."""

    _fn = staticmethod(F.softmax)


class LogSoftmax(_Dim):
    """log(softmax(x)) along dim."""

    _fn = staticmethod(F.log_softmax)


class Softmin(_Dim):
    """softmax(-x) along dim."""

    _fn = staticmethod(F.softmin)


class GLU(Module):
    """a * sigmoid(b) for the halves a, b of the input along dim."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        """glu(input, dim)."""
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        """dim."""
        return f"dim={self.dim}"


class LeakyReLU(Module):
    """x if x > 0 else negative_slope * x."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """leaky_relu(input)."""
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        """negative_slope and inplace."""
        inplace_str = ", inplace=True" if self.inplace else ""
        return f"negative_slope={self.negative_slope}{inplace_str}"


class _Alpha(Module):
    """ELU/CELU: an alpha and an inplace flag."""

    _fn = None

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """Apply the activation."""
        return type(self)._fn(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        """alpha and inplace."""
        inplace_str = ", inplace=True" if self.inplace else ""
        return f"alpha={self.alpha}{inplace_str}"


class ELU(_Alpha):
    """x if x > 0 else alpha * (exp(x) - 1)."""

    _fn = staticmethod(F.elu)


class CELU(_Alpha):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    _fn = staticmethod(F.celu)


class Softplus(Module):
    """log(1 + exp(beta x)) / beta, linear above threshold."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input: Tensor) -> Tensor:
        """softplus(input)."""
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        """beta and threshold."""
        return f"beta={self.beta}, threshold={self.threshold}"


class _Shrink(Module):
    """Soft/hard shrinkage with a lambda."""

    _fn = None

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:
        """Apply the shrinkage."""
        return type(self)._fn(input, self.lambd)

    def extra_repr(self) -> str:
        """lambda."""
        return str(self.lambd)


class Softshrink(_Shrink):
    """x -+ lambd outside [-lambd, lambd], else 0."""

    _fn = staticmethod(F.softshrink)


class Hardshrink(_Shrink):
    """x outside [-lambd, lambd], else 0."""

    _fn = staticmethod(F.hardshrink)


class Threshold(Module):
    """x if x > threshold else value."""

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        """threshold(input)."""
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        """threshold, value and inplace."""
        inplace_str = ", inplace=True" if self.inplace else ""
        return f"threshold={self.threshold}, value={self.value}{inplace_str}"


class PReLU(Module):
    """max(0, x) + a * min(0, x) with a learnable slope a (one, or one per channel)."""

    def __init__(
        self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = empty_param((num_parameters,), device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fill the slope with init."""
        from ember.nn.init import constant_

        constant_(self.weight, self.init)

    def forward(self, input: Tensor) -> Tensor:
        """prelu(input, weight)."""
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        """num_parameters."""
        return f"num_parameters={self.num_parameters}"
