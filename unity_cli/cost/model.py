"""The cost of one training step of a mapped PCG: compute, communication, memory.

Every operator piece costs a roofline estimate forward and backward, or what the profile
measured for it (``CostConfig.profile``, see ``profile.py``); every parallel operator costs
the collective it implies, over the spec's links or the profile's measured ones. A list-scheduling
simulation over two streams per device (compute and communication) turns these into a
step time, so independent work overlaps and the weight-gradient all-reduce hides behind
the rest of the backward pass where it can.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..cluster.machine_view import MachineView
from ..cluster.spec import ClusterSpec
from ..cluster.units import Dimension, format_quantity
from ..ir.dtypes import DType
from ..ir.ops.parallel import (
    REPLICA_DIM,
    CombineAttrs,
    ReductionAttrs,
    RepartitionAttrs,
    ReplicateAttrs,
    reduces_copies,
)
from ..ir.ops.shape_ops import ReshapeAttrs
from ..ir.ops.sources import WeightAttrs
from ..ir.opspec import spec_of
from ..ir.pcg import PCG
from ..ir.pieces import piece_op
from .comm import Collective, groups_time
from .compute import piece_shapes, roofline
from .profile import Profile, piece_key


class Optimizer(Enum):
    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"

    @property
    def states(self) -> int:
        return {"sgd": 0, "momentum": 1, "adam": 2}[self.value]


@dataclass(frozen=True, slots=True)
class CostConfig:
    dtype: DType = DType.FLOAT32
    optimizer: Optimizer = Optimizer.ADAM
    memory_limit: int | None = None   # bytes per device; None: each device's capacity
    profile: Profile | None = None    # measured times that replace the roofline and the links


class Stream(Enum):
    COMPUTE = "compute"
    COMM = "comm"


@dataclass(frozen=True, slots=True)
class Event:
    """One piece of work on the simulated timeline of a step (times in seconds)."""

    node: int
    phase: str                     # "fwd" | "loss" | "bwd" | "sync" | "update"
    stream: Stream
    devices: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class NodeCost:
    node: int
    compute_fwd: float
    compute_bwd: float
    comm_fwd: float
    comm_bwd: float
    grad_sync: float

    @property
    def total(self) -> float:
        return self.compute_fwd + self.compute_bwd + self.comm_fwd + self.comm_bwd + self.grad_sync


@dataclass(frozen=True)
class CostReport:
    step_time: float
    compute_time: float            # busiest device's compute (forward + backward + update)
    comm_time: float               # busiest device's communication (including gradient sync)
    memory: tuple[int, ...]        # bytes per device
    nodes: tuple[NodeCost, ...]
    events: tuple[Event, ...] = field(repr=False, default=())
    infeasible: str | None = None

    @property
    def feasible(self) -> bool:
        return self.infeasible is None


def layout_sources(pcg: PCG) -> list[int | None]:
    """For each node: the source it is a stored layout of (a source, or parallel ops applied
    straight to one), else None. Layouts are set up once, not paid every step."""
    out: list[int | None] = []
    for i, n in pcg:
        if n.spec.is_source:
            out.append(i)
        elif n.spec.is_parallel_op and out[n.inputs[0].node] is not None:
            out.append(out[n.inputs[0].node])
        else:
            out.append(None)
    return out


def gather_then_replicate(pcg: PCG, layout: Sequence[int | None]) -> dict[int, int]:
    """Pairs ``Combine(dim, d)``/``Reduction(d)`` -> ``Replicate(d)`` (first -> second): one
    all-gather / all-reduce leaves the result on all ``d`` devices, so the pair is one
    collective — when its groups of devices are the same before and after
    (:func:`same_groups`; the runtime fuses exactly these). A gather whose result the graph
    returns stays apart."""
    pairs = {}
    returned = {r.node for r in pcg.outputs}
    for i, n in pcg:
        if not isinstance(n.op, ReplicateAttrs) or layout[i] is not None:
            continue
        j = n.inputs[0].node
        prev = pcg.nodes[j].op
        gathers = isinstance(prev, CombineAttrs) and prev.dim != REPLICA_DIM or isinstance(prev, ReductionAttrs)
        if gathers and prev.degree == n.op.degree and len(pcg.consumers[j]) == 1 and j not in returned:
            pairs[j] = i
    return pairs


def same_groups(pcg: PCG, j: int, i: int, views: Mapping[int, MachineView] | Sequence[MachineView]) -> bool:
    """Whether the gather/reduction ``j`` and the replicate ``i`` after it talk in the same
    groups of devices (each group's ``d`` pieces before are its ``d`` copies after)."""
    first, second = pcg.nodes[j], pcg.nodes[i]
    x, d = pcg.shape(first.inputs[0]), first.op.degree
    axis = (x.rank + 1 if reduces_copies(x) else x.rank) if isinstance(first.op, ReductionAttrs) else first.op.dim
    try:
        vin, vout = views[first.inputs[0].node], views[i]
    except KeyError:  # a partial mapping (the machine-mapping DP's) has not placed both ends yet
        return True
    before = vin.groups(x, axis, d)
    after = vout.groups(second.outputs[0], x.rank + 1, d)
    return all(len(set(g)) == d for g in before) and \
        sorted(tuple(sorted(g)) for g in before) == sorted(tuple(sorted(g)) for g in after)


def _comm(pcg: PCG, i: int, views: Mapping[int, MachineView] | Sequence[MachineView], cluster: ClusterSpec,
          dtype: DType, fused: dict[int, int], profile: Profile | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of the collective a parallel op implies."""
    n = pcg.nodes[i]
    before = next((j for j, k in fused.items() if k == i), None)
    if before is not None and same_groups(pcg, before, i, views):
        return 0.0, 0.0  # its gather or reduction already left the data everywhere
    paired = i in fused and same_groups(pcg, i, fused[i], views)
    src = n.inputs[0]
    x, y = pcg.shape(src), n.outputs[0]
    vin, vout = views[src.node], views[i]
    itemsize = dtype.itemsize if x.dtype.is_float else x.dtype.itemsize
    piece_in = x.piece.numel * itemsize
    piece_out = y.piece.numel * itemsize
    rank = x.rank
    match n.op:
        case RepartitionAttrs(dim=dim, degree=d):
            groups = vout.groups(y, dim, d)
            return 0.0, groups_time(Collective.ALL_GATHER, piece_in, cluster, groups, profile)
        case CombineAttrs(dim=dim, degree=d) if dim == REPLICA_DIM:
            return 0.0, 0.0
        case CombineAttrs(dim=dim, degree=d):
            groups = vin.groups(x, dim, d)
            back = groups_time(Collective.REDUCE_SCATTER, piece_out, cluster, groups, profile) if paired else 0.0
            return groups_time(Collective.ALL_GATHER, piece_out, cluster, groups, profile), back
        case ReplicateAttrs(degree=d):
            groups = vout.groups(y, rank + 1, d)
            return (groups_time(Collective.BROADCAST, piece_out, cluster, groups, profile),
                    groups_time(Collective.REDUCE, piece_out, cluster, groups, profile))
        case ReductionAttrs(degree=d):
            groups = vin.groups(x, rank + 1 if reduces_copies(x) else rank, d)
            if paired:
                t = groups_time(Collective.ALL_REDUCE, piece_in, cluster, groups, profile)
                return t, t
            return (groups_time(Collective.REDUCE, piece_in, cluster, groups, profile),
                    groups_time(Collective.BROADCAST, piece_in, cluster, groups, profile))
    raise AssertionError(n.op)


def _sync(pcg: PCG, i: int, views: Mapping[int, MachineView] | Sequence[MachineView], cluster: ClusterSpec,
          profile: Profile | None = None) -> float:
    """Gradient all-reduce of a replicated trainable weight (the backward of its Replicate)."""
    n = pcg.nodes[i]
    if not isinstance(n.op, ReplicateAttrs):
        return 0.0
    y = n.outputs[0]
    groups = views[i].groups(y, y.rank + 1, n.op.degree)
    return groups_time(Collective.ALL_REDUCE, y.piece.nbytes, cluster, groups, profile)


@dataclass(frozen=True)
class CostContext:
    """What per-node costs need besides the views: computed once per PCG."""

    pcg: PCG
    cluster: ClusterSpec
    config: CostConfig
    layout: tuple[int | None, ...]
    fused: dict[int, int]

    @staticmethod
    def of(pcg: PCG, cluster: ClusterSpec, config: CostConfig) -> CostContext:
        layout = tuple(layout_sources(pcg))
        return CostContext(pcg, cluster, config, layout, gather_then_replicate(pcg, layout))


def node_cost(ctx: CostContext, i: int, views: Mapping[int, MachineView] | Sequence[MachineView]) -> NodeCost:
    """The cost of node ``i`` given its view and (for a parallel op) its producer's view."""
    pcg, cluster, config = ctx.pcg, ctx.cluster, ctx.config
    n = pcg.nodes[i]
    src = ctx.layout[i]
    if n.spec.is_source:
        return NodeCost(i, 0, 0, 0, 0, 0)
    if src is not None:
        w = pcg.nodes[src].op
        trainable = isinstance(w, WeightAttrs) and w.trainable
        return NodeCost(i, 0, 0, 0, 0, _sync(pcg, i, views, cluster, config.profile) if trainable else 0.0)
    if n.spec.is_parallel_op:
        f, b = _comm(pcg, i, views, cluster, config.dtype, ctx.fused, config.profile)
        if config.profile is not None and (f or b):  # a task of the runtime's, like a compute one
            half = config.profile.dispatch(cluster.device_type(views[i].devices(n.outputs[0])[0])) / 2
            f, b = f + half if f else 0.0, b + half if b else 0.0
        return NodeCost(i, 0, 0, f, b, 0)
    devices = views[i].devices(n.outputs[0])
    device = min((cluster.device_type(d) for d in devices), key=lambda t: t.flops(config.dtype.value))
    fwd, bwd = _compute_time(n.op, tuple(pcg.shape(r) for r in n.inputs), n.outputs, device, config.dtype,
                             config.profile)
    return NodeCost(i, fwd, bwd, 0, 0, 0)


@functools.lru_cache(maxsize=1 << 16)
def _compute_time(op, inputs: tuple, outputs: tuple, device, dtype: DType,
                  profile: Profile | None = None) -> tuple[float, float]:
    """Forward and backward time of one piece: measured if the profile has it for this
    device type and dtype, else the roofline (cached: candidates share most of their nodes)."""
    ins = piece_shapes(inputs, dtype)
    outs = piece_shapes(outputs, dtype)
    hit = profile.op_time(device, dtype.value, piece_key(piece_op(op, outputs[0]), ins, outs)) if profile else None
    if hit is not None:
        fwd, bwd = hit.fwd, hit.bwd
    else:
        spec = spec_of(op)
        t = roofline(spec.cost(op, ins, outs), device, dtype)
        # unmeasured: the roofline as the profile's measurements of this kind correct it
        fit = profile.unmeasured(device, dtype.value, spec.kind, t.fwd, t.bwd) if profile else None
        fwd, bwd = fit if fit is not None else (t.fwd, t.bwd)
    half = profile.dispatch(device) / 2 if profile else 0.0  # the runtime's own work per task
    return fwd + half, bwd + half


def estimate(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec,
             config: CostConfig = CostConfig()) -> CostReport:
    """Simulate one training step (forward, backward, gradient sync, optimizer update)."""
    ctx = CostContext.of(pcg, cluster, config)
    layout = ctx.layout
    devs = [views[i].devices(n.outputs[0]) for i, n in pcg]
    costs = [node_cost(ctx, i, views) for i in range(len(pcg))]
    out_devs = devs[pcg.outputs[0].node]
    loss = config.profile.loss(cluster.device_type(out_devs[0])) if config.profile is not None else 0.0
    events = _simulate(pcg, devs, costs, layout, (out_devs, loss))
    update = _update_time(pcg, devs, layout, cluster, config)
    end = max((e.end for e in events), default=0.0)
    step = end
    busiest_compute = [0.0] * cluster.num_devices
    busiest_comm = [0.0] * cluster.num_devices
    for e in events:
        acc = busiest_compute if e.phase == "loss" or (e.stream is Stream.COMPUTE and e.phase in ("fwd", "bwd") and
                                                       costs[e.node].comm_fwd + costs[e.node].comm_bwd == 0) \
            else busiest_comm
        for d in e.devices:
            acc[d] += e.end - e.start
    upd_events = []
    for d, t in enumerate(update):
        if t > 0:
            upd_events.append(Event(-1, "update", Stream.COMPUTE, (d,), end, end + t))
            busiest_compute[d] += t
    step = end + max(update, default=0.0)
    memory = memory_per_device(pcg, devs, layout, cluster.num_devices, config)
    infeasible = None
    for d, used in enumerate(memory):
        cap = cluster.device_type(d).memory_capacity
        if config.memory_limit is not None:
            cap = min(cap, config.memory_limit)
        if used > cap:
            limit = " (the --memory-limit)" if cap == config.memory_limit else ""
            infeasible = (f"needs {format_quantity(used, Dimension.BYTES)} on device {d}, "
                          f"which has {format_quantity(cap, Dimension.BYTES)}{limit}")
            break
    return CostReport(step, max(busiest_compute, default=0.0), max(busiest_comm, default=0.0), tuple(memory),
                      tuple(costs), tuple(events) + tuple(upd_events), infeasible)


LOSS_NODE = -2
"""The node of the loss event (the update's is -1): the runtime's fixed work per step
between forward and backward, measured by the profile (``loss_s``)."""


def _simulate(pcg: PCG, devs: Sequence[tuple[int, ...]], costs: Sequence[NodeCost],
              layout: Sequence[int | None], loss: tuple[tuple[int, ...], float] = ((), 0.0)) -> list[Event]:
    """List scheduling: forward in topological order, the loss on the output's devices,
    backward in reverse; each node waits for its inputs (forward) or its consumers'
    gradients (backward) and for its devices."""
    free_compute: dict[int, float] = {}
    free_comm: dict[int, float] = {}
    events: list[Event] = []
    ready = [0.0] * len(pcg)
    for i, n in pcg:
        c = costs[i]
        dur = c.compute_fwd + c.comm_fwd
        start = max([ready[r.node] for r in n.inputs] + [free_compute.get(d, 0.0) for d in devs[i]], default=0.0)
        if dur > 0:
            events.append(Event(i, "fwd", Stream.COMPUTE, devs[i], start, start + dur))
            for d in devs[i]:
                free_compute[d] = start + dur
        ready[i] = start + dur
    fwd_end = max(ready, default=0.0)
    loss_devs, loss_s = loss
    if loss_s > 0 and loss_devs:
        start = max([fwd_end] + [free_compute.get(d, 0.0) for d in loss_devs])
        events.append(Event(LOSS_NODE, "loss", Stream.COMPUTE, loss_devs, start, start + loss_s))
        for d in loss_devs:
            free_compute[d] = start + loss_s
        fwd_end = start + loss_s
    grad_ready = [fwd_end] * len(pcg)
    for i in range(len(pcg) - 1, -1, -1):
        n, c = pcg.nodes[i], costs[i]
        users = pcg.consumers[i]
        start = max([grad_ready[u] for u, _ in users] + [fwd_end], default=fwd_end)
        if c.grad_sync > 0:
            s = max([start] + [free_comm.get(d, 0.0) for d in devs[i]])
            events.append(Event(i, "sync", Stream.COMM, devs[i], s, s + c.grad_sync))
            for d in devs[i]:
                free_comm[d] = s + c.grad_sync
            grad_ready[i] = s + c.grad_sync
            continue
        dur = c.compute_bwd + c.comm_bwd
        if dur > 0 and layout[i] is None:
            s = max([start] + [free_compute.get(d, 0.0) for d in devs[i]])
            events.append(Event(i, "bwd", Stream.COMPUTE, devs[i], s, s + dur))
            for d in devs[i]:
                free_compute[d] = s + dur
            grad_ready[i] = s + dur
        else:
            grad_ready[i] = start
    return events


def stored_layout(pcg: PCG, layout: Sequence[int | None], i: int) -> bool:
    """Whether layout node ``i`` is the end of its chain, kept for the step: something other
    than a layout reads it, the graph returns it, or nothing reads it at all."""
    users = pcg.consumers[i]
    return any(layout[u] is None for u, _ in users) or not users or any(r.node == i for r in pcg.outputs)


def _stored(pcg: PCG, layout: Sequence[int | None]) -> list[bool]:
    """Which nodes hold a buffer of their own during the step."""
    return [stored_layout(pcg, layout, i) if layout[i] is not None else not isinstance(n.op, ReshapeAttrs)
            for i, n in pcg]


def memory_per_device(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                      num_devices: int, config: CostConfig) -> list[int]:
    """Bytes per device: weights with their gradients and optimizer state, constants,
    inputs, and every activation kept for the backward pass."""
    mem = [0] * num_devices
    stored = _stored(pcg, layout)
    for i, n in pcg:
        if not stored[i]:
            continue
        shape = n.outputs[0]
        src = layout[i]
        if src is not None and isinstance(pcg.nodes[src].op, WeightAttrs) and pcg.nodes[src].op.trainable:
            per = shape.piece.numel * 4 * (2 + config.optimizer.states)  # fp32 weight, grad, state
        else:
            per = sum(o.piece.numel * (config.dtype.itemsize if o.dtype.is_float and
                                       not isinstance(pcg.nodes[src].op if src is not None else None, WeightAttrs)
                                       else o.dtype.itemsize) for o in n.outputs)
        for d in devs[i]:
            mem[d] += per
    return mem


def _update_time(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                 cluster: ClusterSpec, config: CostConfig) -> list[float]:
    """Optimizer update: a streaming pass over each device's weights, grads and state."""
    t = [0.0] * cluster.num_devices
    stored = _stored(pcg, layout)
    passes = 3 + 2 * config.optimizer.states     # read w, g, states; write w, states
    for i, n in pcg:
        src = layout[i]
        if not stored[i] or src is None:
            continue
        w = pcg.nodes[src].op
        if isinstance(w, WeightAttrs) and w.trainable:
            nbytes = n.outputs[0].piece.numel * 4 * passes
            for d in devs[i]:
                device = cluster.device_type(d)
                t[d] += nbytes / device.memory_bandwidth
                if config.profile is not None:
                    t[d] += config.profile.update_overhead(device, config.optimizer.value)
    return t

