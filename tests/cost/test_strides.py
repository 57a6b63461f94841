"""On a CPU the runtime's transposes are views and numpy keeps a permuted layout through
elementwise results, so a copy is made only where a Reshape reads a tensor it cannot
regroup in place (cost/strides.py). Checked against numpy itself: random programs of
transposes, splits, strided slices, activations, sums, softmax and reshapes run through the runtime's
kernels, and a Reshape copies exactly where the analysis says; then the prices follow."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.cost.strides import copying_reshapes
from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.norm import SoftmaxAttrs
from unity_cli.ir.ops.shape_ops import ReshapeAttrs, SliceAttrs, SplitAttrs, TransposeAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import PCG, GraphBuilder, TensorRef
from unity_cli.ir.shapes import TensorShape
from unity_cli.kernels import forward
from unity_cli.search.views import default_views

REPO = Path(__file__).resolve().parents[2]


def _random_program(rng: np.random.Generator, steps: int) -> PCG:
    b = GraphBuilder()
    live = [b.add1(InputAttrs(TensorShape((2, 3, 4, 5))), name="x")]
    for k in range(steps):
        x = live[int(rng.integers(len(live)))]
        sizes = b.shape(x).sizes
        rank = len(sizes)
        choice = rng.choice(["transpose", "relu", "add", "softmax", "reshape", "split", "slice"])
        if choice == "transpose":
            op, ins = TransposeAttrs(tuple(int(p) for p in rng.permutation(rank))), [x]
        elif choice == "relu":
            op, ins = UnaryAttrs("Relu"), [x]
        elif choice == "add":
            same = [y for y in live if b.shape(y).sizes == sizes]
            op, ins = BinaryAttrs("Add"), [x, same[int(rng.integers(len(same)))]]
        elif choice == "softmax":
            op, ins = SoftmaxAttrs(rank - 1), [x]
        elif choice == "split":
            axis = int(rng.integers(rank))
            if sizes[axis] < 2:
                continue
            cut = int(rng.integers(1, sizes[axis]))
            op, ins = SplitAttrs(axis, (cut, sizes[axis] - cut)), [x]
        elif choice == "slice":   # every other index of one dim, or its first part
            axis = int(rng.integers(rank))
            if sizes[axis] < 2:
                continue
            cut = (0, sizes[axis], 2) if rng.random() < 0.5 else (0, sizes[axis] - 1, 1)
            op, ins = SliceAttrs(tuple(cut if d == axis else (0, n, 1) for d, n in enumerate(sizes))), [x]
        else:    # merge two neighbouring dims, or split one back into its factors
            if rank > 2 and rng.random() < 0.7:
                j = int(rng.integers(rank - 1))
                dims = sizes[:j] + (sizes[j] * sizes[j + 1],) + sizes[j + 2:]
            else:
                dims = tuple(f for d in sizes for f in ((d // 2, 2) if d % 2 == 0 and d > 2 else (d,)))
            op, ins = ReshapeAttrs(dims), [x]
        refs = b.add(op, ins, name=f"n{k}")
        live.extend(refs)
    return b.build([live[-1]])


def _run(pcg: PCG, rng: np.random.Generator) -> dict[TensorRef, np.ndarray]:
    values: dict[TensorRef, np.ndarray] = {}
    for i, n in pcg:
        if n.spec.is_source:
            outs = [rng.standard_normal(n.outputs[0].sizes).astype(np.float32)]
        else:
            outs, _ = forward(n.op, [values[r] for r in n.inputs], np)
        for k, v in enumerate(outs):
            values[TensorRef(i, k)] = v
    return values


@pytest.mark.parametrize("seed", range(40))
def test_a_reshape_copies_exactly_where_numpy_copies(seed):
    rng = np.random.default_rng(seed)
    pcg = _random_program(rng, 14)
    values = _run(pcg, rng)
    copied = {i for i, n in pcg if isinstance(n.op, ReshapeAttrs)
              and not np.shares_memory(values[TensorRef(i)], values[n.inputs[0]])}
    assert copying_reshapes(pcg) == copied


def _attention_heads(permute_back: bool) -> PCG:
    """[b, s, h*d] -> heads [b, h, s, d] -> an activation -> back to [b, s, h*d] (the
    exporters' attention), or the heads put back in place before the merge."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 64, 256))), name="x")
    w = b.add1(WeightAttrs(TensorShape((256, 256))), name="w")
    y = b.add1(MatMulAttrs(), [x, w], name="proj")
    heads = b.add1(ReshapeAttrs((4, 64, 8, 32)), [y], name="split_heads")
    t = b.add1(TransposeAttrs((0, 2, 1, 3)), [heads], name="to_heads")
    r = b.add1(UnaryAttrs("Relu"), [t], name="act")
    if permute_back:
        r = b.add1(TransposeAttrs((0, 2, 1, 3)), [r], name="from_heads")
    return b.build([b.add1(ReshapeAttrs((4, 64, 256)), [r], name="merge")])


def _seconds(pcg: PCG, cluster) -> dict[str, tuple[float, float]]:
    report = estimate(pcg, default_views(pcg), cluster, CostConfig())
    return {pcg.nodes[c.node].name: (c.compute_fwd, c.compute_bwd) for c in report.nodes}


def test_on_a_cpu_the_transpose_is_its_dispatch_and_the_reshape_that_copies_pays_the_copy():
    cpu = load_cluster(REPO / "cluster_specs" / "local-cpu.yaml")
    device = cpu.nodes[0].device
    moved = 2 * 4 * 64 * 256 * 4     # the merge reads the permuted heads and writes them in order
    merged = _attention_heads(permute_back=False)
    assert copying_reshapes(merged) == {i for i, n in merged if n.name == "merge"}
    t = _seconds(merged, cpu)
    assert t["to_heads"] == pytest.approx((device.launch_overhead, 2 * device.launch_overhead))
    assert t["merge"] == pytest.approx((device.launch_overhead + moved / device.memory_bandwidth, 0.0))   # out of order
    assert t["split_heads"] == (0.0, 0.0)
    # The heads put back in place: nothing to copy, and the two transposes cost dispatches.
    back = _attention_heads(permute_back=True)
    assert copying_reshapes(back) == set()
    assert _seconds(back, cpu)["merge"] == (0.0, 0.0)


def test_on_a_gpu_a_transpose_is_still_priced_as_the_copy_its_reader_makes():
    gpu = load_cluster(REPO / "cluster_specs" / "dgx-a100-8.yaml")
    device = gpu.nodes[0].device
    moved = 2 * 4 * 64 * 256 * 4
    t = _seconds(_attention_heads(permute_back=False), gpu)
    assert t["to_heads"][0] == pytest.approx(device.launch_overhead + moved / device.memory_bandwidth)
    assert t["merge"] == (0.0, 0.0)


def test_the_cache_prices_a_small_pass_at_its_bandwidth_and_a_large_one_at_memorys():
    cpu = load_cluster(REPO / "cluster_specs" / "local-cpu.yaml")
    device = cpu.nodes[0].device
    assert 0 < device.cache_capacity and device.cache_bandwidth > device.memory_bandwidth

    def relu_seconds(numel: int) -> float:
        b = GraphBuilder()
        x = b.add1(InputAttrs(TensorShape((numel,))), name="x")
        g = b.build([b.add1(UnaryAttrs("Relu"), [x], name="r")])
        return _seconds(g, cpu)["r"][0] - device.launch_overhead

    fits = device.cache_capacity // 8          # a relu reads and writes 4 bytes an element
    over = fits + 1
    assert relu_seconds(fits) == pytest.approx(8 * fits / device.cache_bandwidth)
    assert relu_seconds(over) == pytest.approx(8 * over / device.memory_bandwidth)
    assert math.isclose(device.bandwidth(0), device.memory_bandwidth)


def test_a_transposed_weight_pays_backward_the_copy_of_its_gradient():
    """Backward, a Transpose of a weight hands the weight its gradient as a transposed
    view, which the sync's buffer copy reads out of order: the Transpose pays that copy
    backward, at memory's bandwidth (no cache serves an out-of-order read). A Transpose of
    an activation, whose gradient an elementwise backward reads in any order, does not."""
    from unity_cli.ir.ops.elementwise import BinaryAttrs

    cpu = load_cluster(REPO / "cluster_specs" / "local-cpu.yaml")
    device = cpu.nodes[0].device
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((64, 256))), name="x")
    w = b.add1(WeightAttrs(TensorShape((128, 256))), name="w")
    wt = b.add1(TransposeAttrs((1, 0)), [w], name="wt")
    y = b.add1(MatMulAttrs(), [x, wt], name="mm")
    yt = b.add1(TransposeAttrs((1, 0)), [y], name="yt")
    g = b.build([b.add1(BinaryAttrs("Add"), [yt, yt], name="out")])
    t = _seconds(g, cpu)
    moved = 2 * 128 * 256 * 4
    launch = device.launch_overhead
    assert t["wt"] == pytest.approx((launch, 2 * launch + moved / device.memory_bandwidth))
    assert t["yt"] == pytest.approx((device.launch_overhead, 2 * device.launch_overhead))
