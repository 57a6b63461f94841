"""Where a training step's time goes, measured and predicted, phase by phase.

``unity run`` times each rank's step in the phases the cost model simulates: forward and
backward, each split into compute (kernels and the executor's own work) and communication
(time inside the communicator moving pieces and running collectives), the loss, the
gradient all-reduces and the optimizer update; and, apart, the time spent inside the
communicator waiting for the ranks on the other end (``waiting``: the simulation leaves a
device idle then). The cost model's events give the same phases for each device. Both are
busy times per step, so phases that overlap in the simulation (one group's gradient
all-reduce beside another device's backward) can add up to more than the predicted step.
With cupy the phases are host time: kernels and NCCL calls return before the GPU has run
them.

The same communicator counts the bytes of tensor data its rank sends, call by call, by the
convention the plan predicts them with (:func:`unity_cli.cost.comm.sent_bytes`), so
``unity run`` can set the bytes sent beside the bytes predicted (:func:`count_call`).
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..cluster.collectives import Collective, sent_ratio
from ..ir.schedule import LOSS_VALUE_BYTES

PHASES = ("fwd_compute", "fwd_comm", "loss", "bwd_compute", "bwd_comm", "grad_sync", "optimizer", "waiting",
          "other")
HEADINGS = {"fwd_compute": "fwd comp", "fwd_comm": "fwd comm", "loss": "loss", "bwd_compute": "bwd comp",
            "bwd_comm": "bwd comm", "grad_sync": "grad sync", "optimizer": "optimizer", "waiting": "waiting",
            "other": "other"}
_DATA_PLANE = ("exchange", "allreduce", "reduce", "bcast", "allgather", "reduce_scatter", "sum_host", "iallgather",
               "wait")
_SYNC_CALLS = ("iallreduce", "test_all", "wait_all")
"""A bucketed gradient sync's calls (``runtime/weights.py``): made among backward's tasks,
their time is the gradient sync's (``TimedComm.sync_seconds``), not backward's."""


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
    for kind, group, nbytes, root in call_moves(name, rank, size, args):
        counter.add(kind, nbytes, group, rank, root)


CallMove = tuple[Collective, tuple[int, ...], int, int]
"""One move a call takes part in, as the cost model writes it (``cost.moves.Move``): its kind,
its ranks (a message's sender first), its bytes (a piece's, for an all-gather or a
reduce-scatter) and its root (-1 where it has none)."""


def call_moves(name: str, rank: int, size: int, args: Sequence[Any]) -> list[CallMove]:
    """The moves data-plane call ``name`` with (positional) ``args`` makes ``rank`` (of
    ``size``) take part in: an exchange's messages, sent and received, or its collective."""
    match name:
        case "exchange":
            return ([(Collective.P2P, (rank, dest), _nbytes(buf), -1) for dest, buf in args[0]]
                    + [(Collective.P2P, (src, rank), _nbytes(buf), -1) for src, buf in args[1]])
        case "allreduce" | "iallreduce":
            return [(Collective.ALL_REDUCE, tuple(args[0]), _nbytes(args[1]), -1)]
        case "test_all" | "wait_all":
            return []
        case "reduce":
            return [(Collective.REDUCE, tuple(args[0]), _nbytes(args[1]), args[2])]
        case "bcast":
            return [(Collective.BROADCAST, tuple(args[0]), _nbytes(args[1]), args[2])]
        case "allgather" | "iallgather":
            return [(Collective.ALL_GATHER, tuple(args[0]), _nbytes(args[1]), -1)]
        case "wait":
            return []
        case "reduce_scatter":
            return [(Collective.REDUCE_SCATTER, tuple(args[0]), _nbytes(args[2]), -1)]
        case "sum_host":
            return [(Collective.ALL_REDUCE, tuple(range(size)), LOSS_VALUE_BYTES, -1)]
        case _:
            raise AssertionError(name)


def _nbytes(buf: Any) -> int:
    return int(getattr(buf, "nbytes", 0))


Call = tuple[tuple, float]
"""One data-plane call: the key every rank taking part knows it by (:meth:`TimedComm._key`),
and the seconds this rank spent in it."""


class TimedComm:
    """A communicator that adds the seconds spent in its data-plane calls to ``seconds``
    and the bytes they send to ``sent``, and, once a step clock has started a step
    (:meth:`new_step`), keeps each call of the step in ``calls`` (everything else passes
    straight through)."""

    def __init__(self, comm: Any):
        self._comm = comm
        self.seconds = 0.0
        self.sync_seconds = 0.0                  # in a bucketed gradient sync's calls
        self.in_sync = False                     # set around a ZeRO reduce-scatter made among backward's tasks
        self.sent = ByteCounter()
        self.calls: list[Call] | None = None     # None: no step clock, nothing kept
        self.moves: list[tuple[CallMove, ...]] | None = None
        """Set to a list (with a step clock) to keep, beside each kept call, the moves it makes."""
        self._made: dict[tuple, int] = {}
        for name in _DATA_PLANE + _SYNC_CALLS:
            setattr(self, name, self._timed(name, getattr(comm, name)))

    def new_step(self) -> None:
        """Start numbering the calls afresh (each step makes the same calls)."""
        self.calls, self._made = [], {}
        if self.moves is not None:
            self.moves = []

    def _key(self, name: str, args: Sequence[Any]) -> tuple | None:
        """The ranks a call takes part with, and how many calls on those ranks came before it
        this step: the same on every rank taking part, because the collectives of one group
        run in one order everywhere, and so do the point-to-point exchanges of two ranks that
        only talk to each other (None: an exchange with no peer)."""
        me = self._comm.rank
        match name:
            case "exchange":
                peers = {r for r, _ in args[0]} | {r for r, _ in args[1]}
                if not peers:
                    return None
                ranks = ("p2p", *sorted(peers | {me}))
            case "sum_host":
                ranks = ("group", *range(self._comm.size))
            case "wait":          # (its time is the wait for calls keyed when they started)
                return None
            case _:
                ranks = ("group", *args[0])
        made = self._made.get(ranks, 0)
        self._made[ranks] = made + 1
        return ranks, made

    def _timed(self, name: str, call: Any) -> Any:
        """``call`` with its bytes counted and its time added up: a bucketed sync's calls
        (:data:`_SYNC_CALLS`) and a ZeRO reduce-scatter (made while ``in_sync``) to
        ``sync_seconds`` and keeping no key (no waiting is split off them), the others to
        ``seconds``."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            sync = name in _SYNC_CALLS or self.in_sync
            made = call_moves(name, self._comm.rank, self._comm.size, args)
            for kind, group, nbytes, root in made:
                self.sent.add(kind, nbytes, group, self._comm.rank, root)
            key = None if self.calls is None or sync else self._key(name, args)
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                if sync:
                    self.sync_seconds += spent
                else:
                    self.seconds += spent
                if key is not None and self.calls is not None:
                    self.calls.append((key, spent))
                    if self.moves is not None:
                        self.moves.append(tuple(made))
        return timed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


class StepClock:
    """One rank's phase times, step by step (seconds), from wall clock and the comm's time."""

    def __init__(self, comm: TimedComm):
        self.comm = comm
        self.steps: list[dict[str, float]] = []
        self.calls: list[tuple[tuple[str, tuple, float], ...]] = []   # step by step: (phase, key, seconds)
        self.sent: list[Fraction] = []          # bytes this rank sent, step by step
        self.laps: list[tuple[str, ...]] = []   # step by step, beside each call: its lap's compute phase
        self._wall = self._comm = self._sync = 0.0
        self._sent0 = Fraction(0)
        self._now: dict[str, float] = {}
        self._calls: list[tuple[str, tuple, float]] = []
        self._laps: list[str] = []

    def start(self) -> None:
        self._now, self._calls, self._laps = {}, [], []
        self.comm.new_step()
        self._wall, self._comm, self._sync = time.perf_counter(), self.comm.seconds, self.comm.sync_seconds
        self._sent0 = self.comm.sent.total

    def lap(self, compute: str, comm: str | None = None) -> None:
        """The time since the last lap goes to ``comm`` (its communication) and ``compute``
        (the rest); without ``comm`` all of it goes to ``compute``. Time in a bucketed
        gradient sync's calls goes to ``grad_sync`` wherever it falls."""
        wall, spent, synced = time.perf_counter(), self.comm.seconds, self.comm.sync_seconds
        total, talk = wall - self._wall - (synced - self._sync), spent - self._comm
        if synced > self._sync:
            self._now["grad_sync"] = self._now.get("grad_sync", 0.0) + synced - self._sync
        if comm is None:
            self._now[compute] = self._now.get(compute, 0.0) + total
        else:
            self._now[comm] = self._now.get(comm, 0.0) + talk
            self._now[compute] = self._now.get(compute, 0.0) + total - talk
        made = (self.comm.calls or [])[len(self._calls):]
        self._calls += [(comm or compute, key, seconds) for key, seconds in made]
        self._laps += [compute] * len(made)
        self._wall, self._comm, self._sync = wall, spent, synced

    def stop(self, step_seconds: float) -> None:
        """Close the step; what its wall time has beyond the phases is ``other``."""
        self._now["other"] = max(0.0, step_seconds - sum(self._now.values()))
        self.steps.append(self._now)
        self.calls.append(tuple(self._calls))
        self.laps.append(tuple(self._laps))
        self.sent.append(self.comm.sent.total - self._sent0)

    def medians_ms(self) -> dict[str, float]:
        """Each phase's median over the steps after the first (a warm-up), in ms."""
        return _medians_ms(self.steps)


def _medians_ms(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    steps = steps[1:] or steps
    return {p: statistics.median(s.get(p, 0.0) for s in steps) * 1e3 for p in PHASES} if steps else {}


def measured_phases_ms(steps: Sequence[Sequence[Mapping[str, float]]],
                       calls: Sequence[Sequence[Sequence[tuple[str, tuple, float]]]]) -> dict[str, float]:
    """The phases of every rank (``StepClock.steps`` and ``.calls``, rank by rank), the
    median over the steps after the first, the mean over the ranks, with waiting taken out
    of communication. A rank that reaches a collective early waits in it for the others, and
    the rank that comes last waits for nobody: so the least time any rank spent in one call
    is the call's transfer, and the rest of each rank's time in it goes from the call's phase
    to ``waiting`` (the cost model prices transfers and leaves waiting idle). A call no other
    rank shares the key of keeps all its time."""
    least: list[dict[tuple, float]] = []
    for s in range(max((len(c) for c in calls), default=0)):
        fastest: dict[tuple, float] = {}
        for rank in calls:
            for _, key, seconds in rank[s] if s < len(rank) else ():
                fastest[key] = min(fastest.get(key, math.inf), seconds)
        least.append(fastest)
    per_rank = []
    for rank_steps, rank_calls in zip(steps, calls, strict=True):
        split = []
        for s, (phases, made) in enumerate(zip(rank_steps, rank_calls, strict=True)):
            phases = dict(phases)
            for phase, key, seconds in made:
                wait = seconds - least[s][key]
                phases[phase] = phases.get(phase, 0.0) - wait
                phases["waiting"] = phases.get("waiting", 0.0) + wait
            split.append(phases)
        per_rank.append(_medians_ms(split))
    return mean_over_ranks(per_rank)


def mean_over_ranks(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    ranks = [r for r in per_rank if r]
    return {p: sum(r.get(p, 0.0) for r in ranks) / len(ranks) for p in PHASES} if ranks else {}


def predicted_phases_ms(report: Any, devices: int) -> dict[str, float]:
    """The cost model's busy time per phase, averaged over the devices (``report`` is a
    :class:`~unity_cli.cost.model.CostReport`)."""
    busy = dict.fromkeys(PHASES, 0.0)
    for e in report.events:
        if e.hidden:       # a bucketed all-reduce beside compute: the step pays its other events
            continue
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
        busy[key] += (e.end - e.start) * len(e.devices) * e.times   # (the micro-batches it stands for)
    return {p: busy[p] / max(1, devices) * 1e3 for p in PHASES if p not in ("waiting", "other")}


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
