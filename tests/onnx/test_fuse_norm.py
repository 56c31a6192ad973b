"""Layer norms (spelled out, or LayerNormalization), the tiled average pool and Gather fast paths."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import ember.onnx  # noqa: E402
from ember.kernels.cpu import have_numba  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(3)
F32 = TensorProto.FLOAT
pytestmark = pytest.mark.skipif(not have_numba(), reason="no numba: nothing is fused")


def _ln_nodes(x, out, axis=-1, square="Pow", w=True, b=True, opset=12, eps="eps"):
    ax = {"axes": [axis]} if opset < 18 else {}
    ain = ["axes"] if opset >= 18 else []
    nodes = [
        helper.make_node("ReduceMean", [x, *ain], ["m"], **ax),
        helper.make_node("Sub", [x, "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"])
        if square == "Pow"
        else helper.make_node("Mul", ["d", "d"], ["p"]),
        helper.make_node("ReduceMean", ["p", *ain], ["v"], **ax),
        helper.make_node("Add", ["v", eps], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n" if (w or b) else out]),
    ]
    last = "n"
    if w:
        nodes.append(helper.make_node("Mul", [last, "w"], ["nw" if b else out]))
        last = "nw"
    if b:
        nodes.append(helper.make_node("Add", ["b", last], [out]))  # operand order swapped
    return nodes


def _model(nodes, outputs, d, opset=12, wshape=None, dtype=np.float32):
    t = F32 if dtype == np.float32 else TensorProto.DOUBLE
    wshape = wshape or (d,)
    inits = [
        numpy_helper.from_array(np.asarray(2.0, dtype), "two"),
        numpy_helper.from_array(np.asarray(1e-5, dtype), "eps"),
        numpy_helper.from_array(RNG.standard_normal(wshape).astype(dtype), "w"),
        numpy_helper.from_array(RNG.standard_normal(wshape).astype(dtype), "b"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", t, None)],
        [helper.make_tensor_value_info(n, t, None) for n in outputs], initializer=inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _both(model, xs, atol=1e-5):
    data = model.SerializeToString()
    fast, plain = ember.onnx.load(data), ember.onnx.load(data, optimize=False)
    for x in xs:
        a, b = fast.run({"x": x}), plain.run({"x": x})
        for name in plain.output_names:
            want, got = b[name].numpy(), a[name].numpy()
            assert got.shape == want.shape and got.dtype == want.dtype
            scale = max(1.0, np.abs(want).max()) if want.size else 1.0
            np.testing.assert_allclose(got, want, rtol=0, atol=atol * scale)
    return fast


def _ops(m):
    return [nd.op for nd in m.graph.nodes]


def _ref64(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


@pytest.mark.parametrize("d", [1, 7, 120, 384, 1000])
@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("opset", [12, 18])
def test_spelled_out_layer_norm_is_one_node(d, square, opset):
    m = _model(_ln_nodes("x", "y", square=square, opset=opset), ["y"], d, opset=opset)
    xs = [_r(1, 40, d) + 3.0, _r(3, 5, d), _r(3, 2, 9, d)[:, :, 1:], _r(d)]  # batch 1 and 3
    fast = _both(m, xs)
    assert _ops(fast) == ["LayerNorm"]
    init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for x in xs[:2]:
        got = fast.run({"x": x})["y"].numpy()
        want = _ref64(x, init["w"], init["b"])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("w, b", [(False, False), (True, False), (False, True)])
def test_layer_norm_without_scale_or_shift(w, b):
    m = _model(_ln_nodes("x", "y", w=w, b=b), ["y"], 24)
    fast = _both(m, [_r(3, 11, 24), _r(1, 24), _r(0, 24)])  # an empty batch replays
    assert _ops(fast) == ["LayerNorm"]


def test_layer_norm_on_a_positive_axis_and_other_inputs_replays():
    m = _model(_ln_nodes("x", "y", axis=2), ["y"], 16)
    fast = _both(m, [_r(3, 4, 16), _r(1, 5, 16)])
    assert _ops(fast) == ["LayerNorm"]
    # rank 4: axis 2 is not the last axis; float64 input: not the kernel's dtype
    m3 = _model(_ln_nodes("x", "y", axis=2), ["y"], 5, wshape=(5,))
    _both(m3, [_r(2, 3, 16, 5)])  # axis 2 of rank 4 replays the nodes
    m64 = _model(_ln_nodes("x", "y"), ["y"], 16, dtype=np.float64)
    _both(m64, [RNG.standard_normal((3, 4, 16))])


def test_layer_norm_broadcasting_weight_and_wrong_width_replay():
    m = _model(_ln_nodes("x", "y"), ["y"], 8, wshape=(1, 1, 8))
    fast = _both(m, [_r(3, 4, 8), _r(4, 8)])  # rank 2 input: w makes it rank 3
    assert _ops(fast) == ["LayerNorm"]
    m1 = _model(_ln_nodes("x", "y"), ["y"], 1, wshape=(1,))  # w broadcasts over any width
    _both(m1, [_r(3, 4, 8)])


def test_layer_norm_values_read_elsewhere_are_not_fused():
    nodes = _ln_nodes("x", "y") + [helper.make_node("Neg", ["d"], ["nd"])]  # d read three times
    m = _model(nodes, ["y", "nd"], 8)
    assert "LayerNorm" not in _ops(_both(m, [_r(3, 4, 8)]))
    m2 = _model(_ln_nodes("x", "y"), ["y", "s"], 8)  # an inner value is a graph output
    assert "LayerNorm" not in _ops(_both(m2, [_r(3, 4, 8)]))
    m3 = _model(_ln_nodes("x", "y", axis=0), ["y"], 8, wshape=(8,))  # not the last axis: replays
    _both(m3, [_r(8, 8), _r(8)])


def _r(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("axis, bias, shape", [(-1, True, (3, 7, 33)), (2, False, (1, 5, 33)),
                                               (-1, True, (33,))])  # fmt: skip
def test_layer_normalization_node_on_the_kernel(axis, bias, shape):
    ins = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("LayerNormalization", ins, ["y"], axis=axis, epsilon=1e-3)]
    m = _model(nodes, ["y"], 33, opset=17)
    x = _r(*shape) * 3 + 1
    fast = _both(m, [x, _r(1, *shape[1:])])
    assert _ops(fast) == ["LayerNorm"]
    init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    want = _ref64(x, init["w"], init["b"] if bias else 0.0, eps=1e-3)
    got = fast.run({"x": x})["y"].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_layer_normalization_node_that_does_not_fit_replays():
    nodes = [helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], axis=1)]
    m = _model(nodes, ["y"], 4, opset=17, wshape=(4,))
    _both(m, [_r(2, 4, 4), _r(1, 4, 4)])  # axis 1 of rank 3: the node itself
    m2 = _model(
        [helper.make_node("LayerNormalization", ["x", "w"], ["y", "mean"])],
        ["y", "mean"],
        4,
        opset=17,
    )
    assert "LayerNorm" not in _ops(_both(m2, [_r(3, 4)]))


def _avg_pool_ref(x, kh, kw, ceil):
    n, c, h, w = x.shape
    oh = -(-(h - kh) // kh) + 1 if ceil else (h - kh) // kh + 1
    ow = -(-(w - kw) // kw) + 1 if ceil else (w - kw) // kw + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = x[:, :, i * kh : i * kh + kh, j * kw : j * kw + kw].astype(np.float64)
            y[:, :, i, j] = win.mean(axis=(2, 3))
    return y


@pytest.mark.parametrize("k, hw", [((3, 2), (3, 80)), ((3, 2), (7, 9)), ((2, 2), (4, 6)),
                                   ((1, 3), (5, 11)), ((2, 3), (2, 3))])  # fmt: skip
@pytest.mark.parametrize("ceil", [0, 1])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_tiled_average_pool_against_float64(k, hw, ceil, layout):
    nodes = [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=list(k), strides=list(k),
                              ceil_mode=ceil)]  # fmt: skip
    m = ember.onnx.load(_model(nodes, ["y"], 1, opset=12).SerializeToString(), optimize=False)
    for n in (1, 3):
        x = _r(n, 13, *hw) * 2 + 1
        if layout == "nhwc":  # a fused conv's channels-last result
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        got = m.run({"x": x})["y"].numpy()
        want = _avg_pool_ref(x, *k, ceil)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx", [[[2, -1], [0, -3]], -2, [1], [[]]])
@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_gather_takes_rows_with_negative_indices(axis, idx, itype):
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", F32, None),
         helper.make_tensor_value_info("i", TensorProto.INT64 if itype == np.int64 else TensorProto.INT32, None)],
        [helper.make_tensor_value_info("y", F32, None)],
    )  # fmt: skip
    m = ember.onnx.load(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    )
    x = _r(3, 4, 5)
    i = np.array(idx, itype)
    got = m.run({"x": x, "i": i})["y"].numpy()
    want = np.take(x, np.where(i < 0, i + x.shape[axis], i), axis=axis)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    with pytest.raises(Exception, match="out of range"):
        m.run({"x": x, "i": np.array([5], itype)})
