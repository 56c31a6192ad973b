"""ember.onnx.load's graph rewrite: the optimized graph computes what the plain one does.

Every case builds a small graph with onnx.helper, loads it with optimize=True and with
optimize=False, and compares the outputs on random inputs at batch 1 and 3 (and checks that the
rewrite did fuse what it should, so a test that cannot fail is caught too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import ember  # noqa: E402
import ember.onnx  # noqa: E402
from ember.kernels.cpu import attention as A  # noqa: E402
from ember.kernels.cpu import gemm as G  # noqa: E402
from ember.kernels.cpu import gemv  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)
F32 = TensorProto.FLOAT
needs_gemm = pytest.mark.skipif(not G.microkernels_available(), reason="no packed GEMM here")


def _t(name: str, a) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a), name)


def _r(*shape, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, F32, None) for n in outputs],
        initializer=list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _both(model, feeds_list, atol=1e-4):
    """Outputs of the optimized and plain graphs agree on every feed; returns the optimized."""
    data = model.SerializeToString()
    fast, plain = ember.onnx.load(data), ember.onnx.load(data, optimize=False)
    for feeds in feeds_list:
        a, b = fast.run(feeds), plain.run(feeds)
        for name in plain.output_names:
            want = b[name].numpy()
            got = a[name].numpy()
            assert got.shape == want.shape and got.dtype == want.dtype, name
            scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
            np.testing.assert_allclose(got, want, rtol=0, atol=atol * scale, err_msg=name)
    return fast


def _ops(m) -> list[str]:
    return [nd.op for nd in m.graph.nodes]


# ---- convolutions ------------------------------------------------------------------------

CONVS = [  # c, o, k, stride, group, conv attributes
    (3, 5, 3, 1, 1, {"pads": [1, 1, 1, 1]}),
    (7, 9, 3, 2, 1, {"pads": [0, 1, 2, 1]}),  # asymmetric
    (5, 33, 1, 2, 1, {}),  # strided 1x1, odd channels
    (4, 6, 5, 1, 1, {"auto_pad": "SAME_UPPER"}),
    (4, 6, 4, 2, 1, {"auto_pad": "SAME_LOWER"}),
    (6, 6, 3, 1, 1, {"auto_pad": "VALID"}),
    (12, 12, 3, 1, 12, {"pads": [1, 1, 1, 1]}),  # depthwise
    (24, 24, 5, 2, 24, {"pads": [2, 1, 2, 1]}),  # depthwise, stride 2, asymmetric
    (8, 10, 3, 1, 2, {"pads": [1, 1, 1, 1]}),  # grouped: not fused, still right
    (6, 6, 3, 1, 1, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),  # dilated: not fused
]


@pytest.mark.parametrize("c,o,k,s,g,attrs", CONVS)
@pytest.mark.parametrize("tail", ["none", "bn_relu", "affine_clip6", "residual_relu", "bias_free"])
def test_conv_chains_equal_the_plain_graph(c, o, k, s, g, attrs, tail):
    w = _r(o, c // g, k, k, scale=0.3)
    inits = [_t("w", w), _t("b", _r(o))]
    conv_in = ["x", "w"] if tail == "bias_free" else ["x", "w", "b"]
    nodes = [helper.make_node("Conv", conv_in, ["y"], group=g, strides=[s, s], **attrs)]
    inputs = [("x", F32, ["n", c, 11, 10])]
    out = "y"
    if tail == "bn_relu":
        inits += [_t("g", _r(o)), _t("be", _r(o)), _t("mu", _r(o)), _t("v", np.abs(_r(o)) + 0.5)]
        nodes += [helper.make_node("BatchNormalization", ["y", "g", "be", "mu", "v"], ["bn"]),
                  helper.make_node("Relu", ["bn"], ["out"])]  # fmt: skip
        out = "out"
    elif tail == "affine_clip6":
        inits += [_t("sc", _r(1, o, 1, 1)), _t("sh", _r(o, 1, 1)), _t("lo", np.float32(0)),
                  _t("hi", np.float32(6))]  # fmt: skip
        nodes += [helper.make_node("Mul", ["sc", "y"], ["m"]),
                  helper.make_node("Add", ["m", "sh"], ["a"]),
                  helper.make_node("Clip", ["a", "lo", "hi"], ["out"])]  # fmt: skip
        out = "out"
    elif tail == "residual_relu":  # the residual is another conv of the input, same shape
        inits += [_t("w2", _r(o, c // g, k, k, scale=0.3))]
        nodes += [helper.make_node("Conv", ["x", "w2"], ["r"], group=g, strides=[s, s], **attrs),
                  helper.make_node("Add", ["r", "y"], ["s"]),
                  helper.make_node("Relu", ["s"], ["out"])]  # fmt: skip
        out = "out"
    m = _model(nodes, inputs, [out], inits)
    feeds = [{"x": _r(n, c, 11, 10)} for n in (1, 3)]
    fast = _both(m, feeds)
    fusable = g == 1 or g == c == o
    fusable = fusable and "dilations" not in attrs and G.microkernels_available()
    assert ("Conv" not in _ops(fast)) == fusable, _ops(fast)
    if fusable:
        assert set(_ops(fast)) == {"FusedConv"}, _ops(fast)  # the tail went into the conv


@pytest.mark.parametrize("act", ["hardswish_spelled", "HardSwish", "silu_spelled", "Relu", "none"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_activation_then_scalar_affine_then_conv(act, depthwise):
    """PP-OCR's blocks: conv, activation, x * a + b (scalars), the next conv."""
    c = 6
    g = c if depthwise else 1
    consts = {"three": 3.0, "zero": 0.0, "six": 6.0, "a": 0.37, "b2": -0.2, "d": 4.0}
    inits = [_t(k, np.array([v], np.float32)) for k, v in consts.items()]
    inits += [_t("w", _r(c, c // g, 3, 3, scale=0.3)), _t("bias", _r(c)),
              _t("w2", _r(5, c, 1, 1))]  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w", "bias"], ["y"], group=g, pads=[1, 1, 1, 1])]
    if act == "hardswish_spelled":
        nodes += _hardswish_nodes("y", "h")
    elif act == "silu_spelled":
        nodes += [helper.make_node("Sigmoid", ["y"], ["sg"]),
                  helper.make_node("Mul", ["y", "sg"], ["h"])]  # fmt: skip
    elif act == "none":
        nodes += [helper.make_node("Identity", ["y"], ["h"])]
    else:
        nodes += [helper.make_node(act, ["y"], ["h"])]
    nodes += [helper.make_node("Mul", ["a", "h"], ["ha"]),
              helper.make_node("Add", ["ha", "b2"], ["hb"]),
              helper.make_node("Div", ["hb", "d"], ["hd"]),
              helper.make_node("Sub", ["hd", "b2"], ["hs"]),
              helper.make_node("Conv", ["hs", "w2"], ["out"])]  # fmt: skip
    m = _model(nodes, [("x", F32, ["n", c, 7, 9])], ["out"], inits, opset=14)
    fast = _both(m, [{"x": _r(n, c, 7, 9, scale=3.0)} for n in (1, 3)])
    if G.microkernels_available() and act != "none":
        assert _ops(fast) == ["FusedConv", "FusedConv"], _ops(fast)


def test_squeeze_excite_global_pool_of_channels_last_conv_output():
    """PP-OCR's SE blocks: GlobalAveragePool of a fused conv's (channels-last) result, a 1x1 conv
    on the (n, c, 1, 1) means, HardSigmoid, and the scale of the conv's output."""
    c = 7
    inits = [_t("w", _r(c, 3, 3, 3, scale=0.3)), _t("w2", _r(c, c, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["y"], ["m"]),
        helper.make_node("Conv", ["m", "w2"], ["e"]),
        helper.make_node("HardSigmoid", ["e"], ["g"]),
        helper.make_node("Mul", ["y", "g"], ["out"]),
    ]
    m = _model(nodes, [("x", F32, ["n", 3, 9, 11])], ["out", "m"], inits)
    _both(m, [{"x": _r(n, 3, 9, 11)} for n in (1, 3)])


@pytest.mark.parametrize("hw", [(7, 7), (1, 1), (3, 40), (180, 170)])  # 180x170x9: channel_mean
def test_global_pool_then_flatten_as_one_node(hw):
    """A classifier's tail: GlobalAveragePool -> Flatten -> Gemm, the pool of a fused conv's
    channels-last result and of a plain NCHW input (no conv before it)."""
    c, o = 9, 5
    inits = [
        _t("w", _r(c, 3, 3, 3, scale=0.3)),
        _t("b", _r(c)),
        _t("fc", _r(o, c)),
        _t("fb", _r(o)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["m"]),
        helper.make_node("Flatten", ["m"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["out"], transB=1),
        helper.make_node("GlobalAveragePool", ["x"], ["m2"]),
        helper.make_node("Flatten", ["m2"], ["out2"]),
    ]
    m = _model(nodes, [("x", F32, ["n", 3, *hw])], ["out", "out2"], inits)
    fast = _both(m, [{"x": _r(n, 3, *hw)} for n in (1, 3)])
    assert "Flatten" not in _ops(fast) and "GlobalAveragePool" not in _ops(fast)
    nodes[3] = helper.make_node("Flatten", ["m"], ["f"], axis=2)  # (n, c, 1, 1) -> (n * c, 1)
    nodes[4] = helper.make_node("Relu", ["f"], ["out"])
    m = _model(nodes, [("x", F32, ["n", 3, *hw])], ["out", "out2", "m2"], inits)
    fast = _both(m, [{"x": _r(2, 3, *hw)}])
    assert _ops(fast).count("Flatten") == 2  # axis 2, and a pool the graph returns: unfused


@pytest.mark.parametrize("hw", [(7, 7), (1, 1), (3, 5)])
@pytest.mark.parametrize("c,o", [(19, 37), (64, 100)])
def test_classifier_tail_pool_and_product_as_one_node(c, o, hw):
    """ResNet's tail: a fused conv with a residual -> GlobalAveragePool -> Flatten -> Gemm, one
    PoolLinear node (kernels.cpu.gemv's mean and product at batch 1, 1 and 2 threads; the two
    nodes at batch 3 and 0, for an NCHW input and when the input records a gradient)."""
    inits = [_t("w", _r(c, c, 3, 3, scale=0.3)), _t("b", _r(c)), _t("fc", _r(o, c)),
             _t("fb", _r(o))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["y", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["m"]),
        helper.make_node("Flatten", ["m"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["out"], transB=1),
        helper.make_node("GlobalAveragePool", ["x"], ["m2"]),  # NCHW: the two nodes' path
        helper.make_node("Flatten", ["m2"], ["f2"]),
        helper.make_node("Gemm", ["f2", "fc"], ["out2"], transB=1),
    ]
    m = _model(nodes, [("x", F32, ["n", c, *hw])], ["out", "out2"], inits)
    threads = ember.get_num_threads()
    try:
        for t in (1, 2):
            ember.set_num_threads(t)
            fast = _both(m, [{"x": _r(n, c, *hw)} for n in (1, 3, 0, 1)])
    finally:
        ember.set_num_threads(threads)
    if G.microkernels_available():
        assert _ops(fast).count("PoolLinear") == 2, _ops(fast)
    if G.microkernels_available() and hw != (1, 1):  # (1, 1): the pool op's own NHWC path
        x = ember.tensor(_r(1, c, *hw), requires_grad=True)  # records: the plain ops
        g = fast.graph
        pl = next(nd for nd in g.nodes if nd.op == "PoolLinear")
        y = pl.fn(pl.attrs, x)
        assert y.requires_grad and y.shape == (1, o)


@needs_gemm
@pytest.mark.parametrize("shape", [(1, 40), (1, 1, 40), (40,)])
def test_one_row_products_run_the_row_kernel(shape):
    """A product of one row (a classifier at batch 1, a decoder step): kernels.cpu.gemv's
    RowProduct, bitwise the GEMM's row of a larger batch; the product after it too."""
    inits = [_t("w", _r(40, 50)), _t("b", _r(50)), _t("w2", _r(50, 70))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["out"]),
        helper.make_node("MatMul", ["out", "w2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["out2"]),
    ]
    m = _model(nodes, [("x", F32, None)], ["out", "out2"], inits)
    x = _r(*shape)
    fast = _both(m, [{"x": x}])
    rows = [nd.fn.row_product() for nd in fast.graph.nodes if nd.op == "Linear"]
    assert len(rows) == 2 and all(r is not None for r in rows) == (gemv.state() is not None)
    big = np.concatenate([x.reshape(1, 40), _r(4, 40)])
    one, many = fast.run({"x": x}), fast.run({"x": big})
    for name in ("out", "out2"):
        np.testing.assert_array_equal(one[name].numpy().reshape(-1), many[name].numpy()[0])


def test_residual_that_broadcasts_and_values_read_twice_stay_right():
    c, o = 5, 7
    inits = [_t("w", _r(o, c, 3, 3, scale=0.3)), _t("b", _r(o)), _t("w2", _r(o, c, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2"], ["z"]),
        helper.make_node("ReduceMean", ["z"], ["zm"], axes=[2, 3], keepdims=1),  # (n, o, 1, 1)
        helper.make_node("Add", ["y", "zm"], ["s"]),  # a residual that broadcasts
        helper.make_node("Relu", ["s"], ["out"]),
        helper.make_node("Conv", ["out", "w2t"], ["y2"]),  # conv output read twice:
        helper.make_node("Relu", ["y2"], ["r2"]),  # by this Relu
        helper.make_node("Sigmoid", ["y2"], ["g2"]),  # and by this Sigmoid
        helper.make_node("Mul", ["r2", "g2"], ["out2"]),
    ]
    inits.append(_t("w2t", _r(o, o, 1, 1)))
    m = _model(nodes, [("x", F32, ["n", c, 6, 7])], ["out", "y", "out2"], inits)
    fast = _both(m, [{"x": _r(n, c, 6, 7)} for n in (1, 3)])
    assert "Relu" in _ops(fast)  # y2 has two readers: its Relu is not fused into the conv


@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 1, 1), (5, 3, 2), (3, 2, 0)])
@pytest.mark.parametrize("ceil", [0, 1])
@pytest.mark.parametrize("where", ["after_conv", "conv_also_output", "input"])
def test_max_pool_of_a_channels_last_conv_output(k, s, p, ceil, where):
    """MaxPool of a fused conv's channels-last result (one FusedConvMaxPool node when the pool
    alone reads the conv: the NHWC kernel called directly from the second call of a shape on),
    of a conv result the graph also returns (two nodes), and of the graph's own NCHW input all
    equal the plain graph."""
    c, o = 3, 37
    pool = helper.make_node("MaxPool", ["x" if where == "input" else "y"], ["out"],
                            kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, ceil_mode=ceil)  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w"], ["y0"], pads=[3, 3, 3, 3], strides=[2, 2]),
             helper.make_node("Relu", ["y0"], ["y"]), pool]  # fmt: skip
    outs = ["out"] if where == "after_conv" else ["out", "y"]
    m = _model(nodes, [("x", F32, ["n", c, 23, 18])], outs, [_t("w", _r(o, c, 7, 7))])
    x = _r(3, c, 23, 18)
    x[0, :, 4, 5] = np.nan  # NaN wins the max, as in the plain graph
    x1 = _r(1, c, 23, 18)
    fast = _both(m, [{"x": x1}, {"x": x}, {"x": x1}, {"x": x}])
    assert ("FusedConvMaxPool" in _ops(fast)) == (
        where == "after_conv" and G.microkernels_available()
    )


def test_conv_max_pool_node_keeps_the_gradient():
    """A FusedConvMaxPool node run with gradients on (the graph's run called directly) gives the
    plain graph's input gradient on every call: the pool op runs, never the kernel on the raw
    conv result (two guards keep it so: the conv's autograd result is NCHW today, and
    ``_ConvMaxPool`` checks requires_grad itself)."""
    c, o = 3, 8
    nodes = [helper.make_node("Conv", ["x", "w"], ["y0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y0"], ["y"]),
             helper.make_node("MaxPool", ["y"], ["out"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])]  # fmt: skip
    data = _model(nodes, [("x", F32, ["n", c, 11, 9])], ["out"], [_t("w", _r(o, c, 3, 3))])
    data = data.SerializeToString()
    x0 = _r(2, c, 11, 9)
    grads = []
    for optimize in (True, False):
        m = ember.onnx.load(data, optimize=optimize)
        for _ in range(3):  # past the node's first calls (geometry, kept jobs)
            x = ember.Tensor(x0.copy(), requires_grad=True)
            with ember.enable_grad():
                (m.graph.run({"x": x})[0] ** 2).sum().backward()
        grads.append(x.grad.numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4)


def test_residual_with_a_view_read_later_is_not_written_over():
    """a's Identity and Reshape (views of it) are read after the conv that adds a: that conv
    does not write over a (onnx._fuse_conv.donate), and the results equal the plain graph."""
    c, o = 6, 40
    inits = [_t("wa", _r(o, c, 1, 1)), _t("wb", _r(o, c, 1, 1)),
             _t("sh", np.array([-1, o], np.int64))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"]),
        helper.make_node("Identity", ["a"], ["v"]),
        helper.make_node("Reshape", ["a", "sh"], ["v2"]),
        helper.make_node("Conv", ["x", "wb"], ["b0"]),
        helper.make_node("Add", ["b0", "a"], ["b"]),
        helper.make_node("Mul", ["b", "v"], ["w"]),
        helper.make_node("ReduceSum", ["v2"], ["u"], keepdims=0),
    ]
    m = _model(nodes, [("x", F32, ["n", c, 9, 7])], ["w", "u"], inits)
    fast = _both(m, [{"x": _r(n, c, 9, 7)} for n in (1, 2)])
    assert not any(getattr(nd.fn, "donate", False) for nd in fast.graph.nodes)


@pytest.mark.parametrize("o", [37, 64])
def test_residual_that_dies_with_its_conv_is_written_over(o, monkeypatch):
    """A residual read last by its fused conv, a fused conv's own output read only by fused
    convs, takes the conv's output (onnx._fuse_conv.donate); one also read later, a graph
    output, or a graph input does not; every call (the second takes the donating path) agrees
    with the plain graph."""
    c, mid = 5, 11
    inits = [_t("wa", _r(o, c, 1, 1)), _t("wb", _r(mid, o, 1, 1, scale=0.3)),
             _t("wc", _r(o, mid, 1, 1, scale=0.3)), _t("bc", _r(o)),
             _t("wd", _r(o, o, 1, 1, scale=0.2)), _t("we", _r(o, o, 1, 1, scale=0.2)),
             _t("wf", _r(o, o, 1, 1, scale=0.2)), _t("wg", _r(o, c, 1, 1))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"]),
        helper.make_node("Relu", ["a"], ["h0"]),
        helper.make_node("Conv", ["h0", "wb"], ["b"]),
        helper.make_node("Relu", ["b"], ["br"]),
        helper.make_node("Conv", ["br", "wc", "bc"], ["cc"]),
        helper.make_node("Add", ["cc", "h0"], ["s1"]),  # h0 dies here: written over
        helper.make_node("Relu", ["s1"], ["h1"]),
        helper.make_node("Conv", ["h1", "wd"], ["d"], strides=[2, 2]),
        helper.make_node("Conv", ["h1", "we"], ["e"], strides=[2, 2]),
        helper.make_node("Add", ["d", "e"], ["h2"]),  # e dies here (strided, a downsample's)
        helper.make_node("Conv", ["h2", "wf"], ["f"]),
        helper.make_node("Add", ["f", "h2"], ["h3"]),  # h2 is read later: kept
        helper.make_node("ReduceMean", ["h2"], ["m2"], axes=[2, 3], keepdims=1),
        helper.make_node("Add", ["h3", "m2"], ["h4"]),
        helper.make_node("Conv", ["x", "wg"], ["g"]),
        helper.make_node("Add", ["g", "r"], ["out"]),  # r is a graph input: kept
    ]
    from ember.kernels.cpu import conv as K

    over, ran = K.fused_conv2d_over_residual, []
    monkeypatch.setattr(K, "fused_conv2d_over_residual",
                        lambda *a, **k: ran.append(over(*a, **k)) or ran[-1])  # fmt: skip
    feeds = [{"x": _r(n, c, 9, 7), "r": _r(n, o, 9, 7)} for n in (2, 2, 3, 3)]
    m = _model(nodes, [("x", F32, ["n", c, 9, 7]), ("r", F32, ["n", o, 9, 7])], ["h4", "out"],
               inits)  # fmt: skip
    fast = _both(m, feeds)
    donated = {nd.outputs[0] for nd in fast.graph.nodes if getattr(nd.fn, "donate", False)}
    assert donated == {"h1", "h2"}
    assert len(ran) == 4 and all(y is not None for y in ran) or not G.microkernels_available()
    r = feeds[0]["r"].copy()
    fast.run(feeds[0])
    np.testing.assert_array_equal(feeds[0]["r"], r)  # a graph input is never written


@needs_gemm
def test_fused_convs_rerun_their_kept_jobs_from_the_third_call(monkeypatch):
    """From a shape's second call a pooled fused conv keeps its job (conv.KeptConv) and reruns
    it: a graph input read as NCHW, padded and strided convs, a donated residual and one that
    is a graph input; every call, after thread-count changes and with the reference kernels
    too, agrees with the plain graph and leaves the inputs as they were."""
    from ember import config
    from ember.kernels.cpu import pool_tasks as PT

    c, o = 48, 96
    inits = [_t("wa", _r(o, c, 1, 1, scale=0.2)), _t("ba", _r(o)),
             _t("wb", _r(o, o, 3, 3, scale=0.05)), _t("wc", _r(o, o, 1, 1, scale=0.1)),
             _t("wd", _r(o, o, 3, 3, scale=0.05)), _t("lo", np.float32(0)),
             _t("hi", np.float32(6))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"]),  # reads the NCHW graph input
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["ar", "wb"], ["b"], pads=[1, 0, 2, 1], strides=[2, 2]),
        helper.make_node("Clip", ["b", "lo", "hi"], ["br"]),
        helper.make_node("Conv", ["br", "wc"], ["e"]),
        helper.make_node("Conv", ["br", "wc"], ["cc"]),
        helper.make_node("Add", ["cc", "e"], ["s1"]),  # e dies here: written over
        helper.make_node("Conv", ["s1", "wd"], ["d"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["d", "r"], ["out"]),  # r: a graph input, never written
    ]
    m = _model(nodes, [("x", F32, ["n", c, 13, 12]), ("r", F32, ["n", o, 7, 6])], ["out"], inits)
    data = m.SerializeToString()
    fast, plain = ember.onnx.load(data), ember.onnx.load(data, optimize=False)
    assert _ops(fast) == ["FusedConv"] * 5
    monkeypatch.setattr(G, "SERIAL_BELOW", 0)  # small products on the pool too
    old = ember.get_num_threads()
    try:
        for threads, n, kernels in [(2, 1, "all")] * 4 + [(1, 1, "all"), (2, 2, "all"),
                                    (2, 2, "all"), (2, 2, "reference"), (2, 2, "all"),
                                    (2, 1, "all"), (1, 1, "all"), (2, 1, "all")]:  # fmt: skip
            ember.set_num_threads(threads)
            monkeypatch.setattr(config, "KERNELS", kernels)
            feeds = {"x": _r(n, c, 13, 12), "r": _r(n, o, 7, 6)}
            before = {k: v.copy() for k, v in feeds.items()}
            got, want = fast.run(feeds)["out"].numpy(), plain.run(feeds)["out"].numpy()
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
            for k, v in feeds.items():
                np.testing.assert_array_equal(v, before[k])
    finally:
        ember.set_num_threads(old)
    kept = [k for nd in fast.graph.nodes for k, _ in nd.fn._seen.values() if k and k[1]]
    assert len(kept) == (10 if PT.state() is not None else 0)  # five convs, two batch sizes
    assert any(k[1].over_res for k in kept) == (PT.state() is not None)


@pytest.mark.parametrize("k,s,pads,bias,o", [(2, 2, [0, 0, 0, 0], True, 7), (3, 3, [0, 0, 0, 0], False, 7),
                                             (2, 1, [0, 0, 0, 0], True, 7), (2, 2, [1, 0, 1, 0], True, 7),
                                             (2, 2, [0, 0, 0, 0], True, 1), (3, 3, [0, 0, 0, 0], False, 1),
                                             (2, 2, [0, 0, 0, 0], False, 3)])  # fmt: skip
@pytest.mark.parametrize("act", ["Relu", "HardSwish"])
def test_conv_transpose_with_kernel_equal_to_stride(k, s, pads, bias, o, act):
    """o 7: the GEMM and depth-to-space copy; o 1 and 3 (kh*kw*o < 16): the direct loop; ReLU
    in the kernels, hard swish after them."""
    c = 5
    inits = [_t("w0", _r(c, 3, 3, 3, scale=0.3)), _t("w", _r(c, o, k, k)), _t("b", _r(o)),
             _t("g", _r(o)), _t("be", _r(o)), _t("mu", _r(o)), _t("v", np.abs(_r(o)) + 0.5),
             _t("sh", _r(1, o, 1, 1))]  # fmt: skip
    ct_in = ["h", "w", "b"] if bias else ["h", "w"]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),  # channels-last input
        helper.make_node("ConvTranspose", ct_in, ["y"], strides=[s, s], pads=pads),
        helper.make_node("Add", ["y", "sh"], ["ya"]),
        helper.make_node("BatchNormalization", ["ya", "g", "be", "mu", "v"], ["bn"]),
        helper.make_node(act, ["bn"], ["out"]),
    ]
    m = _model(nodes, [("x", F32, ["n", 3, 6, 5])], ["out"], inits)
    fast = _both(m, [{"x": _r(n, 3, 6, 5)} for n in (1, 3)])
    fused = k == s and not any(pads) and G.microkernels_available()
    assert ("FusedConvTranspose" in _ops(fast)) == fused, _ops(fast)
    if fused:
        assert _ops(fast) == ["FusedConv", "FusedConvTranspose"]


def test_conv1d_and_channels_last_between_convs():
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("Conv", ["hr", "w2"], ["y"], pads=[1, 1], strides=[2]),
        helper.make_node("Transpose", ["y"], ["out"], perm=[0, 2, 1]),
    ]
    inits = [_t("w1", _r(13, 5, 3)), _t("b1", _r(13)), _t("w2", _r(11, 13, 3))]
    m = _model(nodes, [("x", F32, ["n", 5, 17])], ["out"], inits)
    fast = _both(m, [{"x": _r(n, 5, 17)} for n in (1, 3)])
    if G.microkernels_available():
        assert _ops(fast).count("FusedConv") == 2


# ---- inverted-residual blocks (kernels.cpu.irblock) ----------------------------------------

IR_BLOCKS = [  # c, expand (ce, k: 0 none, 1 a 1x1, 3 a 3x3 stride-2 stem), co, dw k, stride, pads
    (16, (48, 1), 16, 3, 1, {"pads": [1, 1, 1, 1]}),  # MobileNetV2's: residual
    (5, (30, 1), 7, 3, 2, {"pads": [1, 1, 1, 1]}),  # odd channels, narrow project (co <= NR/2)
    (24, (300, 1), 40, 5, 2, {"pads": [2, 1, 2, 1]}),  # Ce > K_BLOCK, two panels, asymmetric
    (32, (32, 0), 16, 3, 1, {"pads": [1, 1, 1, 1]}),  # no expand (MobileNetV2's first block)
    (3, (19, 3), 9, 3, 1, {"pads": [1, 1, 1, 1]}),  # the stem as the expand (NCHW image rows)
    (2, (11, 3), 5, 3, 2, {"pads": [1, 1, 1, 1]}),  # a stem on 2 channels (not RGB's copy)
    (8, (20, 1), 8, 3, 1, {"auto_pad": "SAME_UPPER"}),
    (6, (12, 1), 6, 3, 2, {"auto_pad": "VALID"}),
]


def _ir_block(c, expand, co, k, s, attrs, acts=("Clip6", "Clip6", None), res=True):
    """[Conv (+BN) act] -> depthwise Conv act -> 1x1 Conv [+ x]: an ONNX inverted residual."""
    ce, ek = expand
    inits = [_t("lo", np.float32(0)), _t("hi", np.float32(6))]
    nodes, h, n_ = [], "x", 0

    def act(src, a):
        nonlocal n_
        n_ += 1
        if a is None:
            return src
        out = f"a{n_}"
        ins = [src, "lo", "hi"] if a == "Clip6" else [src]
        nodes.append(helper.make_node("Clip" if a == "Clip6" else a, ins, [out]))
        return out

    if ek:
        inits += [_t("we", _r(ce, c, ek, ek, scale=0.4)), _t("be", _r(ce)), _t("g", _r(ce)),
                  _t("bb", _r(ce)), _t("mu", _r(ce)), _t("v", np.abs(_r(ce)) + 0.5)]  # fmt: skip
        kw = {"strides": [2, 2], "pads": [1, 1, 1, 1]} if ek == 3 else {}
        nodes += [helper.make_node("Conv", ["x", "we", "be"], ["e"], **kw),
                  helper.make_node("BatchNormalization", ["e", "g", "bb", "mu", "v"], ["eb"])]  # fmt: skip
        h = act("eb", acts[0])
    inits += [_t("wd", _r(ce, 1, k, k, scale=0.4)), _t("bd", _r(ce)), _t("wp", _r(co, ce, 1, 1,
              scale=0.3)), _t("bp", _r(co))]  # fmt: skip
    nodes.append(
        helper.make_node("Conv", [h, "wd", "bd"], ["d"], group=ce, strides=[s, s], **attrs)
    )
    d = act("d", acts[1])
    nodes.append(helper.make_node("Conv", [d, "wp", "bp"], ["p"]))
    out = "p"
    if res:
        nodes.append(helper.make_node("Add", ["x", "p"], ["r"]))
        out = "r"
    return act(out, acts[2]), nodes, inits


def _check_ir_block(c, expand, co, k, s, attrs, acts=("Clip6", "Clip6", None), hw=(19, 14)):
    """One block in the optimized and the plain graph at batch 1, 3 and 0."""
    res = s == 1 and co == c and "VALID" not in attrs.values() and expand[1] != 3
    out, nodes, inits = _ir_block(c, expand, co, k, s, attrs, acts, res)
    m = _model(nodes, [("x", F32, ["n", c, *hw])], [out], inits)
    fast = _both(m, [{"x": _r(n, c, *hw)} for n in (1, 3, 0)])
    if G.microkernels_available():
        assert _ops(fast) == ["FusedInvertedResidual"], _ops(fast)
    return fast


@pytest.mark.parametrize("c,expand,co,k,s,attrs", IR_BLOCKS)
@pytest.mark.parametrize("bands", ["default", "thin"])
def test_inverted_residual_block_as_one_node(c, expand, co, k, s, attrs, bands, monkeypatch):
    """thin: one-row bands and sub-bands, so every band boundary and every reuse of the
    expanded rows of the sub-band before is exercised."""
    from ember.kernels.cpu import irblock

    if bands == "thin":
        monkeypatch.setattr(irblock, "MIN_BAND", 1)
        monkeypatch.setattr(irblock, "L2_BUDGET", 1)
    _check_ir_block(c, expand, co, k, s, attrs)


@pytest.mark.parametrize("acts", [("Relu", "Relu", "Relu"), (None, "Clip6", "Relu"),
                                  ("Clip6", None, None)])  # fmt: skip
def test_inverted_residual_block_activations_and_one_thread(acts):
    threads = ember.get_num_threads()
    try:
        for t in (1, 2):
            ember.set_num_threads(t)
            _check_ir_block(16, (40, 1), 16, 3, 1, {"pads": [1, 1, 1, 1]}, acts, hw=(9, 30))
    finally:
        ember.set_num_threads(threads)


SPLIT_BLOCKS = [  # small maps at batch 1: tasks by parts of the expanded channels
    (40, (96, 1), 40, 3, 1, {"pads": [1, 1, 1, 1]}, ("Clip6", "Clip6", None)),  # residual
    (24, (300, 1), 40, 5, 2, {"pads": [2, 1, 2, 1]}, ("Relu", None, "Relu")),  # partial panel
    (17, (70, 1), 33, 3, 1, {"auto_pad": "SAME_UPPER"}, ("Clip6", "Clip6", "Clip6")),
]


@pytest.mark.parametrize("c,expand,co,k,s,attrs,acts", SPLIT_BLOCKS)
@pytest.mark.parametrize("threads", [2, 3])
def test_inverted_residual_block_by_channel_parts(c, expand, co, k, s, attrs, acts, threads):
    """A map of fewer bands than threads: each task one part of the expanded channels, the last
    adding the others' partial products and applying the project's activation (batch 1; batch
    3 runs bands)."""
    from ember.kernels.cpu import irblock

    before = ember.get_num_threads()
    try:
        ember.set_num_threads(threads)
        fast = _check_ir_block(c, expand, co, k, s, attrs, acts, hw=(7, 6))
        if irblock.state() is not None:  # batch 1 split by channels, batch 3 by bands
            parts = sorted(v[0].parts for v in fast.graph.nodes[0].fn._plans.values() if v)
            assert parts == [1, threads], parts
    finally:
        ember.set_num_threads(before)


def test_inverted_residual_scratch_on_cache_lines():
    """The per-thread scratch starts on a 64-byte line (a large np.empty starts 16 bytes into a
    page)."""
    from ember.kernels.cpu import irblock

    for size, dt in ((100, np.float32), (300000, np.float32), (5000, np.float64)):
        a = irblock._grown(f"test_{size}", size, dt)
        assert a.ctypes.data % 64 == 0 and a.size >= size and a.dtype == dt


def test_inverted_residual_gemm_tiles_even():
    """The block's GEMMs tile rows in the fewest tiles of at most MR rows, as even as they go
    (49 rows: 4 x 10 + 9, not 4 x 12 + 1)."""
    from ember.kernels.cpu import irblock

    assert irblock._even_py(49, 12) == 10 and irblock._even_py(96, 12) == 12
    for mr in range(1, 13):
        for rows in range(1, 200):
            h = irblock._even_py(rows, mr)
            tiles = -(-rows // h)
            assert h <= mr and tiles == -(-rows // mr) and rows - (tiles - 1) * h >= h - tiles


def test_inverted_residual_blocks_not_fused_and_replayed():
    """A chain value read twice stays unfused; a residual that broadcasts, or an input of
    another channel count at run time, runs the three convs."""
    out, nodes, inits = _ir_block(8, (16, 1), 8, 3, 1, {"pads": [1, 1, 1, 1]}, res=False)
    nodes.append(helper.make_node("Add", [out, "rb"], ["o1"]))  # a residual that broadcasts
    m = _model(nodes, [("x", F32, ["n", 8, 7, 6]), ("rb", F32, [1, 8, 1, 1])], ["o1"], inits)
    fast = _both(m, [{"x": _r(n, 8, 7, 6), "rb": _r(1, 8, 1, 1)} for n in (1, 2)])
    if G.microkernels_available():
        assert _ops(fast) == ["FusedInvertedResidual"], _ops(fast)
    out, nodes, inits = _ir_block(8, (16, 1), 8, 3, 1, {"pads": [1, 1, 1, 1]}, res=False)
    m = _model(nodes, [("x", F32, ["n", 8, 7, 6])], [out, "a2"], inits)  # the dw's act read
    fast = _both(m, [{"x": _r(n, 8, 7, 6)} for n in (1, 2)])
    assert "FusedInvertedResidual" not in _ops(fast)


HEADS = [  # c, o, act, hw: a 1x1 conv (+BN) [act] -> GlobalAveragePool -> Flatten -> Gemm
    (320, 1280, "Clip6", (7, 7)),  # MobileNetV2's (K over K_BLOCK: two blocks of K)
    (5, 37, "Relu", (11, 13)),  # odd channels, a partial panel, rows past CHUNK_PIXELS
    (9, 7, None, (1, 1)),  # one panel, under NR/2 columns, one pixel
    (40, 70, "Clip6", (3, 40)),
]


def _head(c, o, act, stride=1):
    inits = [_t("w", _r(o, c, 1, 1, scale=0.3)), _t("b", _r(o)), _t("g", _r(o)), _t("bb", _r(o)),
             _t("mu", _r(o)), _t("v", np.abs(_r(o)) + 0.5), _t("lo", np.float32(0)),
             _t("hi", np.float32(6)), _t("fc", _r(11, o)), _t("fb", _r(11))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[stride, stride]),
        helper.make_node("BatchNormalization", ["y", "g", "bb", "mu", "v"], ["a0"]),
    ]
    if act is not None:
        nodes.append(helper.make_node(act[:4], ["a0", "lo", "hi"] if act == "Clip6" else ["a0"],
                                      ["a1"]))  # fmt: skip
    nodes += [helper.make_node("GlobalAveragePool", [nodes[-1].output[0]], ["m"]),
              helper.make_node("Flatten", ["m"], ["f"], axis=1),
              helper.make_node("Gemm", ["f", "fc", "fb"], ["out"], transB=1)]  # fmt: skip
    return nodes, inits


@pytest.mark.parametrize("c,o,act,hw", HEADS)
def test_head_conv_pool_as_one_node(c, o, act, hw):
    """MobileNetV2's head: the 1x1 conv's tasks pool their own columns (batch 1, 3 and 0, 1 and 2
    threads); a strided 1x1 conv runs the two nodes at run time."""
    nodes, inits = _head(c, o, act)
    m = _model(nodes, [("x", F32, ["n", c, *hw])], ["out"], inits)
    threads = ember.get_num_threads()
    try:
        for t in (1, 2):
            ember.set_num_threads(t)
            fast = _both(m, [{"x": _r(n, c, *hw)} for n in (1, 3, 0)])
    finally:
        ember.set_num_threads(threads)
    if G.microkernels_available():
        assert _ops(fast) == ["FusedConvPool", "Linear"], _ops(fast)
    nodes, inits = _head(c, o, act, stride=2)
    m = _model(nodes, [("x", F32, ["n", c, *hw])], ["out"], inits)
    _both(m, [{"x": _r(n, c, *hw)} for n in (1, 2)])


def test_head_not_fused_when_the_conv_output_is_read_elsewhere():
    nodes, inits = _head(6, 10, "Relu")
    m = _model(nodes, [("x", F32, ["n", 6, 5, 4])], ["out", "a1"], inits)
    fast = _both(m, [{"x": _r(2, 6, 5, 4)}])
    assert "FusedConvPool" not in _ops(fast)


def test_inverted_residual_block_avx2_in_a_fresh_process():
    """NR = 16, MR = 6 and 8-lane depthwise kernels (what an AVX2-only CPU runs)."""
    from tests.helpers import run_fresh

    if G.isa() is None:
        pytest.skip("no AVX2 here")
    code = (
        "from ember.kernels.cpu import gemm\n"
        "from tests.onnx import test_optimize as t\n"
        "assert gemm.isa() == 'avx2'\n"
        "for case in t.IR_BLOCKS:\n"
        "    t._check_ir_block(*case)\n"
        "for case in t.SPLIT_BLOCKS:\n"
        "    t.test_inverted_residual_block_by_channel_parts(*case, 2)\n"
        "for case in t.HEADS:\n"
        "    t.test_head_conv_pool_as_one_node(*case)\n"
        "print('ok')\n"
    )
    assert run_fresh(code, {"EMBER_SGEMM_ISA": "avx2"})[-1] == "ok"


# ---- products ----------------------------------------------------------------------------


@needs_gemm
@pytest.mark.parametrize("shape", [(7,), (1, 7), (3, 7), (3, 4, 7), (2, 1, 3, 7)])
def test_matmul_bias_as_packed_linear(shape):
    inits = [_t("w", _r(7, 9)), _t("b", _r(9)), _t("b2", _r(1, 1, 9))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["b", "h"], ["out"]),
        helper.make_node("MatMul", ["x", "w"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["out2"]),  # a bias of higher rank than x
    ]
    m = _model(nodes, [("x", F32, None)], ["out", "out2"], inits)
    fast = _both(m, [{"x": _r(*shape)}])
    assert _ops(fast) == ["Linear"]  # both products of x: one GEMM on the stacked weights


@needs_gemm
@pytest.mark.parametrize("b,lq", [(1, 5), (3, 13)])
def test_qkv_products_of_one_input_as_one_gemm_into_attention(b, lq):
    """Q, K, V projections of one x (K without bias, as Whisper's) become one product whose
    column views go through the reshapes and transposes into the attention op; the products'
    outputs also read elsewhere (a graph output) stay right."""
    h, d = 3, 8
    e = h * d
    inits = [_t("wq", _r(e, e)), _t("bq", _r(e)), _t("wk", _r(e, e)), _t("wv", _r(e, e)),
             _t("bv", _r(e)), _t("shape", np.array([0, 0, h, d], np.int64)),
             _t("c", np.float32(1 / math.sqrt(d)))]  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("Add", ["q0", "bq"], ["q1"]),
        helper.make_node("MatMul", ["x", "wk"], ["k1"]),
        helper.make_node("MatMul", ["x", "wv"], ["v0"]),
        helper.make_node("Add", ["bv", "v0"], ["v1"]),
        helper.make_node("Reshape", ["q1", "shape"], ["q2"]),
        helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k1", "shape"], ["k2"]),
        helper.make_node("Transpose", ["k2"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["v1", "shape"], ["v2"]),
        helper.make_node("Transpose", ["v2"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "c"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["out"]),
    ]
    m = _model(nodes, [("x", F32, None)], ["out", "k1"], inits)
    fast = _both(m, [{"x": _r(b, lq, e)}])
    ops = _ops(fast)
    assert ops.count("Linear") == 1 and "Attention" in ops and "MatMul" not in ops


@needs_gemm
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 7), (1, 7)])
def test_residual_add_in_the_linear_epilogue(shape):
    """MatMul + bias + a run-time residual (either operand order) becomes one Linear node; a
    residual that broadcasts, or of another dtype, replays the nodes."""
    inits = [_t("w", _r(7, 9)), _t("b", _r(9)), _t("w2", _r(9, 9))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Add", ["r", "hb"], ["y"]),  # residual first
        helper.make_node("MatMul", ["y", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "y"], ["out"]),  # no bias, residual second
    ]
    m = _model(nodes, [("x", F32, None), ("r", F32, None)], ["out"], inits)
    lead = shape[:-1]
    feeds = [
        {"x": _r(*shape), "r": _r(*lead, 9)},
        {"x": _r(*shape), "r": _r(9)},  # broadcasts: the replay
        {"x": _r(*shape), "r": _r(*lead, 9)[..., ::-1]},  # not contiguous
    ]
    fast = _both(m, feeds)
    assert _ops(fast) == ["Linear", "Linear"]
    a = fast.run(feeds[0])["out"].numpy()
    x, r = feeds[0]["x"].astype(np.float64), feeds[0]["r"].astype(np.float64)
    w, b, w2 = (numpy_helper.to_array(t).astype(np.float64) for t in inits)
    y = r + (x @ w + b)
    np.testing.assert_allclose(a, y @ w2 + y, rtol=1e-4, atol=1e-4)


@needs_gemm
@pytest.mark.parametrize("trans_b,alpha,beta,c_shape", [(0, 1.0, 1.0, (9,)), (1, 0.5, 2.0, (1, 9)),
                                                        (1, 1.0, 1.0, None), (0, 1.5, 1.0, (3, 9))])  # fmt: skip
def test_gemm_as_packed_linear(trans_b, alpha, beta, c_shape):
    w = _r(9, 7) if trans_b else _r(7, 9)
    inits = [_t("w", w)] + ([_t("c", _r(*c_shape))] if c_shape else [])
    ins = ["x", "w", "c"] if c_shape else ["x", "w"]
    nodes = [helper.make_node("Gemm", ins, ["out"], transB=trans_b, alpha=alpha, beta=beta)]
    m = _model(nodes, [("x", F32, ["n", 7])], ["out"], inits)
    fast = _both(m, [{"x": _r(3, 7)}])
    assert _ops(fast) == (["Gemm"] if c_shape == (3, 9) else ["Linear"])


# ---- attention ---------------------------------------------------------------------------


def _attention_model(mask: str, scale_op: str = "Mul", casts: int = 0):
    d = 8
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"])]  # fmt: skip
    c = 1 / math.sqrt(d) if scale_op == "Mul" else math.sqrt(d)
    inits = [_t("c", np.float32(c))]
    nodes.append(helper.make_node(scale_op, ["s", "c"], ["ss"]))
    inputs = [("q", F32, None), ("k", F32, None), ("v", F32, None)]
    last = "ss"
    if mask != "none":
        nodes.append(helper.make_node("Add", ["m", "ss"], ["sm"]))  # mask first: either order
        inputs.append(("m", F32, None))
        last = "sm"
    nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
    p = "p"
    for i in range(casts):
        nodes.append(helper.make_node("Cast", [p], [f"p{i}"], to=F32))
        p = f"p{i}"
    nodes.append(helper.make_node("MatMul", [p, "v"], ["out"]))
    return _model(nodes, inputs, ["out"], inits)


def _mask(kind: str, b: int, lq: int, s: int) -> np.ndarray:
    if kind == "keys":  # HF's padding mask: 0 kept, finfo.min dropped, (B, 1, Lq, S)
        keep = np.ones((b, s), bool)
        keep[-1, s // 2 :] = False
        m = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)
        return np.ascontiguousarray(np.broadcast_to(m[:, None, None, :], (b, 1, lq, s)))
    if kind == "keys_1e4":  # older exports: (1 - mask) * -10000, (B, 1, 1, S)
        m = np.zeros((b, 1, 1, s), np.float32)
        m[0, ..., -2:] = -10000.0
        return m
    return _r(b, 1, lq, s)  # any additive bias: to the op as it is


@pytest.mark.parametrize("mask", ["none", "keys", "keys_1e4", "bias"])
@pytest.mark.parametrize("b,h,lq,s", [(1, 2, 9, 9), (3, 3, 16, 11), (2, 1, 3, 5)])
def test_attention_pattern_as_one_op(mask, b, h, lq, s):
    d = 8
    m = _attention_model(mask, "Div" if b == 3 else "Mul", casts=2 if h == 3 else 0)
    feeds = {"q": _r(b, h, lq, d), "k": _r(b, h, s, d), "v": _r(b, h, s, d)}
    if mask != "none":
        feeds["m"] = _mask(mask, b, lq, s)
    fast = _both(m, [feeds])
    assert _ops(fast) == ["Transpose", "Attention"]


def _heads_model(h: int, d: int, mask: bool, q_mul: bool, k_target, o_target):
    """Whisper/BERT-style attention over (B, L, H*D) inputs: [Q * c], Reshape to heads,
    Transpose (K to K^T), the attention pattern [+ mask], Transpose and Reshape back."""
    inits = [_t("sq", np.array([0, 0, h, d], np.int64)), _t("sk", np.array(k_target, np.int64)),
             _t("so", np.array(o_target, np.int64)), _t("c", np.float32(1 / math.sqrt(d))),
             _t("qc", np.float32(0.5))]  # fmt: skip
    q = "xq"
    nodes = []
    if q_mul:
        nodes.append(helper.make_node("Mul", ["xq", "qc"], ["xq2"]))
        q = "xq2"
    nodes += [
        helper.make_node("Reshape", [q, "sq"], ["q2"]),
        helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["xk", "sk"], ["k2"]),
        helper.make_node("Transpose", ["k2"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["xv", "sq"], ["v2"]),
        helper.make_node("Transpose", ["v2"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "c"], ["ss"]),
    ]
    inputs = [("xq", F32, None), ("xk", F32, None), ("xv", F32, None)]
    last = "ss"
    if mask:
        nodes.append(helper.make_node("Add", ["ss", "m"], ["sm"]))
        inputs.append(("m", F32, None))
        last = "sm"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
        helper.make_node("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o2", "so"], ["out"]),
    ]
    return _model(nodes, inputs, ["out"], inits)


@pytest.mark.parametrize("mask", ["none", "keys", "bias"])
@pytest.mark.parametrize("q_mul", [False, True])
@pytest.mark.parametrize("b,lq,s", [(1, 9, 9), (3, 16, 11), (2, 3, 5)])
def test_attention_with_head_split_and_merge_as_one_op(mask, q_mul, b, lq, s, monkeypatch):
    """The reshapes and transposes around the attention pattern (and a scalar Mul of Q) go
    into the attention node, which runs the kernel on the (B, L, H*D) values; few queries
    (lq 3) and an additive mask that is not a key mask run the replaced nodes."""
    h, d = 3, 8
    m = _heads_model(h, d, mask != "none", q_mul, [0, -1, h, d], [0, 0, -1])
    feeds = {"xq": _r(b, lq, h * d), "xk": _r(b, s, h * d), "xv": _r(b, s, h * d)}
    if mask != "none":
        feeds["m"] = _mask(mask, b, lq, s)
    calls = []
    kernel = A.attention
    monkeypatch.setattr(A, "attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    fast = _both(m, [feeds])
    assert _ops(fast) == ["Attention"]
    direct = lq >= A.SDPA_MIN_QUERIES and mask != "bias" and bool(A._kernels())
    assert bool(calls) == direct  # the kernel on the (B, L, H*D) values, or the replay


def test_attention_heads_node_called_again_with_other_shapes_and_masks():
    """The heads node keeps its checks for the last shapes and reshape targets and its key mask
    for the last mask: calls with other batch sizes and lengths, and masks that drop keys or
    keep them all, stay exact."""
    h, d = 3, 8
    m = _heads_model(h, d, True, False, [0, -1, h, d], [0, 0, -1])
    feeds = []
    for b, lq in ((2, 9), (2, 9), (1, 12), (2, 9), (2, 9)):
        x = {"xq": _r(b, lq, h * d), "xk": _r(b, lq, h * d), "xv": _r(b, lq, h * d)}
        feeds.append({**x, "m": _mask("keys", b, lq, lq)})
    feeds[1]["m"] = np.zeros_like(feeds[1]["m"])  # keeps every key
    feeds[3]["m"] = np.zeros_like(feeds[3]["m"])
    fast = _both(m, feeds)
    assert _ops(fast) == ["Attention"]


def test_attention_heads_that_do_not_split_the_features_replay():
    """Reshape targets that are not a split of (B, L, H*D) into H heads (K given as (B, 2L,
    H*D/2)), or an output merged into another shape, keep the ONNX semantics."""
    h, d, b, lq = 2, 8, 2, 10
    m = _heads_model(h, d, False, False, [0, -1, h, d], [0, lq * h * d])
    feeds = [
        {"xq": _r(b, lq, h * d), "xk": _r(b, 2 * lq, h * d // 2), "xv": _r(b, lq, h * d)},
        {"xq": _r(b, lq, h * d), "xk": _r(b, lq, h * d), "xv": _r(b, lq, h * d)},
    ]
    fast = _both(m, feeds)
    assert _ops(fast) == ["Attention"]


@pytest.mark.parametrize("mask", ["keys", "bias"])
def test_attention_layers_sharing_one_mask(mask):
    """Two attention patterns reading one mask (a model's layers): the key mask converted once
    serves both, called twice with new masks of the same shape."""
    d, b, h, lq = 8, 2, 2, 9
    nodes, inputs = [], [("q", F32, None), ("k", F32, None), ("v", F32, None), ("m", F32, None)]
    for j, q in enumerate(["q", "o0"]):
        nodes += [
            helper.make_node("Transpose", ["k"], [f"kt{j}"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [q, f"kt{j}"], [f"s{j}"]),
            helper.make_node("Add", [f"s{j}", "m"], [f"sm{j}"]),
            helper.make_node("Softmax", [f"sm{j}"], [f"p{j}"], axis=-1),
            helper.make_node("MatMul", [f"p{j}", "v"], [f"o{j}"]),
        ]
    m = _model(nodes, inputs, ["o1"])
    feeds = [{"q": _r(b, h, lq, d), "k": _r(b, h, lq, d), "v": _r(b, h, lq, d),
              "m": _mask(mask, b, lq, lq)} for _ in range(2)]  # fmt: skip
    feeds[1]["m"] = feeds[1]["m"][::-1].copy()  # another mask of the same shape
    fast = _both(m, feeds)
    assert _ops(fast).count("Attention") == 2


def test_attention_on_other_ranks_and_dtypes_replays_the_nodes():
    m = _model(
        [helper.make_node("MatMul", ["q", "kt"], ["s"]),
         helper.make_node("Softmax", ["s"], ["p"], axis=-1),
         helper.make_node("MatMul", ["p", "v"], ["out"])],
        [("q", F32, None), ("kt", F32, None), ("v", F32, None)], ["out"],
    )  # fmt: skip
    feeds = [{"q": _r(*lead, 5, 4), "kt": _r(*lead, 4, 6), "v": _r(*lead, 6, 3)}
             for lead in [(), (2,), (2, 3)]]  # fmt: skip
    fast = _both(m, feeds)
    assert _ops(fast) == ["Attention"]
    f64 = {k: v.astype(np.float64) for k, v in feeds[2].items()}
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    for vi in m.graph.input:
        vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    _both(m, [f64])


# ---- activations, constants, shape memo ---------------------------------------------------


def _gelu_nodes(x: str, out: str):
    return [
        helper.make_node("Div", [x, "sqrt2"], [x + "_d"]),
        helper.make_node("Erf", [x + "_d"], [x + "_e"]),
        helper.make_node("Add", [x + "_e", "one"], [x + "_a"]),
        helper.make_node("Mul", [x, x + "_a"], [x + "_g"]),
        helper.make_node("Mul", [x + "_g", "half"], [out]),
    ]


def _hardswish_nodes(x: str, out: str):
    return [
        helper.make_node("Add", [x, "three"], [x + "_p"]),
        helper.make_node("Clip", [x + "_p", "zero", "six"], [x + "_c"]),
        helper.make_node("Mul", [x, x + "_c"], [x + "_m"]),
        helper.make_node("Div", [x + "_m", "six"], [out]),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_spelled_out_activations_as_ops(dtype):
    consts = {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5, "three": 3.0, "zero": 0.0, "six": 6.0}
    inits = [_t(k, dtype(v)) for k, v in consts.items()]
    nodes = _gelu_nodes("x", "g") + _hardswish_nodes("x", "hs")
    nodes += [
        helper.make_node("Sigmoid", ["x"], ["sg"]),
        helper.make_node("Mul", ["sg", "x"], ["si"]),
    ]
    nodes += [helper.make_node("HardSigmoid", ["x"], ["hg"], alpha=1 / 6),
              helper.make_node("Mul", ["x", "hg"], ["hs2"])]  # fmt: skip
    t = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    m = _model(nodes, [("x", t, None)], ["g", "hs", "si", "hs2"], inits)
    x = (RNG.standard_normal((3, 5, 7)) * 4).astype(dtype)
    fast = _both(m, [{"x": x}, {"x": x[0]}])
    assert sorted(_ops(fast)) == ["Gelu", "HardSwish", "HardSwish", "Silu"]


def test_pattern_values_read_elsewhere_are_not_fused():
    consts = {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5}
    inits = [_t(k, np.float32(v)) for k, v in consts.items()]
    nodes = _gelu_nodes("x", "g") + [helper.make_node("Neg", ["x_e"], ["n"])]  # erf read twice
    m = _model(nodes, [("x", F32, None)], ["g", "n"], inits)
    fast = _both(m, [{"x": _r(4, 6)}])
    assert "Gelu" not in _ops(fast)


def test_constants_fold_and_shape_subgraphs_follow_the_input_shape():
    nodes = [
        helper.make_node("Constant", [], ["two"], value=_t("v", np.array([2], np.int64))),
        helper.make_node("Mul", ["two", "two"], ["four"]),  # folded at load
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "four", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["out"]),
        helper.make_node("Range", ["zero", "n", "one"], ["ids"]),  # memoized per shape
        helper.make_node("Cast", ["ids"], ["idsf"], to=F32),
    ]
    inits = [_t("zero", np.int64(0)), _t("zero1", np.array([0], np.int64)),
             _t("minus1", np.array([-1], np.int64)), _t("one", np.int64(1))]  # fmt: skip
    m = _model(nodes, [("x", F32, ["n", 8, 3])], ["out", "idsf"], inits)
    feeds = [{"x": _r(n, 8, 3)} for n in (1, 3, 1, 3, 2)]  # shapes alternate: memo keys
    fast = _both(m, feeds)
    assert "Constant" not in _ops(fast) and _ops(fast).count("Mul") == 0


def test_optimize_is_the_default_and_can_be_skipped(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["out"])]
    m = _model(nodes, [("x", F32, ["n", 4])], ["out"], [_t("w", _r(4, 5))])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    assert _ops(ember.onnx.load(p, optimize=False)) == ["MatMul"]
    if G.microkernels_available():
        assert _ops(ember.onnx.load(p)) == ["Linear"]
    assert ember.onnx.load(p).initializers["w"].shape == (4, 5)  # the file's weights, as they are


@needs_gemm
def test_linear_then_gelu_as_one_node_and_not_when_the_product_is_read_twice():
    """MatMul + bias + spelled-out GELU: one Linear node, the GELU written over the product (a
    big product too: the GELU's pool tasks); the product read elsewhere keeps its own node."""
    consts = {"sqrt2": math.sqrt(2), "one": 1.0, "half": 0.5}
    inits = [_t(k, np.float32(v)) for k, v in consts.items()]
    inits += [_t("w", _r(40, 300, scale=0.2)), _t("b", _r(300))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
    ]
    nodes += _gelu_nodes("hb", "g")
    nodes += [helper.make_node("MatMul", ["x", "w"], ["h2"])]
    nodes += _gelu_nodes("h2", "g2") + [helper.make_node("Neg", ["h2"], ["n2"])]
    m = _model(nodes, [("x", F32, None)], ["g", "g2", "n2"], inits)
    x = _r(3, 250, 40)
    fast = _both(m, [{"x": x}, {"x": x[0, :5]}, {"x": x.astype(np.float64)}])
    assert sorted(_ops(fast)) == ["Gelu", "Linear", "Linear", "Neg"]
    w, b = numpy_helper.to_array(inits[3]), numpy_helper.to_array(inits[4])
    h = x.astype(np.float64) @ w + b
    want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    np.testing.assert_allclose(fast.run({"x": x})["g"].numpy(), want, rtol=1e-4, atol=1e-4)


@needs_gemm
def test_big_products_reuse_buffers_nothing_holds(monkeypatch):
    """With every product in the arena: outputs the caller keeps are never written over, and
    values still to be read (x1 below, read by the last Add) are not reused meanwhile."""
    from ember.onnx import _fuse_dense

    monkeypatch.setattr(_fuse_dense, "ARENA_MIN_BYTES", 0)
    inits = [_t("w1", _r(6, 6)), _t("w2", _r(6, 6)), _t("w3", _r(6, 6))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["x1"]),
        helper.make_node("MatMul", ["x1", "w2"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w3"], ["x3"]),
        helper.make_node("Add", ["x3", "x1"], ["out"]),  # x1 read late: a residual in x3's node
        helper.make_node("Relu", ["x3"], ["r"]),
    ]
    m = _model(nodes, [("x", F32, None)], ["out", "r"], inits)
    feeds = [{"x": _r(4, 6)} for _ in range(4)]
    fast = _both(m, feeds)
    kept = [fast.run(f) for f in feeds]  # all kept: later runs must not write into them
    w1, w2, w3 = (numpy_helper.to_array(t).astype(np.float64) for t in inits)
    for f, got in zip(feeds, kept):
        x1 = f["x"].astype(np.float64) @ w1
        x3 = x1 @ w2 @ w3
        np.testing.assert_allclose(got["out"].numpy(), x3 + x1, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["r"].numpy(), np.maximum(x3, 0), rtol=1e-4, atol=1e-4)


# ---- channels-last tails: SE blocks, nearest upsampling into Add and Concat ---------------


@pytest.mark.parametrize("gate", ["HardSigmoid", "Sigmoid"])
@pytest.mark.parametrize("src", ["y", "x"])
def test_squeeze_excite_residual_as_one_pass(gate, src):
    """v + v * gate(conv(mean(v))): one ScaleAdd node (the HardSigmoid folded in) on a conv's
    channels-last v ("y"); on an NCHW graph input ("x") the same node replays the original ops."""
    c = 7 if src == "y" else 3
    inits = [_t("w", _r(7, 3, 3, 3, scale=0.3)), _t("w2", _r(c, c, 1, 1))]
    gate_attrs = {"alpha": 0.3} if gate == "HardSigmoid" else {}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", [src], ["m"]),
        helper.make_node("Conv", ["m", "w2"], ["e"]),
        helper.make_node(gate, ["e"], ["g"], **gate_attrs),
        helper.make_node("Mul", [src, "g"], ["p"]),
        helper.make_node("Add", ["p", src], ["out"]),
    ]
    outs = ["out"] if src == "y" else ["out", "y"]
    m = _model(nodes, [("x", F32, ["n", 3, 9, 11])], outs, inits)
    fast = _both(m, [{"x": _r(n, 3, 9, 11)} for n in (1, 3)], atol=1e-6)
    assert "ScaleAdd" in _ops(fast) and "Add" not in _ops(fast), _ops(fast)
    assert gate not in _ops(fast) if gate == "HardSigmoid" else gate in _ops(fast)


RESIZES = [  # Resize attributes, scales or sizes (None), sizes
    (
        {
            "mode": "nearest",
            "coordinate_transformation_mode": "asymmetric",
            "nearest_mode": "floor",
        },
        [1, 1, 2, 2],
        None,
    ),  # PP-OCR's FPN
    ({"mode": "nearest"}, [1, 1, 3, 1.5], None),  # half_pixel, round_prefer_floor, odd scales
    ({"mode": "nearest", "coordinate_transformation_mode": "align_corners"}, None, [0, 0, 12, 10]),
    ({"mode": "linear"}, [1, 1, 2, 2], None),  # not nearest: the original ops
]


def _resize_inputs(scales, sizes, n, c, h, w):
    if scales is not None:
        return ["", "sc"], [_t("sc", np.array(scales, np.float32))]
    return ["", "", "sz"], [_t("sz", np.array([n, c, *sizes[2:]], np.int64))]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZES)
def test_nearest_resize_then_add_as_one_pass(attrs, scales, sizes):
    """FPN top-down: a + Resize(conv(x')) with both channels-last -> one ResizeAdd node."""
    c, h, w = 6, 4, 5
    oh, ow = (h * 2, w * 2)
    if scales is not None:
        oh, ow = int(h * scales[2]), int(w * scales[3])
    else:
        oh, ow = sizes[2], sizes[3]
    inits = [_t("w", _r(c, 3, 3, 3, scale=0.3)), _t("w2", _r(c, 3, 1, 1))]
    extra, more = _resize_inputs(scales, sizes, 2, c, h, w)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["small"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["z", "w2"], ["big"]),
        helper.make_node("Resize", ["small", *extra], ["up"], **attrs),
        helper.make_node("Add", ["big", "up"], ["out"]),
    ]
    # big is a graph output too: the Add is not its conv's residual
    m = _model(nodes, [("x", F32, [2, 3, h, w]), ("z", F32, [2, 3, oh, ow])], ["out", "big"],
               inits + more)  # fmt: skip
    fast = _both(m, [{"x": _r(2, 3, h, w), "z": _r(2, 3, oh, ow)}], atol=1e-6)
    assert "ResizeAdd" in _ops(fast), _ops(fast)


@pytest.mark.parametrize("attrs,scales,sizes", RESIZES)
def test_resizes_into_a_channel_concat_and_resize_read_twice(attrs, scales, sizes):
    """Concat(Resize(a), b, Resize(c)) -> one ResizeConcat; a Resize also read elsewhere stays
    a node (the op's own NHWC gather), its Concat the plain NHWC copy."""
    h, w = 4, 5
    if scales is not None:
        oh, ow = int(h * scales[2]), int(w * scales[3])
    else:
        oh, ow = sizes[2], sizes[3]
    inits = [_t("w1", _r(5, 3, 3, 3, scale=0.3)), _t("w2", _r(4, 3, 1, 1)),
             _t("w3", _r(3, 3, 1, 1))]  # fmt: skip
    ex1, more1 = _resize_inputs(scales, sizes, 2, 5, h, w)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["z", "w2"], ["b"]),
        helper.make_node("Conv", ["x", "w3"], ["c"]),
        helper.make_node("Resize", ["a", *ex1], ["ua"], **attrs),
        helper.make_node("Resize", ["c", *ex1], ["uc"], **attrs),
        helper.make_node("Concat", ["ua", "b", "uc"], ["out"], axis=1),
        helper.make_node("Concat", ["ua", "b"], ["out2"], axis=-3),  # ua read twice
    ]
    m = _model(nodes, [("x", F32, [2, 3, h, w]), ("z", F32, [2, 3, oh, ow])], ["out", "out2"],
               inits + more1)  # fmt: skip
    fast = _both(m, [{"x": _r(2, 3, h, w), "z": _r(2, 3, oh, ow)}], atol=1e-6)
    assert _ops(fast).count("Resize") == 1 and "ResizeConcat" in _ops(fast), _ops(fast)


def test_resize_and_concat_of_nchw_inputs_stay_right():
    """Graph inputs (NCHW) through the fused nodes' fallbacks and the ops' plain paths."""
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
             "nearest_mode": "floor"}  # fmt: skip
    nodes = [
        helper.make_node("Resize", ["x", "", "sc"], ["u"], **attrs),
        helper.make_node("Add", ["z", "u"], ["s"]),
        helper.make_node("Resize", ["x", "", "sc"], ["u2"], **attrs),
        helper.make_node("Concat", ["u2", "z"], ["out"], axis=1),
    ]
    inits = [_t("sc", np.array([1, 1, 2, 2], np.float32))]
    m = _model(nodes, [("x", F32, [1, 3, 4, 5]), ("z", F32, [1, 3, 8, 10])], ["s", "out"], inits)
    fast = _both(m, [{"x": _r(1, 3, 4, 5), "z": _r(1, 3, 8, 10)}], atol=0)
    assert "ResizeAdd" in _ops(fast) and "ResizeConcat" in _ops(fast)


@pytest.mark.parametrize("o", [1, 7])
def test_sigmoid_after_conv_transpose_is_fused(o):
    """PP-OCR's head: ConvTranspose (+ BN) then Sigmoid, one node (direct loop and GEMM)."""
    c = 5
    inits = [_t("w0", _r(c, 3, 3, 3, scale=0.3)), _t("w", _r(c, o, 2, 2, scale=3.0)),
             _t("b", _r(o))]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("ConvTranspose", ["h", "w", "b"], ["y"], strides=[2, 2]),
        helper.make_node("Sigmoid", ["y"], ["out"]),
    ]
    m = _model(nodes, [("x", F32, ["n", 3, 6, 5])], ["out"], inits)
    fast = _both(m, [{"x": _r(n, 3, 6, 5)} for n in (1, 2)], atol=1e-5)  # fast-math sums
    if G.microkernels_available():
        assert _ops(fast) == ["FusedConv", "FusedConvTranspose"], _ops(fast)


def test_float32_sigmoid_keeps_layout_limits_and_values():
    """The Sigmoid op's float32 path (numpy passes): +-inf and large values, a channels-last
    input keeps its layout, 0-d input; against float64."""
    x = np.array([[-np.inf, -1e4, -88.8, -3.0, 0.0, 2.5, 90.0, np.inf]], np.float32)
    m = _model([helper.make_node("Sigmoid", ["x"], ["y"])], [("x", F32, [1, 8])], ["y"])
    got = ember.onnx.load(m.SerializeToString()).run({"x": x})["y"].numpy()
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-37)  # float32 exp overflows at 88.7
    from ember.onnx._ops_math import _sigmoid

    cl = _r(2, 5, 4, 3).transpose(0, 3, 1, 2)  # (2, 3, 5, 4) channels-last
    y = _sigmoid(None, ember.from_numpy(cl))._data
    assert y.transpose(0, 2, 3, 1).flags.c_contiguous
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-cl.astype(np.float64))), rtol=1e-6)
    s = _sigmoid(None, ember.from_numpy(np.array(0.5, np.float32)))
    assert s.shape == () and abs(float(s.numpy()) - 1 / (1 + math.exp(-0.5))) < 1e-7
