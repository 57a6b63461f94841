"""The machine-mapping DP prices a node with the cost model's own function: on the graph it
maps, its objective's communication is, node by node, what ``estimate`` charges."""
from __future__ import annotations

import pytest
from search.test_mapping import random_pcg, stacked

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.shapes import TensorShape
from unity_cli.search.mapping import Mapper
from unity_cli.search.views import default_views


def megatron_pair(d: int):
    """Column- then row-parallel MatMuls, a Reduction -> Replicate (one all-reduce when the
    DP maps both ends alike), a replicated weight read by a data-parallel MatMul."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((16, 32))), (), "x")
    w1, w2, w3 = (b.add1(WeightAttrs(TensorShape((32, 32))), (), f"w{k}") for k in range(3))
    h = b.add1(MatMulAttrs(), (b.add1(ReplicateAttrs(d), (x,)), b.add1(RepartitionAttrs(1, d), (w1,))))
    y = b.add1(MatMulAttrs(), (b.add1(UnaryAttrs("Relu"), (h,)), b.add1(RepartitionAttrs(0, d), (w2,))))
    y = b.add1(ReplicateAttrs(d), (b.add1(ReductionAttrs(d), (y,)),))
    z = b.add1(MatMulAttrs(), (y, b.add1(ReplicateAttrs(d), (w3,))))
    return b.build([b.add1(UnaryAttrs("Tanh"), (z,))])


GRAPHS = [("random3", lambda: random_pcg(3, 8)), ("random5", lambda: random_pcg(5, 4)), ("stacked", lambda: stacked(3)),
          ("megatron4", lambda: megatron_pair(4)), ("megatron8", lambda: megatron_pair(8))]


@pytest.mark.parametrize("spec, devices", [("dgx-a100-8", 8), ("dgx-a100-32", 16)])
@pytest.mark.parametrize("name, make", GRAPHS, ids=[g for g, _ in GRAPHS])
def test_dp_objective_and_estimate_agree(cluster_dir, spec, devices, name, make):
    cluster = load_cluster(cluster_dir / f"{spec}.yaml").first(devices)
    g = make()
    m = Mapper(g, cluster, CostConfig())
    _, views = m.run()
    report = estimate(g, views, cluster, CostConfig())
    dp_comm = est_comm = 0.0
    for i in m.nodes:
        mine = m.node_cost(i, views[i], dict(enumerate(views)))
        theirs = report.nodes[i]
        assert (mine.comm_fwd, mine.comm_bwd, mine.grad_sync, mine.comm_loss) == \
            (theirs.comm_fwd, theirs.comm_bwd, theirs.grad_sync, theirs.comm_loss), (i, g.nodes[i].kind)
        assert mine.total == theirs.total
        dp_comm += mine.comm
        est_comm += theirs.comm
    assert dp_comm == est_comm > 0


def test_a_weight_read_off_its_device_costs_in_both(cluster_dir):
    """A Replicate of a weight placed on other devices than the MatMul reading it: the DP and
    the step simulation both charge the reads (the DP used to charge a copy, the step
    simulation nothing)."""
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    g = megatron_pair(4)
    views = list(default_views(g))
    w3 = next(i for i, n in g if n.kind == "Replicate" and g.nodes[n.inputs[0].node].kind == "Weight")
    views[w3] = type(views[w3])(4, views[w3].strides)         # its copies on devices 4-7, the MatMul on 0-3
    reader = next(u for u, _ in g.consumers[w3])
    report = estimate(g, views, cluster, CostConfig())
    m = Mapper(g, cluster, CostConfig())
    mine = m.node_cost(reader, views[reader], dict(enumerate(views)))
    assert report.nodes[reader].comm_fwd > 0 and report.nodes[reader].comm_bwd > 0
    assert mine == report.nodes[reader]
