"""Where a training step's time goes, measured and predicted, phase by phase.

``unity run`` times each rank's step in the phases the cost model simulates: forward and
backward, each split into compute (kernels and the executor's own work) and communication
(time inside the communicator: moving pieces, collectives, and waiting for the ranks on
the other end), the loss, the gradient all-reduces and the optimizer update. The cost
model's events give the same phases for each device. Both are busy times per step, so
phases that overlap in the simulation (a gradient all-reduce on the communication lane
beside backward compute) can add up to more than the predicted step. With cupy the
phases are host time: kernels and NCCL calls return before the GPU has run them.

The same communicator counts the bytes of tensor data its rank sends, call by call, by the
convention the plan predicts them with (:func:`unity_cli.cost.comm.sent_bytes`), so
``unity run`` can set the bytes sent beside the bytes predicted (:func:`count_call`).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..cluster.collectives import Collective, sent_ratio
from ..ir.schedule import LOSS_VALUE_BYTES

PHASES = ("fwd_compute", "fwd_comm", "loss", "bwd_compute", "bwd_comm", "grad_sync", "optimizer", "other")
HEADINGS = {"fwd_compute": "fwd comp", "fwd_comm": "fwd comm", "loss": "loss", "bwd_compute": "bwd comp",
            "bwd_comm": "bwd comm", "grad_sync": "grad sync", "optimizer": "optimizer", "other": "other"}
_DATA_PLANE = ("exchange", "allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "sum_host")


@dataclass(frozen=True, slots=True)
class Buf:
    """An array's size, standing for the array in a call that is counted, not made."""

    nbytes: int


class ByteCounter:
    """Bytes a rank sends, exactly (numerators per denominator: an all-reduce's share is a fraction)."""

    def __init__(self) -> None:
        self._acc: dict[int, int] = {}

    def add(self, kind: Collective, nbytes: int, group: Sequence[int], rank: int, root: int = -1) -> None:
        num, den = sent_ratio(kind, nbytes, tuple(group), rank, root)
        if num:
            self._acc[den] = self._acc.get(den, 0) + num

    @property
    def total(self) -> Fraction:
        return sum((Fraction(n, d) for d, n in self._acc.items()), Fraction(0))


def count_call(counter: ByteCounter, name: str, rank: int, size: int, args: Sequence[Any]) -> None:
    """Count what data-plane call ``name`` of :class:`~.comm.Comm` with (positional) ``args``
    makes ``rank`` (of ``size``) send; arrays are read for their ``nbytes`` only."""
    match name:
        case "exchange":
            for dest, buf in args[0]:
                counter.add(Collective.P2P, _nbytes(buf), (rank, dest), rank)
        case "allreduce":
            counter.add(Collective.ALL_REDUCE, _nbytes(args[1]), args[0], rank)
        case "reduce":
            counter.add(Collective.REDUCE, _nbytes(args[1]), args[0], rank, args[2])
        case "bcast":
            counter.add(Collective.BROADCAST, _nbytes(args[1]), args[0], rank, args[2])
        case "allgather":
            counter.add(Collective.ALL_GATHER, _nbytes(args[1]), args[0], rank)
        case "reduce_scatter":
            counter.add(Collective.REDUCE_SCATTER, _nbytes(args[2]), args[0], rank)
        case "sum_host":
            counter.add(Collective.ALL_REDUCE, LOSS_VALUE_BYTES, tuple(range(size)), rank)
        case _:
            raise AssertionError(name)


def _nbytes(buf: Any) -> int:
    return int(getattr(buf, "nbytes", 0))


class TimedComm:
    """A communicator that adds the seconds spent in its data-plane calls to ``seconds``
    and the bytes they send to ``sent`` (everything else passes straight through)."""

    def __init__(self, comm: Any):
        self._comm = comm
        self.seconds = 0.0
        self.sent = ByteCounter()
        for name in _DATA_PLANE:
            setattr(self, name, self._timed(name, getattr(comm, name)))

    def _timed(self, name: str, call: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            count_call(self.sent, name, self._comm.rank, self._comm.size, args)
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return timed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


class StepClock:
    """One rank's phase times, step by step (seconds), from wall clock and the comm's time."""

    def __init__(self, comm: TimedComm):
        self.comm = comm
        self.steps: list[dict[str, float]] = []
        self.sent: list[Fraction] = []          # bytes this rank sent, step by step
        self._wall = self._comm = 0.0
        self._sent0 = Fraction(0)
        self._now: dict[str, float] = {}

    def start(self) -> None:
        self._now = {}
        self._wall, self._comm = time.perf_counter(), self.comm.seconds
        self._sent0 = self.comm.sent.total

    def lap(self, compute: str, comm: str | None = None) -> None:
        """The time since the last lap goes to ``comm`` (its communication) and ``compute``
        (the rest); without ``comm`` all of it goes to ``compute``."""
        wall, spent = time.perf_counter(), self.comm.seconds
        total, talk = wall - self._wall, spent - self._comm
        if comm is None:
            self._now[compute] = self._now.get(compute, 0.0) + total
        else:
            self._now[comm] = self._now.get(comm, 0.0) + talk
            self._now[compute] = self._now.get(compute, 0.0) + total - talk
        self._wall, self._comm = wall, spent

    def stop(self, step_seconds: float) -> None:
        """Close the step; what its wall time has beyond the phases is ``other``."""
        self._now["other"] = max(0.0, step_seconds - sum(self._now.values()))
        self.steps.append(self._now)
        self.sent.append(self.comm.sent.total - self._sent0)

    def medians_ms(self) -> dict[str, float]:
        """Each phase's median over the steps after the first (a warm-up), in ms."""
        steps = self.steps[1:] or self.steps
        return {p: statistics.median(s.get(p, 0.0) for s in steps) * 1e3 for p in PHASES} if steps else {}


def mean_over_ranks(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    ranks = [r for r in per_rank if r]
    return {p: sum(r.get(p, 0.0) for r in ranks) / len(ranks) for p in PHASES} if ranks else {}


def predicted_phases_ms(report: Any, devices: int) -> dict[str, float]:
    """The cost model's busy time per phase, averaged over the devices (``report`` is a
    :class:`~unity_cli.cost.model.CostReport`)."""
    busy = dict.fromkeys(PHASES, 0.0)
    for e in report.events:
        match e.phase:
            case "fwd":
                key = "fwd_comm" if e.comm else "fwd_compute"
            case "bwd":
                key = "bwd_comm" if e.comm else "bwd_compute"
            case "sync":
                key = "grad_sync"
            case "loss":  # the runtime times the loss's gathering as forward communication
                key = "fwd_comm" if e.comm else "loss"
            case _:
                key = "optimizer"
        busy[key] += (e.end - e.start) * len(e.devices)
    return {p: busy[p] / max(1, devices) * 1e3 for p in PHASES if p != "other"}


def phase_table(measured: Mapping[str, float], predicted: Mapping[str, float]) -> list[str]:
    """Two aligned rows under a heading: measured and predicted ms per phase ('-' where the
    cost model has no such phase)."""
    cols = [p for p in PHASES if p in measured or p in predicted]
    width = max(9, *(len(HEADINGS[p]) + 1 for p in cols))
    head = f"{'ms/step':<10}" + "".join(f"{HEADINGS[p]:>{width}}" for p in cols)
    rows = [head]
    for label, values in (("measured", measured), ("predicted", predicted)):
        rows.append(f"{label:<10}" + "".join(f"{values[p]:>{width}.3f}" if p in values else f"{'-':>{width}}"
                                              for p in cols))
    return rows
