"""A compute op that reads pieces held on other devices pays for them.

The audit's case: the zoo MLP (paper scale, batch 2048) on four DGX A100 nodes, tensor
parallel 8 ways inside each node and data parallel 4 ways across them, with each weight's
replicas packed onto consecutive devices (the views the mapping DP picked: a cheap
intra-node gradient all-reduce). Every MatMul then reads its weight piece from another
node, every step. The cost model used to charge nothing for those reads and priced the
plan at 24 ms, ten times faster than the default views; it now charges what the runtime
moves, and the plan is slower than the default one.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, CostContext, estimate, node_cost_and_moves
from unity_cli.cost.moves import p2p_seconds, sent_per_device
from unity_cli.ir.machine_view import packed_view
from unity_cli.ir.schedule import LOCAL, layout_sources, read_shape, trainable
from unity_cli.onnx_import.convert import ImportOptions, import_model_proto
from unity_cli.runtime.program import StepKind, build_program
from unity_cli.search.baselines import tensor_parallel
from unity_cli.search.views import default_views
from unity_cli.zoo import build

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan():
    cluster = load_cluster(REPO / "cluster_specs" / "dgx-a100-32.yaml")
    pcg = import_model_proto(build("mlp", "paper", 2048).model, ImportOptions(2048)).pcg
    g = tensor_parallel(pcg, cluster).pcg
    layout = layout_sources(g)
    views = list(default_views(g))
    packed = 0
    for i, n in g:
        if n.kind == "Replicate" and layout[i] is not None and trainable(g, layout, i):
            r = n.outputs[0].rank
            views[i] = packed_view(n.outputs[0], [r + 1, r] + list(range(r - 1, -1, -1)))  # replicas innermost
            packed += 1
    assert packed >= 8
    return g, tuple(views), cluster


def test_remote_weight_reads_are_priced(plan):
    g, views, cluster = plan
    packed = estimate(g, views, cluster, CostConfig())
    default = estimate(g, default_views(g), cluster, CostConfig())
    assert packed.step_time > default.step_time         # it was 24 ms against 241 ms
    assert packed.comm_time > 0.15                      # it was 4.6 ms


def test_the_reads_cost_what_the_runtime_moves(plan):
    """Each compute node's communication is its reads as the runtime's program makes them:
    forward, the pieces it reads from other devices; backward, their gradients sent back."""
    g, views, cluster = plan
    ctx = CostContext.of(g, cluster, CostConfig())
    prog = build_program(g, views, 1)
    itemsize = 4
    read_bytes = [0] * cluster.num_devices
    compute = 0
    for s in prog.steps:
        if s.kind is not StepKind.COMPUTE:
            continue
        msgs = [(rd.src, t.rank, math.prod(read_shape(g, rd)) * itemsize)
                for t in s.tasks for rd in t.reads if rd.src not in (LOCAL, t.rank)]
        cost, moves = node_cost_and_moves(ctx, s.node, views)
        fwd = [m for m in moves if m.phase == "fwd"]
        assert sorted((m.group[0], m.group[1], m.nbytes) for m in fwd) == sorted(msgs)
        assert cost.comm_fwd == pytest.approx(p2p_seconds(fwd, cluster))
        for src, _, nb in msgs:
            read_bytes[src] += nb
        compute += bool(msgs)
        bwd = [m for m in moves if m.phase == "bwd"]
        assert sorted((m.group[1], m.group[0], m.nbytes) for m in bwd) == sorted(msgs)  # gradients go back
        for _, dst, nb in msgs:
            read_bytes[dst] += nb
    assert compute >= 8
    assert max(read_bytes) > 400e6                      # the audit's ~480 MB per device, and more
    total = estimate(g, views, cluster, CostConfig()).comm_bytes
    assert all(t >= r for t, r in zip(total, read_bytes))
    assert list(total) == [round(b) for b in sent_per_device(
        (m for i in range(len(g)) for m in node_cost_and_moves(ctx, i, views)[1]), cluster.num_devices)]
