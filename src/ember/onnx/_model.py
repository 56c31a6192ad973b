"""ember.onnx.load: an ONNX model file as a callable ember module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import ember
from ember.errors import DTypeError, FormatError, ShapeError, UnsupportedError
from ember.nn import Module
from ember.onnx import _ops_control, _ops_conv, _ops_math, _ops_misc, _ops_seq, _ops_shape  # noqa: F401 - registers ops
from ember.onnx._graph import Graph, _Node, input_dtype, to_tensor
from ember.onnx._proto import import_onnx, parse_model, read_source
from ember.onnx._registry import Attrs
from ember.tensor import Tensor

MIN_OPSET = 7


def max_opset() -> int:
    """The newest default-domain opset the installed onnx package defines."""
    return import_onnx().defs.onnx_opset_version()


class _Function:
    """A model-local function (FunctionProto): each call site becomes its own subgraph."""

    def __init__(self, f, functions: dict, opset: int) -> None:
        self.f, self.functions, self.opset = f, functions, opset

    def instantiate(self, node, where: str, base, opset: int) -> _Node:
        onnx = import_onnx()
        given = {a.name: a for a in node.attribute}
        defaults = {a.name: a for a in self.f.attribute_proto}
        g = onnx.GraphProto()
        for n in self.f.node:
            m = g.node.add()
            m.CopyFrom(n)
            del m.attribute[:]
            for at in n.attribute:
                if at.ref_attr_name:
                    src = given.get(at.ref_attr_name) or defaults.get(at.ref_attr_name)
                    if src is None:
                        continue
                    new = m.attribute.add()
                    new.CopyFrom(src)
                    new.name = at.name
                else:
                    m.attribute.add().CopyFrom(at)
        for name in self.f.input:
            g.input.add().name = name
        for name in self.f.output:
            g.output.add().name = name
        sub = Graph(g, self.opset, base, self.functions, where=f"{where} function {self.f.name!r}")
        names = list(self.f.input)

        def run(_a: Attrs, *args):
            return tuple(sub.run({k: v for k, v in zip(names, args) if v is not None}))

        at = Attrs({}, opset, len(node.output), node.op_type, node.name)
        return _Node(node.op_type, list(node.input), list(node.output), at, run)


def _opset(model, where: str) -> int:
    v = None
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            v = int(o.version)
    if v is None:
        raise FormatError(f"{where}: the model imports no default-domain opset")
    top = max_opset()
    if not MIN_OPSET <= v <= top:
        raise UnsupportedError(
            f"{where}: default-domain opset {v}; ember supports {MIN_OPSET}..{top}"
        )
    return v


class OnnxModule(Module):
    """An ONNX graph run on ember ops; call with inputs by position or by name."""

    def __init__(
        self, model, base: Path | None, where: str = "<onnx>", optimize: bool = True
    ) -> None:
        super().__init__()
        opset = _opset(model, where)
        functions: dict = {}
        for f in model.functions:
            functions[(f.domain, f.name)] = _Function(f, functions, _fn_opset(f, opset))
        self.opset = opset
        self.graph = Graph(model.graph, opset, base, functions, where=where)
        if optimize:
            from ember.onnx._optimize import optimize as _optimize

            _optimize(self.graph)
        self.input_names: list[str] = list(self.graph.inputs)
        self.output_names: list[str] = list(self.graph.outputs)
        self._dtypes = {n: input_dtype(self.graph.input_info[n], f"{where}: input {n!r}")
                        for n in self.input_names}  # fmt: skip

    @property
    def initializers(self) -> dict[str, Tensor]:
        """The graph's weights (initializers) by ONNX name."""
        return self.graph.initializers

    def _feed(self, name: str, v: Any) -> Tensor:
        if isinstance(v, Tensor):
            t = v
        else:
            want = self._dtypes.get(name)
            arr = np.asarray(v, dtype=want) if want is not None else np.asarray(v)
            t = to_tensor(arr, f"input {name!r}")
        want = self._dtypes.get(name)
        if want is not None and np.dtype(t.dtype.np) != want:
            raise DTypeError(f"ONNX input {name!r}: expected dtype {want}, got {t.dtype}")
        return t

    def run(self, inputs: dict[str, Any]) -> dict[str, Tensor]:
        """Run the graph on named inputs; returns every output by name."""
        unknown = set(inputs) - set(self.input_names)
        if unknown:
            raise ShapeError(
                f"ONNX model has no input(s) {sorted(unknown)}; inputs: {self.input_names}"
            )
        feeds = {k: self._feed(k, v) for k, v in inputs.items() if v is not None}
        missing = [
            n for n in self.input_names if n not in feeds and n not in self.graph.initializers
        ]
        if missing:
            raise ShapeError(f"ONNX model: missing input(s) {missing}")
        with ember.no_grad():
            outs = self.graph.run(feeds)
        return dict(zip(self.output_names, outs))

    def forward(self, *args: Any, **kwargs: Any) -> Tensor | tuple[Tensor, ...]:
        """Inputs by position (graph order) or name; one output as a Tensor, several as a tuple."""
        if len(args) > len(self.input_names):
            raise ShapeError(f"ONNX model takes {len(self.input_names)} inputs, got {len(args)}")
        named = dict(zip(self.input_names, args))
        dup = set(named) & set(kwargs)
        if dup:
            raise ShapeError(f"ONNX model: input(s) {sorted(dup)} given twice")
        named.update(kwargs)
        out = self.run(named)
        vals = tuple(out[n] for n in self.output_names)
        return vals[0] if len(vals) == 1 else vals

    def extra_repr(self) -> str:
        return (f"opset={self.opset}, inputs={self.input_names}, outputs={self.output_names}, "
                f"nodes={len(self.graph.nodes)}")  # fmt: skip


def _fn_opset(f, default: int) -> int:
    for o in f.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return default


def load(src: str | Path | bytes, optimize: bool = True) -> OnnxModule:
    """Load an ONNX model (a path, or the file's bytes) as an ember module (optimize: see
    ember.onnx._optimize; False runs the graph's nodes as they are)."""
    data, base, where = read_source(src)
    model = parse_model(data, where)
    try:
        return OnnxModule(model, base, where, optimize)
    except RecursionError:
        raise FormatError(f"{where}: subgraphs nested too deeply") from None


def from_model_proto(model, base: str | Path | None = None, optimize: bool = True) -> OnnxModule:
    """An already parsed onnx.ModelProto as an ember module (external data read from base)."""
    return OnnxModule(model, Path(base).resolve() if base is not None else None, optimize=optimize)
