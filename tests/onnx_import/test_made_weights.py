"""Tensors made at import from constants (``ConstantOfShape``, ``Expand``, ``Cast``): a
weight where an op reads them as its parameter, a constant anywhere else, and never a
trainable tensor without a value. Ops whose output shape depends on run-time values are
refused in one line that names the node."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unity_cli.errors import UnsupportedOpError
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.backend import UnityBackend


def _save(tmp_path, nodes, inits, inputs, outputs, name="m.onnx"):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    path = tmp_path / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _fill(name: str, dims, value: float) -> list:
    shape = numpy_helper.from_array(np.array(dims, np.int64), f"{name}_shape")
    node = helper.make_node("ConstantOfShape", [shape.name], [name],
                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [value]))
    return [shape, node]


def test_a_fill_read_as_a_parameter_is_a_weight_and_elsewhere_a_constant(tmp_path):
    w_shape, w = _fill("w", [6, 4], 0.5)             # MatMul's B: a parameter
    z_shape, z = _fill("z", [3, 4], 0.0)             # added to the output: a constant (T5's zero bias)
    e_src = numpy_helper.from_array(np.arange(4, dtype=np.int64).reshape(1, 4), "row")
    e_dims = numpy_helper.from_array(np.array([3, 4], np.int64), "e_dims")
    nodes = [w, z, helper.make_node("Expand", ["row", "e_dims"], ["e_int"]),
             helper.make_node("Cast", ["e_int"], ["e"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Add", ["y0", "z"], ["y1"]),
             helper.make_node("Mul", ["y1", "e"], ["y"])]
    path = _save(tmp_path, nodes, [w_shape, z_shape, e_src, e_dims],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    imported = import_model(path, ImportOptions(3))
    assert imported.weights == ["w"] and set(imported.weight_values) == {"w"}
    np.testing.assert_array_equal(imported.weight_values["w"], np.full((6, 4), 0.5, np.float32))
    assert set(imported.constants) >= {"z", "e"} and "z" not in imported.weight_values
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    (got,) = UnityBackend.prepare(onnx.load(str(path))).run([x])
    np.testing.assert_allclose(got, (x @ np.full((6, 4), 0.5)) * np.arange(4), rtol=1e-5)


def test_a_huge_fill_costs_no_memory_at_import(tmp_path):
    w_shape, w = _fill("w", [20000, 10000], 0.01)     # 200M floats: 800 MB if materialized
    nodes = [w, helper.make_node("Gemm", ["x", "w"], ["y"])]
    path = _save(tmp_path, nodes, [w_shape], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 20000])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10000])])
    imported = import_model(path, ImportOptions(2))
    v = imported.weight_values["w"]
    assert v.shape == (20000, 10000) and v.strides == (0, 0)
    assert imported.weights == ["w"]


def test_a_cast_of_a_filled_parameter_keeps_its_value(tmp_path):
    w_shape, w = _fill("w64", [5, 2], 2.0)
    nodes = [w, helper.make_node("Cast", ["w64"], ["w"], to=TensorProto.DOUBLE),
             helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w32"], ["y"])]
    path = _save(tmp_path, nodes, [w_shape], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    imported = import_model(path, ImportOptions(1))
    assert imported.weights == ["w32"]
    np.testing.assert_array_equal(imported.weight_values["w32"], np.full((5, 2), 2.0, np.float32))


@pytest.mark.parametrize("op", ["NonZero", "Unique"])
def test_data_dependent_shapes_are_refused_naming_the_node(tmp_path, op):
    nodes = [helper.make_node(op, ["x"], ["y"], name="router_pick")]
    path = _save(tmp_path, nodes, [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                 [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    with pytest.raises(UnsupportedOpError) as e:
        import_model(path, ImportOptions(4))
    msg = str(e.value)
    assert "router_pick" in msg and op in msg and "depends on the values" in msg and "\n" not in msg


def test_nonzero_of_a_constant_folds(tmp_path):
    c = numpy_helper.from_array(np.array([0, 3, 0, 5], np.int64), "c")
    nodes = [helper.make_node("NonZero", ["c"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "nzf"], ["y"])]
    path = _save(tmp_path, nodes, [c], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    imported = import_model(path, ImportOptions(1))
    assert imported.pcg.shape(imported.pcg.outputs[0]).logical.dims == (1, 2)
