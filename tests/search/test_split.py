"""Graph splitting: segments are bounded and cut where the fewest activations cross,
stitching the untouched segments back gives the original graph, identical layers are
solved once, and the segment-wise search gives a valid plan no slower than its starts."""
from __future__ import annotations

import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.ir import GraphBuilder, TensorShape
from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.validate import validate
from unity_cli.search.segments import boundary_layouts, search_segments
from unity_cli.search.split import live_counts, segment_graph, split, stitch
from unity_cli.search.views import default_views
from unity_cli.substitutions.cache import load_cache


def residual_stack(layers: int, batch: int = 64, width: int = 256, mask: bool = False):
    """``layers`` identical blocks x + W2 relu(W1 x) (4 compute nodes each); with ``mask``
    every block also reads one side tensor computed at the start (like an attention mask)."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((batch, width))), name="x")
    side = b.add1(UnaryAttrs("Sigmoid"), [x], name="side") if mask else None
    for k in range(layers):
        w1 = b.add1(WeightAttrs(TensorShape((width, 4 * width))), name=f"l{k}.w1")
        w2 = b.add1(WeightAttrs(TensorShape((4 * width, width))), name=f"l{k}.w2")
        h = b.add1(MatMulAttrs(), [x, w1], name=f"l{k}.fc1")
        h = b.add1(UnaryAttrs("Relu"), [h], name=f"l{k}.relu")
        h = b.add1(MatMulAttrs(), [h, w2], name=f"l{k}.fc2")
        if side is not None:
            h = b.add1(BinaryAttrs("Mul"), [h, side], name=f"l{k}.mask")
        x = b.add1(BinaryAttrs("Add"), [x, h], name=f"l{k}.res")
    g = b.build([x])
    validate(g)
    return g


def test_segments_are_bounded_and_partition_the_compute_nodes():
    g = residual_stack(10)
    segs = split(g, 8)
    assert len(segs) > 1
    nodes = [n for s in segs for n in s.nodes]
    assert sorted(nodes) == [i for i, n in g if not n.spec.is_source]
    assert all(len(s.nodes) <= 8 for s in segs)
    assert all(len(s.nodes) >= 4 for s in segs[:-1])


def test_cuts_fall_on_post_dominators():
    """Between two residual blocks only the residual stream is live: every cut crosses one tensor."""
    g = residual_stack(10)
    order = [i for i, n in g if not n.spec.is_source]
    live = live_counts(g, order)
    for s in split(g, 8)[1:]:
        assert live[order.index(s.nodes[0])] == 1
        assert len(s.inputs) == 1 and g.nodes[s.inputs[0].node].kind == "Binary"


def test_a_side_tensor_read_by_every_layer_crosses_every_cut():
    g = residual_stack(6, mask=True)
    segs = split(g, 10)
    assert len(segs) > 1
    for s in segs[1:]:
        assert len(s.inputs) == 2  # the residual stream and the mask: the narrowest cut there is


def test_stitching_untouched_segments_gives_the_original_graph():
    g = residual_stack(6, mask=True)
    parts = []
    for s in split(g, 10):
        info = segment_graph(g, s, None)  # unpartitioned boundaries: the segment is valid as it is
        parts.append((info, info.pcg))
    again = stitch(g, parts)
    validate(again)
    assert again.canonical_hash == g.canonical_hash
    assert sorted(n.name for _, n in again) == sorted(n.name for _, n in g)


@pytest.fixture(scope="module")
def rules():
    return load_cache().rules


def test_identical_layers_are_solved_once(cluster_dir, rules):
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    g = residual_stack(12)
    found, stats = search_segments(g, cluster, CostConfig(), rules, budget=20.0, alpha=1.05, batch=64,
                                   max_candidates=600, max_nodes=8)
    assert stats.segments == 6
    layouts = len(boundary_layouts(cluster, 64))
    # the first segment (no boundary in) once per layout out, the four in between once per pair
    # of layouts; the last (no boundary out) is the same problem as a middle one ending whole
    assert stats.segment_problems == layouts + layouts * layouts
    assert found is not None
    validate(found.pcg)
    report = estimate(found.pcg, default_views(found.pcg), cluster, CostConfig())
    assert report.feasible
    # The DP minimizes the sum of the segments' times, which is the step time but for the
    # overlap between segments and each segment's own loss, so it is only a start for the
    # whole-graph search: here within 1 % of the plain graph (a wrong stitch is far off).
    assert report.step_time <= estimate(g, default_views(g), cluster, CostConfig()).step_time * 1.01
    # every layer's weights are still there, once
    weights = sorted(n.name for _, n in found.pcg if n.kind == "Weight")
    assert weights == sorted(n.name for _, n in g if n.kind == "Weight")


def test_small_graphs_are_not_split(cluster_dir, rules):
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    found, stats = search_segments(residual_stack(2), cluster, CostConfig(), rules, budget=5.0, alpha=1.05,
                                   batch=64, max_nodes=48)
    assert found is None and stats.segments == 0
