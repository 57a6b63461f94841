"""The simulation of one training step (:func:`simulate`): list scheduling of its order of
actions (``ir/recompute.NodeOrder``) over each device's compute and communication streams,
with ZeRO-3's gathers and the gradient sync's all-reduces, as :func:`~.model.estimate`
prices them. Its events are what the step's time, phases and busiest device are read from."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, assert_never

import numpy as np

from ..ir.buckets import AFTER_BACKWARD
from ..ir.pcg import PCG
from ..ir.phase import Phase, StepNode
from ..ir.recompute import Action, NodeOrder
from .moves import device_array

if TYPE_CHECKING:
    from .model import NodeCost


class Stream(Enum):
    COMPUTE = "compute"
    COMM = "comm"


@dataclass(frozen=True, slots=True)
class Event:
    """One piece of work on the simulated timeline of a step (times in seconds)."""

    node: int
    phase: Phase
    stream: Stream
    devices: tuple[int, ...]
    start: float
    end: float
    comm: bool = False             # moving data (a stream blocked on communication) rather than computing
    hidden: bool = False           # a bucketed all-reduce's transfer beside compute: no phase of the
                                   # step waits on it (what the step pays of it are its other events)
    times: int = 1                 # micro-batches before the last: the event of the first stands for
                                   # itself and its repeats, each a micro-batch's span later

    def later(self, by: float) -> Event:
        """The same work ``by`` seconds later (made directly: ``dataclasses.replace`` is slow
        on the tens of thousands of events of a large step)."""
        return self if by == 0 else Event(self.node, self.phase, self.stream, self.devices, self.start + by,
                                          self.end + by, self.comm, self.hidden, self.times)

    def repeated(self, times: int) -> Event:
        """The same work standing for ``times`` micro-batches."""
        return Event(self.node, self.phase, self.stream, self.devices, self.start, self.end, self.comm,
                     self.hidden, times)


LOSS_NODE = StepNode.LOSS
"""The node of the loss events (the update's is -1): gathering the output's pieces the loss
needs together (``NodeCost.comm_loss``), then the loss itself (:func:`loss_seconds`)."""
SYNC_NODE = StepNode.SYNC
"""The node of the gradient all-reduce events: each is the flat all-reduces of groups of one
size and buffer size, run at once."""
@dataclass(frozen=True, slots=True)
class SyncClass:
    """All-reduces of the gradient sync that start together on ``devices``: the flat ones of
    groups of one size and buffer size (``ready`` is ``AFTER_BACKWARD``), or the buckets of
    one ready index, group size, size and place in their groups' order (``ir/buckets.py``)."""

    ready: int
    devices: tuple[int, ...]
    seconds: float
    overlap: float = 0.0           # the share that runs beside compute (the profile's sync_overlap)
    copy: tuple[float, ...] = ()   # bucketed: each of ``devices``' filling of its buffers, in backward


@dataclass(frozen=True, slots=True)
class Fetch:
    """ZeRO-3's gathers of one micro-batch that start at one action of the step's order and
    are needed at another (``ir/recompute.gathers``), alike on ``devices`` (one per group)."""

    start: int                 # the index in NodeOrder.actions where they start
    use: int                   # and where they are needed
    devices: tuple[int, ...]
    seconds: float
    overlap: float             # the share that runs beside compute (the profile's sync_overlap)
    phase: Phase               # FWD: the forward pass's; BWD: a recompute's


def simulate(pcg: PCG, devs: Sequence[tuple[int, ...]], costs: Sequence[NodeCost],
              layout: Sequence[int | None], num_devices: int, order: NodeOrder,
              loss: tuple[tuple[int, ...], float] = ((), 0.0), syncs: Sequence[SyncClass] = (),
              fetches: Sequence[Fetch] = (), trace: list[tuple[Action, int]] | None = None) -> list[Event]:
    """List scheduling of the step's ``order`` (:class:`~unity_cli.ir.recompute.NodeOrder`),
    each action appended to ``trace`` as it is simulated: forward in topological
    order, the loss on the output's devices, backward in reverse, a segment's recomputes
    before its backward, each node waiting for its inputs (forward, recompute) or its consumers'
    gradients (backward) and for its devices; ZeRO-3's gathers ``fetches``, each started as
    a bucket is (below) where the action it starts at is, and waited for by the action that
    needs it; and the gradient all-reduces ``syncs``: a
    bucket as its members start it (:func:`issue` below: each fills its buffers and pays its
    share of the transfer that does not overlap compute where its backward is; the transfer
    itself runs on the communication stream once every member has joined), then each
    device's wait for its last bucket; the flat ones on each group's devices once their
    backward is done."""
    free_compute = np.zeros(num_devices)    # when each device's streams are next free
    free_comm = np.zeros(num_devices)

    def free(stream: np.ndarray, ds: tuple[int, ...]) -> list[float]:
        return [float(stream[device_array(ds)].max())] if ds else []
    events: list[Event] = []
    ready = [0.0] * len(pcg)
    loss_devs, loss_s = loss

    def busy(i: int, phase: Phase, parts: Sequence[tuple[float, bool]], start: float) -> float:
        """Events one after another on the compute stream of node ``i``'s devices (``(seconds,
        communication?)``: the runtime moves a step's data, then runs its kernel, or the
        reverse backward); returns when the last ends."""
        t = start
        for dur, comm in parts:
            if dur > 0:
                events.append(Event(i, phase, Stream.COMPUTE, devs[i] if i >= 0 else loss_devs, t, t + dur, comm))
                t += dur
        ix = device_array(devs[i] if i >= 0 else loss_devs)
        free_compute[ix] = np.maximum(free_compute[ix], t)
        return t

    fwd_end = 0.0
    grad_ready = [0.0] * len(pcg)
    again: dict[int, float] = {}                 # a recomputed node: when its recompute ends
    pending = [c for c in syncs if c.ready != AFTER_BACKWARD]   # in the order they start
    issued = 0

    def at_own_time(devices: np.ndarray, seconds: np.ndarray | float, phase: Phase, comm: bool,
                    who: tuple[int, ...] = ()) -> None:
        """Work each device does on its compute stream from where it is (grouped by start;
        ``seconds`` one for all of ``who``, the devices as a tuple: at once where they are alike)."""
        starts = free_compute[devices]
        if who:
            t0 = float(starts[0])
            if (starts == t0).all():
                if seconds > 0:
                    events.append(Event(SYNC_NODE, phase, Stream.COMPUTE, who, t0, t0 + seconds, comm))
                free_compute[devices] = t0 + seconds
                return
            seconds = np.full(len(devices), seconds)
        for t in np.unique(starts):
            ds = devices[starts == t]
            dur = seconds[starts == t]
            for e in np.unique(dur):
                if e > 0:
                    who = tuple(int(d) for d in ds[dur == e])
                    events.append(Event(SYNC_NODE, phase, Stream.COMPUTE, who, float(t), float(t + e), comm))
        free_compute[devices] = starts + seconds

    last = np.zeros(num_devices)             # when each device's last bucket is through

    def issue(c: SyncClass) -> None:
        """A bucket, as each member's runtime starts it: it fills its buffers where its backward
        is, starts the all-reduce and goes on; the transfer begins once every member has
        joined and the link is free, and the share of it that does not overlap compute is
        taken from each member's compute stream (progress made on its core)."""
        ix = device_array(c.devices)
        at_own_time(ix, np.asarray(c.copy), Phase.BWD, False)
        start = max(float(free_compute[ix].max()), float(free_comm[ix].max()))
        block = (1.0 - c.overlap) * c.seconds
        if block > 0:
            at_own_time(ix, np.full(len(ix), block), Phase.SYNC, True)
        events.append(Event(SYNC_NODE, Phase.SYNC, Stream.COMM, c.devices, start, start + c.seconds, hidden=True))
        free_comm[ix] = start + c.seconds
        last[ix] = np.maximum(last[ix], start + c.seconds)
    starts: dict[int, list[Fetch]] = {}
    for f in fetches:
        starts.setdefault(f.start, []).append(f)
    gathered: dict[int, list[tuple[np.ndarray, float, Phase]]] = {}   # by the action that waits: devices, end

    def fetch(f: Fetch) -> None:
        """Gathers started as :func:`issue` starts a bucket; the action that needs them waits."""
        ix = device_array(f.devices)
        start = max(float(free_compute[ix].max()), float(free_comm[ix].max()))
        block = (1.0 - f.overlap) * f.seconds
        if block > 0:
            at_own_time(ix, block, f.phase, True, f.devices)
        events.append(Event(SYNC_NODE, f.phase, Stream.COMM, f.devices, start, start + f.seconds, hidden=True))
        free_comm[ix] = start + f.seconds
        gathered.setdefault(f.use, []).append((ix, start + f.seconds, f.phase))

    for a, (act, i) in enumerate(order.actions):
        if trace is not None:
            trace.append((act, i))
        for f in starts.get(a, ()):
            fetch(f)
        for ix, end, phase in gathered.pop(a, ()):      # waiting for a gather is the pass's communication
            late = np.maximum(end - free_compute[ix], 0.0)
            if late.max() > 0:
                at_own_time(ix, late, phase, True)
        match act:
            case Action.FORWARD:
                c = costs[i]
                start = max([ready[r.node] for r in pcg.nodes[i].inputs] + free(free_compute, devs[i]), default=0.0)
                ready[i] = busy(i, Phase.FWD, ((c.comm_fwd, True), (c.compute_fwd, False)), start)
            case Action.LOSS:
                fwd_end = max(ready, default=0.0)
                gather = sum(c.comm_loss for c in costs)
                if (loss_s > 0 or gather > 0) and loss_devs:
                    start = max([fwd_end] + free(free_compute, loss_devs))
                    fwd_end = busy(LOSS_NODE, Phase.LOSS, ((gather, True), (loss_s, False)), start)
                grad_ready = [fwd_end] * len(pcg)
            case Action.RECOMPUTE:     # its forward again, on its devices, once its inputs are made again
                c = costs[i]
                start = max([again.get(r.node, fwd_end) for r in pcg.nodes[i].inputs] + free(free_compute, devs[i]),
                            default=fwd_end)
                again[i] = busy(i, Phase.BWD, ((c.comm_fwd, True), (c.compute_fwd, False)), start)
            case Action.BACKWARD:
                c = costs[i]
                start = max([grad_ready[u] for u, _ in pcg.consumers[i]] + [fwd_end], default=fwd_end)
                if c.compute_bwd + c.comm_bwd > 0 and layout[i] is None:   # (a sync carrier has neither: below)
                    s = max([start] + free(free_compute, devs[i]))
                    grad_ready[i] = busy(i, Phase.BWD, ((c.compute_bwd, False), (c.comm_bwd, True)), s)
                else:
                    grad_ready[i] = start
                while issued < len(pending) and pending[issued].ready >= i:   # backward has run every node from i on
                    issue(pending[issued])
                    issued += 1
            case Action.DROP:
                pass
            case _:
                assert_never(act)
    for c in pending[issued:]:
        issue(c)
    waits = np.flatnonzero(last > free_compute)   # a bucketed sync's wait for its last transfers
    if len(waits):
        at_own_time(waits, last[waits] - free_compute[waits], Phase.SYNC, True)
    # A flat sync all-reduces a device's weight gradients when its whole backward is done,
    # not beside it, and so does this.
    for c in syncs:
        ds, seconds = c.devices, c.seconds
        if c.ready == AFTER_BACKWARD and seconds > 0:
            s = max(free(free_compute, ds) + free(free_comm, ds))
            events.append(Event(SYNC_NODE, Phase.SYNC, Stream.COMM, ds, s, s + seconds))
            free_comm[device_array(ds)] = s + seconds
    return events
