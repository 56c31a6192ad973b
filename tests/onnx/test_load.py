"""ember.onnx.load: inputs and outputs by name, numpy or ember in, external data, local functions."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import ember  # noqa: E402
import ember.onnx  # noqa: E402
from ember.errors import DTypeError, ShapeError  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402


def _two_outputs(opset=17):
    w = helper.make_tensor(
        "w", TensorProto.FLOAT, [3, 4], np.arange(12, dtype=np.float32).tobytes(), raw=True
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["sum"]),
        helper.make_node("ReduceMax", ["sum"], ["top"], keepdims=0),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("top", TensorProto.FLOAT, [])],
        initializer=[w],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_import_ember_does_not_import_onnx():
    code = "import sys, ember, ember.onnx; assert 'onnx' not in sys.modules and 'google.protobuf' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_inputs_and_outputs_by_name(tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(_two_outputs(), p)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    b = np.arange(4, dtype=np.float32)
    want = x @ np.arange(12.0, dtype=np.float32).reshape(3, 4) + b
    for m in (ember.onnx.load(p), ember.onnx.load(str(p)), ember.onnx.load(p.read_bytes())):
        assert m.input_names == ["x", "b"] and m.output_names == ["sum", "top"]
        out = m.run({"x": x, "b": b})
        assert isinstance(out["sum"], ember.Tensor) and out["top"].shape == ()
        np.testing.assert_allclose(out["sum"].numpy(), want, rtol=1e-6)
        s, top = m(ember.from_numpy(x), b=b.tolist())  # ember tensor by position, a list by name
        np.testing.assert_allclose(s.numpy(), want, rtol=1e-6)
        assert float(top.item()) == pytest.approx(want.max(), rel=1e-6)
    assert "inputs=['x', 'b']" in repr(m)


def test_input_errors():
    m = ember.onnx.load(_two_outputs().SerializeToString())
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ShapeError, match="missing"):
        m(x)
    with pytest.raises(ShapeError, match="no input"):
        m.run({"x": x, "b": np.ones(4, np.float32), "c": x})
    with pytest.raises(DTypeError, match="dtype"):
        m(ember.from_numpy(x.astype(np.float64)), np.ones(4, np.float32))
    with pytest.raises(ShapeError, match="twice"):
        m(x, np.ones(4, np.float32), x=x)
    with pytest.raises(ShapeError):
        m(np.ones((2, 5), np.float32), np.ones(4, np.float32))


def test_external_data_file(tmp_path):
    model = _two_outputs()
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)  # fmt: skip
    assert (tmp_path / "weights.bin").is_file()
    m = ember.onnx.load(tmp_path / "m.onnx")
    np.testing.assert_array_equal(
        m.initializers["w"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4)
    )
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(
        m(x, np.zeros(4, np.float32))[0].numpy(), x @ m.initializers["w"].numpy()
    )


def test_local_function_is_inlined_with_its_attributes():
    body = [helper.make_node("Mul", ["a", "s"], ["t"]), helper.make_node("LeakyRelu", ["t"], ["o"])]
    body[1].attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    f = helper.make_function("local", "ScaledLeaky", ["a", "s"], ["o"], body,
                             [helper.make_opsetid("", 17)], attributes=["alpha"])  # fmt: skip
    node = helper.make_node("ScaledLeaky", ["x", "k"], ["y"], domain="local", alpha=0.25)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[helper.make_tensor("k", TensorProto.FLOAT, [], [2.0])],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[f])  # fmt: skip
    x = np.array([-2.0, -0.5, 0.5, 3.0], np.float32)
    y = ember.onnx.load(model.SerializeToString())(x).numpy()
    np.testing.assert_allclose(y, np.where(2 * x > 0, 2 * x, 0.25 * 2 * x))


def test_supported_ops_lists_the_families():
    ops = ember.onnx.supported_ops()
    for o in ("Conv", "LSTM", "Resize", "Attention", "NonMaxSuppression", "Einsum", "TopK"):
        assert o in ops


def _loop_model(trips: int | None):
    """y = x * 2**n through a Loop whose body reads the outer-scope 'two'; an If picks the sign."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Mul", ["v_in", "two"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)],
    )  # fmt: skip
    neg = helper.make_graph([helper.make_node("Neg", ["looped"], ["r"])], "neg", [],
                            [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])  # fmt: skip
    pos = helper.make_graph([helper.make_node("Identity", ["looped"], ["r"])], "pos", [],
                            [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])  # fmt: skip
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
             helper.make_tensor("go", TensorProto.BOOL, [], [True])]  # fmt: skip
    loop_in = ["n" if trips is not None else "", "go", "x"]
    if trips is not None:
        inits.append(helper.make_tensor("n", TensorProto.INT64, [], [trips]))
    nodes = [helper.make_node("Loop", loop_in, ["looped"], body=body),
             helper.make_node("If", ["flip"], ["y"], then_branch=neg, else_branch=pos)]  # fmt: skip
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("flip", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], initializer=inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_if_and_loop_read_the_outer_scope():
    m = ember.onnx.load(_loop_model(3).SerializeToString())
    x = np.array([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_array_equal(m(x, np.array(False)).numpy(), x * 8)
    np.testing.assert_array_equal(m(x, np.array(True)).numpy(), -x * 8)


def test_endless_loop_stops(monkeypatch):
    from ember.onnx import _ops_control

    monkeypatch.setattr(_ops_control, "MAX_TRIPS", 50)
    m = ember.onnx.load(_loop_model(None).SerializeToString())
    with pytest.raises(ShapeError, match="iterations"):
        m(np.ones(3, np.float32), np.array(False))


def test_run_plan_matches_the_dict_loop_and_follows_the_graph():
    """Graph.run's slot plan (built once) gives the dict loop's values (an output that a later
    node also reads is not freed), and is rebuilt when the nodes or outputs change."""
    g = ember.onnx.load(_two_outputs().SerializeToString(), optimize=False).graph
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    feeds = {"x": ember.from_numpy(x), "b": ember.from_numpy(np.ones(4, np.float32))}
    plan = g._run_plan()
    assert plan is not None and g._run_plan() is plan
    fast = [v.numpy().copy() for v in g.run(feeds)]
    slow = [v.numpy() for v in g.run(feeds, scope={"unused": feeds["b"]})]  # the dict loop
    for a, c in zip(fast, slow):
        np.testing.assert_array_equal(a, c)
    g.nodes, g.outputs = g.nodes[:2], ["sum"]
    g._last_use = g._liveness()
    assert g._run_plan() is not plan
    (only,) = g.run(feeds)
    np.testing.assert_array_equal(only.numpy(), fast[0])
    with pytest.raises(KeyError):  # a value nothing produced: the dict loop's KeyError
        g.run({"x": feeds["x"]})
