"""Gated feed-forward activations: swiglu(gate, up) = silu(gate) * up, geglu = gelu(gate) * up.

The gate of SwiGLU / GeGLU feed-forwards (LLaMA, Gemma, Phi-3...) as one op, ``gated_act``:
one pass where ``act(gate) * up`` would be an activation pass, a product and a temporary (the
float32 kernels live in ``ember.kernels.cpu.glu``). torch has no such function; the names are
the papers'. The backward is the closed form; gate and up are what it keeps, so a kernel may run
in training too.
"""

from __future__ import annotations

import numpy as np

from ember.autograd import Function
from ember.errors import DTypeError, ShapeError
from ember.nn.functional._util import up
from ember.ops.elementwise import Gelu
from ember.tensor import Tensor


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


class _GatedAct(Function):
    """act(g) * u for g, u of one shape; act is silu, gelu_tanh or gelu (exact)."""

    kernel_op = "gated_act"

    def meta(self, g, u, *, act):
        return np.broadcast_shapes(g.shape, u.shape), np.result_type(g.dtype, u.dtype)

    def saved(self, g, u, *, act):
        self.g, self.u, self.act = g, u, act

    def forward(self, g, u, *, act):
        self.saved(g, u, act=act)
        dt = np.result_type(g.dtype, u.dtype)
        gf, uf = up(g), up(u)
        if act == "silu":
            y = gf * _sigmoid(gf)
        else:
            y = Gelu.f(gf, "tanh" if act == "gelu_tanh" else "none")
        return (y * uf).astype(dt, copy=False)

    def backward(self, grad):
        g, u, act = up(self.g), up(self.u), self.act
        gr = up(grad)
        need = self.needs_input_grad
        if type(g) is np.ndarray:  # the one-pass kernel (kernels.cpu.glu) where it applies
            from ember.kernels import registry

            kern = registry.pick("gated_act_grad", "cpu", (gr, g, u), {"act": act})
            if kern is not None:
                dg, du = kern.fn(gr, g, u, act=act)
                return (dg if need[0] else None), (du if need[1] else None)
        if act == "silu":
            sig = _sigmoid(g)
            y = g * sig
            dy = sig * (1 + g * (1 - sig))
        else:
            approx = "tanh" if act == "gelu_tanh" else "none"
            y = Gelu.f(g, approx)
            dy = Gelu.df(g, y, np.ones_like(g), approx)
        dg = (gr * u * dy).astype(self.g.dtype, copy=False) if need[0] else None
        du = (gr * y).astype(self.u.dtype, copy=False) if need[1] else None
        return dg, du


def _gated(gate: Tensor, up_: Tensor, act: str, name: str) -> Tensor:
    if tuple(gate.shape) != tuple(up_.shape):
        raise ShapeError(
            f"{name}: gate of shape {tuple(gate.shape)} and up of shape {tuple(up_.shape)} differ"
        )
    if not (gate.is_floating_point() and up_.is_floating_point()):
        raise DTypeError(f"{name}: gate and up must be floating point")
    return _GatedAct.apply(gate, up_, act=act)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up: the gate of a SwiGLU feed-forward, in one pass."""
    return _gated(gate, up, "silu", "swiglu")


def geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """gelu(gate) * up ('none': exact, 'tanh': the tanh approximation), in one pass."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"geglu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gated(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu", "geglu")


__all__ = ["swiglu", "geglu"]
