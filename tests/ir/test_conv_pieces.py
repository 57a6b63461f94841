"""A Conv split along its channels runs as the whole conv: pieces of whole groups, each a
conv of its share of the groups (``Conv.piece_attrs``), assembled, equal the whole conv
forward and backward; a split that would cut a group is refused."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.errors import ShapeError
from unity_cli.ir import DType, GraphBuilder, ParallelTensorShape
from unity_cli.ir.ops.conv import ConvAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pieces import coords, piece_op, piece_region, task_inputs
from unity_cli.kernels import backward, forward

RNG = np.random.default_rng(3)
ATTRS = {g: ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), g) for g in (1, 2, 4, 8)}


def _conv(x: ParallelTensorShape, w: ParallelTensorShape, groups: int):
    b = GraphBuilder()
    xi = b.add(InputAttrs(x.logical), (), "x", outputs=[x])[0]
    wi = b.add(WeightAttrs(w.logical, True), (), "w", outputs=[w])[0]
    y = b.add1(ATTRS[groups], [xi, wi], "y")
    pcg = b.build([y])
    return pcg.nodes[y.node]


def _assembled(groups: int, x: np.ndarray, w: np.ndarray, g: np.ndarray, xs, ws):
    """The output and both gradients, each piece run alone on its regions and added up."""
    node = _conv(xs, ws, groups)
    out_shape = node.outputs[0]
    reads = task_inputs(node, [xs, ws])
    out, gx, gw = np.zeros(out_shape.sizes), np.zeros(x.shape), np.zeros(w.shape)
    for t in coords(out_shape):
        rx, rw = piece_region(xs, reads.coord(0, t)), piece_region(ws, reads.coord(1, t))
        ro = piece_region(out_shape, t)
        op = piece_op(node.op, out_shape)
        (o,), ctx = forward(op, [x[rx], w[rw]], np)
        out[ro] += o / out_shape.copy_degree
        px, pw = backward(op, ctx, [g[ro]], np)
        gx[rx] += px / out_shape.copy_degree
        gw[rw] += pw / out_shape.copy_degree
    return out, gx, gw


@pytest.mark.parametrize("groups,out_channels", [(1, 8), (2, 8), (4, 8), (8, 8), (4, 16)],
                         ids=["ungrouped", "2-groups", "4-groups", "depthwise", "depthwise-multiplier"])
@pytest.mark.parametrize("split", [2, 4])
def test_a_conv_split_along_its_channels_equals_the_whole(groups, out_channels, split):
    c = 8
    if groups > 1 and groups % split:
        pytest.skip("cuts a group: refused (the test below)")
    x = RNG.standard_normal((2, c, 5, 5))
    w = RNG.standard_normal((out_channels, c // groups, 3, 3))
    op = ATTRS[groups]
    (want,), ctx = forward(op, [x, w], np)
    g = RNG.standard_normal(want.shape)
    want_gx, want_gw = backward(op, ctx, [g], np)
    # the input's channels split (grouped: with the groups; ungrouped: a contraction), and
    # the batch; the weight's rows split as the output channels
    xs = ParallelTensorShape.of(x.shape, (2, split, 1, 1), DType.FLOAT64)
    ws = ParallelTensorShape.of(w.shape, (split if groups > 1 else 1, 1 if groups > 1 else split, 1, 1),
                                DType.FLOAT64, copy_degree=2)
    got, gx, gw = _assembled(groups, x, w, g, xs, ws)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("groups,split", [(2, 4), (4, 8)])
def test_a_channel_split_that_cuts_a_group_is_refused(groups, split):
    xs = ParallelTensorShape.of((2, 8, 5, 5), (1, split, 1, 1), DType.FLOAT64)
    ws = ParallelTensorShape.of((8, 8 // groups, 3, 3), (split, 1, 1, 1), DType.FLOAT64)
    with pytest.raises(ShapeError, match="whole groups"):
        _conv(xs, ws, groups)


def test_a_grouped_conv_reads_the_input_channels_of_its_groups_alone():
    """The input whole and the output channels split: each piece would read every channel
    into a conv of fewer groups, so the split is refused rather than run wrong."""
    xs = ParallelTensorShape.of((2, 8, 5, 5), (1, 1, 1, 1), DType.FLOAT64, copy_degree=2)
    ws = ParallelTensorShape.of((8, 2, 3, 3), (2, 1, 1, 1), DType.FLOAT64)
    with pytest.raises(ShapeError):
        _conv(xs, ws, 4)
