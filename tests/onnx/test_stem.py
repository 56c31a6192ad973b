"""A ResNet-style stem (7x7 stride-2 conv to 64 channels, BatchNormalization, ReLU, 3x3 stride-2
MaxPool) as one FusedConvMaxPool node on kernels.cpu.stem: the optimized graph equals the plain
one on awkward image sizes, batches and paddings, NaN included; the kernel runs where it applies
(its plan made from a shape's second call on) and the conv + pool where it does not."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import ember  # noqa: E402
import ember.onnx  # noqa: E402
from ember.kernels.cpu import stem as S  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(3)
F32 = TensorProto.FLOAT


def _t(name: str, a) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a), name)


def _r(*shape, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _stem_model(c: int, o: int, pads, pool_pads, act: str | None = "Relu", strides=(2, 2)):
    """Conv, BatchNormalization, act (None: none), MaxPool 3x3 stride 2."""
    inits = [_t("w", _r(o, c, 7, 7, scale=0.2)), _t("g", _r(o) + 2), _t("be", _r(o)),
             _t("mu", _r(o)), _t("var", np.abs(_r(o)) + 0.5)]  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y0"], pads=list(pads), strides=list(strides)),
        helper.make_node("BatchNormalization", ["y0", "g", "be", "mu", "var"], ["y1"]),
    ]
    if act:
        nodes.append(helper.make_node(act, ["y1"], ["y"]))
    nodes.append(
        helper.make_node(
            "MaxPool",
            ["y" if act else "y1"],
            ["out"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=list(pool_pads),
        )
    )
    g = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", F32, None)],
                          [helper.make_tensor_value_info("out", F32, None)], initializer=inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _node(m):
    (nd,) = [n for n in m.graph.nodes if n.op == "FusedConvMaxPool"]
    return nd.fn


def _compare(data, xs, threads):
    fast, plain = ember.onnx.load(data), ember.onnx.load(data, optimize=False)
    old = ember.get_num_threads()
    ember.set_num_threads(threads)
    try:
        for x in xs:
            want = plain.run({"x": x})["out"].numpy()
            for _ in range(3):  # the first call learns the pool's geometry, the second plans
                got = fast.run({"x": x})["out"].numpy()
                assert got.shape == want.shape
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                ok = ~np.isnan(want)
                scale = max(1.0, float(np.abs(want[ok]).max()))
                np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * scale)
    finally:
        ember.set_num_threads(old)
    return _node(fast)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "hw,pads,pool_pads",
    [((224, 224), (3, 3, 3, 3), (1, 1, 1, 1)), ((37, 41), (3, 1, 2, 3), (1, 1, 1, 1)),
     ((30, 23), (0, 3, 3, 0), (0, 0, 0, 0)), ((9, 13), (3, 3, 3, 3), (1, 1, 1, 1))],
)  # fmt: skip
def test_stem_node_equals_the_plain_graph(hw, pads, pool_pads, threads):
    data = _stem_model(3, 64, pads, pool_pads)
    xs = [_r(1, 3, *hw), _r(3, 3, *hw)]
    xs[1][2, 1, hw[0] // 2, hw[1] // 3] = np.nan  # NaN wins the pool, as in the plain graph
    run = _compare(data, xs, threads)
    plans = [p for p in run._stems.values() if p is not None]
    assert plans and all(bool(p) == (S.state() is not None) for p in plans)


@pytest.mark.parametrize("act", ["Relu", None, "Sigmoid"])
def test_stem_node_without_the_kernel_still_equals_the_plain_graph(act):
    """37 output channels, a conv with no activation (the kernel's pool compares ReLU'd bits),
    or an activation the kernel has not (Sigmoid stays its own node, so there is no fused
    conv + pool node): the conv and the pool run as before."""
    data = _stem_model(3, 37 if act == "Relu" else 64, (3, 3, 3, 3), (1, 1, 1, 1), act)
    if act == "Sigmoid":
        m = ember.onnx.load(data)
        assert not [n for n in m.graph.nodes if n.op == "FusedConvMaxPool"]
    else:
        run = _compare(data, [_r(2, 3, 33, 35)], 2)
        assert not any(run._stems.values())


def test_stem_node_with_a_strided_input_copies_nothing_wrong():
    """A non-contiguous image (a slice) takes the conv + pool path and still agrees."""
    data = _stem_model(3, 64, (3, 3, 3, 3), (1, 1, 1, 1))
    big = _r(2, 3, 40, 48)
    x = big[:, :, :, ::2]
    fast, plain = ember.onnx.load(data), ember.onnx.load(data, optimize=False)
    want = plain.run({"x": np.ascontiguousarray(x)})["out"].numpy()
    for _ in range(3):
        got = fast.run({"x": x})["out"].numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
