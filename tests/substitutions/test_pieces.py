"""Piece-level semantics: running a PCG piece by piece gives its logical value."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.shape_ops import ReshapeAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.shapes import ParallelTensorShape
from unity_cli.substitutions.generator import GeneratorSettings, enumerate_graphs, input_values
from unity_cli.substitutions.pieces import (
    PieceError,
    assemble,
    check_pieces,
    coords,
    evaluate_pieces,
    input_coord,
    split_value,
)
from unity_cli.substitutions.semantics import evaluate

RNG = np.random.default_rng(7)


def ints(*dims: int) -> np.ndarray:
    return RNG.integers(-4, 5, size=dims).astype(np.int64)


def source(b: GraphBuilder, name: str, shape: ParallelTensorShape):
    return b.add1(InputAttrs(shape.logical), (), name) if not shape.is_partitioned else \
        b.add(InputAttrs(shape.logical), (), name, outputs=[shape])[0]


def same_as_logical(pcg, feed, logical=None) -> list[dict]:
    """Assert the assembled pieces equal the logical values; return the pieces."""
    pieces = evaluate_pieces(pcg, feed, check=True)
    want = evaluate(pcg, logical or feed)
    for p, w, ref in zip(pieces, want, pcg.outputs, strict=True):
        np.testing.assert_array_equal(assemble(p, pcg.shape(ref)), w)
    return pieces


@pytest.mark.parametrize("shape", [
    ParallelTensorShape.of((4, 6), (1, 1)),
    ParallelTensorShape.of((4, 6), (2, 3)),
    ParallelTensorShape.of((4, 6), (2, 1), sum_degree=2),
    ParallelTensorShape.of((4, 6), (1, 2), sum_degree=3, copy_degree=2),
])
def test_split_then_assemble_is_the_value(shape):
    x = ints(4, 6)
    for rng in (None, np.random.default_rng(0)):
        pieces = split_value(x, shape, rng)
        assert len(pieces) == shape.pieces == len(list(coords(shape)))
        check_pieces(pieces, shape)
        np.testing.assert_array_equal(assemble(pieces, shape), x)


def test_dim_coordinates_are_consecutive_slices():
    x = ints(4, 4)
    b = GraphBuilder()
    x_ref = source(b, "x", ParallelTensorShape.of((4, 4), (1, 1)))
    r = b.add1(RepartitionAttrs(0, 2), [b.add1(RepartitionAttrs(0, 2), [x_ref])])
    (pieces,) = evaluate_pieces(b.build([r]), {"x": x}, check=True)
    for i in range(4):   # new index = old * d + k: piece i holds row i
        np.testing.assert_array_equal(pieces[(i, 0, 0, 0)], x[i:i + 1])


def test_every_enumerated_graph_with_two_ops():
    settings = GeneratorSettings(max_ops=2)
    en = enumerate_graphs(settings)
    feed = input_values(settings)
    for root in en.roots:
        same_as_logical(en.pcg(root), feed)


def test_megatron_mlp_column_then_row_with_reduction():
    """x replicated; W1 split by columns, W2 by rows: the second MatMul leaves partial sums
    that a Reduction adds up."""
    b = GraphBuilder()
    unp = ParallelTensorShape.of((4, 4), (1, 1))
    x, w1, w2 = (source(b, n, unp) for n in ("x", "w1", "w2"))
    h = b.add1(MatMulAttrs(), [b.add1(ReplicateAttrs(2), [x]), b.add1(RepartitionAttrs(1, 2), [w1])])
    h = b.add1(UnaryAttrs("Relu"), [h])
    y = b.add1(MatMulAttrs(), [h, b.add1(RepartitionAttrs(0, 2), [w2])])
    assert b.shape(y).sum_degree == 2
    out = b.add1(ReductionAttrs(2), [y])
    g = b.build([y, out])
    feed = {"x": ints(4, 4), "w1": ints(4, 4), "w2": ints(4, 4)}
    partial, _ = same_as_logical(g, feed)
    hidden = np.maximum(feed["x"] @ feed["w1"], 0)
    for s in range(2):   # each partial sum is one column block of h times one row block of W2
        np.testing.assert_array_equal(partial[(0, 0, s, 0)], hidden[:, 2 * s:2 * s + 2] @ feed["w2"][2 * s:2 * s + 2])


def test_contracted_split_matmul_pieces_are_partial_products():
    b = GraphBuilder()
    unp = ParallelTensorShape.of((4, 4), (1, 1))
    x, w = source(b, "x", unp), source(b, "w", unp)
    y = b.add1(MatMulAttrs(), [b.add1(RepartitionAttrs(1, 2), [x]), b.add1(RepartitionAttrs(0, 2), [w])])
    feed = {"x": ints(4, 4), "w": ints(4, 4)}
    (pieces,) = same_as_logical(b.build([y]), feed)
    for c in range(2):
        np.testing.assert_array_equal(pieces[(0, 0, c, 0)], feed["x"][:, 2 * c:2 * c + 2] @ feed["w"][2 * c:2 * c + 2])


def test_replicate_then_reduction_doubles():
    b = GraphBuilder()
    x = source(b, "x", ParallelTensorShape.of((4, 4), (1, 1)))
    y = b.add1(ReductionAttrs(2), [b.add1(ReplicateAttrs(2), [x])])
    v = ints(4, 4)
    (pieces,) = same_as_logical(b.build([y]), {"x": v})
    np.testing.assert_array_equal(pieces[(0, 0, 0, 0)], 2 * v)


def test_partial_input_and_contraction_compose():
    """Output sum index = partial index * contracted + contraction index."""
    b = GraphBuilder()
    x = source(b, "x", ParallelTensorShape.of((4, 4), (1, 2), sum_degree=2))
    w = source(b, "w", ParallelTensorShape.of((4, 4), (1, 1)))
    w = b.add1(ReplicateAttrs(2), [b.add1(RepartitionAttrs(0, 2), [w])])
    y = b.add1(MatMulAttrs(), [x, w])
    assert b.shape(y).sum_degree == 4
    r1 = b.add1(ReductionAttrs(2), [y])
    r2 = b.add1(ReductionAttrs(2), [r1])
    feed = {"x": ints(4, 4), "w": ints(4, 4)}
    rng = np.random.default_rng(1)
    xs = split_value(feed["x"], ParallelTensorShape.of((4, 4), (1, 2), sum_degree=2), rng)
    pieces = same_as_logical(b.build([y, r1, r2]), {"x": xs, "w": feed["w"]}, feed)
    for p in range(2):
        for c in range(2):
            want = xs[(0, c, p, 0)] @ feed["w"][2 * c:2 * c + 2]
            np.testing.assert_array_equal(pieces[0][(0, 0, p * 2 + c, 0)], want)


def test_linear_ops_pass_partial_sums():
    b = GraphBuilder()
    shape = ParallelTensorShape.of((4, 4), (2, 1), sum_degree=2)
    x, y = source(b, "x", shape), source(b, "y", shape)
    z = b.add1(BinaryAttrs("Add"), [x, y])
    r = b.add1(ReductionAttrs(2), [z])
    rng = np.random.default_rng(2)
    feed = {"x": split_value(ints(4, 4), shape, rng), "y": split_value(ints(4, 4), shape, rng)}
    got = evaluate_pieces(b.build([z, r]), feed, check=True)
    want = assemble(feed["x"], shape) + assemble(feed["y"], shape)
    np.testing.assert_array_equal(assemble(got[0], shape), want)
    np.testing.assert_array_equal(assemble(got[1], b.shape(r)), want)


def test_reshape_runs_on_piece_shapes():
    b = GraphBuilder()
    x = source(b, "x", ParallelTensorShape.of((4, 4), (1, 1)))
    y = b.add1(ReshapeAttrs((16,)), [b.add1(RepartitionAttrs(0, 2), [x])])
    assert b.shape(y).degrees == (2,)
    same_as_logical(b.build([y]), {"x": ints(4, 4)})


def test_replicas_that_differ_are_caught():
    shape = ParallelTensorShape.of((2, 2), (1, 1), copy_degree=2)
    bad = {(0, 0, 0, 0): np.zeros((2, 2)), (0, 0, 0, 1): np.ones((2, 2))}
    with pytest.raises(PieceError, match="replica"):
        check_pieces(bad, shape)
    b = GraphBuilder()
    x = b.add(InputAttrs(shape.logical), (), "x", outputs=[shape])[0]
    y = b.add1(CombineAttrs(REPLICA_DIM, 2), [x])
    with pytest.raises(PieceError, match="differ"):
        evaluate_pieces(b.build([y]), {"x": bad})


def test_input_coord_decomposes_the_sum_index():
    shape = ParallelTensorShape.of((4, 4), (1, 2), sum_degree=3)
    # roles of MatMul's first input: row -> output dim 0, column contracted; 2-way contraction.
    t = (0, 0, 5, 1)          # output sum index 5 = partial 2 * 2 + contraction 1
    assert input_coord((0, "sum"), True, shape, t, 2) == (0, 1, 2, 0)
    assert input_coord((0, "whole"), False, ParallelTensorShape.of((4, 4), (1, 1), sum_degree=6), t, 2) == (0, 0, 5, 0)
    assert input_coord((0, 1), None, ParallelTensorShape.of((4, 4), (1, 1)), t, 1) == (0, 0, 0, 0)
