"""The machine-mapping DP finds the optimum of its objective: it equals an exhaustive
search on random small PCGs (devices 2, 4, 8 on one node; 8 and 16 on two nodes)."""
from __future__ import annotations

import random

import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig
from unity_cli.ir import GraphBuilder, TensorShape
from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import CombineAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.validate import validate
from unity_cli.search.mapping import Mapper, dp_map, exhaustive_map
from unity_cli.search.sp import Leaf, Parallel, Series, decompose


def random_pcg(seed: int, max_degree: int):
    """A small random graph of MatMul/Add/Relu branches with random data-parallel degrees."""
    rng = random.Random(seed)
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((16, 16))), name="x")
    branches = []
    for k in range(rng.randint(1, 2)):
        d = rng.choice([g for g in (1, 2, 4, 8) if g <= max_degree])
        h = b.add1(RepartitionAttrs(0, d), [x]) if d > 1 else x
        w = b.add1(WeightAttrs(TensorShape((16, 16))), name=f"w{k}")
        if d > 1:
            w = b.add1(ReplicateAttrs(d), [w])
        h = b.add1(MatMulAttrs(), [h, w])
        if rng.random() < 0.6:
            h = b.add1(UnaryAttrs("Relu"), [h])
        if d > 1:
            h = b.add1(CombineAttrs(0, d), [h])
        branches.append(h)
    out = branches[0]
    for h in branches[1:]:
        out = b.add1(BinaryAttrs("Add"), [out, h])
    g = b.build([out])
    validate(g)
    return g


CLUSTERS = [("dgx-a100-8", 2), ("dgx-a100-8", 4), ("dgx-a100-8", 8), ("dgx-a100-32", 16)]


@pytest.mark.parametrize("spec, devices", CLUSTERS)
@pytest.mark.parametrize("seed", range(6))
def test_dp_equals_exhaustive(cluster_dir, spec, devices, seed):
    cluster = load_cluster(cluster_dir / f"{spec}.yaml").first(devices)
    g = random_pcg(seed * 31 + devices, devices)
    dp_cost, views = dp_map(g, cluster)  # small graphs stay within the state budget
    assert dp_cost == pytest.approx(exhaustive_map(g, cluster), rel=1e-12)
    for i, n in g:  # the views it returns are real views of the cluster
        assert all(0 <= d < devices for d in views[i].devices(n.outputs[0]))


def test_two_nodes_are_split_by_node(cluster_dir):
    cluster = load_cluster(cluster_dir / "dgx-a100-32.yaml").first(16)
    g = random_pcg(3, 8)
    m = Mapper(g, cluster)
    cost, _ = m.run()
    assert cost == pytest.approx(exhaustive_map(g, cluster))
    assert m.states > 0


def test_decomposition_covers_every_node_once():
    g = random_pcg(5, 4)

    def leaves(t):
        match t:
            case Leaf(node=i):
                return [i]
            case Series(first=a, then=b) | Parallel(left=a, right=b):
                return leaves(a) + leaves(b)

    assert sorted(leaves(decompose(g))) == list(range(len(g)))


def stacked(blocks: int):
    """``blocks`` identical data-parallel Linear+Relu layers in a row."""
    b = GraphBuilder()
    h = b.add1(RepartitionAttrs(0, 4), [b.add1(InputAttrs(TensorShape((16, 16))), name="x")])
    for k in range(blocks):
        w = b.add1(ReplicateAttrs(4), [b.add1(WeightAttrs(TensorShape((16, 16))), name=f"w{k}")])
        h = b.add1(UnaryAttrs("Relu"), [b.add1(MatMulAttrs(), [h, w])])
    return b.build([h])


class _NoSharing(Mapper):
    """The same DP with its memo keyed by subtree identity instead of structure."""

    def signature(self, t):
        _, order, where = super().signature(t)
        return str(id(t)), order, where


def test_repeated_layers_are_solved_once(cluster_dir):
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    g = stacked(8)
    shared, alone = Mapper(g, cluster), _NoSharing(g, cluster)
    cost_shared, _ = shared.run()
    cost_alone, _ = alone.run()
    assert cost_shared == pytest.approx(cost_alone)  # same optimum...
    assert shared.states < 0.6 * alone.states, (shared.states, alone.states)  # ...for far less work
    small = stacked(2)
    assert dp_map(small, cluster)[0] == pytest.approx(exhaustive_map(small, cluster))


def test_mapping_cache_tells_equal_graphs_in_another_order_apart(cluster_dir):
    """A mapping is by node position: the same graph built in another order (same canonical
    hash) must not reuse it. It did, and `optimize` failed on bert_tiny with "view has 5
    strides for 4 parallel axes" once two searches returned such a pair."""
    from unity_cli.search.baselines import data_parallel  # noqa: PLC0415
    from unity_cli.search.optimize import evaluate  # noqa: PLC0415

    def build(order: str):
        b, outs = GraphBuilder(), {}
        for part in order:
            if part == "A":
                x = b.add1(InputAttrs(TensorShape((8, 16))), (), "x")
                w = b.add1(WeightAttrs(TensorShape((16, 4))), (), "w")
                outs["a"] = b.add1(MatMulAttrs(), (x, w), "mm")
            else:
                y = b.add1(InputAttrs(TensorShape((8, 4, 2))), (), "y")
                outs["b"] = b.add1(UnaryAttrs("Relu"), (y,), "relu")
        return b.build([outs["a"], outs["b"]])

    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    first, second = build("AB"), build("BA")
    assert first.canonical_hash == second.canonical_hash
    cache: dict = {}
    for g in (first, second):
        c = evaluate(data_parallel(g, cluster), cluster, CostConfig(), None, cache)
        for i, n in c.baseline.pcg:
            c.views[i].devices(n.outputs[0])   # each view fits its own node
