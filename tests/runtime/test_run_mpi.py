"""`mpiexec -n P unity run plan.json --check`: every kind of plan trains like one process.

The property under test is the runtime's contract: a plan run on P ranks matches the
original model run on one process, loss and weights, step for step.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from runtime.mpirun import run_json

from unity_cli.cli import cli
from unity_cli.cluster.parse import load_cluster
from unity_cli.ir.machine_view import MachineView
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.shapes import TensorShape
from unity_cli.onnx_import.load import file_sha256
from unity_cli.plan.plan import Plan, load_plan
from unity_cli.runtime.program import build_program

SHARED = ("bert_tiny", "bert_tiny_dynamo", "convnet_tiny", "convnet_tiny_dynamo")
CASES = [(m, s, 2) for m in SHARED for s in ("data_parallel", "tensor_parallel", "unity")] + [
    # model, strategy, devices
    ("bert_tiny", "tensor_parallel", 4),     # all-reduces, all-gathers and point-to-point slices
    ("convnet_tiny", "unity", 4),            # a broadcast to 4 ranks
]


@pytest.mark.parametrize("model,strategy,devices", CASES, ids=[f"{m}-{s}-{d}" for m, s, d in CASES])
def test_plan_matches_one_process(plans, model, strategy, devices):
    plan = plans.get(model, strategy, devices)
    doc = run_json(plan, "--check", "--steps", "2", ranks=devices)
    assert doc["check"]["passed"], doc["check"]
    assert doc["check"]["max_rel_err"] <= 1e-4
    assert doc["ranks"] == devices and doc["steps"] == 2 and len(doc["loss"]) == 2
    assert all(x == x and x > 0 for x in doc["loss"])        # finite, positive


def test_algebraic_rewrite_plan_matches_one_process(plans):
    """Concat(MatMul(x, w1), MatMul(x, w2)) -> MatMul(x, Concat(w1, w2)), then data parallelism:
    the two weights are stored as one, folded (no Concat runs each step), and checked and
    trained as the model's two."""
    plan = plans.get("rewrite", "unity", 2, batch=64)
    doc_plan = json.loads(plan.read_text())
    assert doc_plan["rewrites"], "the search found no algebraic rewrite"
    assert any([p[0] for p in n["op"].get("parts", ())] == ["w1", "w2"] for n in doc_plan["pcg"]["nodes"])
    assert any(n["outputs"][0]["degrees"][0] > 1 for n in doc_plan["pcg"]["nodes"])   # and it is split
    doc = run_json(plan, "--check", "--steps", "3")
    assert doc["check"]["passed"], doc["check"]


def handmade_plan(root: Path, spec: Path) -> Path:
    """x @ W1 (columns split 4 ways) -> Relu -> @ W2 (rows split): 4 partial sums, reduced onto
    rank 0 (a reduce), replicated onto ranks 1-3 (a broadcast), one replica kept on rank 2."""
    rng = np.random.default_rng(1)
    model = root / "mlp.onnx"
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.5).astype(np.float32), n)
             for n, s in [("w1", (8, 8)), ("w2", (8, 6))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 8))), (), "x")
    w1 = b.add1(WeightAttrs(TensorShape((8, 8))), (), "w1")
    w2 = b.add1(WeightAttrs(TensorShape((8, 6))), (), "w2")
    h = b.add1(MatMulAttrs(), (b.add1(ReplicateAttrs(4), (x,)), b.add1(RepartitionAttrs(1, 4), (w1,))), "mm1")
    r = b.add1(UnaryAttrs("Relu"), (h,), "relu")
    y = b.add1(MatMulAttrs(), (r, b.add1(RepartitionAttrs(0, 4), (w2,))), "mm2")
    y = b.add1(CombineAttrs(REPLICA_DIM, 3), (b.add1(ReplicateAttrs(3), (b.add1(ReductionAttrs(4), (y,)),)),))
    pcg = b.build([y])
    z = (0, 0, 0, 0)
    views = (MachineView(0, z), MachineView(0, z), MachineView(0, z), MachineView(0, (0, 0, 0, 1)),
             MachineView(0, (0, 1, 0, 0)), MachineView(0, (0, 1, 0, 0)), MachineView(0, (0, 1, 0, 0)),
             MachineView(0, (1, 0, 0, 0)), MachineView(0, (0, 0, 1, 0)), MachineView(0, z),
             MachineView(1, (0, 0, 0, 1)), MachineView(2, z))
    info = {"path": str(model), "sha256": file_sha256(model), "inputs": {"x": {"dims": [4, 8], "dtype": "float32"}},
            "outputs": ["y"], "batch_size": 4}
    plan = Plan(info, load_cluster(spec), {"dtype": "float32", "optimizer": "momentum"}, "handmade", pcg, views,
                {"step_time_ms": 0.01}, {"handmade": {"step_time_ms": 0.01}})
    path = root / "handmade.json"
    plan.save(path)
    return path


def test_reduce_broadcast_and_replica_pick(plans, tmp_path):
    plan = handmade_plan(tmp_path, plans.specs[4])
    prog = build_program(load_plan(plan).pcg, load_plan(plan).views, None)
    kinds = sorted(c.kind.value for s in prog.steps for c in s.collectives)
    assert kinds == ["broadcast", "reduce"]
    doc = run_json(plan, "--check", "--steps", "2", "--loss", "mse", ranks=4)
    assert doc["optimizer"] == "momentum" and doc["check"]["passed"], doc["check"]


def _grouped_conv_model(path: Path, groups: int) -> Path:
    """Conv (8 channels, ``groups`` groups) -> BatchNormalization -> Relu -> global pool -> MatMul."""
    rng = np.random.default_rng(1)
    c = 8
    inits = [numpy_helper.from_array((rng.standard_normal((c, c // groups, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((c, 4)) * 0.3).astype(np.float32), "fc")]
    inits += [numpy_helper.from_array(np.full(c, v, np.float32), n)
              for n, v in (("s", 1), ("b", 0), ("m", 0), ("v", 1))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=groups, pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("MatMul", ["f", "fc"], ["y"])]
    g = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("groups", [4, 8], ids=["grouped", "depthwise"])
def test_a_grouped_conv_split_along_its_channels_trains_as_one_process(tmp_path, groups):
    """ResNeXt's grouped convolutions under tensor parallelism: each rank runs its share of
    the groups on their input channels (a rank that ran the whole input through a conv of
    the model's group count trained a wrong model, and a depthwise one failed)."""
    model = _grouped_conv_model(tmp_path / "g.onnx", groups)
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", "local-cpu:2", "--batch-size", "8",
                                 "--strategy", "tp=2,dp=1", "--out", str(plan)])
    assert r.exit_code == 0, r.output
    doc_plan = json.loads(plan.read_text())
    conv = next(n for n in doc_plan["pcg"]["nodes"] if n["name"] == "c")
    assert conv["outputs"][0]["degrees"][1] == 2      # its channels split
    doc = run_json(plan, "--check", "--steps", "2")
    assert doc["check"]["passed"], doc["check"]
