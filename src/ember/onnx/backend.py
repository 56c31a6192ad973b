"""`onnx.backend.base.Backend` on ember: the API `onnx.backend.test` drives (prepare, run, run_node)."""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.backend.base import Backend, BackendRep

from ember.onnx._model import from_model_proto, max_opset
from ember.onnx._proto import onnx_code
from onnx import helper


class EmberRep(BackendRep):
    """A prepared model: run(inputs) returns numpy outputs in graph order."""

    def __init__(self, module) -> None:
        self.module = module

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run on a list (graph input order) or a dict of numpy arrays."""
        m = self.module
        if isinstance(inputs, dict):
            named = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            named = dict(zip(m.input_names, inputs))
        out = m.run(named)
        return tuple(np.asarray(out[n].numpy()) for n in m.output_names)


class EmberBackend(Backend):
    """ember as an ONNX backend (CPU)."""

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> EmberRep:
        """Check and convert a ModelProto once; the returned rep runs it."""
        super().prepare(model, device, **kwargs)
        return EmberRep(from_model_proto(model, kwargs.get("base_dir")))

    @classmethod
    def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any):
        """Prepare and run in one call."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs: Any):
        """Run one NodeProto on numpy inputs (wrapped in a one-node model)."""
        arrays = [np.asarray(x) for x in inputs]
        names = [n for n in node.input]
        vin = [helper.make_tensor_value_info(n, onnx_code(a.dtype), a.shape)
               for n, a in zip(names, arrays) if n]  # fmt: skip
        vout = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        graph = helper.make_graph([node], "node", vin, vout)
        opset = kwargs.get("opset_version", max_opset())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        rep = EmberRep(from_model_proto(model))  # the checker would want typed outputs
        return rep.run({n: a for n, a in zip(names, arrays) if n})

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU only."""
        return str(device).upper().startswith("CPU")


prepare = EmberBackend.prepare
run_model = EmberBackend.run_model
run_node = EmberBackend.run_node
supports_device = EmberBackend.supports_device
