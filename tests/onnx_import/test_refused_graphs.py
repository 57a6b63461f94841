"""ONNX that real tools emit imports, and ONNX that breaks the format is refused in one
line naming the tensor or opset (#13, group 4)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from unity_cli.errors import ModelError
from unity_cli.onnx_import import ImportOptions, import_model


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


W = helper.make_tensor("w", TensorProto.FLOAT, [8, 2], np.linspace(-1, 1, 16).tolist())


def test_a_model_with_local_functions_imports_as_onnxruntime_runs_it(tmp_path):
    """Dynamo exports wrap modules in local functions; they are inlined on import."""
    f = helper.make_function("local", "double_relu", ["a"], ["b"],
                             [helper.make_node("Relu", ["a"], ["t"]), helper.make_node("Add", ["t", "t"], ["b"])],
                             [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("double_relu", ["x"], ["h"], domain="local"),
                           helper.make_node("MatMul", ["h", "w"], ["y"])], "g", [_vi("x", [4, 8])],
                          [_vi("y", [4, 2])], [W])
    m = helper.make_model(g, functions=[f],
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    onnx.checker.check_model(m)
    path = tmp_path / "func.onnx"
    onnx.save(m, path)
    pcg = import_model(path, ImportOptions()).pcg
    assert {"Unary", "Binary", "MatMul"} <= {n.kind for _, n in pcg}
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(want, (2 * np.maximum(x, 0)) @ np.linspace(-1, 1, 16).reshape(8, 2), rtol=1e-5)


def _model(nodes, inputs, outputs, opset=17, inits=()):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("case, words", [
    ("two_writers", ["tensor 'h'", "written by node 'a' (Relu)", "node 'b' (Sigmoid)"]),
    ("writes_an_input", ["tensor 'x'", "a graph input"]),
    ("duplicate_input", ["graph input 'x' is declared twice"]),
    ("duplicate_output", ["graph output 'y' is declared twice"]),
    ("opset_99", ["opset 99 is newer than the installed onnx defines"]),
])
def test_a_broken_graph_is_refused_naming_the_tensor(tmp_path, case, words):
    relu = helper.make_node("Relu", ["x"], ["h"], name="a")
    out = helper.make_node("Relu", ["h"], ["y"], name="c")
    models = {
        "two_writers": _model([relu, helper.make_node("Sigmoid", ["x"], ["h"], name="b"), out],
                              [_vi("x", [2, 3])], [_vi("y", [2, 3])]),
        "writes_an_input": _model([helper.make_node("Relu", ["y0"], ["x"], name="a"), out],
                                  [_vi("x", [2, 3]), _vi("y0", [2, 3])], [_vi("y", [2, 3])]),
        "duplicate_input": _model([relu, out], [_vi("x", [2, 3]), _vi("x", [2, 3])], [_vi("y", [2, 3])]),
        "duplicate_output": _model([relu, out], [_vi("x", [2, 3])], [_vi("y", [2, 3]), _vi("y", [2, 3])]),
        "opset_99": _model([relu, out], [_vi("x", [2, 3])], [_vi("y", [2, 3])], opset=99),
    }
    path = tmp_path / f"{case}.onnx"
    onnx.save(models[case], path)
    with pytest.raises(ModelError) as e:
        import_model(path, ImportOptions())
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg and all(w in msg for w in words), msg
