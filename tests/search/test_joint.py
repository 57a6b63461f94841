"""The joint search (`--strategy unity`): never worse than the baselines it starts from,
anytime under its budget, deterministic when it finishes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.optimize import optimize
from unity_cli.substitutions.cache import load_cache

UNITY = str(Path(sys.executable).parent / "unity")


@pytest.fixture(scope="module")
def rules():
    return load_cache().rules


@pytest.mark.parametrize("name", ["convnet_tiny.onnx", "bert_tiny.onnx"])
def test_never_worse_than_any_baseline(tiny_models, cluster_dir, rules, name):
    pcg = import_model(tiny_models / name, ImportOptions(batch_size=8)).pcg
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    res = optimize(pcg, cluster, CostConfig(), "unity", rules, max_candidates=60)
    best = res.chosen.report.step_time
    for cand in res.candidates.values():
        assert best <= cand.report.step_time * (1 + 1e-9)
    assert res.stats.candidates >= len(res.candidates)


def test_a_budget_is_a_ceiling_and_says_when_it_cut(tmp_path, tiny_models, cluster_dir):
    """--budget far below what bert's search needs: the run still writes a plan, the summary
    says in one line that the ceiling cut the search, and the plan records it."""
    out = tmp_path / "plan.json"
    p = subprocess.run([UNITY, "optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                        str(cluster_dir / "dgx-a100-8.yaml"), "--budget", "0.01", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    cut = [line for line in p.stdout.splitlines() if "--budget 0.01 s cut the search" in line]
    assert len(cut) == 1, p.stdout
    search = json.loads(out.read_text())["search"]
    assert search["cut_by_budget"] is True and search.get("candidates", 0) < 50
    # Every row the ceiling left no time for is named, in the summary and in the plan.
    assert set(search["not_priced"]) <= {"tensor_parallel", "hybrid", "unity", "parallel_only",
                                         "algebraic_then_parallel"} and search["not_priced"]
    assert f"left out: {', '.join(search['not_priced'])}" in cut[0]


def test_max_candidates_wins_over_the_budget(tiny_models, cluster_dir, rules):
    """A work count given, the time ceiling does not apply: the plan cannot depend on speed."""
    pcg = import_model(tiny_models / "convnet_tiny.onnx", ImportOptions(batch_size=8)).pcg
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    res = optimize(pcg, cluster, CostConfig(), "unity", rules, budget=1e-6, max_candidates=30)
    assert not res.cut_by_budget
    free = optimize(pcg, cluster, CostConfig(), "unity", rules, max_candidates=30)
    assert res.chosen.report == free.chosen.report and res.rewrites == free.rewrites


def test_deterministic_across_hash_seeds(tmp_path, tiny_models, cluster_dir):
    plans = []
    for seed in ("1", "4242"):
        out = tmp_path / f"plan{seed}.json"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        p = subprocess.run([UNITY, "optimize", str(tiny_models / "convnet_tiny.onnx"), "--cluster",
                            str(cluster_dir / "dgx-a100-8.yaml"), "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=900)
        assert p.returncode == 0, p.stderr
        plans.append(out.read_bytes())
    assert plans[0] == plans[1]   # default options: stopped by a count of work, never by the clock
    assert json.loads(plans[0])["search"]["cut_by_budget"] is False


def test_search_baselines_are_reported_beside_unity(tiny_models, cluster_dir, rules):
    pcg = import_model(tiny_models / "convnet_tiny.onnx", ImportOptions(batch_size=8)).pcg
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    res = optimize(pcg, cluster, CostConfig(), "unity", rules, max_candidates=40)
    assert {"parallel_only", "algebraic_then_parallel", "data_parallel", "tensor_parallel"} <= set(res.candidates)
    for name in ("parallel_only", "algebraic_then_parallel"):
        alone = optimize(pcg, cluster, CostConfig(), name, rules, max_candidates=20)
        assert alone.chosen.baseline.name == name
        assert alone.chosen.report.step_time <= alone.candidates["data_parallel"].report.step_time * (1 + 1e-9)


def test_a_candidate_cap_gives_the_same_plan_everywhere(tmp_path, tiny_models, cluster_dir):
    """bert does not finish in a few seconds; --max-candidates stops it deterministically."""
    plans = []
    for seed in ("3", "99"):
        out = tmp_path / f"plan{seed}.json"
        p = subprocess.run([UNITY, "optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                            str(cluster_dir / "dgx-a100-8.yaml"), "--batch-size", "16", "--strategy", "unity",
                            "--max-candidates", "12", "--out", str(out)],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED=seed), timeout=600)
        assert p.returncode == 0, p.stderr
        plans.append(out.read_bytes())
    assert plans[0] == plans[1]
    search = json.loads(plans[0])["search"]
    assert search["capped"] is True and search["candidates"] <= 6 + 4  # the unity share, plus its start graphs


FUSE_SIBLINGS = "Concat(MatMul(a, b), MatMul(a, c), axis=-1) = MatMul(a, Concat(b, c, axis=-1))"


def test_fusing_two_linears_makes_a_megatron_pair(tmp_path, cluster_dir, rules):
    """Two Linears sharing an input, concatenated, then Relu and a Linear, on 8 GPUs.
    Without rewrites, tensor parallelism gathers the two column-split halves before the
    Concat. Fusing the two into one MatMul on their concatenated weights (stored folded:
    one GEMM and no Concat, so faster on one device too) makes the whole a column-then-row
    pair. Both searches that have the algebraic rules find it; ``parallel_only`` cannot.
    (``test_a_bias_set_apart_lets_the_second_linear_split_by_rows`` is a rewrite that only
    the joint search finds.)"""
    from models.catalog import shared_input_model

    pcg = import_model(shared_input_model(tmp_path / "m.onnx"), ImportOptions()).pcg
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    unity = optimize(pcg, cluster, CostConfig(), "unity", rules, budget=120, max_candidates=300)
    po = optimize(pcg, cluster, CostConfig(), "parallel_only", rules, budget=120, max_candidates=1000)
    atp = optimize(pcg, cluster, CostConfig(), "algebraic_then_parallel", rules, budget=120, max_candidates=600)
    assert po.stats.converged  # not for want of budget
    best = unity.chosen.report.step_time
    assert best < 0.97 * po.chosen.report.step_time
    assert best <= atp.chosen.report.step_time * (1 + 1e-9)
    assert best < 0.97 * unity.candidates["tensor_parallel"].report.step_time
    assert [a.at for a in unity.rewrites if a.rule_name.startswith(FUSE_SIBLINGS)] == ["concat"]
    assert any(n.op.parts for _, n in unity.chosen.baseline.pcg if n.kind == "Weight")
    assert any(n.kind == "Reduction" for _, n in unity.chosen.baseline.pcg)


def test_a_search_never_returns_less_than_the_baselines_it_started_from(tmp_path, cluster_dir, rules):
    """AlexNet on 192 V100s: the search ranks graphs under default views, where a graph can
    beat tensor parallelism and then lose to it once the mapping DP places both; the search
    must then keep the baseline."""
    from models.catalog import zoo9_model

    path = tmp_path / "alexnet.onnx"
    onnx.save(zoo9_model("alexnet"), path)
    pcg = import_model(path, ImportOptions(batch_size=192)).pcg
    cluster = load_cluster(cluster_dir / "summit-192.yaml")
    res = optimize(pcg, cluster, CostConfig(), "best", rules, max_candidates=16)
    t = {k: c.report.step_time for k, c in res.candidates.items()}
    for search in ("unity", "parallel_only"):
        assert t[search] <= min(t["data_parallel"], t["tensor_parallel"]) * (1 + 1e-9), (search, t)


def test_the_help_states_the_default_work_count():
    from click.testing import CliRunner

    from unity_cli.cli import cli
    from unity_cli.search.optimize import DEFAULT_CANDIDATES

    text = " ".join(CliRunner().invoke(cli, ["optimize", "--help"]).output.split())
    assert f"(default: {DEFAULT_CANDIDATES})" in text


def pcie_cluster(tmp_path: Path, cluster_dir: Path, devices: int = 4) -> Path:
    """``devices`` A100s on PCIe-class links (16 GB/s): communication matters."""
    spec = tmp_path / f"pcie-{devices}.yaml"
    spec.write_text((cluster_dir / "dgx-a100-8.yaml").read_text().replace("devices: 8", f"devices: {devices}")
                    .replace("300 GB/s", "16 GB/s").replace("name: dgx-a100-8", f"name: pcie-a100-{devices}"))
    return spec


def test_a_bias_set_apart_lets_the_second_linear_split_by_rows(tmp_path, cluster_dir, rules):
    """PyTorch's nn.Linear is a Gemm with its bias inside, and a Gemm's row split would add
    the bias once per partial sum: tensor parallelism gathers the hidden layer instead.
    Setting the bias apart (``Gemm(x, W, b) = Gemm(x, W) + b``, slower on one device: one
    launch more) lets the solver split the second Gemm by rows (Megatron) and reduce before
    the bias: less communication. ``parallel_only`` lacks the rule, ``algebraic_then_parallel``
    does not apply it on one device; the plan says what the rewrite bought."""
    from models.families import torch_mlp

    pcg = import_model(torch_mlp(tmp_path / "mlp.onnx", width=1024, layers=1, shape_only=True),
                       ImportOptions(batch_size=64)).pcg
    cluster = load_cluster(pcie_cluster(tmp_path, cluster_dir))
    res = {s: optimize(pcg, cluster, CostConfig(), s, rules) for s in ("unity", "parallel_only",
                                                                      "algebraic_then_parallel")}
    best = res["unity"].chosen.report.step_time
    assert best < 0.95 * res["parallel_only"].chosen.report.step_time
    assert best < 0.95 * res["algebraic_then_parallel"].chosen.report.step_time
    (bias,) = [a for a in res["unity"].rewrites if a.rule_name == "gemm-trans-b-bias-as-add"]
    assert bias.at == "l0.1.gemm" and not bias.reverse
    bought = dict(bias.bought)
    assert bought["comm_ms"] > 0 and bought["step_ms"] > 0 > bought["compute_ms"]   # comm saved, a launch paid
    assert any(n.kind == "Reduction" for _, n in res["unity"].chosen.baseline.pcg)
    assert not any(a.rule_name == bias.rule_name for s in ("parallel_only", "algebraic_then_parallel")
                   for a in res[s].rewrites)


def test_fusions_wait_for_the_parallelization_and_unity_is_never_behind_taso(cluster_dir, rules):
    """DLRM's torch export on 8 GPUs: TASO-then-FlexFlow fuses every Linear's ReLU for one
    device first; the joint search fuses only after choosing the parallelization, so a
    fusion never takes a row split away, and it keeps the faster of its walk and the
    search baselines' plans: it is at least as fast as both, and its plan fuses."""
    from models.catalog import EXPORTED_DIR

    pcg = import_model(EXPORTED_DIR / "dlrm_tiny.onnx", ImportOptions(batch_size=64)).pcg
    res = optimize(pcg, load_cluster(cluster_dir / "dgx-a100-8.yaml"), CostConfig(), "best", rules)
    unity = res.candidates["unity"].report.step_time
    for other in ("parallel_only", "algebraic_then_parallel"):
        assert unity <= res.candidates[other].report.step_time * (1 + 1e-9), other
    assert any(a.rule_name.endswith("-fused") for a in res.rewrites)


def test_after_the_search_every_activation_that_saves_time_is_fused(tmp_path, cluster_dir, rules, monkeypatch):
    """The pass after the search: on a data-parallel MLP every ReLU after a Linear runs inside
    it, each fusion recorded with the time it bought; priced slower, none is applied."""
    from dataclasses import replace

    from unity_cli import zoo
    from unity_cli.cost.model import estimate
    from unity_cli.search import joint
    from unity_cli.search.baselines import data_parallel
    from unity_cli.search.views import default_views

    path = tmp_path / "mlp.onnx"
    zoo.write("mlp", path, "small", weights=False)
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    dp = data_parallel(import_model(path, ImportOptions(batch_size=64)).pcg, cluster).pcg
    views = default_views(dp)
    before = estimate(dp, views, cluster, CostConfig())
    start = joint.Found(dp, views, before, "data_parallel")

    def relus(g):
        return sum(1 for _, n in g if n.kind == "Unary" and n.op.fn == "Relu")

    fused, priced = joint.fuse_activations(start, cluster, CostConfig(), rules)
    assert relus(dp) >= 4 and relus(fused.pcg) == 0 and priced >= relus(dp)
    assert len(fused.path) == relus(dp) and all(a.rule_name.endswith("-fused") for a in fused.path)
    assert all(dict(a.bought)["step_ms"] > 0 for a in fused.path)
    assert fused.report.step_time < before.step_time
    assert fused.report == estimate(fused.pcg, default_views(fused.pcg), cluster, CostConfig())
    slower = replace(before, step_time=before.step_time * 2)
    monkeypatch.setattr(joint, "estimate", lambda *_: slower)
    assert joint.fuse_activations(start, cluster, CostConfig(), rules)[0] is start
    # The run's time ceiling passed: the plan as it was stands (the search's result is kept).
    from unity_cli.deadline import ceiling
    with ceiling(0.0):
        assert joint.fuse_activations(start, cluster, CostConfig(), rules) == (start, 0)


def test_activations_fuse_where_the_solver_parallelizes_them_so(monkeypatch):
    """XDL at paper scale on 8 Summit GPUs: the polish ends on a plan whose last product is
    split by rows (partial sums, then the sigmoid), where no fusion can match; the plain
    graph with its three activations fused, each priced as the solver parallelizes it
    (products unsplit), is faster, and unity keeps it. Without that pass it does not."""
    from unity_cli.onnx_import import import_model_proto
    from unity_cli.search import optimize as opt
    from unity_cli.zoo import build as build_zoo

    pcg = import_model_proto(build_zoo("xdl", "paper", batch_size=4096).model, ImportOptions(4096)).pcg
    cluster = load_cluster(Path(__file__).resolve().parents[2] / "cluster_specs" / "summit-192.yaml").first(8)
    rules = load_cache().rules

    def unity():
        res = optimize(pcg, cluster, CostConfig(), "unity", rules)
        return res.chosen.report.step_time, sorted(a.rule_name for a in res.rewrites)

    fused, names = unity()
    assert names == ["matmul-relu-fused", "matmul-relu-fused", "matmul-sigmoid-fused"]
    monkeypatch.setattr(opt, "fuse_solved", lambda *args: None)   # the pass finds nothing
    without, _ = unity()
    assert fused < without * (1 - 1e-6)


def test_uneven_sibling_fusions_are_kept_only_where_device_groups_price_them_faster(tmp_path, cluster_dir, rules):
    """Sibling fusions of unequal widths are priced only with device groups (after the walk
    and the polish): where one pays so (three reductions, 256/256/128 channels), unity takes
    it and is faster than without those rules; where it does not (Inception-tiny's dynamo
    export at 32 GPUs: flat, the fused triple looked best, grouped it ran 28 % slower than
    the equal pair it hid), unity's plan is the one it finds without them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.catalog import EXPORTED_DIR
    from models.families import reductions

    without = [r for r in rules if not r.grouped_only]
    assert 0 < len(rules) - len(without) <= 12
    a100 = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    pcg = import_model(reductions(tmp_path / "r.onnx", 256), ImportOptions(batch_size=64)).pcg
    got, plain = (optimize(pcg, a100, CostConfig(), "unity", rs) for rs in (rules, without))
    assert [a.rule_name for a in got.rewrites] == ["sibling-conv1x1-uneven-3"]
    assert got.chosen.report.step_time < plain.chosen.report.step_time
    inception = import_model(EXPORTED_DIR / "inception_tiny_dynamo.onnx", ImportOptions()).pcg
    a100x32 = load_cluster(cluster_dir / "dgx-a100-32.yaml")
    got, plain = (optimize(inception, a100x32, CostConfig(), "unity", rs) for rs in (rules, without))
    assert got.chosen.report.step_time == plain.chosen.report.step_time
    assert not any(r.rule_name.endswith(("uneven-2", "uneven-3")) for r in got.rewrites)


def test_a_graph_searched_by_segments_gets_no_rule_only_device_groups_price(tmp_path, cluster_dir, rules,
                                                                             monkeypatch):
    """Where the solver has no plan, the graph is searched segment by segment, flat: the
    uneven sibling fusions are not among its rules either."""
    import unity_cli.search.optimize as opt
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.families import reductions

    seen = []
    real = opt.search_segments

    def recording(pcg, cluster, config, rs, *args, **kwargs):
        seen.append(list(rs))
        return real(pcg, cluster, config, rs, *args, **kwargs)

    monkeypatch.setattr(opt, "search_segments", recording)
    monkeypatch.setattr(opt._Evaluator, "solve", lambda self, pcg, grouped=False: None)
    pcg = import_model(reductions(tmp_path / "r.onnx", 64), ImportOptions(batch_size=16)).pcg
    optimize(pcg, load_cluster(cluster_dir / "dgx-a100-8.yaml"), CostConfig(), "unity", rules, max_candidates=40)
    assert seen and any(r.grouped_only for r in rules)
    assert not any(r.grouped_only for rs in seen for r in rs)
