"""``validate()`` accepts imported real models and rejects hand-corrupted graphs,
naming the bad node."""
from __future__ import annotations

import dataclasses

import onnx
import pytest
from models.catalog import TINY_MODELS, ZOO9_NAMES, list_exported, zoo9_model

from unity_cli.errors import ShapeError
from unity_cli.ir import PCG, GraphBuilder, ParallelTensorShape, TensorRef, TensorShape
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.validate import problems, validate
from unity_cli.onnx_import import ImportOptions, import_model


def _import(path, shapes):
    return import_model(path, ImportOptions(input_shapes={k: tuple(v) for k, v in shapes.items()})).pcg


@pytest.mark.parametrize("filename", [f for f, _ in TINY_MODELS])
def test_shared_models_validate(filename, tiny_models):
    shapes = dict(TINY_MODELS)[filename]
    path = tiny_models / filename
    if not path.exists():
        pytest.skip(f"{path} is not there")
    pcg = _import(path, shapes)
    assert problems(pcg) == []
    validate(pcg)
    assert len(pcg.outputs) >= 1


@pytest.mark.parametrize("path,shapes", list_exported(), ids=lambda v: getattr(v, "name", ""))
def test_exported_models_validate(path, shapes):
    validate(_import(path, shapes))


@pytest.mark.parametrize("name", ZOO9_NAMES)
def test_zoo9_models_validate(name, tmp_path):
    path = tmp_path / f"{name}.onnx"
    onnx.save(zoo9_model(name), path)
    imported = import_model(path, ImportOptions(batch_size=2))
    pcg = imported.pcg
    validate(pcg)
    assert imported.inputs["data"].dims == (2, 3, 224, 224)
    (out,) = pcg.outputs
    assert pcg.shape(out).sizes == (2, 1000)
    # Initializers listed as graph inputs are weights, not data inputs.
    assert [pcg.nodes[i].name for i in pcg.sources() if pcg.nodes[i].kind == "Input"] == ["data"]


# ---------------------------------------------------------------------------
# Corrupted graphs.


def _graph() -> PCG:
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((8, 6))), (), "x")
    w = b.add1(InputAttrs(TensorShape((6, 4))), (), "w")
    x = b.add1(RepartitionAttrs(0, 2), [x], "split_batch")
    w = b.add1(ReplicateAttrs(2), [w], "copy_w")
    h = b.add1(MatMulAttrs(), [x, w], "the_matmul")
    return b.build([b.add1(UnaryAttrs("Relu"), [h], "the_relu")])


def _replace(pcg: PCG, name: str, **changes) -> PCG:
    i = pcg.find(name)
    nodes = list(pcg.nodes)
    nodes[i] = dataclasses.replace(nodes[i], **changes)
    return PCG(tuple(nodes), pcg.outputs)


def test_the_uncorrupted_graph_validates():
    validate(_graph())


def test_wrong_stored_output_shape_is_named():
    g = _graph()
    wrong = ParallelTensorShape.of((8, 5), (2, 1))
    bad = _replace(g, "the_matmul", outputs=(wrong,))
    with pytest.raises(ShapeError, match="the_matmul") as e:
        validate(bad)
    assert "stored outputs" in str(e.value)
    # Its reader now sees a shape that differs from its own stored output: also reported.
    assert any("the_relu" in p for p in problems(bad))


def test_wrong_stored_degree_is_named():
    g = _graph()
    i = g.find("the_relu")
    wrong = g.nodes[i].outputs[0].with_dim(1, 2)
    bad = _replace(g, "the_relu", outputs=(wrong,))
    with pytest.raises(ShapeError, match="the_relu"):
        validate(bad)


def test_wrong_stored_dtype_is_named():
    g = _graph()
    i = g.find("the_relu")
    s = g.nodes[i].outputs[0]
    wrong = ParallelTensorShape(s.dims, type(s.dtype)("float16"), s.sum_degree, s.copy_degree)
    with pytest.raises(ShapeError, match="the_relu"):
        validate(_replace(g, "the_relu", outputs=(wrong,)))


def test_degree_that_does_not_divide_is_named():
    g = _graph()
    bad_shape = ParallelTensorShape.of((8, 6), (3, 1))
    bad = _replace(g, "split_batch", outputs=(bad_shape,))
    msgs = problems(bad)
    assert any("split_batch" in m and "not divisible" in m for m in msgs), msgs
    with pytest.raises(ShapeError, match="split_batch.*not divisible"):
        validate(bad)


def test_degree_that_does_not_divide_on_a_source_is_named():
    g = _graph()
    bad = _replace(g, "w", outputs=(ParallelTensorShape.of((6, 4), (1, 3)),))
    with pytest.raises(ShapeError, match="w: output 0: dim 1 of size 4 is not divisible by its degree 3"):
        validate(bad)


def test_illegal_input_layout_is_named():
    """A node whose inputs' layout its spec rejects (Relu of a partial sum)."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 6))), (), "x")
    w = b.add1(InputAttrs(TensorShape((6, 4))), (), "w")
    x = b.add1(RepartitionAttrs(1, 2), [x], "split_k_x")
    w = b.add1(RepartitionAttrs(0, 2), [w], "split_k_w")
    h = b.add1(MatMulAttrs(), [x, w], "partial_mm")
    assert b.shape(h).sum_degree == 2
    g = b.build([h])
    relu_out = ParallelTensorShape.of((4, 4), (1, 1), sum_degree=2)
    nodes = g.nodes + (dataclasses.replace(g.nodes[-1], op=UnaryAttrs("Relu"), inputs=(g.outputs[0],),
                                           outputs=(relu_out,), name="bad_relu"),)
    bad = PCG(nodes, (TensorRef(len(nodes) - 1),))
    with pytest.raises(ShapeError, match="bad_relu.*not linear"):
        validate(bad)
    with pytest.raises(ShapeError, match="bad_relu"):
        b.add1(UnaryAttrs("Relu"), [h], "bad_relu")


def test_source_with_inputs_is_named():
    g = _graph()
    bad = _replace(g, "w", inputs=(TensorRef(0),))    # w is node 1, so it may read node 0
    with pytest.raises(ShapeError, match="w: a source has inputs"):
        validate(bad)


def test_all_problems_are_counted():
    g = _graph()
    bad = _replace(g, "split_batch", outputs=(ParallelTensorShape.of((8, 6), (3, 1)),))
    bad = _replace(bad, "the_relu", outputs=(ParallelTensorShape.of((8, 4), (1, 1)),))
    msgs = problems(bad)
    assert len(msgs) >= 2
    with pytest.raises(ShapeError, match=r"and \d+ more"):
        validate(bad)
