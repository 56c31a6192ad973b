"""RNN, LSTM, GRU (multi-layer, bidirectional, batch_first) and their single-step cells.

Parameter names, shapes, gate order (LSTM: i, f, g, o; GRU: r, z, n) and initialisation follow
torch, so state_dicts load both ways.
"""

from __future__ import annotations

import math

from ember.errors import ShapeError, UnsupportedError
from ember.nn import functional as F
from ember.nn import init
from ember.nn.layers._common import empty_param
from ember.nn.layers._rnn_kernels import GRULayer, LSTMLayer, RNNLayer
from ember.nn.module import Module
from ember.tensor import Tensor


def _zeros(shape, like: Tensor) -> Tensor:
    from ember.ops.creation import zeros

    return zeros(tuple(shape), dtype=like.dtype, device=like.device)


class RNNBase(Module):
    """Shared parameters and the layer/direction loop of RNN, LSTM and GRU."""

    _gates = 1
    mode = "RNN_TANH"

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError(
                "dropout should be a number in range [0, 1] representing the "
                "probability of an element being zeroed"
            )
        if proj_size:
            raise UnsupportedError("LSTM proj_size > 0 is not supported by ember yet")
        if hidden_size <= 0 or num_layers <= 0:
            raise ValueError("hidden_size and num_layers must be positive")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        gate = {"LSTM": 4, "GRU": 3}.get(mode, 1) * hidden_size
        dirs = 2 if bidirectional else 1
        self._flat_weights_names = []
        for layer in range(num_layers):
            for d in range(dirs):
                n_in = input_size if layer == 0 else hidden_size * dirs
                sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
                params = [
                    ("weight_ih" + sfx, (gate, n_in)),
                    ("weight_hh" + sfx, (gate, hidden_size)),
                ]
                if bias:
                    params += [("bias_ih" + sfx, (gate,)), ("bias_hh" + sfx, (gate,))]
                for name, shape in params:
                    setattr(self, name, empty_param(shape, device, dtype))
                    self._flat_weights_names.append(name)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight and bias ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    @property
    def all_weights(self) -> list:
        """Parameters grouped per layer-direction: [[w_ih, w_hh, b_ih, b_hh], ...]."""
        per = 4 if self.bias else 2
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i : i + per]] for i in range(0, len(names), per)]

    def extra_repr(self) -> str:
        """torch's summary (non-default settings only)."""
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    def _run(self, x: Tensor, states: list) -> tuple:
        """x (T, N, I), states [(L*D, N, H) per kind] -> (output, final states)."""
        from ember.ops import movement

        dirs = 2 if self.bidirectional else 1
        T = x.shape[0]
        finals: list[list] = [[] for _ in states]
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                k = layer * dirs + d
                sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
                ws = [getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx)]
                if self.bias:
                    ws += [getattr(self, "bias_ih" + sfx), getattr(self, "bias_hh" + sfx)]
                init_states = [movement.select(s, 0, k) for s in states]
                packed = self._layer(layer_in, init_states, ws, d == 1)
                outs.append(movement.narrow(packed, 0, 0, T))
                for j in range(len(states)):
                    finals[j].append(movement.select(packed, 0, T + j))
            layer_in = outs[0] if dirs == 1 else movement.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        return layer_in, [movement.stack(f, 0) for f in finals]

    def _layer(self, x: Tensor, init_states: list, ws: list, reverse: bool) -> Tensor:
        raise NotImplementedError

    def _prepare(self, input: Tensor, hx, n_states: int) -> tuple:
        """Normalise input to (T, N, I) and initial states to (L*D, N, H); note what to undo."""
        if input.ndim not in (2, 3):
            raise ShapeError(
                f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.ndim}D instead"
            )
        batched = input.ndim == 3
        x = input
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[-1] != self.input_size:
            raise ShapeError(
                f"{type(self).__name__}: input.size(-1) must be equal to input_size. "
                f"Expected {self.input_size}, "
                f"got {x.shape[-1]}"
            )
        dirs = 2 if self.bidirectional else 1
        want = (self.num_layers * dirs, x.shape[1], self.hidden_size)
        if hx is None:
            states = [_zeros(want, x) for _ in range(n_states)]
        else:
            hs = list(hx) if isinstance(hx, (tuple, list)) else [hx]
            if len(hs) != n_states:
                raise ShapeError(
                    f"{type(self).__name__}: expected {n_states} initial state "
                    f"tensor(s), got {len(hs)}"
                )
            states = []
            for h in hs:
                if not batched:
                    if h.ndim != 2:
                        raise ShapeError(
                            "For unbatched 2-D input, hx should also be 2-D but got "
                            f"{h.ndim}-D tensor"
                        )
                    h = h.unsqueeze(1)
                elif h.ndim != 3:
                    raise ShapeError(
                        f"For batched 3-D input, hx should also be 3-D but got {h.ndim}-D tensor"
                    )
                if tuple(h.shape) != want:
                    raise ShapeError(f"Expected hidden size {want}, got {tuple(h.shape)}")
                states.append(h)
        return x, states, batched

    def _finish(self, out: Tensor, finals: list, batched: bool) -> tuple:
        if not batched:
            return out.squeeze(1), [f.squeeze(1) for f in finals]
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, finals


class RNN(RNNBase):
    """Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        *args,
        **kwargs,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        mode = "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
        super().__init__(mode, input_size, hidden_size, num_layers, *args, **kwargs)
        self.nonlinearity = nonlinearity

    def _layer(self, x, init_states, ws, reverse):
        return RNNLayer.apply(
            x, init_states[0], *ws, reverse=reverse, relu=self.nonlinearity == "relu"
        )

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple:
        """(output, h_n)."""
        x, states, batched = self._prepare(input, hx, 1)
        out, finals = self._run(x, states)
        out, finals = self._finish(out, finals, batched)
        return out, finals[0]


class LSTM(RNNBase):
    """Long short-term memory; gates i, f, g, o stacked in that order in weight_ih/weight_hh."""

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, *args, **kwargs
    ) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, *args, **kwargs)

    def _layer(self, x, init_states, ws, reverse):
        return LSTMLayer.apply(x, init_states[0], init_states[1], *ws, reverse=reverse)

    def forward(self, input: Tensor, hx: tuple | None = None) -> tuple:
        """(output, (h_n, c_n))."""
        x, states, batched = self._prepare(input, hx, 2)
        out, finals = self._run(x, states)
        out, finals = self._finish(out, finals, batched)
        return out, (finals[0], finals[1])


class GRU(RNNBase):
    """Gated recurrent unit; gates r, z, n stacked in that order in weight_ih/weight_hh."""

    def __init__(
        self, input_size: int, hidden_size: int, num_layers: int = 1, *args, **kwargs
    ) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, *args, **kwargs)

    def _layer(self, x, init_states, ws, reverse):
        return GRULayer.apply(x, init_states[0], *ws, reverse=reverse)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple:
        """(output, h_n)."""
        x, states, batched = self._prepare(input, hx, 1)
        out, finals = self._run(x, states)
        out, finals = self._finish(out, finals, batched)
        return out, finals[0]


class RNNCellBase(Module):
    """Parameters of a single-step cell: weight_ih, weight_hh, bias_ih, bias_hh."""

    _gates = 1

    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        g = self._gates * hidden_size
        self.weight_ih = empty_param((g, input_size), device, dtype)
        self.weight_hh = empty_param((g, hidden_size), device, dtype)
        if bias:
            self.bias_ih = empty_param((g,), device, dtype)
            self.bias_hh = empty_param((g,), device, dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight and bias ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -stdv, stdv)

    def extra_repr(self) -> str:
        """torch's summary."""
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _step(self, x: Tensor, states: list, fn) -> Tensor:
        batched = x.ndim == 2
        if not batched:
            x = x.unsqueeze(0)
            states = [s.unsqueeze(0) for s in states]
        seq = x.unsqueeze(0)
        ws = [self.weight_ih, self.weight_hh]
        if self.bias:
            ws += [self.bias_ih, self.bias_hh]
        packed = fn(seq, states, ws)
        return packed, batched

    def _init(self, input: Tensor, hx, n: int) -> list:
        if hx is None:
            shape = (input.shape[0], self.hidden_size) if input.ndim == 2 else (self.hidden_size,)
            return [_zeros(shape, input) for _ in range(n)]
        return list(hx) if isinstance(hx, (tuple, list)) else [hx]


class RNNCell(RNNCellBase):
    """One Elman RNN step."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """h'."""
        relu = self.nonlinearity == "relu"
        packed, batched = self._step(
            input,
            self._init(input, hx, 1),
            lambda x, s, ws: RNNLayer.apply(x, s[0], *ws, reverse=False, relu=relu),
        )
        h = packed[1]
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """One LSTM step: (h', c')."""

    _gates = 4

    def forward(self, input: Tensor, hx: tuple | None = None) -> tuple:
        """(h', c')."""
        packed, batched = self._step(
            input,
            self._init(input, hx, 2),
            lambda x, s, ws: LSTMLayer.apply(x, s[0], s[1], *ws, reverse=False),
        )
        h, c = packed[1], packed[2]
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """One GRU step."""

    _gates = 3

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """h'."""
        packed, batched = self._step(
            input,
            self._init(input, hx, 1),
            lambda x, s, ws: GRULayer.apply(x, s[0], *ws, reverse=False),
        )
        h = packed[1]
        return h if batched else h.squeeze(0)
