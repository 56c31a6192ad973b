"""Activation functions with torch.nn.functional signatures (inplace flags, softmax dims)."""

from __future__ import annotations

from ember.ops import elementwise as _E
from ember.ops import reduce as _R
from ember.tensor import Tensor

sigmoid = _E.sigmoid
tanh = _E.tanh
softplus = _E.softplus

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _maybe_inplace(input: Tensor, out: Tensor, inplace: bool) -> Tensor:
    return input._assign(out) if inplace else out


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0)."""
    return _maybe_inplace(input, _E.relu(input), inplace)


def relu_(input: Tensor) -> Tensor:
    """In-place relu."""
    return relu(input, True)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x, 0), 6)."""
    return _maybe_inplace(input, _E.relu6(input), inplace)


def hardtanh(
    input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False
) -> Tensor:
    """clamp(x, min_val, max_val)."""
    return _maybe_inplace(input, _E.hardtanh(input, min_val, max_val), inplace)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """x if x > 0 else negative_slope * x."""
    return _maybe_inplace(input, _E.leaky_relu(input, negative_slope), inplace)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x if x > 0 else alpha * (exp(x) - 1)."""
    return _maybe_inplace(input, _E.elu(input, alpha), inplace)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """scale * elu(x, alpha) with the self-normalising constants."""
    return _maybe_inplace(input, _E.elu(input, _SELU_ALPHA) * _SELU_SCALE, inplace)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    return _maybe_inplace(input, _E.elu(input / alpha, 1.0) * alpha, inplace)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """Gaussian error linear unit ('none' exact, 'tanh' approximation)."""
    return _E.gelu(input, approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """x * sigmoid(x) (swish)."""
    return _maybe_inplace(input, _E.silu(input), inplace)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * tanh(softplus(x))."""
    return _maybe_inplace(input, _E.mish(input), inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6."""
    return _maybe_inplace(input, _E.hardswish(input), inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3) / 6."""
    return _maybe_inplace(input, _E.hardsigmoid(input), inplace)


def logsigmoid(input: Tensor) -> Tensor:
    """log(sigmoid(x)), computed stably as -softplus(-x)."""
    return -_E.softplus(-input)


def softsign(input: Tensor) -> Tensor:
    """x / (1 + |x|)."""
    return input / (_E.abs(input) + 1)


def tanhshrink(input: Tensor) -> Tensor:
    """x - tanh(x)."""
    return input - _E.tanh(input)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x - lambd if x > lambd, x + lambd if x < -lambd, else 0."""
    zero = input * 0
    return _E.where(input > lambd, input - lambd, _E.where(input < -lambd, input + lambd, zero))


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x if |x| > lambd else 0."""
    return _E.where(_E.abs(input) > lambd, input, input * 0)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x if x > threshold else value."""
    out = _E.where(input > threshold, input, input * 0 + value)
    return _maybe_inplace(input, out, inplace)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """max(0, x) + weight * min(0, x), weight per channel (dim 1) or shared."""
    w = weight
    if weight.numel() != 1 and input.ndim >= 2:
        w = weight.reshape((weight.numel(),) + (1,) * (input.ndim - 2))
    return _E.where(input > 0, input, input * w)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b) where a, b are the two halves of input along dim."""
    if input.shape[dim] % 2:
        from ember.errors import ShapeError

        raise ShapeError(
            f"glu: halving dimension must be even, but dimension {dim} is size {input.shape[dim]}"
        )
    a, b = input.chunk(2, dim)
    return a * _E.sigmoid(b)


def _softmax_dim(ndim: int) -> int:
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """exp(x) / sum(exp(x)) along dim (computed stably)."""
    return _R.softmax(input, _softmax_dim(input.ndim) if dim is None else dim, dtype=dtype)


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """log(softmax(x)) along dim (computed stably)."""
    return _R.log_softmax(input, _softmax_dim(input.ndim) if dim is None else dim, dtype=dtype)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """softmax(-x) along dim."""
    return softmax(-input, dim, dtype=dtype)


def gumbel_softmax(
    logits: Tensor, tau: float = 1.0, hard: bool = False, eps: float = 1e-10, dim: int = -1
) -> Tensor:
    """Sample from the Gumbel-softmax distribution (straight-through when hard)."""
    from ember.ops.random import rand_like

    u = rand_like(logits.detach())
    gumbels = -_E.log(-_E.log(u + eps) + eps)
    y = softmax((logits + gumbels) / tau, dim)
    if not hard:
        return y
    idx = y.detach().argmax(dim, keepdim=True)
    from ember.ops.creation import zeros_like

    y_hard = zeros_like(y.detach()).scatter(dim, idx, 1.0)
    return y_hard - y.detach() + y


__all__ = [
    "relu",
    "relu_",
    "relu6",
    "hardtanh",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "gelu",
    "silu",
    "mish",
    "hardswish",
    "hardsigmoid",
    "logsigmoid",
    "softsign",
    "tanhshrink",
    "softshrink",
    "hardshrink",
    "threshold",
    "prelu",
    "glu",
    "softmax",
    "log_softmax",
    "softmin",
    "sigmoid",
    "tanh",
    "softplus",
    "gumbel_softmax",
]
