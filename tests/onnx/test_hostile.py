"""Malformed and hostile ONNX files: a FormatError, never a crash, a hang or a read outside the folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import ember.onnx  # noqa: E402
from ember.errors import FormatError, ShapeError, UnsupportedError  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape=(2, 3)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _small():
    w = helper.make_tensor(
        "w", TensorProto.FLOAT, [3, 4], np.arange(12, dtype=np.float32).tobytes(), raw=True
    )
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return _model(nodes, [_vi("x")], [_vi("y", (2, 4))], [w])


def test_small_model_runs():
    m = ember.onnx.load(_small().SerializeToString())
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(
        m(x).numpy(), np.maximum(x @ np.arange(12.0).reshape(3, 4), 0), rtol=1e-6
    )


@pytest.mark.parametrize("data", [b"", b"\x00", b"not an onnx file at all", bytes(range(256)) * 4])
def test_garbage_bytes(data):
    with pytest.raises(FormatError):
        ember.onnx.load(data)


def test_every_truncation_is_a_format_error_or_a_valid_model():
    data = _small().SerializeToString()
    for n in range(len(data)):
        try:
            ember.onnx.load(data[:n])
        except FormatError:
            continue


def test_random_byte_flips_never_crash():
    data = bytearray(_small().SerializeToString())
    rng = np.random.default_rng(0)
    x = np.ones((2, 3), np.float32)
    for _ in range(300):
        b = bytearray(data)
        for i in rng.integers(0, len(b), 3):
            b[i] = int(rng.integers(0, 256))
        try:
            m = ember.onnx.load(bytes(b))
            m.run({k: x for k in m.input_names})
        except (FormatError, UnsupportedError, ShapeError):
            pass


def test_missing_file_and_wrong_type(tmp_path):
    with pytest.raises(FormatError):
        ember.onnx.load(tmp_path / "nope.onnx")
    with pytest.raises(TypeError):
        ember.onnx.load(3)


@pytest.mark.parametrize("dims", [[1 << 40, 1 << 40], [-1, 3], [1 << 62]])
def test_absurd_dims_are_refused_before_reading(dims):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims, raw_data=b"\x00" * 16)
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")], [t])
    with pytest.raises(FormatError):
        ember.onnx.load(m.SerializeToString())


def test_data_shorter_than_dims():
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1000], raw_data=b"\x00" * 12)
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")], [t])
    with pytest.raises(FormatError, match="raw_data"):
        ember.onnx.load(m.SerializeToString())
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10], float_data=[1.0, 2.0])
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x")], [_vi("y")], [t])
    with pytest.raises(FormatError):
        ember.onnx.load(m.SerializeToString())


def _external_model(location, offset=0, length=48):
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3, 4])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x")], [_vi("y", (2, 4))], [t]
    )


def _save(tmp_path, model, name="m.onnx"):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_bytes(model.SerializeToString())
    return p


def test_external_data_inside_the_folder_loads(tmp_path):
    p = _save(tmp_path, _external_model("w.bin", offset=8))
    w = np.arange(12, dtype=np.float32)
    (p.parent / "w.bin").write_bytes(b"\x00" * 8 + w.tobytes())
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(ember.onnx.load(p)(x).numpy(), x @ w.reshape(3, 4))


@pytest.mark.parametrize("loc", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin", ""])
def test_external_data_escaping_the_folder(tmp_path, loc):
    (tmp_path / "secret.bin").write_bytes(b"\x01" * 64)
    p = _save(tmp_path, _external_model(loc))
    with pytest.raises(FormatError):
        ember.onnx.load(p)


def test_external_data_symlink_out_of_the_folder(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\x01" * 64)
    p = _save(tmp_path, _external_model("link.bin"))
    os.symlink(tmp_path / "secret.bin", p.parent / "link.bin")
    with pytest.raises(FormatError, match="escapes"):
        ember.onnx.load(p)


@pytest.mark.parametrize(("offset", "length"), [(40, 48), (0, 40), (-8, 48), (1 << 60, 48)])
def test_external_data_out_of_the_file(tmp_path, offset, length):
    p = _save(tmp_path, _external_model("w.bin", offset, length))
    (p.parent / "w.bin").write_bytes(b"\x00" * 64)
    with pytest.raises(FormatError):
        ember.onnx.load(p)


def test_external_data_from_bytes_is_refused(tmp_path):
    with pytest.raises(FormatError, match="path"):
        ember.onnx.load(_external_model("w.bin").SerializeToString())


def test_cyclic_graphs():
    nodes = [helper.make_node("Add", ["x", "z"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    with pytest.raises(FormatError, match="cycle"):
        ember.onnx.load(_model(nodes, [_vi("x")], [_vi("z")]).SerializeToString())
    self_loop = [helper.make_node("Add", ["x", "y"], ["y"])]
    with pytest.raises(FormatError):
        ember.onnx.load(_model(self_loop, [_vi("x")], [_vi("y")]).SerializeToString())


def test_dangling_and_duplicate_names():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"])]
    with pytest.raises(FormatError, match="ghost"):
        ember.onnx.load(_model(nodes, [_vi("x")], [_vi("y")]).SerializeToString())
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["y"])]
    with pytest.raises(FormatError, match="twice"):
        ember.onnx.load(_model(nodes, [_vi("x")], [_vi("y")]).SerializeToString())
    with pytest.raises(FormatError, match="never produced"):
        ember.onnx.load(
            _model(
                [helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("q")]
            ).SerializeToString()
        )


def _field(num: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2)."""
    key, n, size = (num << 3) | 2, len(payload), b""
    while True:
        size += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            break
    return bytes([key]) + size + payload


def test_deeply_nested_subgraphs():
    # If nodes nested 2000 deep, encoded by hand (onnx.helper itself refuses the depth)
    graph = _field(1, _field(1, b"x") + _field(2, b"y") + _field(4, b"Identity"))
    for _ in range(2000):
        attr = _field(1, b"then_branch") + _field(6, graph) + bytes([0xA0, 0x01, 5])
        graph = _field(1, _field(1, b"c") + _field(2, b"y") + _field(4, b"If") + _field(5, attr))
    model = bytes([0x08, 8]) + _field(7, graph) + _field(8, bytes([0x10, 17]))
    with pytest.raises(FormatError):
        ember.onnx.load(model)


def test_opsets_and_domains():
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    for bad in (6, 10_000):
        with pytest.raises(UnsupportedError, match="opset"):
            ember.onnx.load(_model(relu, [_vi("x")], [_vi("y")], opset=bad).SerializeToString())
    m = _model(relu, [_vi("x")], [_vi("y")])
    del m.opset_import[:]
    with pytest.raises(FormatError, match="opset"):
        ember.onnx.load(m.SerializeToString())
    custom = [helper.make_node("Relu", ["x"], ["y"], domain="com.example")]
    with pytest.raises(UnsupportedError, match="domain"):
        ember.onnx.load(_model(custom, [_vi("x")], [_vi("y")]).SerializeToString())
    with pytest.raises(UnsupportedError, match="NotAnOp"):
        ember.onnx.load(
            _model(
                [helper.make_node("NotAnOp", ["x"], ["y"])], [_vi("x")], [_vi("y")]
            ).SerializeToString()
        )


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Tile", "Range"])
def test_absurd_runtime_shapes_raise(op):
    big = helper.make_tensor("s", TensorProto.INT64, [2], [1 << 20, 1 << 20])
    if op == "ConstantOfShape":
        node, ins = helper.make_node(op, ["s"], ["y"]), []
    elif op == "Expand":
        node, ins = helper.make_node(op, ["x", "s"], ["y"]), [_vi("x", (1, 1))]
    elif op == "Tile":
        node, ins = helper.make_node(op, ["x", "s"], ["y"]), [_vi("x", (1, 1))]
    else:
        big = helper.make_tensor("s", TensorProto.INT64, [], [1 << 40])
        z = helper.make_tensor("z", TensorProto.INT64, [], [0])
        o = helper.make_tensor("o", TensorProto.INT64, [], [1])
        m = _model(
            [helper.make_node(op, ["z", "s", "o"], ["y"])], [], [_vi("y", None)], [big, z, o]
        )
        with pytest.raises(ShapeError):
            ember.onnx.load(m.SerializeToString()).run({})
        return
    m = _model([node], ins, [_vi("y", None)], [big])
    mod = ember.onnx.load(m.SerializeToString())
    with pytest.raises(ShapeError):
        mod.run({n: np.ones((1, 1), np.float32) for n in mod.input_names})
