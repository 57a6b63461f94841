"""ONNX that real tools emit imports, and ONNX that breaks the format is refused in one
line naming the tensor or opset (#13, group 4)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from unity_cli.cli import cli
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


def _dim(value=None, param=None):
    d = onnx.TensorShapeProto.Dimension()
    if value is not None:
        d.dim_value = value
    if param is not None:
        d.dim_param = param
    return d


@pytest.mark.parametrize("dims, words", [
    ([4, 0], ["dim 1 is 0 (an empty tensor)"]),
    ([0, 8], ["dim 0 is 0 (an empty tensor)"]),            # not taken for a symbolic batch of 32
    ([4, -3], ["dim 1 is -3, which no tensor has"]),
    ([4, None], ["dim 1 is unknown (neither a size nor a name)"]),
    ([4, "width"], ["dim 1 is symbolic ('width')", "--input x="]),
])
def test_an_odd_dim_is_named_for_what_it_is(tmp_path, dims, words):
    x = _vi("x", [2, 8])
    del x.type.tensor_type.shape.dim[:]
    x.type.tensor_type.shape.dim.extend(_dim(param=d) if isinstance(d, str) else _dim(d) for d in dims)
    path = tmp_path / "odd.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [_vi("y", [2, 8])]), path)
    with pytest.raises(ModelError) as e:
        import_model(path, ImportOptions())
    msg = str(e.value)
    assert str(path) in msg and "input 'x'" in msg and all(w in msg for w in words), msg


def _baked(tmp_path, batch="fixed"):
    """x[2, 8] -> Reshape to a baked [2, 2, 4] -> y: only the exported shape fits."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [3], [2, 2, 4])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], name="baked")
    x = _vi("x", [2 if batch == "fixed" else "N", 8])
    path = tmp_path / "baked.onnx"
    onnx.save(_model([node], [x], [_vi("y", [2, 2, 4])], inits=[shape]), path)
    return path


@pytest.mark.parametrize("options, culprit", [
    (ImportOptions(input_shapes={"x": (4, 8)}), "--input x=4,8 changes input 'x' from its exported [2, 8] to [4, 8]"),
    (ImportOptions(batch_size=4), "--batch-size 4 changes input 'x' from its exported [2, 8] to [4, 8]"),
])
def test_a_shape_that_breaks_a_baked_reshape_blames_the_option(tmp_path, options, culprit):
    path = _baked(tmp_path)
    with pytest.raises(ModelError) as e:
        import_model(path, options)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {culprit}, which shapes baked into the model do not follow"), msg
    assert "node 'baked' (Reshape)" in msg and "\n" not in msg
    assert import_model(path, ImportOptions(input_shapes={"x": (2, 8)})).inputs["x"].dims == (2, 8)


def test_a_symbolic_batch_set_by_the_user_is_not_blamed(tmp_path):
    """Only an exported concrete dim the user changed is blamed; a symbolic one is theirs to set."""
    path = _baked(tmp_path, batch="symbolic")
    with pytest.raises(ModelError) as e:
        import_model(path, ImportOptions(batch_size=4))
    assert "changes input" not in str(e.value) and "node 'baked' (Reshape)" in str(e.value)


def test_the_opset_read_is_recorded_and_shown(tmp_path):
    path = tmp_path / "old.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])], opset=9),
              path)
    assert import_model(path, ImportOptions()).opset == 9
    r = CliRunner().invoke(cli, ["optimize", str(path), "--cluster", "local-cpu", "--out", str(tmp_path / "p.json"),
                                 "--max-candidates", "2"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith(f"model    {path}  (opset 9; ")


def test_an_input_without_a_shape_takes_the_one_given(tmp_path):
    """Nothing exported to compare with: --input is the shape, and nothing is blamed."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    path = tmp_path / "shapeless.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [_vi("y", [2, 3])]), path)
    assert import_model(path, ImportOptions(input_shapes={"x": (2, 3)})).inputs["x"].dims == (2, 3)
