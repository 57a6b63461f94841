"""What ``unity profile --plan`` keeps from a plan's own training steps besides kernel times:
the parallel ops' own work, each call's excess over the fits, the optimizer's and the loss's
fixed costs (``profiling/profiler.py``), and how the cost model charges them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from unity_cli.cli import cli
from unity_cli.cluster import load_cluster
from unity_cli.cluster.collectives import Collective
from unity_cli.cost.model import CostConfig, Optimizer, estimate, updates_per_device
from unity_cli.cost.moves import Move, phase_seconds
from unity_cli.cost.profile import Profile, load_profile
from unity_cli.ir import DType
from unity_cli.plan.plan import load_plan
from unity_cli.profiling.profiler import (
    InSitu,
    TimingPolicy,
    _between,
    _fixed_costs,
    _least_calls,
    _shares,
    run_profile,
)

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "cluster_specs" / "local-cpu.yaml"
BIN = Path(sys.executable).parent
FAST = TimingPolicy(min_repeats=2, min_seconds=0.001, max_repeats=5, max_seconds=5.0)
P2P, AR = Collective.P2P, Collective.ALL_REDUCE


def _plan(mlp: Path, out: Path, strategy: str, spec: Path = LOCAL) -> Path:
    r = CliRunner().invoke(cli, ["optimize", str(mlp), "--cluster", str(spec), "--batch-size", "8", "--strategy",
                                 strategy, "--out", str(out), "--no-profile"])
    assert r.exit_code == 0, r.output
    return out


def _fitted() -> Profile:
    """A profile of fits only: a 10 us + 1 GB/s link, all-reduce 20 us + 1 ns per byte."""
    return Profile.from_json({
        "format": "unity-profile/1", "machine": {}, "settings": {}, "compute": {},
        "comm": {"device_type": "cpu-core", "device_kind": "cpu", "ranks": 2, "hosts": 1,
                 "links": {"intra-node": {"latency_s": 1e-5, "bandwidth_Bps": 1e9, "samples": []}},
                 "collectives": {"all-reduce": {"intra-node": {"ranks": 2, "alpha_s": 2e-5, "beta_s_per_byte": 1e-9,
                                                              "samples": []}}}}})


def test_a_call_is_the_fastest_ranks_time_and_holds_each_message_once(cluster):
    """Per call (its key), per step the least time any rank spent in it (the others waited),
    the median over the steps; its moves are every rank's, a message its sender and its
    receiver both list counted once, two equal messages of one exchange twice."""
    ex = ("p2p", 0, 1), 0
    ar = ("group", 0, 1), 0
    send, back = (P2P, (0, 1), 64, -1), (P2P, (1, 0), 32, -1)
    rank0 = [[(ex, "fwd", 5e-5, (send, send, back)), (ar, "sync", 3e-5, ((AR, (0, 1), 8, -1),))],
             [(ex, "fwd", 4e-5, (send, send, back)), (ar, "sync", 9e-5, ((AR, (0, 1), 8, -1),))],
             [(ex, "fwd", 6e-5, (send, send, back)), (ar, "sync", 2e-5, ((AR, (0, 1), 8, -1),))]]
    rank1 = [[(ex, "fwd", 1e-5, (back, send, send)), (ar, "sync", 4e-5, ((AR, (0, 1), 8, -1),))],
             [(ex, "fwd", 7e-5, (back, send, send)), (ar, "sync", 1e-5, ((AR, (0, 1), 8, -1),))],
             [(ex, "fwd", 2e-5, (back, send, send)), (ar, "sync", 5e-5, ((AR, (0, 1), 8, -1),))]]
    calls = {m: (phase, t) for _, phase, m, t in _least_calls(cluster, [rank0, rank1])}
    assert calls[tuple(sorted((send, send, back), key=repr))] == ("fwd", pytest.approx(2e-5))   # min 1, 4, 2
    assert calls[((AR, (0, 1), 8, -1),)] == ("sync", pytest.approx(2e-5))                       # min 3, 1, 2
    assert len(calls) == 2


def test_a_calls_overhead_is_its_mean_excess_over_the_fits(cluster):
    """The fits price an exchange of 1,000 B each way at 10 us + 1 us, an all-reduce of 1,000 B
    at 21 us: forward calls that took 5 us and 15 us more give 10 us in the forward phase, a
    gradient all-reduce 30 us more 30 us in the sync; calls faster than their fit, 0."""
    prof = _fitted()
    ex = ((P2P, (0, 1), 1000, -1), (P2P, (1, 0), 1000, -1))
    ar = ((AR, (0, 1), 1000, -1),)
    assert phase_seconds([Move(k, "fwd", g, n) for k, g, n, _ in ex], cluster, prof)["fwd"] == pytest.approx(1.1e-5)
    situ = InSitu({}, None, {}, None, ((cluster, "fwd", ex, 1.1e-5 + 5e-6), (cluster, "fwd", ar, 2.1e-5 + 1.5e-5),
                                       (cluster, "sync", ar, 2.1e-5 + 3e-5)))
    assert situ.call_overhead(prof) == {"fwd": pytest.approx(1e-5), "sync": pytest.approx(3e-5)}
    assert InSitu({}, None, {}, None, ((cluster, "bwd", ar, 1e-5),)).call_overhead(prof) == {"bwd": 0.0}
    assert InSitu({}, None, {}, None).call_overhead(prof) == {}


def test_the_optimizer_and_the_loss_keep_what_their_bandwidth_terms_do_not_explain(mlp, tmp_path, cluster):
    """Phases made of the cost model's bandwidth terms plus 7 us per updated weight piece and
    5 us per loss give back exactly 7 us and 5 us; phases of the bandwidth terms alone, 0."""
    plan = load_plan(_plan(mlp, tmp_path / "tp.json", "tensor_parallel"))
    bare = CostConfig(DType.FLOAT32, Optimizer.ADAM)
    report = estimate(plan.pcg, plan.views, plan.cluster, bare)
    counts = updates_per_device(plan.pcg, plan.views, plan.cluster, bare)
    assert sum(counts) >= 2 and all(counts)
    upd, loss = np.zeros(2), np.zeros(2)
    for e in report.events:
        if e.phase == "update":
            upd[list(e.devices)] += e.end - e.start
        elif e.phase == "loss" and not e.comm:
            loss[list(e.devices)] += e.end - e.start
    assert upd.min() > 0 and loss.max() > 0
    ranks = [{"optimizer": upd[d] + counts[d] * 7e-6, "loss": loss[d] + 5e-6} for d in range(2)]
    per_update, per_loss = _fixed_costs(plan, "adam", ranks)
    assert per_update == pytest.approx([7e-6, 7e-6]) and per_loss and per_loss == pytest.approx([5e-6] * len(per_loss))
    per_update, per_loss = _fixed_costs(plan, "adam", [{"optimizer": upd[d], "loss": loss[d]} for d in range(2)])
    assert per_update == pytest.approx([0.0, 0.0], abs=1e-12) and per_loss == pytest.approx([0.0] * len(per_loss))


def test_a_pass_shares_its_time_outside_the_tasks_among_them():
    assert _between(1e-4, [2e-5, 3e-5]) == pytest.approx(2.5e-5)
    assert _between(1e-5, [2e-5, 3e-5]) == 0.0        # noise: tasks' medians add up to more than the pass's
    assert _between(1e-4, []) == 0.0


def test_a_recompute_is_a_backward_task_not_the_backward_passs_leftover():
    """The backward pass runs the recomputes too: their seconds are tasks of that pass, so the
    pass's leftover shared among its tasks leaves them out (counted in, every backward piece
    was priced with a share of them, and the recompute priced again on top)."""
    tasks = {(1, "fwd"): 1.0, (2, "fwd"): 2.0, (1, "again"): 1.0, (1, "bwd"): 2.0, (2, "bwd"): 3.0}
    parallel = {(3, "fwd"): (0.5, 0.2), (3, "again"): (0.5, 0.2), (3, "bwd"): (0.25, 0.1)}
    got = _shares(tasks, parallel, {"fwd": [4.0, 4.5, 3.5], "bwd": [7.95]})
    assert got["fwd"] == pytest.approx((4.0 - 3.5) / 3)
    assert got["bwd"] == pytest.approx((7.95 - 6.75) / 5)     # five tasks: 2, 3, the recompute 1, its op 0.5, 0.25
    assert _shares({(1, "bwd"): 2.0}, {}, {"bwd": [1.0]})["bwd"] == 0.0


def test_a_recomputed_plans_recomputes_are_timed_as_their_own_tasks(mlp, tmp_path, monkeypatch):
    """``--plan`` of a fully recomputed plan: each recompute the step runs is timed under its
    own key ("again"), beside its node's forward, so the backward pass's leftover leaves it out."""
    from unity_cli.profiling import profiler
    spec = tmp_path / "one.yaml"
    spec.write_text(LOCAL.read_text().replace("devices: 2", "devices: 1").replace("name: local-cpu", "name: one"))
    plan = _plan(mlp, tmp_path / "plan.json", "tp=1,dp=1,recompute=full", spec)
    seen = []
    real = profiler._shares

    def spy(tasks, parallel, pass_seconds):
        seen.append(set(tasks))
        return real(tasks, parallel, pass_seconds)
    monkeypatch.setattr(profiler, "_shares", spy)
    run_profile([], load_cluster(spec), batch_size=8, policy=FAST, plans=[str(plan)])
    (keys,) = seen
    again = {node for node, kind in keys if kind == "again"}
    assert again and again <= {node for node, kind in keys if kind == "fwd"}
    assert {node for node, kind in keys if kind == "bwd"} - again      # not every backward task follows a recompute


def test_one_rank_plans_fixed_costs_replace_the_probes(mlp, tmp_path):
    """``--plan`` on one rank: the plan's optimizer (adam) and loss are timed in its steps; no
    parallel op moves data and no call is made, so neither is recorded."""
    spec = tmp_path / "one.yaml"
    spec.write_text(LOCAL.read_text().replace("devices: 2", "devices: 1").replace("name: local-cpu", "name: one"))
    plan = _plan(mlp, tmp_path / "plan.json", "data_parallel", spec)
    run = run_profile([], load_cluster(spec), batch_size=8, policy=FAST, plans=[str(plan)])
    dev = run.profile.to_json()["compute"]["cpu-core"]
    assert set(dev["update_s"]) == {"sgd", "momentum", "adam"} and dev["loss_s"] >= 0
    assert "parallel_task_s" not in dev and "call_overhead_s" not in run.profile.to_json()["comm"]
    assert "in steps optimizer adam" in run.summary(str(tmp_path / "p.json"))


@pytest.mark.skipif(not (BIN / "mpiexec").exists(), reason="no mpiexec in the venv")
def test_mpiexec_profiles_a_tensor_parallel_plans_own_work_and_calls(mlp, tmp_path):
    """Two ranks, a tensor-parallel plan: its parallel ops make calls, so the profile keeps
    their own work per pass and the calls' overhead, and the cost model then charges both."""
    plan = _plan(mlp, tmp_path / "tp.json", "tensor_parallel")
    out = tmp_path / "p.json"
    r = subprocess.run([str(BIN / "mpiexec"), "-n", "2", str(BIN / "unity"), "profile", "--cluster", str(LOCAL),
                        "--out", str(out), "--plan", str(plan), "--json"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    over = doc["comm"]["call_overhead_s"]
    assert {"fwd", "bwd", "loss"} <= set(over) and all(t >= 0 for t in over.values())
    prof = load_profile(out)
    dev = prof.to_json()["compute"]["cpu-core"]
    assert 0 < dev["parallel_task_s"] < 0.05
    p = load_plan(plan)
    device = p.cluster.device_type(0)
    assert prof.parallel_task(device) == dev["parallel_task_s"]
    with_it = estimate(p.pcg, p.views, p.cluster, CostConfig(profile=prof))
    moving = [c for c in with_it.nodes if p.pcg.nodes[c.node].spec.is_parallel_op and c.comm_fwd > 0]
    assert moving and all(c.compute_fwd == dev["parallel_task_s"] for c in moving)
