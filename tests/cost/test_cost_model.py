"""Sanity of the cost model: scaling trends of data parallelism, the dtype's effect on
compute, the collective formulas, and memory per device checked by hand."""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest
from models.catalog import EXPORTED_DIR, absent_initializer, mlp_model
from onnx import TensorProto

from unity_cli import zoo
from unity_cli.cluster import Link, load_cluster
from unity_cli.cluster.collectives import Collective
from unity_cli.cost.comm import collective_time, group_link, groups_time
from unity_cli.cost.memory import PART, memory_account
from unity_cli.cost.model import CostConfig, Optimizer, estimate, sync_copy_seconds, update_seconds
from unity_cli.ir import DType
from unity_cli.ir.ops.sources import WeightAttrs
from unity_cli.ir.recompute import Recompute
from unity_cli.ir.schedule import layout_sources
from unity_cli.ir.training import Training
from unity_cli.onnx_import import ImportOptions, import_model, import_model_proto
from unity_cli.search.baselines import data_parallel, tensor_parallel
from unity_cli.search.optimize import evaluate
from unity_cli.search.views import default_views

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "cluster_specs"


@pytest.fixture(scope="module")
def dgx8():
    return load_cluster(SPECS / "dgx-a100-8.yaml")


@pytest.fixture(scope="module")
def dgx32():
    return load_cluster(SPECS / "dgx-a100-32.yaml")


def _absent(name: str, dims: list[int]) -> TensorProto:
    return absent_initializer(name, dims)

def _mlp(path: Path, d_in: int, hidden: int, d_out: int, shape_only: bool = False) -> Path:
    return mlp_model(path, d_in, hidden, d_out, shape_only)

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A conv model and an MLP, both at batch 16."""
    tmp = tmp_path_factory.mktemp("cost")
    return {
        "conv": import_model(EXPORTED_DIR / "inception_tiny.onnx", ImportOptions(16)).pcg,
        "mlp": import_model(_mlp(tmp / "mlp.onnx", 256, 1024, 256), ImportOptions(16)).pcg,
    }


@pytest.fixture(scope="module")
def tiny_mlp(tmp_path_factory):
    return _mlp(tmp_path_factory.mktemp("tiny") / "tiny.onnx", 16, 32, 8)


def _dp(pcg, cluster, config: CostConfig | None = None):
    return evaluate(data_parallel(pcg, cluster), cluster, config or CostConfig())


def _parts(pcg, cluster, config: CostConfig, device: int = 0) -> dict[str, int]:
    """Device ``device``'s bytes by part under data parallelism (``cost/memory.py``)."""
    b = data_parallel(pcg, cluster).pcg
    views = default_views(b)
    devs = [views[i].devices(n.outputs[0]) for i, n in b]
    return {k: int(v[device]) for k, v in memory_account(b, devs, layout_sources(b), cluster, config).items()}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# -- scaling -------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["conv", "mlp"])
@pytest.mark.parametrize("cluster_name", ["dgx8", "dgx32"])
def test_data_parallel_scaling(models, request, which, cluster_name):
    cluster = request.getfixturevalue(cluster_name)
    reports = []
    for n in (1, 2, 4, 8):
        cand = _dp(models[which], cluster.first(n))
        assert cand.baseline.devices == n
        reports.append(cand.report)
    # Forward and backward compute fall (the update does not: each replica updates all of
    # every weight, and copies the gradients it syncs into the flat buffer).
    compute = [max(sum(e.end - e.start for e in r.events if e.phase in ("fwd", "bwd") and not e.comm
                       and d in e.devices) for d in range(n)) for r, n in zip(reports, (1, 2, 4, 8))]
    comm = [r.comm_time for r in reports]
    assert all(a > b for a, b in zip(compute, compute[1:])), compute
    assert comm[0] == 0.0
    assert all(a <= b for a, b in zip(comm, comm[1:])), comm
    # Memory per device falls too from two replicas on: activations are split, weights are
    # not. (One device syncs nothing: backward makes each gradient as it goes, where replicas
    # hold the sync's flat buffer through the step.)
    mem = [max(r.memory) for r in reports]
    assert all(a > b for a, b in zip(mem[1:], mem[2:])), mem


@pytest.mark.parametrize("which", ["conv", "mlp"])
def test_crossing_nodes_costs_more(models, dgx32, which):
    one_node = _dp(models[which], dgx32.first(8)).report
    two_nodes = _dp(models[which], dgx32.first(16)).report
    assert len({dgx32.node_of(d) for d in range(16)}) == 2
    assert two_nodes.comm_time > one_node.comm_time
    # A slower link, not just more ranks: the 16-rank all-reduce over NVLink would cost
    # barely more than the 8-rank one.
    ratio = two_nodes.comm_time / one_node.comm_time
    assert ratio > 2


def test_one_node_of_a_big_cluster_is_the_small_cluster(models, dgx8, dgx32):
    a = _dp(models["mlp"], dgx8).report
    b = _dp(models["mlp"], dgx32.first(8)).report
    assert a.step_time == b.step_time and a.memory == b.memory


def test_bfloat16_is_faster_for_matmuls(tmp_path, dgx8):
    pcg = import_model(_mlp(tmp_path / "big.onnx", 1024, 4096, 1024, shape_only=True), ImportOptions(512)).pcg
    one = dgx8.first(1)
    f32 = _dp(pcg, one, CostConfig(DType.FLOAT32)).report
    bf16 = _dp(pcg, one, CostConfig(DType.BFLOAT16)).report
    assert bf16.compute_time < f32.compute_time / 4
    assert bf16.step_time < f32.step_time
    # Activations are stored in bfloat16; a parameter costs 2 (bf16 copy) + 4 (fp32 gradient) + 4 (fp32
    # master) + 8 (Adam) = 18 bytes, against 16 in float32 (ir/training.WeightBytes).
    params = sum(n.outputs[0].logical.numel for _, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable)
    a, b = _parts(pcg, one, CostConfig(DType.FLOAT32)), _parts(pcg, one, CostConfig(DType.BFLOAT16))
    assert (a["weights"], b["weights"]) == (4 * params, 2 * params)
    assert b["optimizer"] - a["optimizer"] == 4 * params          # the fp32 master (the scratch alike)
    assert a["activations"] > 0 and b["activations"] == a["activations"] // 2


def test_tensor_parallel_costs_a_reduction(tiny_mlp, dgx8):
    pcg = import_model(tiny_mlp, ImportOptions(4)).pcg
    tp = tensor_parallel(pcg, dgx8)
    views = default_views(tp.pcg)
    report = estimate(tp.pcg, views, dgx8, CostConfig())
    assert report.comm_time > 0
    assert sum(c.comm_fwd for c in report.nodes) > 0


# -- collectives -------------------------------------------------------------------------------------


LINK = Link(100e9, 0.0)          # no latency: the bandwidth term alone
SLOW = Link(10e9, 5e-6)


@pytest.mark.parametrize("kind", list(Collective))
def test_nothing_to_do_costs_nothing(kind):
    assert collective_time(kind, 0, 8, SLOW) == 0.0
    assert collective_time(kind, 1e6, 1, SLOW) == 0.0
    assert collective_time(kind, 1e6, 2, SLOW) > 0.0


@pytest.mark.parametrize("kind", [Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL])
def test_ring_scales_with_p_minus_one_over_p(kind):
    n = 1e9
    for p in (2, 3, 4, 8, 64):
        assert collective_time(kind, n, p, LINK) == pytest.approx((p - 1) / p * n / LINK.bandwidth)
    # With latency, each of the p-1 steps pays it once.
    assert collective_time(kind, n, 8, SLOW) == pytest.approx(7 * SLOW.latency + 7 / 8 * n / SLOW.bandwidth)


def test_all_reduce_ring_and_tree():
    n = 1e9
    for p in (2, 4, 8):
        assert collective_time(Collective.ALL_REDUCE, n, p, LINK) == pytest.approx(2 * (p - 1) / p * n / 100e9)
    # Tiny buffers on a high-latency link: the tree's log2(p) latency beats the ring's p-1.
    small, p = 8.0, 64
    ring = 2 * (p - 1) * SLOW.latency + 2 * (p - 1) / p * small / SLOW.bandwidth
    tree = 2 * math.ceil(math.log2(p)) * SLOW.latency + 2 * small / SLOW.bandwidth
    assert collective_time(Collective.ALL_REDUCE, small, p, SLOW) == pytest.approx(min(ring, tree)) == \
        pytest.approx(tree)
    # An all-reduce moves about twice an all-gather's bytes.
    assert collective_time(Collective.ALL_REDUCE, n, 8, LINK) == \
        pytest.approx(2 * collective_time(Collective.ALL_GATHER, n, 8, LINK))


def test_broadcast_and_p2p():
    n = 1e6
    assert collective_time(Collective.BROADCAST, n, 8, SLOW) == pytest.approx(3 * SLOW.latency + n / SLOW.bandwidth)
    assert collective_time(Collective.P2P, n, 2, SLOW) == pytest.approx(SLOW.transfer_time(n))


def test_groups_share_the_network(dgx32):
    inter, intra = dgx32.inter_link, dgx32.nodes[0].intra_link
    assert group_link(dgx32, [(0, 1), (2, 3)]) == intra
    assert group_link(dgx32, [(0, 8)]) == inter
    shared = group_link(dgx32, [(0, 8), (1, 9), (2, 10), (3, 11)])
    assert shared.bandwidth == pytest.approx(inter.bandwidth / 4)
    n = 1e8
    alone = groups_time(Collective.ALL_REDUCE, n, dgx32, [(0, 8)])
    four = groups_time(Collective.ALL_REDUCE, n, dgx32, [(0, 8), (1, 9), (2, 10), (3, 11)])
    assert four > alone
    assert groups_time(Collective.ALL_REDUCE, n, dgx32, []) == 0.0


# -- memory ------------------------------------------------------------------------------------------


PARAMS = 16 * 32 + 32 * 8                 # w1 + w2 of the tiny MLP
ROW = 16 + 32 + 32 + 8                    # per sample: x, h = x@w1, r = relu(h), y = r@w2


@pytest.mark.parametrize("optimizer,states", [(Optimizer.ADAM, 2), (Optimizer.MOMENTUM, 1), (Optimizer.SGD, 0)])
@pytest.mark.parametrize("devices", [2, 4, 8])
def test_data_parallel_memory_by_hand(tiny_mlp, dgx8, optimizer, states, devices):
    """x[8,16] -> MatMul w1 -> h -> Relu -> r -> MatMul w2 -> y[8,8], over replicas: the
    busiest moment is backward after fc2, with y's and r's gradients in flight."""
    batch = 8
    m = batch // devices
    pcg = import_model(tiny_mlp, ImportOptions(batch)).pcg
    report = _dp(pcg, dgx8.first(devices), CostConfig(DType.FLOAT32, optimizer)).report
    want = (PARAMS * 4 * (2 + states)     # float32 weight, its gradient in the sync's buffer, the states
            + 16 * 32 * 4                  # the optimizer's scratch: the largest update
            + batch * 16 * 4 + batch * 8   # the micro-batch's x, whole on every rank, and its class ids
            + m * (32 + 32 + 8) * 4        # h and r (Relu keeps both), y (the loss reads it)
            + m * (8 + 32) * 4)            # gradients in flight: y's and r's
    assert report.memory == (want,) * devices


def test_data_parallel_memory_bfloat16(tiny_mlp, dgx8):
    pcg = import_model(tiny_mlp, ImportOptions(8)).pcg
    report = _dp(pcg, dgx8.first(4), CostConfig(DType.BFLOAT16)).report
    # a bf16 copy, an fp32 gradient and master, Adam's two fp32 states: 2 + 4 + 4 + 8 bytes;
    # activations and their gradients in bfloat16
    assert report.memory == (PARAMS * 18 + 16 * 32 * 4 + 8 * 16 * 4 + 8 * 8 + 2 * (72 + 40) * 2,) * 4


@pytest.mark.parametrize("dtype,kept,sharded", [(DType.FLOAT32, 4, 8), (DType.BFLOAT16, 2, 12)])
@pytest.mark.parametrize("devices", [2, 3, 4])
def test_zero_shards_the_optimizer_over_the_replicas(tiny_mlp, dgx8, dtype, kept, sharded, devices):
    """ZeRO-1: each replica keeps the weights and gradients (in the sync's flat buffer, padded
    to equal shards) and 1/d of the master and Adam's states (Megatron-LM's distributed
    optimizer: 8 + 8/d float32, 6 + 12/d mixed), and the 1/d of the gradient it
    reduce-scatters into (4/d, a communication buffer); the update works a shard at a time."""
    batch = 12
    pcg = import_model(tiny_mlp, ImportOptions(batch)).pcg
    cluster = dgx8.first(devices)
    plain = _dp(pcg, cluster, CostConfig(dtype)).report
    zero = _dp(pcg, cluster, CostConfig(dtype, training=Training(zero=1))).report
    p, z = _parts(pcg, cluster, CostConfig(dtype)), _parts(pcg, cluster, CostConfig(dtype, training=Training(zero=1)))
    shards = [_ceil(w, devices) for w in (16 * 32, 32 * 8)]
    assert (p["weights"], z["weights"]) == (kept * PARAMS, kept * sum(shards) * devices)
    assert z["gradients"] - p["gradients"] == 4 * (sum(shards) * devices - PARAMS)
    assert (p["communication buffers"], z["communication buffers"]) == (0, 4 * sum(shards))
    assert (p["optimizer"], z["optimizer"]) == (sharded * PARAMS + 4 * 16 * 32, (sharded + 4) * sum(shards))
    assert [a - b for a, b in zip(plain.memory, zero.memory)] == [sum(p.values()) - sum(z.values())] * devices
    assert zero.training == Training(zero=1) and plain.training == Training()
    # the same bytes sent: a reduce-scatter and an all-gather of the padded flat buffer
    shard = -(-PARAMS // devices)
    assert zero.comm_bytes[0] - plain.comm_bytes[0] == 2 * (devices - 1) * shard * 4 - round(
        Fraction(2 * (devices - 1) * PARAMS * 4, devices))


@pytest.mark.parametrize("dtype,grad,sharded", [(DType.FLOAT32, 4, 8), (DType.BFLOAT16, 4, 12)])
@pytest.mark.parametrize("devices", [2, 3, 4])
@pytest.mark.parametrize("micro", [1, 3])
def test_zero2_shards_the_gradients_and_reduce_scatters_each_micro_batch(tiny_mlp, dgx8, dtype, grad, sharded,
                                                                         devices, micro):
    """ZeRO-2 against ZeRO-1: each replica keeps 1/d of the gradient as well (float32 4 + 12/d,
    mixed 2 + 16/d per parameter), and reduce-scatters each micro-batch, each weight on its
    own (as soon as backward has made its gradient) where ZeRO-1 sends one flat buffer once:
    each weight's shard padded on its own, the reduce-scatters and the gathers after the update."""
    pcg = import_model(tiny_mlp, ImportOptions(12)).pcg
    cluster = dgx8.first(devices)
    configs = [CostConfig(dtype, training=Training(z, micro)) for z in (1, 2)]
    one, two = (_dp(pcg, cluster, c).report for c in configs)
    p1, p2 = (_parts(pcg, cluster, c) for c in configs)
    shards = [_ceil(w, devices) for w in (16 * 32, 32 * 8)]
    assert p1["weights"] == p2["weights"]
    assert (p1["communication buffers"], p2["communication buffers"]) == (grad * sum(shards), 0)
    # the states alike; the update's scratch a flat shard, or a weight's shard
    assert p1["optimizer"] - 4 * sum(shards) == p2["optimizer"] - 4 * max(shards)
    # the gradient's shards, and in flight the activations' gradients and, until its
    # reduce-scatter, a weight's whole gradient beside the flat buffer it is scattered from
    flight = p1["gradients"] - grad * sum(shards) * devices
    assert grad * sum(shards) < p2["gradients"] <= grad * sum(shards) + 2 * grad * max(shards) * devices + flight
    assert [a - b for a, b in zip(one.memory, two.memory)] == [sum(p1.values()) - sum(p2.values())] * devices
    flat, each = _ceil(PARAMS, devices), sum(shards)
    assert [b - a for a, b in zip(one.comm_bytes, two.comm_bytes)] == \
        [(devices - 1) * 4 * ((micro + 1) * each - 2 * flat)] * devices
    assert two.step_time >= one.step_time
    assert two.training == Training(2, micro)


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_zero3_shards_the_weights_and_gathers_each_for_forward_and_again_for_backward(tiny_mlp, dgx8, devices):
    """ZeRO-3 against ZeRO-2: each replica keeps 1/d of each weight (each weight its own
    padded unit) where ZeRO-2 keeps it whole, and holds a weight gathered only while a pass
    reads it, with the next in flight (here the MLP's two weights: as many bytes as ZeRO-2's
    whole weights, as communication buffers); the bytes are each weight's reduce-scatter and
    two gathers per micro-batch (forward's, and backward's: FSDP's), none after the update."""
    pcg = import_model(tiny_mlp, ImportOptions(12)).pcg
    two = _dp(pcg, dgx8.first(devices), CostConfig(training=Training(2))).report
    three = _dp(pcg, dgx8.first(devices), CostConfig(training=Training(3))).report
    shards = 4 * sum(_ceil(w, devices) for w in (16 * 32, 32 * 8))
    assert [b - a for a, b in zip(two.memory, three.memory)] == [shards] * devices
    plain = _dp(pcg, dgx8.first(devices)).report
    padded = sum(-(-w // devices) for w in (16 * 32, 32 * 8))          # per weight, not one flat buffer
    assert [b - a for a, b in zip(plain.comm_bytes, three.comm_bytes)] == \
        [3 * (devices - 1) * padded * 4 - round(Fraction(2 * (devices - 1) * PARAMS * 4, devices))] * devices
    assert three.training == Training(3)


@pytest.mark.parametrize("devices", [2, 3, 4])
def test_each_weight_is_priced_at_its_own_stage(tiny_mlp, dgx8, devices):
    """w1 at ZeRO-3, w2 at the step's ZeRO-1 (``Training.zero_by_weight``): w1 sends its
    reduce-scatter and two gathers per micro-batch on its own, w2 a ZeRO-1 reduce-scatter and
    gather of its own flat buffer; each replica keeps w1's shard and w2 whole (padded). Named
    for every weight, a stage prices as that stage does for the whole step."""
    pcg = import_model(tiny_mlp, ImportOptions(12)).pcg
    cluster = dgx8.first(devices)
    plain = _dp(pcg, cluster).report
    mixed = CostConfig(training=Training(1, zero_by_weight=(("w1", 3),)))
    report = _dp(pcg, cluster, mixed).report
    w1, w2 = _ceil(16 * 32, devices), _ceil(32 * 8, devices)     # each one's padded shard
    assert [b - a for a, b in zip(plain.comm_bytes, report.comm_bytes)] == \
        [(devices - 1) * 4 * (3 * w1 + 2 * w2) - round(Fraction(2 * (devices - 1) * PARAMS * 4, devices))] * devices
    assert _parts(pcg, cluster, mixed)["weights"] == 4 * (w1 + w2 * devices)
    assert report.training == mixed.training
    for base, z in ((0, 3), (1, 2), (3, 0), (2, 1)):
        named = _dp(pcg, cluster, CostConfig(training=Training(base, 2, zero_by_weight=(("w*", z),)))).report
        same = _dp(pcg, cluster, CostConfig(training=Training(z, 2))).report
        assert (named.step_time, named.memory, named.comm_bytes) == (same.step_time, same.memory, same.comm_bytes)


def test_zero3_with_recomputation_keeps_shards_alone():
    """On the small GPT over 4 replicas: with every reader of a block's weights recomputed,
    ZeRO-3 keeps a block weight's shard alone, so it holds less than ZeRO-2 there, and pays
    a second gather per micro-batch for each such weight."""
    cluster = load_cluster(SPECS / "dgx-a100-8.yaml").first(4)
    pcg = import_model_proto(zoo.build("gpt3-175b", "small", 4).model, ImportOptions(4)).pcg
    reports = {z: _dp(pcg, cluster, CostConfig(training=Training(z, 1, Recompute.FULL))).report for z in (2, 3)}
    parts = {z: r.memory for z, r in reports.items()}
    assert max(parts[3]) < max(parts[2])
    assert sum(reports[3].comm_bytes) > sum(reports[2].comm_bytes)


def test_tensor_parallel_memory_by_hand(tiny_mlp, dgx8):
    """Each weight split 8 ways and synced by no one: its gradient is made as backward
    reaches its reader, so at the busiest moment at most the weights' and y's gradients are
    in flight."""
    batch = 4
    pcg = import_model(tiny_mlp, ImportOptions(batch)).pcg
    tp = tensor_parallel(pcg, dgx8)
    report = evaluate(tp, dgx8, CostConfig()).report
    views = default_views(tp.pcg)
    devs = [views[i].devices(n.outputs[0]) for i, n in tp.pcg]
    acc = memory_account(tp.pcg, devs, layout_sources(tp.pcg), dgx8, CostConfig())
    piece = PARAMS // 8
    for d in range(8):
        parts = {k: int(v[d]) for k, v in acc.items()}
        assert parts["weights"] == piece * 4
        assert parts["optimizer"] == piece * 8 + 16 * 32 // 8 * 4            # Adam's states, the scratch
        assert parts["inputs and constants"] == batch * 16 * 4 + batch * 8   # x whole, the class ids
        hidden = batch * 32 // 8 * 2 * 4                                    # h and r, split by features
        reduced = batch * 8 * 4 if d == 0 else 0                            # the loss reads y on device 0
        assert parts["activations"] == hidden + reduced
        assert 0 < parts["gradients"] <= piece * 4 + batch * 8 * 4
        assert report.memory[d] == sum(parts.values())


def test_infeasible_report_names_the_amounts(tiny_mlp, tmp_path):
    text = (SPECS / "dgx-a100-8.yaml").read_text().replace("capacity: 40 GiB", "capacity: 4 KiB")
    path = tmp_path / "small.yaml"
    path.write_text(text)
    cluster = load_cluster(path)
    pcg = import_model(tiny_mlp, ImportOptions(8)).pcg
    report = _dp(pcg, cluster).report
    assert not report.feasible
    need = max(report.memory)
    assert report.infeasible.startswith("needs ")
    assert "which has 4.0 KiB" in report.infeasible and "on device 0" in report.infeasible
    assert need > 4096


@pytest.mark.parametrize("cluster_name", ["dgx8", "dgx32"])
def test_gradient_sync_is_one_flat_all_reduce_after_backward(models, request, cluster_name):
    """Priced as the runtime syncs (runtime/weights.py): every weight gradient a group keeps
    in one flat all-reduce, once the group's backward pass is done. One all-reduce per weight
    would pay each weight's latency; beside backward it would hide behind it."""
    from unity_cli.ir.ops.sources import WeightAttrs

    c = request.getfixturevalue(cluster_name)
    b = data_parallel(models["mlp"], c)
    rep = estimate(b.pcg, default_views(b.pcg), c, CostConfig())
    syncs = [e for e in rep.events if e.phase == "sync"]
    everyone = tuple(sorted({d for e in rep.events if e.phase == "bwd" for d in e.devices}))   # the batch's
    weights = sum(n.outputs[0].logical.numel * 4 for _, n in b.pcg if isinstance(n.op, WeightAttrs) and n.op.trainable)
    assert len(syncs) == 1 and syncs[0].devices == everyone
    flat = groups_time(Collective.ALL_REDUCE, weights, c, [everyone])
    assert syncs[0].end - syncs[0].start == pytest.approx(flat, rel=1e-12)
    assert sum(n.grad_sync for n in rep.nodes) > flat * 1.001       # the per-weight price, latencies added
    assert syncs[0].start >= max(e.end for e in rep.events if e.phase == "bwd")
    assert rep.step_time == pytest.approx(max(e.end for e in rep.events))
    # The update phase: each weight's update, and the copy of every synced gradient into the
    # flat buffer (two passes over its bytes).
    dev = c.device_type(0)
    numels = [n.outputs[0].logical.numel for _, n in b.pcg if isinstance(n.op, WeightAttrs) and n.op.trainable]
    (upd,) = [e for e in rep.events if e.phase == "update" and e.devices == (0,)]
    assert upd.end - upd.start == pytest.approx(sum(update_seconds(k, dev, CostConfig()) for k in numels)
                                                + sync_copy_seconds(weights, dev), rel=1e-9)
    assert sync_copy_seconds(weights, dev) == pytest.approx(2 * weights / dev.memory_bandwidth)


def test_the_loss_is_priced_over_the_region_it_reads(dgx8, tmp_path):
    """The loss event's length: runtime/loss.py's passes over the output region one device
    reads (12 for MSE; cross entropy's 22 over logit rows gathered whole) at its memory
    bandwidth. Twice the output, twice the loss; splitting the batch halves each device's."""
    from unity_cli.cost.model import LOSS_PASSES
    from unity_cli.search.baselines import data_parallel

    pcg = import_model(_mlp(tmp_path / "m.onnx", 64, 256, 1000), ImportOptions(64)).pcg
    dev = dgx8.device_type(0)

    def loss_ms(loss, n):
        c = dgx8.first(n)
        b = data_parallel(pcg, c)
        rep = estimate(b.pcg, default_views(b.pcg), c, CostConfig(loss=loss))
        (ev,) = [e for e in rep.events if e.phase == "loss" and not e.comm]
        return ev.end - ev.start

    whole = 64 * 1000 * 4 / dev.memory_bandwidth
    assert loss_ms("mse", 1) == pytest.approx(LOSS_PASSES["mse"] * whole, rel=1e-9)
    assert loss_ms("cross_entropy", 1) == pytest.approx(LOSS_PASSES["cross_entropy"] * whole, rel=1e-9)
    assert loss_ms("cross_entropy", 2) == pytest.approx(loss_ms("cross_entropy", 1) / 2, rel=1e-9)


@pytest.mark.parametrize("fn,kept", [("Relu", 0), ("Sigmoid", 0), ("Tanh", 0), ("Gelu", 1)])
def test_a_fused_activation_keeps_what_its_kernel_keeps(dgx8, fn, kept):
    """Unfused, the activation's kernel keeps its input, the product, and its output for
    backward. Fused, the kernel keeps the product only where the activation's backward reads
    it (Gelu's does; Relu's, Sigmoid's and Tanh's read their output), and the memory model
    counts so; both kernels' backward agree with the unfused pair's."""
    import numpy as np

    from unity_cli.cost.memory import memory_table
    from unity_cli.ir.ops.elementwise import UnaryAttrs
    from unity_cli.ir.ops.linear import GemmAttrs
    from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
    from unity_cli.ir.pcg import GraphBuilder
    from unity_cli.ir.shapes import TensorShape
    from unity_cli.kernels import backward, forward

    def graph(fused: bool):
        b = GraphBuilder()
        x = b.add1(InputAttrs(TensorShape((64, 32))), name="x")
        w = b.add1(WeightAttrs(TensorShape((128, 32))), name="w")
        c = b.add1(WeightAttrs(TensorShape((128,))), name="c")
        if fused:
            return b.build([b.add1(GemmAttrs(trans_b=True, activation=fn), [x, w, c], name="fc")])
        y = b.add1(GemmAttrs(trans_b=True), [x, w, c], name="fc")
        return b.build([b.add1(UnaryAttrs(fn), [y], name="act")])

    product = 64 * 128 * 4

    def held(g):
        views = default_views(g)
        table = memory_table(g, [views[i].devices(n.outputs[0]) for i, n in g], layout_sources(g), dgx8, CostConfig())
        return int(table.kept[:, PART["activations"], 0].sum()), max(estimate(g, views, dgx8, CostConfig()).memory)

    (kept0, mem0), (kept1, mem1) = held(graph(False)), held(graph(True))
    assert (kept0, kept1) == (product, kept * product)
    assert mem0 > mem1
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(s) for s in ((64, 32), (128, 32), (128,))]
    g = rng.standard_normal((64, 128))
    (y1,), ctx = forward(GemmAttrs(trans_b=True, activation=fn), xs, np)
    (z,), c0 = forward(GemmAttrs(trans_b=True), xs, np)
    (y0,), c1 = forward(UnaryAttrs(fn), [z], np)
    np.testing.assert_allclose(y1, y0, rtol=1e-12)
    (gz,) = backward(UnaryAttrs(fn), c1, [g], np)
    for got, want in zip(backward(GemmAttrs(trans_b=True, activation=fn), ctx, [g], np),
                         backward(GemmAttrs(trans_b=True), c0, [gz], np), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", [2, 5])
def test_micro_batches_repeat_forward_and_backward_not_the_sync(tiny_mlp, dgx8, k):
    """A step of k micro-batches is k forward and backward passes, then one gradient sync and
    one update: k - 1 passes longer than one micro-batch's step, with k times its moves'
    compute in the busiest device's sum and one micro-batch's activations in memory."""
    pcg = import_model(tiny_mlp, ImportOptions(4)).pcg
    one = _dp(pcg, dgx8.first(4), CostConfig()).report
    many = _dp(pcg, dgx8.first(4), CostConfig(training=Training(micro_batches=k))).report
    passes = max(e.end for e in one.events if e.phase in ("fwd", "loss", "bwd"))
    assert many.step_time == pytest.approx(one.step_time + (k - 1) * passes, rel=1e-12)
    update = max(e.end - e.start for e in one.events if e.phase == "update")
    assert many.compute_time == pytest.approx(k * (one.compute_time - update) + update, rel=1e-12)
    assert many.memory == one.memory and many.training.micro_batches == k
    assert len(many.events) < 2 * len(one.events) + 8     # the first micro-batch stands for the others


def test_every_shape_of_step_shares_the_node_prices_and_gets_its_own_answer():
    """The node price table is shared by every micro-batch count, ZeRO stage, recomputation
    and bucket size (they order and repeat a node's work, they do not change it): each step
    priced after all the others is priced as it is alone, with an empty table."""
    from unity_cli.cost import model
    cluster = load_cluster(SPECS / "dgx-a100-8.yaml").first(4)
    pcg = import_model_proto(zoo.build("gpt3-175b", "small", 4).model, ImportOptions(4)).pcg
    b = data_parallel(pcg, cluster)
    views = default_views(b.pcg)
    shapes = [CostConfig(training=Training(z, 1, r)) for z in (0, 2, 3) for r in (Recompute.NONE, Recompute.FULL)]
    shapes += [CostConfig(sync_bucket=0, memory_limit=1 << 20)]

    def seen(report):
        return report.step_time, report.memory, report.comm_bytes, report.events, report.feasible

    alone = []
    for config in shapes:
        model._tables.cache_clear()
        alone.append(seen(estimate(b.pcg, views, cluster, config)))
    model._tables.cache_clear()
    together = [seen(estimate(b.pcg, views, cluster, config)) for config in shapes]
    assert together == alone
    assert len({t[0] for t in together}) > 3                 # the shapes price differently
