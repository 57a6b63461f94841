"""The phase clock of `unity run` and the cost model's phases (no MPI needed)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from unity_cli.cli import cli
from unity_cli.cost.model import Optimizer, estimate
from unity_cli.plan.config import plan_config
from unity_cli.plan.plan import load_plan
from unity_cli.runtime import phases
from unity_cli.runtime.phases import PHASES, StepClock, TimedComm, mean_over_ranks, phase_table, predicted_phases_ms


class _Clock:
    """A clock the test moves by hand: the phase arithmetic is checked exactly, whatever the
    machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Comm:
    rank, size = 0, 1

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def exchange(self, sends, recvs, tag):
        self.clock.sleep(0.02)

    def allreduce(self, group, buf):
        self.clock.sleep(0.01)

    reduce = bcast = allgather = reduce_scatter = sum_host = allreduce


def test_clock_splits_wall_time_into_compute_and_communication(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(phases, "time", fake)
    comm = TimedComm(_Comm(fake))
    assert comm.rank == 0                              # everything else passes through
    clock = StepClock(comm)
    for compute in (0.05, 0.01, 0.02):               # a warm-up step (left out), then 10 and 20 ms: 15
        clock.start()
        fake.sleep(compute)
        comm.exchange([], [], 0)
        clock.lap("fwd_compute", "fwd_comm")
        fake.sleep(0.005)
        clock.lap("loss")
        comm.allreduce((0,), None)
        clock.lap("optimizer", "grad_sync")
        clock.stop(0.1)
    ms = clock.medians_ms()
    assert list(ms) == list(PHASES)
    expected = {"fwd_compute": 15.0, "fwd_comm": 20.0, "loss": 5.0, "grad_sync": 10.0, "optimizer": 0.0,
                "bwd_compute": 0.0, "bwd_comm": 0.0}
    for k, v in expected.items():
        assert ms[k] == pytest.approx(v, abs=1e-9), k
    assert ms["other"] == pytest.approx(100 - 15 - 20 - 5 - 10, abs=1e-6)   # the step's time no phase took


def test_mean_over_ranks_skips_empty_ranks():
    a, b = dict.fromkeys(PHASES, 1.0), dict.fromkeys(PHASES, 3.0)
    assert mean_over_ranks([a, b, {}]) == dict.fromkeys(PHASES, 2.0)


@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
def test_predicted_phases_show_the_strategy_and_the_optimizer(tiny_models, cluster_dir, tmp_path, strategy):
    """bert_tiny on 2 devices: data parallelism all-reduces gradients and moves little
    forward, tensor parallelism moves activations; the optimizer's phase is its passes over
    the weights."""
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                                 str(cluster_dir / "local-cpu.yaml"), "--batch-size", "4", "--strategy", strategy,
                                 "--out", str(out), "--no-profile"])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    config = plan_config(plan)
    ms = predicted_phases_ms(estimate(plan.pcg, plan.views, plan.cluster, config), 2)
    assert ms["fwd_compute"] > 0 and ms["bwd_compute"] > 0 and ms["optimizer"] > 0
    if strategy == "data_parallel":
        # (forward it moves little: a batch slice of the replicated token-type embedding, and the loss value)
        assert ms["grad_sync"] > 0 and ms["fwd_comm"] < ms["grad_sync"]
    else:
        assert ms["fwd_comm"] > 0 and ms["bwd_comm"] > 0
    # Adam streams weight, gradient and two states and writes three (7 passes), SGD 3: the
    # update phase scales so, and nothing else moves.
    sgd = predicted_phases_ms(estimate(plan.pcg, plan.views, plan.cluster,
                                       replace(config, optimizer=Optimizer.SGD)), 2)
    assert config.optimizer is Optimizer.ADAM and ms["optimizer"] == pytest.approx(sgd["optimizer"] * 7 / 3)
    assert {k: v for k, v in ms.items() if k != "optimizer"} == {k: v for k, v in sgd.items() if k != "optimizer"}


def test_table_aligns_and_marks_what_the_model_lacks():
    rows = phase_table(dict.fromkeys(PHASES, 1.5), {"fwd_compute": 2.0})
    assert len({len(r) for r in rows}) == 1
    assert rows[1].split()[1:3] == ["1.500", "1.500"] and rows[2].split()[1:3] == ["2.000", "-"]
