"""Each kind's cost, pinned on a few shapes, from first principles: flops are the
arithmetic a textbook kernel does (a multiply-add is 2), bytes are what it reads and writes
once (float32: 4 bytes, int64: 8). A change to a cost model shows here, with the formula
it broke."""
from __future__ import annotations

from pathlib import Path

import pytest

from unity_cli.ir.dtypes import DType
from unity_cli.ir.ops.conv import ConvAttrs
from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.gather_reduce import GatherAttrs, ReduceAttrs
from unity_cli.ir.ops.linear import GemmAttrs, MatMulAttrs
from unity_cli.ir.ops.norm import LayerNormAttrs, SoftmaxAttrs
from unity_cli.ir.ops.shape_ops import ConcatAttrs, ReshapeAttrs, SplitAttrs, TransposeAttrs
from unity_cli.ir.ops.unary import UNARY
from unity_cli.ir.opspec import OpCost, spec_of
from unity_cli.ir.shapes import TensorShape


def T(*dims: int, dtype: DType = DType.FLOAT32) -> TensorShape:
    return TensorShape(dims, dtype)


def cost(attrs, *inputs: TensorShape) -> OpCost:
    spec = spec_of(attrs)
    return spec.cost(attrs, inputs, spec.infer(attrs, inputs))


def test_matmul_and_batched_matmul():
    # [8,16] @ [16,32]: 8*32 outputs of 16 multiply-adds; reads both, writes the output.
    a, b, y = 8 * 16 * 4, 16 * 32 * 4, 8 * 32 * 4
    # Backward is two GEMMs of the forward's size (dA = dY B^T, dB = A^T dY), each gradient
    # accumulated into its buffer (read and written once more).
    assert cost(MatMulAttrs(), T(8, 16), T(16, 32)) == OpCost(2 * 8 * 32 * 16, a + b + y, 2 * 2 * 8 * 32 * 16,
                                                              2 * (a + b + y) + a + b)
    # [2,4,8,16] @ [2,4,16,8]: 8 batches of an 8x16 @ 16x8.
    c = cost(MatMulAttrs(), T(2, 4, 8, 16), T(2, 4, 16, 8))
    assert (c.fwd_flops, c.fwd_bytes) == (2 * 8 * (8 * 8 * 16), 4 * (2 * 8 * 8 * 16 + 8 * 8 * 8))


def test_a_product_whose_input_wants_no_gradient_skips_its_gemm():
    # x is a graph input: backward makes only dB = A^T dY (reads A and dY, writes and
    # accumulates dB), one GEMM and one launch; nothing wanted, no backward at all.
    a, b, y = 8 * 16 * 4, 16 * 32 * 4, 8 * 32 * 4
    spec = spec_of(MatMulAttrs())
    ins = (T(8, 16), T(16, 32))
    outs = spec.infer(MatMulAttrs(), ins)
    assert spec.cost_of_grads(MatMulAttrs(), ins, outs, (False, True)) == \
        OpCost(2 * 8 * 32 * 16, a + b + y, 2 * 8 * 32 * 16, y + a + 2 * b, 1, 1)
    assert spec.cost_of_grads(MatMulAttrs(), ins, outs, (True, False)) == \
        OpCost(2 * 8 * 32 * 16, a + b + y, 2 * 8 * 32 * 16, y + b + 2 * a, 1, 1)
    assert spec.cost_of_grads(MatMulAttrs(), ins, outs, (True, True)) == spec.cost(MatMulAttrs(), ins, outs)
    # A Conv reading the image: dW (the image unfolded again, a product per image, their
    # sum) and the bias' reduction, no dX.
    conv = ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    x, w, y, bias = 4 * 2 * 3 * 8 * 8, 4 * 4 * 3 * 3 * 3, 4 * 2 * 4 * 8 * 8, 4 * 4
    cols, padded = 4 * 2 * 27 * 64, 4 * 2 * 3 * 10 * 10
    unfold = x + padded + 2 * cols
    ins = (T(2, 3, 8, 8), T(4, 3, 3, 3), T(4))
    outs = spec_of(conv).infer(conv, ins)
    flops = 2 * (2 * 4 * 8 * 8) * 27
    assert spec_of(conv).cost_of_grads(conv, ins, outs, (False, True, True)) == \
        OpCost(flops, cols + w + y, flops, y + cols + 2 * w, 1, 1) \
        .followed_by(OpCost(0, unfold, 0, unfold + 2 * 2 * w)) \
        .followed_by(OpCost(2 * 4 * 8 * 8, 2 * y + bias, 2 * 4 * 8 * 8, y + bias))


def test_gemm_with_its_bias():
    # [8,16] x [32,16]^T + b[32]: the product as MatMul prices it, then the add of b as
    # an Add prices it (reads Y and b, writes Y), a pass of its own in the same call.
    a, w, y, b = 4 * 8 * 16, 4 * 32 * 16, 4 * 8 * 32, 4 * 32
    product = OpCost(2 * 8 * 16 * 32, a + w + y, 2 * 2 * 8 * 16 * 32, 2 * (a + w + y) + a + w)
    add = OpCost(8 * 32, y + b + y, 2 * 8 * 32, 2 * (y + b + y))
    assert cost(GemmAttrs(trans_b=True), T(8, 16), T(32, 16), T(32)) == product.followed_by(add)


@pytest.mark.parametrize("rows", [8, 4096])
def test_a_gemm_costs_its_matmul_and_add_less_the_adds_launches(rows):
    # The runtime runs a Gemm's bias add after its product (and a fused activation after
    # that), so each pass is timed on its own roofline and added: a compute-bound product
    # does not hide a memory-bound add. All that fusing saves is the add's launches.
    from unity_cli.cluster import load_cluster
    from unity_cli.cost.compute import roofline
    from unity_cli.ir.dtypes import DType
    repo = Path(__file__).resolve().parents[2]
    for spec in ("dgx-a100-8.yaml", "local-cpu.yaml"):
        device = load_cluster(repo / "cluster_specs" / spec).nodes[0].device
        t = {k: roofline(c, device, DType.FLOAT32) for k, c in (
            ("gemm", cost(GemmAttrs(activation="Relu"), T(rows, 512), T(512, 512), T(512))),
            ("matmul", cost(MatMulAttrs(), T(rows, 512), T(512, 512))),
            ("add", cost(BinaryAttrs("Add"), T(rows, 512), T(512))),
            ("relu", cost(UnaryAttrs("Relu"), T(rows, 512))))}
        launches = 2 * device.launch_overhead, 4 * device.launch_overhead
        assert t["gemm"].fwd == pytest.approx(t["matmul"].fwd + t["add"].fwd + t["relu"].fwd - launches[0])
        assert t["gemm"].bwd == pytest.approx(t["matmul"].bwd + t["add"].bwd + t["relu"].bwd - launches[1])


def test_conv():
    # 2x3x8x8 with 4 filters of 3x3x3, pad 1: 2*4*8*8 outputs of 27 multiply-adds, a product
    # of W and the unfolded image (cols: each of the 9 offsets' 3x8x8 slices, per image).
    x, w, y = 4 * 2 * 3 * 8 * 8, 4 * 4 * 3 * 3 * 3, 4 * 2 * 4 * 8 * 8
    cols, padded = 4 * 2 * 27 * 64, 4 * 2 * 3 * 10 * 10
    flops = 2 * (2 * 4 * 8 * 8) * 27
    product = OpCost(flops, cols + w + y, 2 * flops, 2 * (cols + w + y) + cols + w)
    # Forward pads (reads x, writes the padded image) and unfolds (reads the slices, writes
    # cols); backward unfolds again for dW and sums the two images' products, and adds dX's
    # unfolded gradient slice by slice into a zeroed padded gradient (reads the slice, reads
    # and writes the gradient).
    unfold = x + padded + 2 * cols
    passes = OpCost(0, unfold, 0, unfold + 2 * 2 * w + padded + 3 * cols)
    assert cost(ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)), T(2, 3, 8, 8), T(4, 3, 3, 3)) == \
        product.followed_by(passes)
    # Without pads there is no padded copy; a 1x1 conv still copies its one slice.
    one = cost(ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1)), T(2, 3, 8, 8), T(4, 3, 1, 1))
    assert one.then[0].fwd_bytes == 2 * x


@pytest.mark.parametrize("fn,per", [("Relu", 1), ("Gelu", 24), ("Sigmoid", 8), ("Softsign", 3)])
def test_unary_streams_once(fn, per):
    # Reads and writes 32 floats; its flops per element (a compare; erf's polynomial and
    # the products around it; an exp, an add, a divide; an abs, an add, a divide); backward
    # twice of each.
    n = 4 * 8
    assert UNARY[fn].flops == per
    assert cost(UnaryAttrs(fn), T(4, 8)) == OpCost(per * n, 8 * n, 2 * per * n, 16 * n)


def test_a_broadcast_add_reads_the_small_operand_once():
    assert cost(BinaryAttrs("Add"), T(4, 8), T(8)) == OpCost(32, 4 * (32 + 8 + 32), 64, 2 * 4 * (32 + 8 + 32))


def test_softmax_and_layernorm():
    assert cost(SoftmaxAttrs(1), T(4, 8)) == OpCost(10 * 32, 4 * 64, 20 * 32, 8 * 64)
    # (LayerNorm's scale and bias, 2 x 8 floats, are not counted: a tenth of its bytes here.)
    assert cost(LayerNormAttrs(1), T(4, 8), T(8), T(8)) == OpCost(8 * 32, 4 * 64, 20 * 32, 4 * 160)


def test_gather_reads_only_the_rows_it_takes():
    # 20 ids (int64) into a 100x16 table: reads 20 rows, not the table; writes 20 rows.
    rows = 20 * 16 * 4
    assert cost(GatherAttrs(0), T(100, 16), T(4, 5, dtype=DType.INT64)) == \
        OpCost(0, rows + 20 * 8 + rows, 20 * 16, 2 * (rows + 20 * 8 + rows))


def test_reduce_and_data_movement():
    assert cost(ReduceAttrs("mean", (1,)), T(4, 8)) == OpCost(32, 4 * (32 + 4), 64, 8 * (32 + 4))
    assert cost(TransposeAttrs((1, 0)), T(4, 8)) == OpCost(0, 4 * 64, 0, 4 * 64)
    # Concat copies forward and hands out views of the gradient backward; Split the reverse.
    assert cost(ConcatAttrs(1), T(4, 8), T(4, 8)) == OpCost(0, 4 * 128, 0, 0)
    assert cost(SplitAttrs(1, (4, 4)), T(4, 8)) == OpCost(0, 0, 0, 4 * 64)
    assert cost(ReshapeAttrs((8, 4)), T(4, 8)) == OpCost(0, 0, 0, 0, kernels=0)   # a view: no kernel
