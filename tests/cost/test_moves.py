"""Bytes predicted = bytes sent: for many plans, the bytes the cost model predicts each
device sends per step (``cost.moves``) equal, exactly, the bytes every rank's program sends
(``runtime.planned.planned_sent``: the calls the executor makes, counted by the code the
runtime counts its real calls with). Plans: random machine views over hand-built graphs
with every parallel op, the baselines (default and mapped views, and random views), and
searched plans; 2-6 devices on one or two nodes. No MPI: the programs are built, not run."""
from __future__ import annotations

import random
from fractions import Fraction

import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cluster.collectives import Collective, sent_bytes
from unity_cli.cost.model import CostConfig, estimate, weight_syncs
from unity_cli.cost.moves import Structure, moves_of, node_moves, sent_per_device
from unity_cli.errors import PlanError
from unity_cli.ir.buckets import sync_buckets
from unity_cli.ir.machine_view import MachineView, check_view, parallel_axes
from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.shapes import TensorShape
from unity_cli.ir.training import Training
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.planned import planned_sent
from unity_cli.runtime.program import build_program
from unity_cli.runtime.weights import weight_syncs as runtime_weight_syncs
from unity_cli.search.baselines import STRATEGIES
from unity_cli.search.mapping import dp_map
from unity_cli.search.views import default_views

SHAPES = [(1, 2), (1, 3), (1, 4), (1, 6), (2, 1), (2, 2), (2, 3)]   # nodes x devices per node

COUNT = {"plans": 0, "checks": 0}
RAN: set[str] = set()       # this file's tests run in this process (test_coverage reads it)


@pytest.fixture(autouse=True)
def _ran(request):
    yield
    RAN.add(request.node.nodeid)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory, cluster_dir):
    """local-cpu with 1-2 nodes of 1-6 cores, the nodes joined by a slower link."""
    text = (cluster_dir / "local-cpu.yaml").read_text()
    out = {}
    for nodes, per in SHAPES:
        path = tmp_path_factory.mktemp("clusters") / f"cpu-{nodes}x{per}.yaml"
        body = text.replace("count: 1", f"count: {nodes}").replace("devices: 2", f"devices: {per}")
        path.write_text(body.replace("name: local-cpu", f"name: cpu-{nodes}x{per}") +
                        "inter_node_link:\n  bandwidth: 1 GB/s\n  latency: 10 us\n")
        out[(nodes, per)] = load_cluster(path)
    return out


def losses(pcg) -> tuple[str, ...]:
    out = pcg.shape(pcg.outputs[0])
    return ("cross_entropy", "mse") if out.rank >= 2 and out.sizes[-1] >= 2 else ("mse",)


def assert_bytes_equal(pcg, views, n: int) -> None:
    """Predicted == sent, per device, for each loss the runtime may train with."""
    COUNT["plans"] += 1
    for loss in losses(pcg):
        st = Structure.of(pcg, n, loss)
        try:
            prog = build_program(pcg, views, st.class_axis)
        except PlanError:
            return          # a graph the runtime does not run (its output is a constant)
        predicted = sent_per_device(moves_of(st, views), n)
        sent = [planned_sent(prog, r, n).total for r in range(n)]
        assert predicted == sent, (loss, [float(x) for x in predicted], [float(x) for x in sent])
        COUNT["checks"] += 1
    # The gradient sync's buckets the cost model prices are those the runtime runs.
    st = Structure.of(pcg, n)
    priced = weight_syncs(st, [node_moves(st, i, views) for i in range(len(pcg))])
    ran = runtime_weight_syncs(prog)
    for bucket in (0, 1, 64, 4096):
        assert sync_buckets(pcg, priced, bucket) == sync_buckets(pcg, ran, bucket)


def random_view(shape, n: int, rng: random.Random) -> MachineView:
    """A strided view of ``shape``'s pieces on distinct devices of ``n``: axes in a random
    order, sometimes with gaps between them, from a random start."""
    axes = parallel_axes(shape)
    for _ in range(100):
        order = list(range(len(axes)))
        rng.shuffle(order)
        strides, step = [0] * len(axes), 1
        for a in order:
            if axes[a] > 1:
                strides[a] = step
                step *= axes[a] * rng.choice((1, 1, 2))
        span = sum((d - 1) * s for d, s in zip(axes, strides))
        if span < n:
            v = MachineView(rng.randrange(n - span), tuple(strides))
            if check_view(v, shape, n) is None:
                return v
    return MachineView(0, tuple(strides))


def random_views(pcg, n: int, rng: random.Random) -> tuple[MachineView, ...]:
    return tuple(random_view(node.outputs[0], n, rng) for _, node in pcg)


# -- hand-built graphs with every parallel op --------------------------------------------------


def megatron(d: int):
    """x (replicated) @ W1 (columns split) -> Relu -> @ W2 (rows split) -> Reduction -> Replicate
    (an all-reduce pair, when the views agree) -> @ W3 (columns) -> Combine -> Replicate (an
    all-gather pair) -> Combine of replicas."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 12))), (), "x")
    ws = [b.add1(WeightAttrs(TensorShape(s)), (), f"w{k}") for k, s in enumerate([(12, 12), (12, 12), (12, 12)])]
    h = b.add1(MatMulAttrs(), (b.add1(ReplicateAttrs(d), (x,)), b.add1(RepartitionAttrs(1, d), (ws[0],))), "mm1")
    h = b.add1(UnaryAttrs("Relu"), (h,), "relu")
    y = b.add1(MatMulAttrs(), (h, b.add1(RepartitionAttrs(0, d), (ws[1],))), "mm2")
    y = b.add1(ReplicateAttrs(d), (b.add1(ReductionAttrs(d), (y,)),))
    z = b.add1(MatMulAttrs(), (y, b.add1(RepartitionAttrs(1, d), (ws[2],))), "mm3")
    z = b.add1(ReplicateAttrs(d), (b.add1(CombineAttrs(1, d), (z,)),))
    z = b.add1(CombineAttrs(REPLICA_DIM, d), (z,))
    g = b.build([b.add1(UnaryAttrs("Tanh"), (z,), "out")])
    validate(g)
    return g


def data_parallel_mlp(d: int):
    """Batch split d ways, weights replicated; a residual Add; one weight read twice; an op
    on the data alone (no gradient flows back to it)."""
    b = GraphBuilder()
    x = b.add1(RepartitionAttrs(0, d), (b.add1(InputAttrs(TensorShape((2 * d, 8))), (), "x"),))
    x = b.add1(UnaryAttrs("Tanh"), (x,), "data")
    w = b.add1(ReplicateAttrs(d), (b.add1(WeightAttrs(TensorShape((8, 8))), (), "w"),))
    h = b.add1(UnaryAttrs("Relu"), (b.add1(MatMulAttrs(), (x, w), "mm1"),), "relu")
    h = b.add1(BinaryAttrs("Add"), (h, b.add1(MatMulAttrs(), (h, w), "mm2")), "add")
    g = b.build([b.add1(CombineAttrs(0, d), (h,))])
    validate(g)
    return g


def reduce_then_broadcast(d: int):
    """d partial sums reduced onto one device, then replicated to d readers (a reduce and a
    broadcast when d >= 3), read back as partial sums by an elementwise op."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 2 * d))), (), "x")
    w1 = b.add1(WeightAttrs(TensorShape((2 * d, 2 * d))), (), "w1")
    w2 = b.add1(WeightAttrs(TensorShape((2 * d, 6))), (), "w2")
    h = b.add1(MatMulAttrs(), (b.add1(ReplicateAttrs(d), (x,)), b.add1(RepartitionAttrs(1, d), (w1,))), "mm1")
    y = b.add1(MatMulAttrs(), (b.add1(UnaryAttrs("Relu"), (h,)), b.add1(RepartitionAttrs(0, d), (w2,))), "mm2")
    y = b.add1(ReplicateAttrs(d), (b.add1(ReductionAttrs(d), (y,)),))
    y = b.add1(UnaryAttrs("Sigmoid"), (b.add1(CombineAttrs(REPLICA_DIM, d), (y,)),), "out")
    g = b.build([y])
    validate(g)
    return g


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_random_views_of_every_parallel_op(clusters, shape):
    cluster = clusters[shape]
    n = cluster.num_devices
    rng = random.Random(n * 7 + shape[0])
    graphs = [megatron(d) for d in (2, 3, 4, 6) if d <= n] + \
        [f(d) for d in range(2, n + 1) for f in (data_parallel_mlp, reduce_then_broadcast)]
    for g in graphs:
        assert_bytes_equal(g, default_views(g), n)
        for _ in range(6):
            assert_bytes_equal(g, random_views(g, n, rng), n)


STEPS = [Training(0, 2), Training(1, 1), Training(1, 3),
         Training(1, 2, zero_by_weight=(("w1", 3), ("w2", 2))),       # weights kept at different stages
         Training(3, 1, zero_by_weight=(("w0", 0), ("w", 2), ("w[2-9]", 1)))]


@pytest.mark.parametrize("shape", [(1, 2), (1, 3), (2, 2), (2, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_micro_batches_and_zero_send_what_the_step_predicts(clusters, shape):
    """The bytes ``estimate`` predicts for a step of several micro-batches, or under ZeRO
    (the padded reduce-scatter and all-gather of each group's flat buffer; each weight's
    gathers; weights kept at different stages), are the bytes the
    runtime's calls for that step send (``planned_sent`` with the same ``Training``), device
    for device, on random views of every parallel op."""
    cluster = clusters[shape]
    n = cluster.num_devices
    rng = random.Random(17 * n + shape[0])
    graphs = [megatron(d) for d in (2, 3) if d <= n] + [data_parallel_mlp(d) for d in range(2, n + 1)] + \
        [reduce_then_broadcast(n)]
    for g in graphs:
        for views in (default_views(g), random_views(g, n, rng)):
            st = Structure.of(g, n, "mse")
            prog = build_program(g, views, st.class_axis)
            for train in STEPS:
                report = estimate(g, views, cluster, CostConfig(loss="mse", training=train))
                sent = [round(planned_sent(prog, r, n, train).total) for r in range(n)]
                assert list(report.comm_bytes) == sent, (train, report.comm_bytes, sent)
                COUNT["checks"] += 1
            # k micro-batches send k times each one's moves, the sync once
            moves = moves_of(st, views)
            each = sent_per_device([m for m in moves if m.phase != "sync"], n)
            once = sent_per_device([m for m in moves if m.phase == "sync"], n)
            two = estimate(g, views, cluster, CostConfig(loss="mse", training=Training(0, 2)))
            assert list(two.comm_bytes) == [round(2 * a + b) for a, b in zip(each, once)]


# -- baselines and searched plans -------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tiny_models):
    return {name: import_model(tiny_models / f"{name}.onnx", ImportOptions(12)).pcg
            for name in ("bert_tiny", "convnet_tiny")}


@pytest.mark.parametrize("shape", [(1, 2), (1, 3), (1, 4), (2, 2), (2, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_baselines_default_mapped_and_random_views(clusters, models, shape):
    cluster = clusters[shape]
    n = cluster.num_devices
    rng = random.Random(n)
    for name, pcg in sorted(models.items()):
        for _, build in sorted(STRATEGIES.items()):
            g = build(pcg, cluster).pcg
            views = [default_views(g)]
            if name == "convnet_tiny":     # bert_tiny's DP is slow; its default views cover it
                mapped = dp_map(g, cluster, seconds=2.0)
                views += [mapped[1]] if mapped else []
            views.append(random_views(g, n, rng))
            for v in views:
                assert_bytes_equal(g, v, n)


def test_searched_plans(clusters, models):
    from unity_cli.search.optimize import optimize  # noqa: PLC0415
    from unity_cli.substitutions.cache import load_cache  # noqa: PLC0415

    rules = load_cache().rules
    for shape in ((1, 4), (2, 3)):
        cluster = clusters[shape]
        res = optimize(models["convnet_tiny"], cluster, CostConfig(), "unity", rules, budget=60, max_candidates=12)
        for c in res.candidates.values():
            assert_bytes_equal(c.baseline.pcg, c.views, cluster.num_devices)
            # and the step simulation reports the same bytes (for the loss unity run picks)
            rep = estimate(c.baseline.pcg, c.views, cluster, CostConfig())
            st = Structure.of(c.baseline.pcg, cluster.num_devices)
            assert list(rep.comm_bytes) == [round(b) for b in sent_per_device(moves_of(st, c.views),
                                                                              cluster.num_devices)]
            assert rep.comm_bytes == c.report.comm_bytes


def test_coverage(request):
    """The property held for this many plans (by the tests of this file above this one)."""
    items = request.session.items
    before = {i.nodeid for i in items[:items.index(request.node)] if getattr(i, "module", None) is request.module}
    if not before or not before <= RAN:    # (selected alone, or xdist spread the file's tests over workers)
        pytest.skip("counts only after the tests of this file above it ran in this process")
    assert COUNT["plans"] >= 300 and COUNT["checks"] >= 500, COUNT


# -- the convention -------------------------------------------------------------------------------


def test_the_convention_adds_up():
    """Per member: a ring all-reduce sends 2(g-1)/g of the buffer, an all-gather (g-1)
    pieces; a binomial-tree broadcast sends g-1 copies in all (the root ceil(log2 g)), a
    reduce one per member but the root."""
    for g in range(2, 9):
        group = tuple(range(10, 10 + g))
        assert sent_bytes(Collective.ALL_REDUCE, 96, group, 10) == Fraction(2 * (g - 1) * 96, g)
        assert sent_bytes(Collective.ALL_GATHER, 96, group, 11) == (g - 1) * 96
        for root in group:
            bcast = [sent_bytes(Collective.BROADCAST, 5, group, r, root) for r in group]
            reduce = [sent_bytes(Collective.REDUCE, 5, group, r, root) for r in group]
            assert sum(bcast) == sum(reduce) == 5 * (g - 1)
            assert bcast[group.index(root)] == 5 * (g - 1).bit_length() and reduce[group.index(root)] == 0
    assert sent_bytes(Collective.P2P, 7, (3, 4), 3) == 7 and sent_bytes(Collective.P2P, 7, (3, 4), 4) == 0


@pytest.mark.parametrize("shape", [(1, 2), (1, 3), (1, 4), (1, 6), (2, 2), (2, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_branches_on_disjoint_device_groups(clusters, shape):
    """Every grouping of independent branches (``search/groups.py``), solved on every mesh:
    each node's pieces packed into its group's devices, the parallel ops moving between
    the groups and the rest."""
    from search.test_groups import SMALL  # noqa: PLC0415

    from unity_cli.search.groups import group_ranges, groupings  # noqa: PLC0415
    from unity_cli.search.mesh import Mesh  # noqa: PLC0415
    from unity_cli.search.solver import build_problem, factorizations, realize, solve_problem  # noqa: PLC0415

    cluster = clusters[shape]
    n = cluster.num_devices
    for _, make in SMALL:
        pcg = make()
        for g in groupings(pcg, cluster):
            for mesh in factorizations(n):
                p = build_problem(pcg, cluster, CostConfig(), mesh, meshes={i: Mesh(*mesh).sub(r.count)
                                                                            for i, r in g.ranges})
                solved = realize(p, solve_problem(p))
                ranges = group_ranges(pcg, g, solved)
                assert ranges is not None
                assert_bytes_equal(solved, default_views(solved, ranges), n)


def _p2p_by_pairs(messages, cluster, profile):
    """The definition, message by message: each over its pair's link (``comm.link_for``)."""
    from collections import Counter

    from unity_cli.cost.comm import link_for
    out, into, nic_out, nic_in = Counter(), Counter(), Counter(), Counter()
    latency = 0.0
    for m in messages:
        s, d = m.group
        link = link_for(cluster, (s, d), profile)
        t = m.nbytes / link.bandwidth
        out[s] += t
        into[d] += t
        latency = max(latency, link.latency)
        a, b = cluster.node_of(s), cluster.node_of(d)
        if a != b:
            nic_out[a] += t
            nic_in[b] += t
    return latency, max(max(c.values(), default=0.0) for c in (out, into, nic_out, nic_in))


@pytest.mark.parametrize("name", ["summit-192:12", "dgx-a100-80:24", "local-cpu:3", "summit-192:18"])
def test_point_to_point_messages_are_priced_as_their_pairs_links_to_the_last_bit(name):
    """``_p2p_parts`` prices all of a phase's messages at once, and gives, bit for bit, what
    pricing each over its own pair's link gives: inside a node, across nodes, to itself, with
    and without a profile's measured links, for one message and for thousands."""
    from unity_cli.cost.moves import Move, _p2p_parts
    from unity_cli.cost.profile import Profile
    from unity_cli.ir.phase import Phase
    cluster = load_cluster(name)
    fitted = Profile.from_json({
        "format": "unity-profile/1", "machine": {}, "settings": {}, "compute": {},
        "comm": {"device_type": "cpu-core", "device_kind": "cpu", "ranks": 2, "hosts": 1,
                 "links": {"intra-node": {"latency_s": 1e-5, "bandwidth_Bps": 1e9, "samples": []},
                           "inter-node": {"latency_s": 3e-5, "bandwidth_Bps": 2e8, "samples": []}},
                 "collectives": {}}})
    rng = random.Random(7)
    n = cluster.num_devices
    for profile in (None, fitted):
        for count in (1, 2, 5, 40, 3000):
            messages = [Move(Collective.P2P, Phase.FWD, (rng.randrange(n), rng.randrange(n)), rng.randrange(1, 1 << 30))
                        for _ in range(count)]
            assert _p2p_parts(messages, cluster, profile) == _p2p_by_pairs(messages, cluster, profile)
    assert _p2p_parts([], cluster, None) == (0.0, 0.0)
