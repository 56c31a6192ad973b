"""ONNX import: `ember.onnx.load(path_or_bytes)` runs an ONNX graph on ember's ops.

The `onnx` package (the `onnx` extra) parses the protobuf; it is imported on the first load, never
by `import ember`. `ember.onnx.backend` implements `onnx.backend.base.Backend`;
`python -m ember.onnx.coverage` runs the official node test suite against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.onnx._model import OnnxModule

__all__ = ["load", "OnnxModule", "supported_ops"]


def load(src: Any, optimize: bool = True) -> OnnxModule:
    """Load an ONNX model (a path, or the file's bytes) as a callable ember module.

    optimize (default): rewrite the graph once for inference (constants folded, convolutions
    fused channels-last on packed weights, products by constant weights on the packed GEMM,
    attention and spelled-out activations as ember's ops); False runs its nodes as they are.
    """
    from ember.onnx._model import load as _load

    return _load(src, optimize)


def supported_ops() -> list[str]:
    """The ONNX operator names ember implements (default domain)."""
    from ember.onnx import _model  # noqa: F401 - registers the ops
    from ember.onnx._registry import OPS

    return sorted(OPS)


def __getattr__(name: str) -> Any:
    if name == "OnnxModule":
        from ember.onnx._model import OnnxModule

        return OnnxModule
    raise AttributeError(f"module 'ember.onnx' has no attribute {name!r}")
