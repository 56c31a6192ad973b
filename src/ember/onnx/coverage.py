"""Run the official `onnx.backend.test` node cases on ember: `python -m ember.onnx.coverage`.

A case is in the NN set when every operator of its graph is in NN_OPS or HELPER_OPS and at least
one is in NN_OPS (helpers such as Cast or Constant only count alongside an NN operator). Prints the
pass rate of that set and of every case, the passing cases, and the failures grouped by reason.
"""

from __future__ import annotations

import argparse
import collections
import warnings
from dataclasses import dataclass

import numpy as np

NN_OPS = {
    # arithmetic, comparison, logic
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Clip", "Cos",
    "Cosh", "Div", "Equal", "Erf", "Exp", "Floor", "Greater", "GreaterOrEqual", "IsInf", "IsNaN",
    "Less", "LessOrEqual", "Log", "Max", "Mean", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pow",
    "Reciprocal", "Round", "Sign", "Sin", "Sinh", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "Where",
    "Xor", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
    # activations
    "Celu", "Elu", "Gelu", "HardSigmoid", "HardSwish", "Hardmax", "LeakyRelu", "LogSoftmax", "Mish",
    "PRelu", "Relu", "Selu", "Shrink", "Sigmoid", "Softmax", "Softplus", "Softsign", "Swish",
    "ThresholdedRelu",
    # conv / pool / norm
    "AveragePool", "BatchNormalization", "Conv", "ConvTranspose", "Dropout", "GlobalAveragePool",
    "GlobalMaxPool", "GroupNormalization", "InstanceNormalization", "LayerNormalization", "LpPool",
    "LpNormalization", "LRN", "MaxPool", "MaxUnpool", "MeanVarianceNormalization",
    "RMSNormalization",
    # matmul / gemm / einsum
    "Einsum", "Gemm", "MatMul",
    # reductions
    "ArgMax", "ArgMin", "CumProd", "CumSum", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
    "ReduceSumSquare",
    # shape, movement, indexing
    "CenterCropPad", "Compress", "Concat", "ConstantOfShape", "DepthToSpace", "Expand", "EyeLike",
    "Flatten", "Gather", "GatherElements", "GatherND", "NonZero", "OneHot", "Pad", "Range",
    "Reshape", "ReverseSequence", "Scatter", "ScatterElements", "ScatterND", "Shape", "Size",
    "Slice", "SpaceToDepth", "Split", "Squeeze", "Tile", "Transpose", "Trilu", "Unique",
    "Unsqueeze",
    # attention-related, recurrent, resampling, selection
    "Attention", "RotaryEmbedding", "RNN", "GRU", "LSTM", "Resize", "Upsample", "TopK",
    "NonMaxSuppression",
}  # fmt: skip
HELPER_OPS = {"Constant", "Identity", "Cast", "CastLike"}


@dataclass
class Result:
    """One node case: its name, operators, whether it passed and why not."""

    name: str
    ops: tuple[str, ...]
    ok: bool
    reason: str = ""

    @property
    def in_nn_set(self) -> bool:
        """Whether the case counts toward the NN-set goal."""
        s = set(self.ops)
        return bool(s & NN_OPS) and s <= NN_OPS | HELPER_OPS


def _compare(ref: np.ndarray, out: np.ndarray, rtol: float, atol: float) -> str:
    ref, out = np.asarray(ref), np.asarray(out)
    if ref.dtype != out.dtype:
        return f"wrong dtype ({out.dtype}, expected {ref.dtype})"
    if ref.shape != out.shape:
        return "wrong shape"
    if ref.dtype.kind in "fc":
        if not np.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True):
            return "wrong values"
    elif ref.dtype == object:
        if not np.array_equal(ref, out):
            return "wrong values"
    elif not np.array_equal(ref, out):
        return "wrong values"
    return ""


def _reason(e: BaseException) -> str:
    msg = str(e).split("\n")[0]
    if "is not implemented" in msg and "operator" in msg:
        return "operator not implemented: " + msg.split("ONNX operator ")[-1].split(" ")[0]
    if "element type" in msg:
        return "element type not supported: " + msg.rsplit(" ", 4)[-4]
    if "has no ember equivalent" in msg:
        return "dtype ember lacks: " + msg.split("numpy dtype ")[-1].split(" ")[0]
    if "opset" in msg and "supports" in msg:
        return "opset out of range"
    return f"{type(e).__name__}: {msg[:120]}"


def _arrays(values) -> list:
    from onnx import TensorProto, numpy_helper

    return [numpy_helper.to_array(v) if isinstance(v, TensorProto) else v for v in values]


def run_cases(name_filter: str | None = None) -> list[Result]:
    """Run every node case of the installed onnx (optionally those whose name contains a string)."""
    from onnx.backend.test.loader import load_node_model_tests

    from ember.onnx import backend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_node_model_tests()
    results = []
    for c in cases:
        if name_filter and name_filter not in c.name:
            continue
        ops = tuple(sorted({n.op_type for n in c.model.graph.node}))
        try:
            rep = backend.prepare(c.model)
            reason = ""
            for inputs, ref in c.data_sets:
                inputs, ref = _arrays(inputs), _arrays(ref)
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    outs = rep.run(list(inputs))
                if len(outs) != len(ref):
                    reason = "wrong number of outputs"
                for r, o in zip(ref, outs):
                    reason = reason or _compare(r, o, c.rtol, c.atol)
                if reason:
                    break
            results.append(Result(c.name, ops, not reason, reason))
        except Exception as e:  # a case that raises is a failure with its reason
            results.append(Result(c.name, ops, False, _reason(e)))
    return results


def report(results: list[Result], show_pass: bool = True) -> str:
    """The coverage report as markdown-ish text."""
    nn = [r for r in results if r.in_nn_set]
    lines = []
    npass = sum(r.ok for r in nn)
    allpass = sum(r.ok for r in results)
    lines.append(
        f"NN set: {npass}/{len(nn)} node cases pass ({100 * npass / max(len(nn), 1):.1f}%)"
    )
    lines.append(
        f"all node cases: {allpass}/{len(results)} pass ({100 * allpass / max(len(results), 1):.1f}%)"
    )
    per_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for r in nn:
        for o in r.ops:
            if o in NN_OPS:
                per_op[o][1] += 1
                per_op[o][0] += r.ok
    lines.append("\n| operator | NN-set cases passing |\n| --- | --- |")
    for o in sorted(per_op):
        p, t = per_op[o]
        lines.append(f"| {o} | {p}/{t} |")
    fails = collections.defaultdict(list)
    for r in nn:
        if not r.ok:
            fails[r.reason].append(r.name)
    lines.append("\nNN-set failures by reason:")
    for reason, names in sorted(fails.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- {reason} ({len(names)}): {', '.join(sorted(names))}")
    other = collections.Counter(r.reason for r in results if not r.ok and not r.in_nn_set)
    lines.append("\nOutside the NN set, failures by reason (counts):")
    for reason, n in other.most_common():
        lines.append(f"- {reason}: {n}")
    if show_pass:
        lines.append("\nNN-set passing cases:")
        lines.append(", ".join(sorted(r.name for r in nn if r.ok)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the node cases and print the report."""
    p = argparse.ArgumentParser(prog="python -m ember.onnx.coverage", description=__doc__)
    p.add_argument("--filter", help="only cases whose name contains this string")
    p.add_argument("--no-pass-list", action="store_true", help="omit the list of passing cases")
    args = p.parse_args(argv)
    print(report(run_cases(args.filter), show_pass=not args.no_pass_list))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
