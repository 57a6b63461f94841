"""The baseline strategies (data parallel, Megatron-style tensor parallel) and the choice
between them: valid PCGs, the device counts and splits they promise, ``best`` picking the
fastest plan that fits, and infeasibility when nothing fits."""
from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest
from models.catalog import TINY_MODELS, mlp_model

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig
from unity_cli.errors import InfeasibleError, UsageError
from unity_cli.ir.machine_view import check_view
from unity_cli.ir.ops.linear import GemmAttrs, MatMulAttrs
from unity_cli.ir.ops.parallel import ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.baselines import STRATEGIES, data_parallel, largest_divisor_at_most, tensor_parallel
from unity_cli.search.optimize import CHOICES, evaluate, optimize

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "cluster_specs"
CLUSTERS = ("dgx-a100-8", "dgx-a100-32")


@pytest.fixture(scope="module")
def clusters():
    return {name: load_cluster(SPECS / f"{name}.yaml") for name in CLUSTERS}


def _mlp(tmp_path: Path, hidden: int = 32) -> Path:
    """x[batch,16] -> MatMul -> Relu -> MatMul -> y[batch,8]: two Linears in a row."""
    return mlp_model(tmp_path / "mlp.onnx", hidden=hidden)

@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory) -> Path:
    return _mlp(tmp_path_factory.mktemp("baselines"))


def _kinds(pcg) -> collections.Counter:
    return collections.Counter(n.kind for _, n in pcg)


def _logical_outputs(pcg):
    return [pcg.shape(r).logical for r in pcg.outputs]


# -- every shared model, both clusters ------------------------------------------------------------


@pytest.mark.parametrize("filename", [f for f, _ in TINY_MODELS])
@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_baselines_are_valid(tiny_models, clusters, filename, cluster_name):
    cluster = clusters[cluster_name]
    imported = import_model(tiny_models / filename, ImportOptions(4))
    for name, make in STRATEGIES.items():
        baseline = make(imported.pcg, cluster)
        assert baseline.name == name
        validate(baseline.pcg)
        assert _logical_outputs(baseline.pcg) == _logical_outputs(imported.pcg)
        # Every tensor lives on at most the baseline's devices, and no output holds partial sums.
        assert 1 <= baseline.devices <= cluster.num_devices
        assert all(s.pieces <= baseline.devices for _, n in baseline.pcg for s in n.outputs)
        assert all(baseline.pcg.shape(r).sum_degree == 1 for r in baseline.pcg.outputs)
        # The sources are the model's, unchanged.
        src = sorted(n.name for _, n in baseline.pcg if n.spec.is_source)
        assert src == sorted(n.name for _, n in imported.pcg if n.spec.is_source)
        cand = evaluate(baseline, cluster, CostConfig())
        for i, n in baseline.pcg:
            assert check_view(cand.views[i], n.outputs[0], cluster.num_devices) is None
        assert cand.report.step_time > 0 and cand.report.feasible
        assert len(cand.report.memory) == cluster.num_devices


@pytest.mark.parametrize("filename", [f for f, _ in TINY_MODELS])
def test_data_parallel_uses_the_batch(tiny_models, clusters, filename):
    imported = import_model(tiny_models / filename, ImportOptions(4))
    for cluster in clusters.values():
        dp = data_parallel(imported.pcg, cluster)
        assert dp.devices == 4
        assert _kinds(dp.pcg)["Reduction"] == 0
        for _, n in dp.pcg:
            if isinstance(n.op, RepartitionAttrs) and dp.pcg.nodes[n.inputs[0].node].kind == "Input":
                assert n.op == RepartitionAttrs(0, 4)


@pytest.mark.parametrize("n,cap,want", [(4, 8, 4), (6, 8, 6), (8, 8, 8), (16, 8, 8), (7, 8, 7), (9, 8, 3),
                                        (12, 8, 6), (1, 8, 1), (5, 1, 1), (64, 32, 32), (48, 32, 24)])
def test_largest_divisor_at_most(n, cap, want):
    assert largest_divisor_at_most(n, cap) == want


@pytest.mark.parametrize("batch,want", [(4, 4), (6, 6), (8, 8), (12, 6), (9, 3), (1, 1)])
def test_data_parallel_devices(mlp_path, clusters, batch, want):
    imported = import_model(mlp_path, ImportOptions(batch))
    dp = data_parallel(imported.pcg, clusters["dgx-a100-8"])
    assert dp.devices == want
    validate(dp.pcg)
    g = dp.pcg
    for _, n in g:
        src = g.nodes[n.inputs[0].node] if n.inputs else None
        if isinstance(n.op, ReplicateAttrs):
            assert isinstance(src.op, WeightAttrs) and n.op.degree == want
    # Every MatMul runs on `want` pieces, batch split.
    for _, n in g:
        if isinstance(n.op, MatMulAttrs):
            out = n.outputs[0]
            assert out.degrees == (want, 1) and out.pieces == want


def test_data_parallel_on_32(mlp_path, clusters):
    imported = import_model(mlp_path, ImportOptions(64))
    assert data_parallel(imported.pcg, clusters["dgx-a100-32"]).devices == 32
    assert data_parallel(imported.pcg, clusters["dgx-a100-8"]).devices == 8


# -- tensor parallel ------------------------------------------------------------------------------


def test_tensor_parallel_bert_splits_matmul_weights(tiny_models, clusters):
    imported = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(4))
    for cluster in clusters.values():
        tp = tensor_parallel(imported.pcg, cluster)
        g = tp.pcg
        split_weights = [n for _, n in g if isinstance(n.op, RepartitionAttrs)
                         and isinstance(g.nodes[n.inputs[0].node].op, WeightAttrs)]
        assert split_weights, "tensor parallelism splits some weights"
        assert _kinds(g)["Reduction"] >= 1
        # Every MatMul reading a trainable weight reads it split 8 ways (one node's devices).
        for _, n in g:
            if isinstance(n.op, MatMulAttrs | GemmAttrs):
                w = g.shape(n.inputs[1])
                chain = g.nodes[n.inputs[1].node]
                while chain.spec.is_parallel_op:
                    chain = g.nodes[chain.inputs[0].node]
                if isinstance(chain.op, WeightAttrs) and chain.op.trainable:
                    assert w.shard_degree == 8, f"{n.name}: weight {w}"
        assert tp.devices == cluster.num_devices


def test_tensor_parallel_mlp_is_column_then_row(mlp_path, clusters):
    imported = import_model(mlp_path, ImportOptions(4))
    tp = tensor_parallel(imported.pcg, clusters["dgx-a100-8"])
    g = tp.pcg
    validate(g)
    fc1, fc2 = g.nodes[g.find("fc1")], g.nodes[g.find("fc2")]
    # Column split: W1 split on its output dim, fc1's output split on features.
    assert g.shape(fc1.inputs[1]).degrees == (1, 8)
    assert fc1.outputs[0].degrees == (1, 8) and fc1.outputs[0].sum_degree == 1
    # Row split: W2 split on its input dim, fed straight from the split activation.
    assert g.shape(fc2.inputs[1]).degrees == (8, 1)
    assert fc2.outputs[0].sum_degree == 8
    relu = g.nodes[g.find("relu")]
    assert fc2.inputs[0].node == g.find("relu") and relu.inputs[0].node == g.find("fc1")
    kinds = _kinds(g)
    assert kinds["Reduction"] == 1 and kinds["Combine"] == 0
    (red,) = [i for i, n in g if isinstance(n.op, ReductionAttrs)]
    assert g.nodes[red].inputs[0].node == g.find("fc2") and g.nodes[red].op.degree == 8
    assert [r.node for r in g.outputs] == [red]
    assert g.shape(g.outputs[0]).sum_degree == 1
    # The reduction is paid for.
    cand = evaluate(tp, clusters["dgx-a100-8"], CostConfig())
    assert cand.report.nodes[red].comm_fwd > 0


def test_tensor_parallel_across_nodes_is_data_parallel_between_them(mlp_path, clusters):
    imported = import_model(mlp_path, ImportOptions(8))
    tp = tensor_parallel(imported.pcg, clusters["dgx-a100-32"])
    assert tp.devices == 32
    g = tp.pcg
    x = [i for i, n in g if isinstance(n.op, InputAttrs)][0]
    assert any(isinstance(n.op, RepartitionAttrs) and n.inputs[0].node == x and n.op == RepartitionAttrs(0, 4)
               for _, n in g)
    assert g.nodes[g.find("fc1")].outputs[0].degrees == (4, 8)


# -- choosing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("filename", [f for f, _ in TINY_MODELS])
@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_best_is_the_fastest_feasible(tiny_models, clusters, filename, cluster_name):
    cluster = clusters[cluster_name]
    imported = import_model(tiny_models / filename, ImportOptions(4))
    result = optimize(imported.pcg, cluster, CostConfig(), "best")  # no rules: the search only compares its starts
    assert set(result.candidates) == set(CHOICES) - {"best"}
    feasible = [c for c in result.candidates.values() if c.report.feasible]
    assert result.chosen.report.step_time == min(c.report.step_time for c in feasible)
    for name in STRATEGIES:
        forced = optimize(imported.pcg, cluster, CostConfig(), name)
        assert forced.chosen.baseline.name == name
        assert forced.chosen.report.step_time == result.candidates[name].report.step_time


def test_unknown_strategy(mlp_path, clusters):
    imported = import_model(mlp_path, ImportOptions(4))
    with pytest.raises(UsageError, match="nonsense"):
        optimize(imported.pcg, clusters["dgx-a100-8"], CostConfig(), "nonsense")
    assert CHOICES == ("best", "unity", "parallel_only", "algebraic_then_parallel", "data_parallel", "tensor_parallel",
                       "hybrid")


def _small_cluster(tmp_path: Path, capacity: str):
    text = (SPECS / "dgx-a100-8.yaml").read_text()
    assert "capacity: 40 GiB" in text
    path = tmp_path / "small.yaml"
    path.write_text(text.replace("capacity: 40 GiB", f"capacity: {capacity}"))
    return load_cluster(path)


def test_memory_infeasible(tiny_models, tmp_path):
    cluster = _small_cluster(tmp_path, "1 MiB")
    imported = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(4))
    with pytest.raises(InfeasibleError) as e:
        optimize(imported.pcg, cluster, CostConfig(), max_candidates=4)   # (nothing fits: a short search says so)
    msg = str(e.value)
    # The amount needed is spelled out as a size, not rounded to nothing, in the summary's binary units.
    assert re.search(r"needs \d+\.\d (MiB|KiB) on device \d+, which has 1\.0 MiB", msg), msg
    with pytest.raises(InfeasibleError, match="data_parallel does not fit"):
        optimize(imported.pcg, cluster, CostConfig(), "data_parallel")


def test_best_skips_the_infeasible(tiny_models, tmp_path):
    """bert_tiny at batch 1: data parallel is faster but keeps every weight on its one device;
    tensor parallelism splits the weights and is the only one that fits in 2 MiB."""
    imported = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(1))
    roomy = optimize(imported.pcg, load_cluster(SPECS / "dgx-a100-8.yaml"), CostConfig())
    dp, tp = roomy.candidates["data_parallel"].report, roomy.candidates["tensor_parallel"].report
    assert dp.step_time < tp.step_time
    assert max(tp.memory) < 2 * 2**20 < max(dp.memory)
    tight = optimize(imported.pcg, _small_cluster(tmp_path, "2 MiB"), CostConfig())
    assert tight.chosen.report.feasible and max(tight.chosen.report.memory) <= 2 * 2**20
    assert tight.candidates["tensor_parallel"].report.feasible
    assert not tight.candidates["data_parallel"].report.feasible


def test_memory_limit_is_a_hard_constraint(tmp_path):
    from click.testing import CliRunner

    from unity_cli.cli import cli

    model = Path(__file__).resolve().parents[2] / "examples" / "bert_tiny.onnx"
    out = tmp_path / "plan.json"
    args = ["optimize", str(model), "--cluster", str(SPECS / "dgx-a100-8.yaml"), "--batch-size", "64",
            "--out", str(out), "--max-candidates", "8"]
    ok = CliRunner().invoke(cli, args + ["--memory-limit", "0.5"])
    assert ok.exit_code == 0, ok.output
    plan = json.loads(out.read_text())
    assert plan["config"]["memory_limit_bytes"] == 500_000_000
    assert max(plan["predicted"]["memory_bytes"]) <= 500_000_000
    # One batch fits nowhere in 1 MB: with the step fixed so, refused; left to the search, it
    # goes on to ZeRO, micro-batches and recomputation until a plan fits.
    fixed = ["--zero", "0", "--micro-batches", "1", "--recompute", "none"]
    bad = CliRunner().invoke(cli, args + ["--memory-limit", "0.001", *fixed])
    assert bad.exit_code == 1
    assert "no plan fits" in bad.output and "needs" in bad.output and "--memory-limit" in bad.output
    small = [a if a != "64" else "16" for a in args]
    ok = CliRunner().invoke(cli, small + ["--memory-limit", "0.001"])
    assert ok.exit_code == 0, ok.output
    plan = json.loads(out.read_text())
    config = plan["config"]
    assert config.get("micro_batches", 1) > 1 or config.get("recompute") == "full" or config.get("zero")
    assert max(plan["predicted"]["memory_bytes"]) <= 1_000_000
    assert plan["model"]["batch_size"] * config.get("micro_batches", 1) == 16
