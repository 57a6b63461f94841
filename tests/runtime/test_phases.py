"""The phase clock of `unity run` and the cost model's phases (no MPI needed)."""
from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from unity_cli.cli import cli
from unity_cli.cost.model import estimate
from unity_cli.plan.plan import load_plan
from unity_cli.report.summary import plan_config
from unity_cli.runtime.phases import PHASES, StepClock, TimedComm, mean_over_ranks, phase_table, predicted_phases_ms


class _Comm:
    rank, size = 0, 1

    def exchange(self, sends, recvs, tag):
        time.sleep(0.02)

    def allreduce(self, group, buf):
        time.sleep(0.01)

    reduce = bcast = allgather = reduce_scatter = sum_host = allreduce


def test_clock_splits_wall_time_into_compute_and_communication():
    comm = TimedComm(_Comm())
    assert comm.rank == 0                              # everything else passes through
    clock = StepClock(comm)
    for _ in range(2):
        clock.start()
        time.sleep(0.01)
        comm.exchange([], [], 0)
        clock.lap("fwd_compute", "fwd_comm")
        time.sleep(0.005)
        clock.lap("loss")
        comm.allreduce((0,), None)
        clock.lap("optimizer", "grad_sync")
        clock.stop(0.1)
    ms = clock.medians_ms()
    assert list(ms) == list(PHASES)
    assert ms["fwd_comm"] == pytest.approx(20, abs=8) and ms["fwd_compute"] == pytest.approx(10, abs=8)
    assert ms["grad_sync"] == pytest.approx(10, abs=8) and ms["optimizer"] < 5
    assert ms["loss"] == pytest.approx(5, abs=5) and ms["bwd_compute"] == 0
    assert ms["other"] == pytest.approx(100 - sum(v for k, v in ms.items() if k != "other"), abs=1e-6)


def test_mean_over_ranks_skips_empty_ranks():
    a, b = dict.fromkeys(PHASES, 1.0), dict.fromkeys(PHASES, 3.0)
    assert mean_over_ranks([a, b, {}]) == dict.fromkeys(PHASES, 2.0)


@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
def test_predicted_phases_add_up_to_the_simulated_busy_time(tiny_models, cluster_dir, tmp_path, strategy):
    """bert_tiny on 2 devices: the phases sum to the simulation's busy time per device;
    data parallelism all-reduces gradients and moves nothing forward, tensor parallelism
    moves activations."""
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                                 str(cluster_dir / "local-cpu.yaml"), "--batch-size", "4", "--strategy", strategy,
                                 "--out", str(out), "--no-profile"])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    report = estimate(plan.pcg, plan.views, plan.cluster, plan_config(plan))
    phases = predicted_phases_ms(report, 2)
    busy = sum((e.end - e.start) * len(e.devices) for e in report.events) / 2 * 1e3
    assert sum(phases.values()) == pytest.approx(busy)
    assert phases["fwd_compute"] > 0 and phases["bwd_compute"] > 0 and phases["optimizer"] > 0
    if strategy == "data_parallel":
        # (forward it moves little: a batch slice of the replicated token-type embedding, and the loss value)
        assert phases["grad_sync"] > 0 and phases["fwd_comm"] < phases["grad_sync"]
    else:
        assert phases["fwd_comm"] > 0 and phases["bwd_comm"] > 0


def test_table_aligns_and_marks_what_the_model_lacks():
    rows = phase_table(dict.fromkeys(PHASES, 1.5), {"fwd_compute": 2.0})
    assert len({len(r) for r in rows}) == 1
    assert rows[1].split()[1:3] == ["1.500", "1.500"] and rows[2].split()[1:3] == ["2.000", "-"]
