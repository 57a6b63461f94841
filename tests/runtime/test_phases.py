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
from unity_cli.runtime.phases import (
    PHASES,
    StepClock,
    TimedComm,
    mean_over_ranks,
    measured_phases_ms,
    phase_table,
    predicted_phases_ms,
)


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

    reduce = bcast = allgather = reduce_scatter = sum_host = iallreduce = iallgather = allreduce

    def test_all(self, requests):
        return True

    wait_all = wait = test_all


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


class _Rank(_Comm):
    """Rank ``rank`` of ``size``, whose calls take the seconds the test gives them in turn."""

    def __init__(self, clock: _Clock, rank: int, size: int, seconds: list[float]) -> None:
        super().__init__(clock)
        self.rank, self.size, self.seconds = rank, size, list(seconds)

    def exchange(self, sends, recvs, tag):
        self.clock.sleep(self.seconds.pop(0))

    def allreduce(self, group, buf):
        self.clock.sleep(self.seconds.pop(0))

    sum_host = allreduce


def _two_steps(monkeypatch, rank: int, size: int, seconds: list[float], calls) -> StepClock:
    """A warm-up step and one more, each making ``calls`` (``comm -> None``) in forward,
    1 ms of compute before them."""
    fake = _Clock()
    monkeypatch.setattr(phases, "time", fake)
    comm = TimedComm(_Rank(fake, rank, size, seconds * 2))
    clock = StepClock(comm)
    for _ in range(2):
        clock.start()
        fake.sleep(0.001)
        calls(comm)
        clock.lap("fwd_compute", "fwd_comm")
        clock.stop(fake.now)
        fake.now = 0.0
    return clock


def test_waiting_is_taken_out_of_the_call_every_rank_makes(monkeypatch):
    """Rank 0 reaches the all-reduce 20 ms before rank 1: 30 ms in it against 10. The
    transfer is the 10 ms both spent at least; rank 0's other 20 ms are waiting."""
    def calls(comm):
        comm.allreduce((0, 1), None)
    ranks = [_two_steps(monkeypatch, r, 2, [s], calls) for r, s in enumerate((0.030, 0.010))]
    ms = measured_phases_ms([c.steps for c in ranks], [c.calls for c in ranks])
    assert ms["fwd_comm"] == pytest.approx(10.0) and ms["waiting"] == pytest.approx(10.0)   # (20 + 0) / 2
    assert ms["fwd_compute"] == pytest.approx(1.0)
    # Without the split each rank keeps what it spent: (30 + 10) / 2 = 20 ms of communication.
    plain = mean_over_ranks([c.medians_ms() for c in ranks])
    assert plain["fwd_comm"] == pytest.approx(20.0) and plain["waiting"] == 0.0


def test_calls_match_by_their_ranks_and_their_order(monkeypatch):
    """Two collectives on one group match in order; an exchange matches the peer's exchange
    with this rank; a call on a group of this rank alone, or with a peer that made no such
    call, keeps all its time."""
    def calls(comm):
        comm.allreduce((0, 1), None)                     # key ((group 0 1), 0)
        comm.allreduce((0, 1), None)                     # ((group 0 1), 1)
        comm.exchange([(1 - comm.rank, None)], [], 0)    # rank 0 sends to 1, rank 1 to 0: ((p2p 0 1), 0)
        comm.allreduce((comm.rank,), None)               # alone
        comm.exchange([], [], 0)                         # no peer: not a call to match
    r0 = _two_steps(monkeypatch, 0, 2, [0.004, 0.009, 0.005, 0.007, 0.0], calls)
    r1 = _two_steps(monkeypatch, 1, 2, [0.006, 0.002, 0.001, 0.003, 0.0], calls)
    keys = [[k for _, k, _ in c.calls[1]] for c in (r0, r1)]
    assert keys[0][:3] == keys[1][:3] and keys[0][3] != keys[1][3] and len(keys[0]) == 4
    ms = measured_phases_ms([r0.steps, r1.steps], [r0.calls, r1.calls])
    # transfers 4 + 2 + 1 ms, alone 7 and 3 ms: (14 + 10) / 2; waiting (0 + 7 + 4) and (2 + 0 + 0)
    assert ms["fwd_comm"] == pytest.approx(12.0) and ms["waiting"] == pytest.approx(6.5)
    whole = mean_over_ranks([r0.medians_ms(), r1.medians_ms()])
    assert ms["fwd_comm"] + ms["waiting"] == pytest.approx(whole["fwd_comm"])   # moved, not lost


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
    # Adam streams weight, gradient and two states and writes three (7 passes), momentum 5,
    # SGD 3, each after the same copy of the synced gradients into the flat buffer (2 passes
    # over the bytes each device syncs: all its weights under data parallelism): the update
    # phase grows by as much per state, and nothing else moves.
    sgd, momentum = (predicted_phases_ms(estimate(plan.pcg, plan.views, plan.cluster, replace(config, optimizer=o)), 2)
                     for o in (Optimizer.SGD, Optimizer.MOMENTUM))
    per_state = momentum["optimizer"] - sgd["optimizer"]           # 2 passes over the weights
    assert config.optimizer is Optimizer.ADAM and ms["optimizer"] - momentum["optimizer"] == pytest.approx(per_state)
    copy = sgd["optimizer"] - 1.5 * per_state                        # what the 3 passes of SGD leave
    if strategy == "data_parallel":
        assert copy == pytest.approx(per_state, rel=1e-6)            # every weight synced: 2 passes too
    else:
        assert 0 <= copy < per_state * (1 - 1e-6)                     # some weights are split, not synced
    for other in (sgd, momentum):
        assert {k: v for k, v in ms.items() if k != "optimizer"} == {k: v for k, v in other.items() if k != "optimizer"}


def test_table_aligns_and_marks_what_the_model_lacks():
    rows = phase_table(dict.fromkeys(PHASES, 1.5), {"fwd_compute": 2.0})
    assert len({len(r) for r in rows}) == 1
    assert rows[1].split()[1:3] == ["1.500", "1.500"] and rows[2].split()[1:3] == ["2.000", "-"]
