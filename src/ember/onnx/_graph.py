"""An ONNX graph as a checked, topologically sorted list of ember op calls."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

import ember
from ember.errors import EmberError, FormatError, UnsupportedError
from ember.onnx._proto import np_dtype, tensor_to_numpy
from ember.onnx._registry import OPS, Attrs
from ember.tensor import Tensor

_DEFAULT_DOMAINS = ("", "ai.onnx")
MAX_NODES = 10_000_000


def to_tensor(a: np.ndarray, where: str = "value") -> Tensor:
    """A numpy array as an ember tensor (sharing memory where it can)."""
    if a.dtype == object:
        raise UnsupportedError(f"{where}: string tensors are not supported")
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = np.array(a, order="C")
    return ember.from_numpy(a)


class _Node:
    __slots__ = ("op", "inputs", "outputs", "attrs", "fn")

    def __init__(self, op, inputs, outputs, attrs, fn) -> None:
        self.op, self.inputs, self.outputs, self.attrs, self.fn = op, inputs, outputs, attrs, fn


def _attr(a, base: Path | None, opset: int, where: str, functions) -> Any:
    t = a.type
    if t == 1:
        return float(a.f)
    if t == 2:
        return int(a.i)
    if t == 3:
        return a.s.decode("utf-8", "replace")
    if t == 4:
        return tensor_to_numpy(a.t, base)
    if t == 5:
        return Graph(a.g, opset, base, functions, where=f"{where} subgraph {a.name!r}", outer=True)
    if t == 6:
        return [float(v) for v in a.floats]
    if t == 7:
        return [int(v) for v in a.ints]
    if t == 8:
        return [s.decode("utf-8", "replace") for s in a.strings]
    if t == 9:
        return [tensor_to_numpy(x, base) for x in a.tensors]
    if t == 10:
        return [Graph(g, opset, base, functions, where=where, outer=True) for g in a.graphs]
    if t == 13:
        return a.tp
    if t == 11:
        raise UnsupportedError(f"{where}: sparse tensor attributes are not supported")
    raise FormatError(f"{where}: attribute {a.name!r} has unknown type {t}")


class Graph:
    """A checked graph: initializers as ember tensors, nodes in an order that respects their edges."""

    def __init__(
        self, g, opset: int, base: Path | None, functions: dict | None = None, *,
        where: str = "graph", outer: bool = False,
    ) -> None:  # fmt: skip
        self.opset = opset
        self.where = where
        functions = functions or {}
        if len(g.node) > MAX_NODES:
            raise FormatError(f"{where}: {len(g.node)} nodes is absurd")
        self.initializers: dict[str, Tensor] = {}
        for t in g.initializer:
            self.initializers[t.name] = to_tensor(
                tensor_to_numpy(t, base), f"initializer {t.name!r}"
            )
        self.constants: dict[str, Tensor] = dict(self.initializers)  # what run() reads
        if len(g.sparse_initializer):
            raise UnsupportedError(f"{where}: sparse initializers are not supported")
        self.inputs = [v.name for v in g.input if v.name not in self.initializers]
        self.input_info = {v.name: v for v in g.input if v.name not in self.initializers}
        self.outputs = [v.name for v in g.output]
        nodes = [self._node(n, i, base, functions) for i, n in enumerate(g.node)]
        self.nodes = self._sort(nodes, outer)
        self._last_use = self._liveness()
        self._plan: _Plan | None = None

    def _node(self, n, i: int, base, functions) -> _Node:
        where = f"{self.where}: node {i} ({n.op_type} {n.name!r})"
        if n.domain not in _DEFAULT_DOMAINS:
            key = (n.domain, n.op_type)
            if key in functions:
                return functions[key].instantiate(n, where, base, self.opset)
            raise UnsupportedError(f"{where}: operator domain {n.domain!r} is not supported")
        if (n.domain, n.op_type) in functions:
            return functions[(n.domain, n.op_type)].instantiate(n, where, base, self.opset)
        fn = OPS.get(n.op_type)
        if fn is None:
            raise UnsupportedError(f"{where}: ONNX operator {n.op_type} is not implemented")
        attrs = {}
        for a in n.attribute:
            if a.ref_attr_name:
                raise FormatError(
                    f"{where}: attribute reference {a.ref_attr_name!r} outside a function"
                )
            attrs[a.name] = _attr(a, base, self.opset, where, functions)
        at = Attrs(attrs, self.opset, len(n.output), n.op_type, n.name)
        return _Node(n.op_type, list(n.input), list(n.output), at, fn)

    def _sort(self, nodes: list[_Node], outer: bool) -> list[_Node]:
        known = set(self.inputs) | set(self.initializers)
        producer: dict[str, int] = {}
        for i, nd in enumerate(nodes):
            for o in nd.outputs:
                if not o:
                    continue
                if o in producer or o in known:
                    raise FormatError(f"{self.where}: value {o!r} is produced twice")
                producer[o] = i
        deps: list[set[int]] = []
        users: list[list[int]] = [[] for _ in nodes]
        self.outer_names: set[str] = set()
        for i, nd in enumerate(nodes):
            d = set()
            names = list(nd.inputs) + [n for g in _subgraphs(nd) for n in g.outer_names]
            for name in names:
                if not name or name in known:
                    continue
                if name in producer:
                    if producer[name] == i:
                        raise FormatError(
                            f"{self.where}: node {nd.op} reads its own output {name!r}"
                        )
                    d.add(producer[name])
                elif outer:
                    self.outer_names.add(name)
                else:
                    raise FormatError(
                        f"{self.where}: node {nd.op} reads {name!r}, which nothing produces"
                    )
            deps.append(d)
            for j in d:
                users[j].append(i)
        for o in self.outputs:
            if o not in producer and o not in known:
                if outer:
                    self.outer_names.add(o)
                else:
                    raise FormatError(f"{self.where}: graph output {o!r} is never produced")
        count = [len(d) for d in deps]
        ready = deque(i for i, c in enumerate(count) if c == 0)
        order: list[int] = []
        while ready:  # Kahn's algorithm: file order among ready nodes
            i = ready.popleft()
            order.append(i)
            for j in users[i]:
                count[j] -= 1
                if count[j] == 0:
                    ready.append(j)
        if len(order) != len(nodes):
            stuck = [nodes[i].op for i, c in enumerate(count) if c > 0][:5]
            raise FormatError(f"{self.where}: the graph has a cycle (through {stuck})")
        return [nodes[i] for i in order]

    def _liveness(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for i, nd in enumerate(self.nodes):
            for name in nd.inputs:
                last[name] = i
            for g in _subgraphs(nd):
                for name in g.outer_names:
                    last[name] = i
        for o in self.outputs:
            last[o] = len(self.nodes)
        return last

    def _run_plan(self) -> _Plan | None:
        """The slot plan of the current nodes and constants (None for control flow)."""
        plan = self._plan
        if plan is None or plan.key != _Plan.key_of(self):
            plan = self._plan = _Plan(self)
        return plan if plan.ok else None

    def run(self, feeds: dict[str, Tensor], scope: dict[str, Tensor] | None = None) -> list[Tensor]:
        """Evaluate the graph on the given inputs (and the enclosing scope, for subgraphs)."""
        plan = None if scope else self._run_plan()
        out = None if plan is None else plan.run(self, feeds)
        if out is not None:
            return out
        env: dict[str, Any] = dict(scope) if scope else {}
        consts = self.constants
        env.update(consts)
        env.update(feeds)
        last = self._last_use
        for i, nd in enumerate(self.nodes):
            args = [env[n] if n else None for n in nd.inputs]
            at = nd.attrs
            if nd.op in _SCOPED:  # control flow reads the enclosing values (a copy: thread-safe)
                at = Attrs({**at.values, "__scope__": env}, at.opset, at.n_out, at.op, at.name)
            out = _call(nd, at, args, self.where)
            for name, v in zip(nd.outputs, out):
                if name:
                    env[name] = v
            for name in nd.inputs:
                if name and last.get(name) == i and name not in consts and name not in feeds:
                    env.pop(name, None)
        return [env[o] for o in self.outputs]


_SCOPED = {"If", "Loop", "Scan"}


def _call(nd: _Node, at: Attrs, args: list, where: str) -> tuple | list:
    """One node's outputs (a tuple or list); a failure that is not ember's own -> FormatError."""
    try:
        out = nd.fn(at, *args)
    except EmberError:
        raise
    except (ValueError, TypeError, IndexError, ZeroDivisionError, KeyError) as e:
        raise FormatError(f"{where}: ONNX {at.where()} failed: {e}") from e
    return out if isinstance(out, (tuple, list)) else (out,)


class _Plan:
    """Graph.run's loop prepared once: values in a list by slot instead of a dict by name.

    Each step is (node, input slots, output slots, slots freed after it: the values whose last
    reader it is). Graphs with control flow (subgraphs read the enclosing values by name) keep
    the dict loop. Slot 0 is the absent optional input (""), always None.
    """

    @staticmethod
    def key_of(g: Graph) -> tuple:
        """What a plan is built from (by identity: the optimizer replaces these, not edits)."""
        return tuple(map(id, (g.nodes, g.constants, g.inputs, g.outputs, g._last_use)))

    def __init__(self, g: Graph) -> None:
        self.key = _Plan.key_of(g)
        self._refs = (g.nodes, g.constants, g.inputs, g.outputs, g._last_use)  # ids stay unique
        self.ok = not any(nd.op in _SCOPED or _subgraphs(nd) for nd in g.nodes)
        slot: dict[str, int] = {"": 0}

        def at(name: str) -> int:
            if name not in slot:
                slot[name] = len(slot)
            return slot[name]

        self.const_slots = [(at(k), v) for k, v in g.constants.items()]
        self.input_slots = {k: at(k) for k in g.inputs}
        keep = {s for s, _ in self.const_slots} | set(self.input_slots.values())
        last = g._last_use
        self.steps = []
        for i, nd in enumerate(g.nodes):
            ins = tuple(at(n) for n in nd.inputs)
            outs = tuple(at(n) if n else -1 for n in nd.outputs)
            free = tuple({slot[n] for n in nd.inputs if n and last.get(n) == i} - keep)
            self.steps.append((nd, ins, outs, free))
        self.out_slots = [at(o) for o in g.outputs]
        self.names = list(slot)
        self.size = len(slot)

    def run(self, g: Graph, feeds: dict[str, Tensor]) -> list[Tensor] | None:
        """Graph.run without a scope: the same values, errors and frees, by slot (None, having
        run nothing, when a feed is not a declared input: the dict loop takes those)."""
        vals: list[Any] = [None] * self.size
        for s, v in self.const_slots:
            vals[s] = v
        for k, v in feeds.items():
            s = self.input_slots.get(k)
            if s is None:
                return None
            vals[s] = v
        names = self.names
        for nd, ins, outs, free in self.steps:
            args = []
            for s in ins:
                v = vals[s]
                if v is None and s:
                    raise KeyError(names[s])  # as the dict loop's env[name]
                args.append(v)
            out = _call(nd, nd.attrs, args, g.where)
            for s, v in zip(outs, out):
                if s >= 0:
                    vals[s] = v
            for s in free:
                vals[s] = None
        out = []
        for s in self.out_slots:
            v = vals[s]
            if v is None:
                raise KeyError(names[s])
            out.append(v)
        return out


def _subgraphs(nd: _Node) -> list[Graph]:
    out = []
    for v in nd.attrs.values.values():
        if isinstance(v, Graph):
            out.append(v)
        elif isinstance(v, list) and v and isinstance(v[0], Graph):
            out.extend(v)
    return out


def input_dtype(info, where: str) -> np.dtype | None:
    """The numpy dtype a graph input declares, or None when it declares none."""
    tt = info.type.tensor_type if info.type.HasField("tensor_type") else None
    if tt is None or not tt.elem_type:
        return None
    return np_dtype(tt.elem_type, where)
