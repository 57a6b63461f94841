"""TopK, OneHot, GatherElements and ScatterElements: their parallel rules hold on real
pieces, their shape rules refuse bad models, and the scatter kernel agrees with onnx's
reference evaluator on repeated writes.

The parallel check builds a one-node PCG whose inputs are split 2 ways on every dim the
roles allow (and, for the linear inputs, hold 2 partial sums), runs the runtime kernel
on each piece as a device would, and compares the assembled pieces with the kernel run
on whole tensors.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from unity_cli.errors import ShapeError
from unity_cli.ir import DType, GraphBuilder, ParallelTensorShape, TensorShape
from unity_cli.ir.ops.index_ops import GatherElementsAttrs, OneHotAttrs, ScatterElementsAttrs, TopKAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.opspec import WHOLE, attrs_from_json, attrs_to_json, spec_of
from unity_cli.ir.pieces import coords, piece_op, piece_region, task_inputs
from unity_cli.kernels import KernelError, forward

RNG = np.random.default_rng(20240611)


def _floats(*shape: int) -> np.ndarray:
    return RNG.uniform(-2, 2, shape).astype(np.float64)


def _index(shape: Sequence[int], n: int) -> np.ndarray:
    """Indices in ``[-n, n)``: negative ones too."""
    return RNG.integers(-n, n, tuple(shape)).astype(np.int64)


def _shape(a: np.ndarray) -> TensorShape:
    return TensorShape(tuple(a.shape), DType.from_numpy(a.dtype))


def _layout(op, arrays: Sequence[np.ndarray], sums: Sequence[int]) -> list[ParallelTensorShape]:
    """Every dim with an output-dim role split 2 ways, inputs ``sums`` holding 2 partial
    sums, and the rest replicated so that every input has as many pieces as the output."""
    spec = spec_of(op)
    logical = [_shape(a) for a in arrays]
    roles = spec.roles(op, logical)
    mapped = {r for rs in roles for r in rs if isinstance(r, int)}
    s = 2 if sums else 1
    pieces = 2 ** len(mapped) * s
    shapes = []
    for i, (x, rs) in enumerate(zip(logical, roles, strict=True)):
        degrees = tuple(2 if isinstance(r, int) else 1 for r in rs)
        sum_degree = s if i in sums else 1
        copy = pieces // (math.prod(degrees) * sum_degree)
        shapes.append(ParallelTensorShape.of(x.dims, degrees, x.dtype, sum_degree, copy))
    return shapes


def check_pieces(op, arrays: Sequence[np.ndarray], sums: Sequence[int] = (), split: int | None = None) -> None:
    """Assembled pieces equal the whole result; ``split``: how many output dims must be split."""
    shapes = _layout(op, arrays, sums)
    b = GraphBuilder()
    refs = [b.add(InputAttrs(s.logical), (), f"in{i}", outputs=[s])[0] for i, s in enumerate(shapes)]
    outs = b.add(op, refs, "op")
    pcg = b.build(outs)
    node = pcg.nodes[-1]
    out_shapes = node.outputs
    assert out_shapes[0].sum_degree == (2 if sums else 1)
    if split is not None:
        assert sum(d > 1 for d in out_shapes[0].degrees) == split, out_shapes[0]
    for o in out_shapes:
        assert o.pieces == shapes[0].pieces

    # Partial sums: random parts adding up to the value (the first part takes the rest).
    parts = []
    for a, s in zip(arrays, shapes, strict=True):
        if s.sum_degree == 1:
            parts.append([a])
        else:
            extra = [RNG.uniform(-1, 1, a.shape) for _ in range(s.sum_degree - 1)]
            parts.append([a - sum(extra)] + extra)

    reading = task_inputs(node, shapes)
    attrs = piece_op(op, out_shapes[0])
    whole, _ = forward(op, list(arrays), np)
    got = [np.zeros(w.shape, w.dtype) for w in whole]
    copies: dict[tuple, list[np.ndarray]] = {}
    for t in coords(out_shapes[0]):
        ins = []
        for i, s in enumerate(shapes):
            c = reading.coord(i, t)
            ins.append(parts[i][c[-2]][piece_region(s, c)])
        res, _ = forward(attrs, ins, np)
        key = t[:-1]
        if key in copies:  # replicas must agree
            for r, first in zip(res, copies[key], strict=True):
                np.testing.assert_array_equal(r, first)
            continue
        copies[key] = res
        for k, (r, o) in enumerate(zip(res, out_shapes, strict=True)):
            region = piece_region(o, t)
            assert r.shape == o.piece.dims
            if o.sum_degree > 1:
                got[k][region] += r
            else:
                got[k][region] = r
    for g, w in zip(got, whole, strict=True):
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
        else:
            np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------------
# Parallel correctness, one test per op.


@pytest.mark.parametrize("axis,largest", [(1, True), (2, False), (0, True)])
def test_topk_pieces(axis, largest):
    check_pieces(TopKAttrs(3, axis, largest), [_floats(4, 6, 4)], split=2)


def test_topk_moe_router_pieces():
    """A router's TopK over the expert axis splits over the tokens."""
    check_pieces(TopKAttrs(2, 1), [_floats(8, 4)], split=1)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_onehot_pieces(axis):
    idx = _index((4, 6), 7)  # some out of range
    check_pieces(OneHotAttrs(5, axis), [idx, _floats(2)], split=2)


def test_onehot_pieces_with_partial_sums_of_values():
    check_pieces(OneHotAttrs(3, 1), [_index((4, 2), 3), _floats(2)], sums=(1,), split=2)


@pytest.mark.parametrize("data,idx,axis,split", [
    ((4, 6, 4), (4, 9, 4), 1, 2),     # off-axis sizes agree: both split
    ((4, 6, 4), (4, 3, 2), 1, 1),     # dim 2 differs: whole
    ((4, 6), (2, 6), 1, 0),           # dim 0 differs: whole
    ((6, 4), (2, 4), 0, 1),
])
def test_gather_elements_pieces(data, idx, axis, split):
    op = GatherElementsAttrs(axis)
    check_pieces(op, [_floats(*data), _index(idx, data[axis])], split=split)
    check_pieces(op, [_floats(*data), _index(idx, data[axis])], sums=(0,), split=split)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("data,idx,axis,split", [
    ((4, 5, 6), (4, 3, 6), 1, 2),
    ((4, 5, 6), (4, 3, 4), 1, 1),
    ((6, 4), (2, 2), 0, 0),
])
def test_scatter_elements_pieces(reduction, data, idx, axis, split):
    op = ScatterElementsAttrs(axis, reduction)
    n = data[axis]
    if reduction == "none":  # one write per position: distinct indices along the axis
        perm = np.argsort(RNG.random((n,) + tuple(s for d, s in enumerate(idx) if d != axis)), axis=0)
        index = np.moveaxis(perm[:idx[axis]], 0, axis) - RNG.integers(0, 2) * n
    else:
        index = _index(idx, n)
    args = [_floats(*data), index.astype(np.int64), _floats(*idx)]
    check_pieces(op, args, split=split)
    sums = {"none": (0, 2), "add": (0, 2), "mul": (0,)}.get(reduction)
    if sums:
        check_pieces(op, args, sums=sums, split=split)


def test_roles_keep_the_axis_and_unequal_dims_whole():
    data, idx = TensorShape((4, 6, 4)), TensorShape((4, 3, 2), DType.INT64)
    ge = spec_of(GatherElementsAttrs(1))
    assert ge.roles(GatherElementsAttrs(1), [data, idx]) == ((0, WHOLE, WHOLE),) * 2
    se = spec_of(ScatterElementsAttrs(1))
    upd = TensorShape((4, 3, 2))
    assert se.roles(ScatterElementsAttrs(1), [data, idx, upd]) == ((0, WHOLE, WHOLE),) * 3
    assert spec_of(TopKAttrs(2, 1)).roles(TopKAttrs(2, 1), [data]) == ((0, WHOLE, 2),)
    oh = OneHotAttrs(5, 1)
    assert spec_of(oh).roles(oh, [TensorShape((4, 3), DType.INT64), TensorShape((2,))]) == ((0, 2), (WHOLE,))


def test_split_axis_is_refused():
    x = ParallelTensorShape.of((4, 6), (1, 2))
    with pytest.raises(ShapeError, match="whole"):
        spec_of(TopKAttrs(2, 1)).infer_parallel(TopKAttrs(2, 1), [x])


# ---------------------------------------------------------------------------
# Shapes, attributes and costs.


def test_shapes_and_dtypes():
    x = TensorShape((3, 8), DType.FLOAT16)
    values, indices = spec_of(TopKAttrs(2, 1)).infer(TopKAttrs(2, 1), [x])
    assert values == TensorShape((3, 2), DType.FLOAT16) and indices == TensorShape((3, 2), DType.INT64)
    oh = OneHotAttrs(7, 0)
    (y,) = spec_of(oh).infer(oh, [TensorShape((3, 4), DType.INT32), TensorShape((2,), DType.INT64)])
    assert y == TensorShape((7, 3, 4), DType.INT64)
    ge = GatherElementsAttrs(0)
    (y,) = spec_of(ge).infer(ge, [TensorShape((2, 5)), TensorShape((6, 3), DType.INT64)])
    assert y == TensorShape((6, 3))


@pytest.mark.parametrize("op,inputs,match", [
    (TopKAttrs(9, 1), [TensorShape((3, 8))], "k=9"),
    (GatherElementsAttrs(0), [TensorShape((3, 4)), TensorShape((3, 5), DType.INT64)], "larger"),
    (GatherElementsAttrs(0), [TensorShape((3, 4)), TensorShape((3,), DType.INT64)], "rank"),
    (GatherElementsAttrs(0), [TensorShape((3, 4)), TensorShape((3, 4))], "int32 or int64"),
    (ScatterElementsAttrs(0), [TensorShape((3, 4)), TensorShape((2, 4), DType.INT64), TensorShape((2, 3))],
     "differ in shape"),
    (ScatterElementsAttrs(0, "sub"), [TensorShape((3, 4)), TensorShape((2, 4), DType.INT64), TensorShape((2, 4))],
     "reduction"),
    (OneHotAttrs(3, 0), [TensorShape((3,), DType.INT64), TensorShape((3,))], r"\[off, on\]"),
])
def test_bad_shapes_are_refused(op, inputs, match):
    with pytest.raises(ShapeError, match=match):
        spec_of(op).infer(op, inputs)


@pytest.mark.parametrize("op", [TopKAttrs(2, 1, False, False), OneHotAttrs(5, 2), GatherElementsAttrs(1),
                                ScatterElementsAttrs(0, "mul")])
def test_attrs_round_trip_through_json(op):
    assert attrs_from_json(attrs_to_json(op)) == op


def test_topk_cost_grows_with_log_k():
    x = TensorShape((1024, 64))
    spec = spec_of(TopKAttrs(2, 1))

    def flops(k: int) -> float:
        op = TopKAttrs(k, 1)
        return spec.cost(op, [x], spec.infer(op, [x])).fwd_flops

    assert flops(2) == x.numel and flops(8) == 3 * x.numel


# ---------------------------------------------------------------------------
# Kernels beyond the onnxruntime cases.


def _one_node(op_type: str, inputs: dict[str, np.ndarray], n_out: int, opset: int,
              inits: dict[str, np.ndarray] | None = None, **attrs):
    """A one-node model: ``inputs`` are graph inputs, then ``inits`` initializers, in node order."""
    inits = inits or {}
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op_type, list(inputs) + list(inits), outs, **attrs)
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
          for n, v in inputs.items()]
    graph = helper.make_graph([node], op_type, vi, [helper.make_empty_tensor_value_info(o) for o in outs],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_with_repeated_writes_matches_the_reference(reduction):
    """Repeated targets apply in indices' row-major order (the last write wins for none)."""
    for trial in range(20):
        axis = trial % 3
        data = _floats(3, 4, 2)
        shape = [3, 4, 2]
        shape[axis] = 5
        idx = _index(shape, data.shape[axis])
        upd = _floats(*shape)
        model = _one_node("ScatterElements", {"d": data, "i": idx, "u": upd}, 1, 18, axis=axis, reduction=reduction)
        (want,) = ReferenceEvaluator(model).run(None, {"d": data, "i": idx, "u": upd})
        (got,), _ = forward(ScatterElementsAttrs(axis, reduction), [data, idx, upd], np)
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_topk_unsorted_selects_what_onnxruntime_selects():
    x = RNG.uniform(-2, 2, (5, 9)).astype(np.float32)
    model = _one_node("TopK", {"x": x}, 2, 11, {"k": np.array([4], np.int64)}, axis=1, sorted=0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want_v, want_i = sess.run(None, {"x": x})
    (v, i), _ = forward(TopKAttrs(4, 1, True, False), [x], np)
    np.testing.assert_array_equal(np.sort(i, axis=1), np.sort(want_i, axis=1))
    np.testing.assert_array_equal(np.sort(v, axis=1), np.sort(want_v, axis=1))


def test_out_of_range_index_is_an_error():
    with pytest.raises(KernelError, match="outside"):
        forward(GatherElementsAttrs(0), [np.zeros((3, 2)), np.array([[3, 0]])], np)
