"""Pad, Tile, Trilu and CumSum: run on pieces split along every dim their roles allow,
the pieces assemble to the whole op (forward and backward); partial sums pass through
the linear ones; import from ONNX, including Swin's Pad with constant pads."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unity_cli.errors import ModelError, ShapeError
from unity_cli.ir import WHOLE, DType, GraphBuilder, ParallelTensorShape, TensorShape
from unity_cli.ir.ops.array_ops import CumSumAttrs, PadAttrs, TileAttrs, TriluAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.opspec import attrs_from_json, attrs_to_json, spec_of
from unity_cli.ir.pieces import coords, piece_op, piece_region, task_inputs
from unity_cli.kernels import backward, forward
from unity_cli.onnx_import import ImportOptions, import_model_proto

RNG = np.random.default_rng(7)

OPS = {
    "pad_constant": (PadAttrs("constant", ((0, 0), (2, -1), (0, 0), (1, 3)), 0.0), (4, 6, 2, 4)),
    "pad_constant_value": (PadAttrs("constant", ((0, 0), (0, 0), (1, 1)), -1.5), (2, 4, 3)),
    "pad_reflect": (PadAttrs("reflect", ((0, 0), (2, 1), (0, 0)), 0.0), (4, 5, 6)),
    "pad_edge": (PadAttrs("edge", ((1, -1), (0, 0), (0, 2)), 0.0), (4, 4, 3)),
    "pad_wrap": (PadAttrs("wrap", ((0, 0), (3, 2)), 0.0), (6, 4)),
    "tile": (TileAttrs((1, 3, 1, 2)), (2, 3, 4, 2)),
    "trilu_upper": (TriluAttrs(True, 1), (2, 4, 5, 6)),
    "trilu_lower": (TriluAttrs(False, -1), (4, 5, 5)),
    "cumsum": (CumSumAttrs(1), (4, 6, 2)),
    "cumsum_exclusive_reverse": (CumSumAttrs(0, exclusive=True, reverse=True), (6, 4)),
}


def _split_degrees(op, dims: tuple[int, ...]) -> tuple[int, ...]:
    """2 on every even-sized dim the roles let split, 1 elsewhere."""
    (roles,) = spec_of(op).roles(op, [TensorShape(dims)])
    return tuple(2 if r != WHOLE and n % 2 == 0 else 1 for r, n in zip(roles, dims))


def _one_node(op, x: ParallelTensorShape):
    b = GraphBuilder()
    xin = b.add(InputAttrs(x.logical), (), "x", outputs=[x])[0]
    y = b.add1(op, [xin], "y")
    return b.build([y]), y


def _run_pieces(op, x: np.ndarray, shape: ParallelTensorShape, g: np.ndarray):
    """The op's output and input gradient assembled from its pieces, and the output's shape."""
    pcg, y = _one_node(op, shape)
    node = pcg.nodes[y.node]
    out_shape = node.outputs[0]
    reads = task_inputs(node, [shape])
    out = np.zeros(out_shape.sizes, x.dtype)
    gx = np.zeros(x.shape, x.dtype)
    for t in coords(out_shape):
        region = piece_region(shape, reads.coord(0, t))
        out_region = piece_region(out_shape, t)
        piece = piece_op(op, out_shape)
        (o,), ctx = forward(piece, [x[region]], np)
        assert o.shape == out_shape.piece.dims
        out[out_region] += o / out_shape.copy_degree
        (gp,) = backward(piece, ctx, [g[out_region]], np)
        gx[region] += gp / out_shape.copy_degree
    return out, gx, out_shape


@pytest.mark.parametrize("name", list(OPS))
def test_pieces_assemble_to_the_whole_op(name):
    op, dims = OPS[name]
    degrees = _split_degrees(op, dims)
    assert any(d > 1 for d in degrees), f"{name}: nothing to split"
    x = RNG.standard_normal(dims)
    (want,), ctx = forward(op, [x], np)
    g = RNG.standard_normal(want.shape)
    (want_gx,) = backward(op, ctx, [g], np)
    shape = ParallelTensorShape.of(dims, degrees, DType.FLOAT64)
    got, got_gx, out_shape = _run_pieces(op, x, shape, g)
    assert out_shape.logical.dims == want.shape
    assert out_shape.pieces == shape.pieces
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_gx, want_gx, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(OPS))
def test_partial_sums_pass_through_the_linear_ops(name):
    op, dims = OPS[name]
    shape = ParallelTensorShape.of(dims, (1,) * len(dims), DType.FLOAT64, 2)
    if name == "pad_constant_value":
        with pytest.raises(ShapeError, match="not linear"):
            _one_node(op, shape)
        return
    (out_shape,) = spec_of(op).infer_parallel(op, [shape])
    assert out_shape.sum_degree == 2
    x = RNG.standard_normal(dims)
    part = RNG.standard_normal(dims)
    (whole,), _ = forward(op, [x], np)
    (a,), _ = forward(op, [part], np)
    (b,), _ = forward(op, [x - part], np)
    np.testing.assert_allclose(a + b, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(OPS))
def test_whole_dims_refuse_a_split(name):
    op, dims = OPS[name]
    (roles,) = spec_of(op).roles(op, [TensorShape(dims)])
    for d, r in enumerate(roles):
        if r == WHOLE and dims[d] % 2 == 0:
            degrees = tuple(2 if k == d else 1 for k in range(len(dims)))
            with pytest.raises(ShapeError, match=f"dim {d} whole"):
                _one_node(op, ParallelTensorShape.of(dims, degrees))


def test_roles():
    pad = PadAttrs("constant", ((0, 0), (1, 0), (0, -1), (0, 0)))
    assert spec_of(pad).roles(pad, [TensorShape((2, 3, 4, 5))]) == ((0, WHOLE, WHOLE, 3),)
    tile = TileAttrs((2, 1))
    assert spec_of(tile).roles(tile, [TensorShape((2, 3))]) == ((WHOLE, 1),)
    tri = TriluAttrs()
    assert spec_of(tri).roles(tri, [TensorShape((2, 3, 4, 5))]) == ((0, 1, WHOLE, WHOLE),)
    cs = CumSumAttrs(1)
    assert spec_of(cs).roles(cs, [TensorShape((2, 3, 4))]) == ((0, WHOLE, 2),)


@pytest.mark.parametrize("name", list(OPS))
def test_attrs_json_round_trip(name):
    op, _ = OPS[name]
    assert attrs_from_json(attrs_to_json(op)) == op


def test_pad_infers_cropped_and_padded_sizes():
    op = PadAttrs("constant", ((1, -2), (0, 3)))
    assert spec_of(op).infer(op, [TensorShape((5, 2), DType.INT64)]) == (TensorShape((4, 5), DType.INT64),)
    with pytest.raises(ShapeError, match="crops away all of dim 0"):
        spec_of(op).infer(op, [TensorShape((2, 2))])
    with pytest.raises(ShapeError, match="pairs for a rank-3"):
        spec_of(op).infer(op, [TensorShape((2, 2, 2))])


# ---------------------------------------------------------------------------
# Import


def _model(op_type: str, x_dims, inits: dict[str, np.ndarray], inputs: list[str], opset: int, **attrs):
    node = helper.make_node(op_type, inputs, ["y"], name="the_node", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _imported_op(model: onnx.ModelProto):
    imported = import_model_proto(model, ImportOptions())
    (n,) = [n for _, n in imported.pcg if not n.spec.is_source]
    return n


@pytest.mark.parametrize("opset", [17, 18])
def test_swin_pad_imports_with_batch_and_channels_splittable(opset):
    """Swin pads H and W of its NHWC feature map up to a multiple of the window size."""
    inits = {"value": np.array(0.0, np.float32)}
    if opset == 17:
        inits["pads"] = np.array([0, 0, 0, 0, 0, 3, 1, 0], np.int64)
        inputs = ["x", "pads", "value"]
    else:
        inits["pads"], inits["axes"] = np.array([0, 0, 3, 1], np.int64), np.array([-3, 2], np.int64)
        inputs = ["x", "pads", "value", "axes"]
    n = _imported_op(_model("Pad", [2, 5, 7, 8], inits, inputs, opset))
    assert n.op == PadAttrs("constant", ((0, 0), (0, 3), (0, 1), (0, 0)), 0.0)
    assert n.outputs[0].sizes == (2, 8, 8, 8)
    assert n.spec.roles(n.op, [TensorShape((2, 5, 7, 8))]) == ((0, WHOLE, WHOLE, 3),)
    assert n.spec.terms(n.op, 1) == ((0,),)


def test_pad_opset10_attrs_and_tile_trilu_cumsum_import():
    n = _imported_op(_model("Pad", [2, 3], {}, ["x"], 10, pads=[1, 0, 0, 2], mode="edge"))
    assert n.op == PadAttrs("edge", ((1, 0), (0, 2)), 0.0)
    n = _imported_op(_model("Tile", [2, 3], {"r": np.array([3, 1], np.int64)}, ["x", "r"], 13))
    assert n.op == TileAttrs((3, 1))
    n = _imported_op(_model("Trilu", [2, 3], {"k": np.array(-1, np.int64)}, ["x", "k"], 14, upper=0))
    assert n.op == TriluAttrs(False, -1)
    n = _imported_op(_model("Trilu", [2, 3], {}, ["x"], 14))
    assert n.op == TriluAttrs(True, 0)
    n = _imported_op(_model("CumSum", [2, 3], {"a": np.array([-1], np.int32)}, ["x", "a"], 14, reverse=1))
    assert n.op == CumSumAttrs(1, False, True)


BAD = {
    "pads-length": (_model("Pad", [2, 3], {"p": np.array([1, 1], np.int64)}, ["x", "p"], 13),
                    "pads has 2 values for 2 axes"),
    "wrap-before-19": (_model("Pad", [2, 3], {"p": np.array([1, 1, 1, 1], np.int64)}, ["x", "p"], 18, mode="wrap"),
                       "wrap.*opset 19"),
    "unknown-mode": (_model("Pad", [2, 3], {"p": np.array([1, 1, 1, 1], np.int64)}, ["x", "p"], 18, mode="mirror"),
                     "unknown pad mode"),
    "repeated-axes": (_model("Pad", [2, 3], {"p": np.array([1, 1, 1, 1], np.int64), "a": np.array([1, -1], np.int64)},
                             ["x", "p", "", "a"], 18), "repeated axes"),
    "tile-repeats-length": (_model("Tile", [2, 3], {"r": np.array([2], np.int64)}, ["x", "r"], 13),
                            "repeats has 1 values"),
    "cumsum-axis": (_model("CumSum", [2, 3], {"a": np.array(2, np.int64)}, ["x", "a"], 14), "axis 2 is out of range"),
    "trilu-k-not-scalar": (_model("Trilu", [2, 3], {"k": np.array([1, 2], np.int64)}, ["x", "k"], 14),
                           "must be a scalar"),
}


@pytest.mark.parametrize("case_id", list(BAD))
def test_bad_nodes_are_refused_with_their_name(case_id):
    model, why = BAD[case_id]
    with pytest.raises(ModelError, match=f"the_node.*{why}"):
        import_model_proto(model, ImportOptions())


def test_runtime_pads_are_refused():
    node = helper.make_node("Pad", ["x", "p"], ["y"], name="the_node")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                            helper.make_tensor_value_info("p", TensorProto.INT64, [4])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(ModelError, match="the_node.*computed at run time"):
        import_model_proto(model, ImportOptions())
