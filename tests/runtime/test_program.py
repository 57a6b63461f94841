"""The schedule every rank derives from a plan: collectives, weight residency, loss groups."""
from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from unity_cli.cli import cli
from unity_cli.ir.machine_view import MachineView
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.schedule import looks_like_logits
from unity_cli.ir.shapes import TensorShape
from unity_cli.onnx_import import import_model
from unity_cli.plan.plan import load_plan
from unity_cli.runtime.data import Data, gather_tables
from unity_cli.runtime.loss import LossKind, choose_loss
from unity_cli.runtime.program import LOCAL, CollectiveKind, StepKind, build_program
from unity_cli.runtime.threads import share_cores


def megatron(devices_after: tuple[int, int]):
    """x @ W1 (columns split) @ W2 (rows split) -> Reduction(2) -> Replicate(2)."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 8))), (), "x")
    w1 = b.add1(WeightAttrs(TensorShape((8, 6))), (), "w1")
    w2 = b.add1(WeightAttrs(TensorShape((6, 8))), (), "w2")
    xr = b.add1(ReplicateAttrs(2), (x,))
    w1s = b.add1(RepartitionAttrs(1, 2), (w1,))
    h = b.add1(MatMulAttrs(), (xr, w1s), "mm1")
    w2s = b.add1(RepartitionAttrs(0, 2), (w2,))
    y = b.add1(MatMulAttrs(), (h, w2s), "mm2")
    red = b.add1(ReductionAttrs(2), (y,))
    rep = b.add1(ReplicateAttrs(2), (red,))
    pcg = b.build([rep])
    views = [MachineView(0, (0, 0, 0, 0))] * 3 + [
        MachineView(0, (0, 0, 0, 1)), MachineView(0, (0, 1, 0, 0)), MachineView(0, (0, 1, 0, 0)),
        MachineView(0, (1, 0, 0, 0)), MachineView(0, (0, 0, 1, 0)), MachineView(0, (0, 0, 0, 0)),
        MachineView(0, (0, 0, 0, devices_after[1] - devices_after[0]))]
    views[-1] = MachineView(devices_after[0], views[-1].strides)
    return pcg, views


def test_reduction_then_replicate_on_the_same_ranks_is_one_allreduce():
    pcg, views = megatron((0, 1))
    prog = build_program(pcg, views, None)
    fused = [s for s in prog.steps if s.kind is StepKind.FUSED]
    assert len(fused) == 1 and fused[0].collectives[0].kind is CollectiveKind.ALLREDUCE
    assert fused[0].collectives[0].group == (0, 1)
    # Weights are stored where they are read: no step reads a weight from another rank.
    for s in prog.steps:
        for t in s.tasks:
            for rd in t.reads:
                assert rd.src in (LOCAL, t.rank)


def test_reduction_then_replicate_on_other_ranks_moves_pieces():
    pcg, views = megatron((2, 3))
    prog = build_program(pcg, views, None)
    assert not [s for s in prog.steps if s.kind is StepKind.FUSED]
    kinds = [pcg.nodes[s.node].kind for s in prog.steps if s.kind is StepKind.MOVE]
    assert kinds == ["Reduction", "Replicate"]


def test_weights_sharded_or_replicated_keep_their_region():
    pcg, views = megatron((0, 1))
    prog = build_program(pcg, views, None)
    params = {p.name: p for p in prog.params}
    assert params["w1"].master[1] == (slice(0, 8), slice(3, 6))
    assert params["w1"].group == {0: (0,), 1: (1,)}          # shards: no gradient sync


def test_weight_read_in_two_layouts_keeps_it_whole(tiny_models, cluster_dir, tmp_path):
    """bert_tiny's exporter shared one zero bias between a LayerNorm (replicated) and the query
    projection (split): both ranks keep all of it and all-reduce all of its gradient."""
    out = tmp_path / "tp.json"
    r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                                 str(cluster_dir / "local-cpu.yaml"), "--batch-size", "4", "--strategy",
                                 "tensor_parallel", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    prog = build_program(plan.pcg, plan.views, None)
    bias = next(p for p in prog.params if p.name == "m.embeddings.LayerNorm.bias")
    assert bias.master == {0: (slice(0, 64),), 1: (slice(0, 64),)} and bias.group[0] == (0, 1)
    assert len({node for node, _, _ in bias.pieces[0]}) == 2
    assert [s for s in prog.steps if s.kind is StepKind.FUSED]


def test_loss_groups_gather_partial_sums_and_class_shards():
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 6))), (), "x")
    w = b.add1(WeightAttrs(TensorShape((6, 6))), (), "w")
    xs = b.add1(ReplicateAttrs(2), (x,))
    ws = b.add1(RepartitionAttrs(1, 2), (w,))
    y = b.add1(MatMulAttrs(), (xs, ws), "mm")               # [4, 6/2]: logits split by class
    pcg = b.build([y])
    views = [MachineView(0, (0, 0, 0, 0))] * 2 + [MachineView(0, (0, 0, 0, 1)), MachineView(0, (0, 1, 0, 0)),
                                                  MachineView(0, (0, 1, 0, 0))]
    prog = build_program(pcg, views, class_axis=1)
    (g,) = prog.loss_groups
    assert g.leader == 0 and g.region == (slice(0, 4), slice(0, 6))
    assert [(r, part[1]) for r, _, part in g.members] == [(0, slice(0, 3)), (1, slice(3, 6))]
    prog = build_program(pcg, views, class_axis=None)          # mse: each shard on its own
    assert len(prog.loss_groups) == 2


def test_loss_and_data_rules(tiny_models):
    conv = import_model(tiny_models / "convnet_tiny.onnx")
    bert = import_model(tiny_models / "bert_tiny.onnx")
    assert looks_like_logits(conv.pcg) and not looks_like_logits(bert.pcg)
    assert choose_loss("auto", None, conv.pcg) is LossKind.CROSS_ENTROPY
    assert choose_loss("auto", np.zeros(3, np.float32), conv.pcg) is LossKind.MSE
    tables = gather_tables(bert.pcg)
    assert tables == {"input_ids": 500}
    data = Data(bert.inputs, (32, 32, 64), LossKind.MSE, 0, tables)
    ids = data.batch(0).inputs["input_ids"]
    assert ids.min() >= 0 and ids.max() < 500 and len(np.unique(ids)) > 10
    assert not np.array_equal(ids, data.batch(1).inputs["input_ids"])
    assert np.array_equal(ids, Data(bert.inputs, (32, 32, 64), LossKind.MSE, 0, tables).batch(0).inputs["input_ids"])


def test_ranks_share_the_cores():
    env = {"MPI_LOCALNRANKS": "2"}
    assert share_cores(env) is not None and env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"]
    env = {"MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "3"}
    assert share_cores(env) is None and "OPENBLAS_NUM_THREADS" not in env
    assert share_cores({}) is None
