"""A reshape of a reshape is read as one, and a reshape to its input's own shape as none
(``ir/simplify.merge_reshapes``, run at import): the imported model computes what
onnxruntime computes on the original file, a tensor keeps the splits the chain lost, and
every real export that has such chains still computes what it did."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models.catalog import EXPORTED_DIR
from onnx import TensorProto, helper, numpy_helper

from unity_cli.ir.opspec import OpKind
from unity_cli.ir.simplify import merge_reshapes
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.model_io import weight_values
from unity_cli.substitutions.semantics import evaluate

B, S, D = 4, 3, 8


def _chain_model(path: Path, also_read: bool = False) -> Path:
    """``[B, S, D] -> [B*S, D]`` (a layer over tokens) ``-> [B, S, D]`` then a reshape to the
    same shape, a softmax over the tokens; ``also_read``: the middle shape is a second output."""
    shape = {n: numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("flat", [-1, D]), ("back", [B, S, D]), ("same", [B, S, D]))}
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((D, D)).astype(np.float32), "w")
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"]), helper.make_node("Reshape", ["f", "back"], ["r"]),
             helper.make_node("Reshape", ["r", "same"], ["q"]), helper.make_node("MatMul", ["q", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["y"], axis=1)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, D])]
    if also_read:
        outs.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, [B * S, D]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])], outs,
                          [w, *shape.values()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _same_as_onnxruntime(path: Path, imported) -> None:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        dims = imported.inputs[i.name].dims
        feeds[i.name] = rng.integers(0, 2, dims).astype(np.int64) if "int" in i.type else \
            rng.standard_normal(dims).astype(np.float32)
    w = weight_values(path, imported, [imported.pcg], seed=0)
    got = evaluate(imported.pcg, {**feeds, **w.trainable, **w.constants})
    for g, e in zip(got, session.run(None, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)


def _reshapes(pcg) -> list:
    return [n for _, n in pcg if n.kind == OpKind.Reshape]


def test_a_chain_that_comes_back_is_read_as_nothing(tmp_path):
    path = _chain_model(tmp_path / "chain.onnx")
    imported = import_model(path, ImportOptions())
    assert _reshapes(imported.pcg) == []
    assert imported.recognised == {"Reshape chain": 3}
    _same_as_onnxruntime(path, imported)
    # the token dim splits through to the MatMul: through the chain it could not
    (matmul,) = [n for _, n in imported.pcg if n.kind == OpKind.MatMul]
    assert imported.pcg.nodes[matmul.inputs[0].node].kind == OpKind.Input


def test_an_intermediate_read_elsewhere_stays_for_its_reader(tmp_path):
    path = _chain_model(tmp_path / "chain.onnx", also_read=True)
    imported = import_model(path, ImportOptions())
    (kept,) = _reshapes(imported.pcg)
    assert kept.op.dims == (B * S, D)
    _same_as_onnxruntime(path, imported)


def test_a_graph_without_chains_is_left_as_it_is(tiny_models):
    pcg = import_model(tiny_models / "convnet_tiny.onnx", ImportOptions()).pcg
    assert merge_reshapes(pcg) == (pcg, 0)


@pytest.mark.parametrize("name", ["gpt2_tiny.onnx", "dlrm_tiny.onnx", "gpt2_tiny_dynamo.onnx"])
def test_an_exports_chains_merge_and_it_computes_what_onnxruntime_does(name):
    path = EXPORTED_DIR / name
    imported = import_model(path, ImportOptions())
    assert imported.recognised.get("Reshape chain", 0) >= 2
    assert not any(imported.pcg.nodes[n.inputs[0].node].kind == OpKind.Reshape for n in _reshapes(imported.pcg))
    _same_as_onnxruntime(path, imported)
