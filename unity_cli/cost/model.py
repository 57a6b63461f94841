"""The cost of one training step of a mapped PCG: compute, communication, memory.

Every operator piece costs a roofline estimate forward and backward, or what the profile
measured for it (``CostConfig.profile``, see ``profile.py``). Every byte the runtime moves is
priced from one list, :func:`~unity_cli.cost.moves.node_moves` (a compute op's reads of pieces on
other devices, every parallel op as the runtime runs it, the weight-gradient all-reduces and
the loss's gathering), over the spec's links or the profile's measured ones; the
machine-mapping DP prices nodes with the same :func:`node_cost`. A list-scheduling
simulation over two streams per device (compute and communication) turns these into a
step time, so independent work overlaps; the weight-gradient all-reduces run as the
runtime runs them (``ir/buckets.py``): flat, after the backward pass of their devices, or
in buckets started during it, the share of each the profile measured hiding under compute
(``comm.sync_overlap``) beside it; ``CostConfig.sync_bucket`` None picks the fastest.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum

import numpy as np

from ..cluster.collectives import Collective
from ..cluster.spec import ClusterSpec
from ..cluster.units import format_bytes
from ..deadline import check
from ..errors import ShapeError
from ..ir.buckets import (
    AFTER_BACKWARD,
    SyncBucket,
    SyncCall,
    SyncCallKind,
    SyncWhen,
    WeightSync,
    sync_buckets,
    sync_calls,
)
from ..ir.dtypes import DType
from ..ir.machine_view import MachineView
from ..ir.ops.sources import WeightAttrs
from ..ir.opspec import backward_mask, spec_of
from ..ir.pcg import PCG
from ..ir.phase import Phase, StepNode
from ..ir.pieces import piece_op
from ..ir.recompute import Action, Gather, NodeOrder, Pass, gathers, node_order, recomputed, weight_passes
from ..ir.schedule import gather_then_replicate, layout_sources, loss_pieces, stored_layout
from ..ir.shapes import ParallelTensorShape
from ..ir.training import OPTIMIZER_STATES, Training, WeightBytes
from .compute import piece_shapes, roofline
from .memory import MEMORY_PARTS, memory_account, memory_per_device, stored_nodes
from .moves import Move, Structure, device_array, node_moves, phase_seconds, sent_rounded_parts
from .profile import Profile, piece_key
from .simulate import LOSS_NODE, SYNC_NODE, Event, Fetch, Stream, SyncClass, simulate
from .strides import as_run
from .strides import copies as runtime_copies

__all__ = ["LOSS_NODE", "MEMORY_PARTS", "SYNC_NODE", "CostConfig", "CostContext", "CostReport", "Event", "NodeCost",
           "Optimizer", "Stream",
           "device_capacity", "estimate", "gather_then_replicate", "layout_sources", "memory_account",
           "memory_per_device", "node_cost", "step_time", "stored_layout", "updates_per_device"]


class Optimizer(Enum):
    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"

    @property
    def states(self) -> int:
        return OPTIMIZER_STATES[self.value]


@dataclass(frozen=True, slots=True)
class CostConfig:
    dtype: DType = DType.FLOAT32
    optimizer: Optimizer = Optimizer.ADAM
    memory_limit: int | None = None   # bytes per device; None: each device's capacity
    profile: Profile | None = None    # measured times that replace the roofline and the links
    loss: str = "auto"                # the loss unity run trains with: auto | cross_entropy | mse
    sync_bucket: int | None = None    # the gradient sync's bucket bytes (ir/buckets.py): 0 flat after
                                      # backward; None: the fastest of SYNC_BUCKETS by the profile's overlap
    training: Training = Training()   # micro-batches and the ZeRO stage (ir/training.py)

    @property
    def unshaped(self) -> CostConfig:
        """The config less the step's shape: a node's or a resharding's price (its compute and
        its moves) is the same however micro-batches, ZeRO, recomputation and the bucket size
        order and repeat its work, and whatever room it has; so every shape shares its tables."""
        return replace(self, memory_limit=None, sync_bucket=None, training=Training())

    @property
    def weight_bytes(self) -> WeightBytes:
        """The bytes of one trainable parameter (``ir/training.py``), as this config trains it."""
        return WeightBytes.of(self.dtype, self.optimizer.states)


@dataclass(frozen=True, slots=True)
class NodeCost:
    node: int
    compute_fwd: float
    compute_bwd: float
    comm_fwd: float
    comm_bwd: float
    grad_sync: float
    comm_loss: float = 0.0         # the output node: the loss's gathering and its gradients

    @property
    def comm(self) -> float:
        """Every second of communication the node's moves cost."""
        return self.comm_fwd + self.comm_bwd + self.grad_sync + self.comm_loss

    @property
    def total(self) -> float:
        return self.compute_fwd + self.compute_bwd + self.comm


@dataclass(frozen=True, eq=False)
class CostReport:
    step_time: float
    compute_time: float            # busiest device's compute (forward + backward + update)
    comm_time: float               # busiest device's communication (including gradient sync)
    memory: tuple[int, ...]        # bytes per device
    nodes: tuple[NodeCost, ...]
    events: tuple[Event, ...] = field(repr=False, default=())
    infeasible: str | None = None
    sent: tuple[int, ...] | Callable[[], tuple[int, ...]] = field(repr=False, default=())   # see comm_bytes
    sync_bucket: int = 0               # the gradient sync's bucket bytes it was priced with (0: flat)
    training: Training = Training()    # the micro-batches and ZeRO stage it was priced with

    @property
    def feasible(self) -> bool:
        return self.infeasible is None

    @property
    def comm_bytes(self) -> tuple[int, ...]:
        """Bytes of tensor data each device sends per step (``cost.comm.sent_bytes``), counted
        when first read: a search reads the step times of many reports and the bytes of one."""
        if callable(self.sent):
            object.__setattr__(self, "sent", self.sent())
        return self.sent  # type: ignore[return-value]

    def __getstate__(self) -> dict:
        # sent to another process (search/workers.py): the bytes counted, not the means to
        return {**self.__dict__, "sent": self.comm_bytes}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CostReport):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.name != "sent") \
            and self.comm_bytes == other.comm_bytes

    __hash__ = None     # type: ignore[assignment]  (equal by value, and mutable in its one cached field)


@dataclass(frozen=True)
class CostContext:
    """What per-node costs need besides the views: computed once per PCG."""

    pcg: PCG
    cluster: ClusterSpec
    config: CostConfig
    layout: tuple[int | None, ...]
    fused: dict[int, int]
    structure: Structure
    cache: dict = field(default_factory=dict, repr=False, compare=False)   # shared by equal (cluster, config)

    @functools.cached_property
    def recomputed(self) -> tuple[tuple[int, ...], ...]:
        """The nodes backward recomputes, per segment (``ir/recompute.py``)."""
        t = self.config.training
        return recomputed(self.pcg, self.layout, self.structure.grads, t.recompute, t.recompute_segments)

    @functools.cached_property
    def order(self) -> NodeOrder:
        """The order of a micro-batch's work, which the simulation walks (``ir/recompute.py``)."""
        t = self.config.training
        return node_order(self.pcg, self.layout, self.structure.grads, t.recompute, t.recompute_segments)

    @functools.cached_property
    def gathers(self) -> tuple[Gather, ...]:
        """ZeRO-3's gathers of a micro-batch, in the order they are needed (``ir/recompute.gathers``)."""
        return gathers(self.order, self.weight_passes)

    @functools.cached_property
    def weight_passes(self) -> dict[int, tuple[Pass, ...]]:
        """Per trainable weight, the passes of a micro-batch that read it (``ir/recompute.py``)."""
        return weight_passes(self.pcg, self.layout, self.recomputed)

    def __getstate__(self) -> dict:
        # The shared price table stays with the process that filled it: a context sent to
        # another (search/workers.py) starts an empty one.
        return {**self.__dict__, "cache": {}}

    @staticmethod
    def of(pcg: PCG, cluster: ClusterSpec, config: CostConfig) -> CostContext:
        st = Structure.of(pcg, cluster.num_devices, config.loss, runtime_copies(pcg, cluster))
        return CostContext(pcg, cluster, config, st.layout, st.pairs, st,
                           price_table(cluster, config.unshaped, "nodes", NODE_CACHE_LIMIT))


@functools.lru_cache(maxsize=8)
def _tables(cluster: ClusterSpec, config: CostConfig) -> dict[str, dict]:
    return {}


def price_table(cluster: ClusterSpec, config: CostConfig, name: str, limit: int) -> dict:
    """A table of prices that depend only on (cluster, config) and their keys, shared by
    every graph a process prices with them (the candidates of a search, the models of a
    benchmark share most of their nodes); emptied when it holds more than ``limit``
    entries (a bound on memory, not on speed), so sharing changes no answer."""
    table = _tables(cluster, config).setdefault(name, {})
    if len(table) > limit:
        table.clear()
    return table


NODE_CACHE_LIMIT = 50_000


def node_cost(ctx: CostContext, i: int, views: Mapping[int, MachineView] | Sequence[MachineView]) -> NodeCost:
    """The cost of node ``i``: its compute, and its moves (``cost.moves.node_moves``) priced
    over the links. ``views`` needs ``i`` and ``ctx.structure.deps(i)``."""
    return node_cost_and_moves(ctx, i, views)[0]


def node_cost_and_moves(ctx: CostContext, i: int, views: Mapping[int, MachineView] | Sequence[MachineView]
                        ) -> tuple[NodeCost, tuple[Move, ...]]:
    """:func:`node_cost` and the moves it priced."""
    st = ctx.structure
    key = (st.key(i), views[i], *(views[d] for d in st.deps(i)))
    hit = ctx.cache.get(key)
    if hit is None:
        if len(ctx.cache) > NODE_CACHE_LIMIT:
            ctx.cache.clear()
        hit = ctx.cache[key] = _price(ctx, i, views)
    cost, moves = hit
    return (cost if cost.node == i else replace(cost, node=i)), moves


def _price(ctx: CostContext, i: int, views: Mapping[int, MachineView] | Sequence[MachineView]
           ) -> tuple[NodeCost, tuple[Move, ...]]:
    moves = node_moves(ctx.structure, i, views, ctx.config.dtype)
    t = phase_seconds(moves, ctx.cluster, ctx.config.profile) if moves else {}
    return cost_of_phases(ctx, i, views, t), moves


def cost_of_phases(ctx: CostContext, i: int, views: Mapping[int, MachineView] | Sequence[MachineView],
                   t: Mapping[str, float]) -> NodeCost:
    """Node ``i``'s cost when its moves take ``t`` seconds per phase (``cost.moves.phase_seconds``):
    its compute, and those times (what :func:`node_cost` finds, given the moves it finds)."""
    pcg, cluster, config = ctx.pcg, ctx.cluster, ctx.config
    n = pcg.nodes[i]
    f, b = t.get(Phase.FWD, 0.0), t.get(Phase.BWD, 0.0)
    sync, loss = t.get(Phase.SYNC, 0.0), t.get(Phase.LOSS, 0.0)
    if n.spec.is_source or ctx.layout[i] is not None:
        return NodeCost(i, 0, 0, 0, 0, sync, loss)
    if n.spec.is_parallel_op:
        # a task of the runtime's: each pass that moves data pays the executor's own work
        # around its calls, which the runtime counts as compute
        own = 0.0
        if config.profile is not None and (f or b):
            own = config.profile.parallel_task(cluster.device_type(views[i].devices(n.outputs[0])[0]))
        return NodeCost(i, own if f else 0.0, own if b else 0.0, f, b, 0, loss)
    devices = views[i].devices(n.outputs[0])
    device = min((cluster.device_type(d) for d in devices), key=lambda t: t.flops(config.dtype.value))
    inputs = tuple(pcg.shape(r) for r in n.inputs)
    mask = backward_mask(n.spec, inputs, [r in ctx.structure.grads for r in n.inputs])
    fwd, bwd = _compute_time(n.op, inputs, n.outputs, device, config.dtype, config.profile, mask,
                             i in ctx.structure.copies)
    return NodeCost(i, fwd, bwd, f, b, 0, loss)


def _sizes_apart(a: float, b: float) -> tuple[str, str]:
    """Two sizes in binary units, with as many decimals as it takes to tell them apart."""
    for digits in range(1, 7):
        x, y = format_bytes(a, digits), format_bytes(b, digits)
        if x != y:
            break
    return x, y


@functools.lru_cache(maxsize=1 << 16)
def _compute_time(op, inputs: tuple, outputs: tuple, device, dtype: DType, profile: Profile | None = None,
                  mask: tuple[bool, ...] | None = None, copies: bool = False) -> tuple[float, float]:
    """Forward and backward time of one piece: measured if the profile has it for this
    device type and dtype, else the roofline (cached: candidates share most of their nodes).
    ``mask`` (:func:`~unity_cli.ir.opspec.backward_mask`) says which input gradients its
    backward makes: none, and backward costs nothing (the runtime skips it); some, and a
    selective kernel's backward is priced for those (measured so if the profile has that
    piece, else its full measurement scaled as the roofline scales). ``copies``: the piece
    makes a transposing copy on a CPU (``cost.strides.copies``)."""
    ins = piece_shapes(inputs, dtype)
    outs = piece_shapes(outputs, dtype)
    spec = spec_of(op)
    runs_backward = mask is None or any(mask)
    part = roofline(as_run(spec.cost(op, ins, outs) if mask is None else spec.cost_of_grads(op, ins, outs, mask),
                           spec.kind, device, copies, ins, outs), device, dtype)
    hit = None
    if profile:
        key = piece_op(op, outputs[0])
        hit = profile.op_time(device, dtype.value, piece_key(key, ins, outs, mask)) if mask is not None else None
        if hit is None:
            hit = whole = profile.op_time(device, dtype.value, piece_key(key, ins, outs))
            if whole is not None and mask is not None:   # measured whole: scaled as the roofline scales
                full = roofline(as_run(spec.cost(op, ins, outs), spec.kind, device, copies, ins, outs), device, dtype)
                hit = replace(whole, bwd=whole.bwd * (part.bwd / full.bwd if full.bwd > 0 else 1.0))
    if hit is not None:
        fwd, bwd = hit.fwd, hit.bwd
    else:
        # unmeasured: the roofline as the profile's measurements of this kind correct it
        fit = profile.unmeasured(device, dtype.value, spec.kind, part.fwd, part.bwd) if profile else None
        fwd, bwd = fit if fit is not None else (part.fwd, part.bwd)
    half = profile.dispatch(device) / 2 if profile else 0.0  # the runtime's own work per task
    return fwd + half, (bwd + half if runs_backward else 0.0)


def simulated_order(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec,
                    config: CostConfig = CostConfig()) -> list[tuple[Action, int]]:
    """The actions the step's simulation walks, in the order it walks them (``(action, node)``):
    the runtime runs the same order (``runtime/program.StepOrder``), which tests hold it to."""
    ctx = CostContext.of(pcg, cluster, config)
    devs = [views[i].devices(n.outputs[0]) for i, n in pcg]
    free = [NodeCost(i, 0.0, 0.0, 0.0, 0.0, 0.0) for i in range(len(pcg))]
    trace: list[tuple[Action, int]] = []
    simulate(pcg, devs, free, ctx.layout, cluster.num_devices, ctx.order, trace=trace)
    return trace


def estimate(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec,
             config: CostConfig = CostConfig()) -> CostReport:
    """Simulate one training step (forward, backward, gradient sync, optimizer update), and
    count each device's memory (``cost/memory.py``) and bytes sent."""
    sim = _simulated(pcg, views, cluster, config)
    memory = memory_per_device(pcg, sim.devs, sim.ctx.layout, cluster, config)
    infeasible = None
    caps = device_capacity(cluster, config)
    over = np.flatnonzero(np.asarray(memory, dtype=np.int64) > caps)
    if len(over):
        d = int(over[0])
        cap = int(caps[d])
        limit = " (the --memory-limit)" if cap == config.memory_limit else ""
        need, have = _sizes_apart(memory[d], cap)
        infeasible = f"needs {need} on device {d}, which has {have}{limit}"
    events = sim.events
    busiest_compute = np.zeros(cluster.num_devices)
    busiest_comm = np.zeros(cluster.num_devices)
    for e in events:
        acc = busiest_comm if e.comm or e.stream is Stream.COMM else busiest_compute
        np.add.at(acc, device_array(e.devices), (e.end - e.start) * e.times)
    end = sim.end
    upd_events = [Event(StepNode.UPDATE, Phase.UPDATE, Stream.COMPUTE, (int(d),), end, end + float(sim.update[d]))
                  for d in np.flatnonzero(sim.update > 0)]
    busiest_compute += sim.update
    return CostReport(sim.step, float(busiest_compute.max(initial=0.0)), float(busiest_comm.max(initial=0.0)),
                      tuple(memory), tuple(sim.costs), tuple(events) + tuple(upd_events), infeasible,
                      functools.partial(_sent_bytes, sim), sim.bucket, config.training)


def step_time(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec,
              config: CostConfig = CostConfig()) -> float:
    """:func:`estimate`'s step time alone (neither memory nor bytes counted)."""
    return _simulated(pcg, views, cluster, config).step


@dataclass(frozen=True)
class _Simulated:
    """One step's simulation (:func:`_simulated`), what :func:`estimate` reports from."""

    ctx: CostContext
    devs: list[tuple[int, ...]]
    priced: list[tuple[NodeCost, tuple[Move, ...]]]
    flat: FlatCalls
    costs: list[NodeCost]
    step: float
    bucket: int
    events: list[Event]          # every event but the update's, each micro-batch's as often as it runs
    update: np.ndarray           # each device's optimizer update (seconds)
    end: float                   # when the updates start


def _sent_bytes(sim: _Simulated) -> tuple[int, ...]:
    """Bytes each device sends in the step: each micro-batch's moves (a recomputed node's
    forward ones twice), and the sync's calls (``ir/buckets.sync_calls``, which the runtime
    makes) as often as they run: per weight and per bucket the same for an all-reduce, but
    ZeRO's shards are padded per bucket."""
    ctx, priced, flat = sim.ctx, sim.priced, sim.flat
    train = ctx.config.training
    again = {i for seg in ctx.recomputed for i in seg}
    return sent_rounded_parts([((m for _, ms in priced for m in ms if m.phase != Phase.SYNC), train.micro_batches),
                               ((m for i in sorted(again) for m in priced[i][1] if m.phase == Phase.FWD),
                                train.micro_batches),
                               ((_call_move(c) for _, cs in flat for c in cs
                                 if c.when in (SyncWhen.SYNC, SyncWhen.AFTER_UPDATE)), 1),
                               ((_call_move(c) for _, cs in flat for c in cs if c.when is SyncWhen.MICRO_BATCH),
                                train.micro_batches),
                               ((_call_move(c) for b, cs in flat for c in cs
                                 if c.when is SyncWhen.BEFORE_USE for _ in ctx.weight_passes[b.weights[0]]),
                                train.micro_batches)],
                              ctx.cluster.num_devices)


def _simulated(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec, config: CostConfig) -> _Simulated:
    ctx = CostContext.of(pcg, cluster, config)
    layout = ctx.layout
    devs = [views[i].devices(n.outputs[0]) for i, n in pcg]
    for i, ds in enumerate(devs):
        if ds and not 0 <= min(ds) <= max(ds) < cluster.num_devices:
            raise ShapeError(f"node {pcg.nodes[i].name!r}'s view reaches device {max(ds)}, and cluster "
                             f"{cluster.name!r} has {cluster.num_devices} devices")
    priced = []
    for i in range(len(pcg)):
        if i % 256 == 0:
            check()    # under optimize --budget: a graph of 20,000 nodes takes seconds to price
        priced.append(node_cost_and_moves(ctx, i, views))
    train = config.training
    # A recomputed node's forward (its compute and its moves) runs again in backward, where
    # the step's order recomputes it (ir/recompute.py): the simulation prices it there.
    costs = [c for c, _ in priced]
    weights = weight_syncs(ctx.structure, [ms for _, ms in priced])
    flat = [(b, sync_calls(b)) for b in sync_buckets(pcg, weights, 0, train.stages(pcg))]
    fetches = _fetches(ctx, flat)       # ZeRO-3: each pass's gathers, prefetched one ahead
    out_devs = devs[pcg.outputs[0].node]
    loss = loss_seconds(pcg.shape(pcg.outputs[0]), ctx.structure.class_axis, cluster.device_type(out_devs[0]), config)
    synced = [m for _, ms in priced for m in ms if m.phase == Phase.SYNC]
    # The micro-batches before the last run forward and backward alone; the last one's
    # backward is where the sync's buckets may start.
    before = simulate(pcg, devs, costs, layout, cluster.num_devices, ctx.order, (out_devs, loss), fetches=fetches) \
        if train.micro_batches > 1 else []
    span = max((e.end for e in before), default=0.0)
    if before and any(b.zero >= 2 for b, _ in flat):    # ZeRO-2, 3: each ends with its reduce-scatters
        before += _at_once_events(ctx, flat, span, SyncWhen.MICRO_BATCH)
        span = max(e.end for e in before)
    best, tried = None, set()
    for bucket in sync_bucket_choices(cluster, config):
        syncs = _flat_syncs(ctx, flat) if bucket == 0 else _bucket_syncs(ctx, weights, bucket)
        if tuple(syncs) in tried:     # a larger size that cuts the same buckets: the same step
            continue
        tried.add(tuple(syncs))
        events = simulate(pcg, devs, costs, layout, cluster.num_devices, ctx.order, (out_devs, loss), syncs, fetches)
        update = _update_time(pcg, devs, layout, cluster, config, synced if bucket == 0 else (), flat)
        end = max((e.end for e in events), default=0.0) + (train.micro_batches - 1) * span
        finish, gathers = _after_update(ctx, flat, end + update)
        step = float(finish.max(initial=0.0))
        if best is None or step < best[0]:
            best = (step, bucket, events, update, end, gathers)
    step, bucket, events, update, end, gathers = best
    # The first micro-batch's events stand for all before the last (Event.times): a step of 256
    # micro-batches lists two micro-batches' events, not 256.
    events = [e.repeated(train.micro_batches - 1) for e in before] + \
        [e.later((train.micro_batches - 1) * span) for e in events] + gathers
    return _Simulated(ctx, devs, priced, flat, costs, step, bucket, events, update, end)


FlatCalls = Sequence[tuple[SyncBucket, tuple[SyncCall, ...]]]
"""The flat sync's buckets (``ir/buckets.sync_buckets``), each with its calls under the step's
ZeRO stage (``sync_calls``), made once per step priced."""

_CALL_KINDS = {SyncCallKind.ALL_REDUCE: Collective.ALL_REDUCE, SyncCallKind.REDUCE_SCATTER: Collective.REDUCE_SCATTER,
               SyncCallKind.ALL_GATHER: Collective.ALL_GATHER}


def _call_move(c) -> Move:
    """A sync call of ``ir/buckets.sync_calls`` as the move the cost model prices."""
    return Move(_CALL_KINDS[c.kind], Phase.SYNC, c.group, c.nbytes)


def _fetches(ctx: CostContext, flat: FlatCalls) -> list[Fetch]:
    """ZeRO-3's gathers of one micro-batch (``SyncWhen.BEFORE_USE``) as the runtime makes them:
    each pass's, started where the gather before it is needed (``ir/recompute.gathers``)."""
    cluster, profile = ctx.cluster, ctx.config.profile
    if not any(b.zero >= 3 for b, _ in flat):
        return []
    by_weight: dict[int, list[tuple[tuple[int, ...], float, float]]] = {}
    priced: dict[tuple, float] = {}
    for b, cs in flat:
        calls = tuple((c.group, c.nbytes) for c in cs if c.when is SyncWhen.BEFORE_USE)
        if calls:
            if calls not in priced:
                priced[calls] = phase_seconds([Move(Collective.ALL_GATHER, Phase.SYNC, g, n) for g, n in calls],
                                              cluster, profile)[Phase.SYNC]
            by_weight.setdefault(b.weights[0], []).append((b.group, priced[calls], _hidden(cluster, profile, b.group)))
    if not by_weight:
        return []
    alike: dict[tuple, set[int]] = {}
    for g in ctx.gathers:
        for group, seconds, overlap in by_weight.get(g.weight, ()):
            alike.setdefault((g.start, g.use, seconds, overlap, Phase.FWD if g.kind is Action.FORWARD else Phase.BWD),
                             set()).update(group)
    return [Fetch(start, use, tuple(sorted(ds)), seconds, overlap, phase)
            for (start, use, seconds, overlap, phase), ds in alike.items()]


def _at_once_events(ctx: CostContext, flat: FlatCalls, start: float, when: SyncWhen) -> list[Event]:
    """The flat sync's calls that run ``when``, from ``start`` on, each class once the last
    one on its devices is through."""
    free = np.full(ctx.cluster.num_devices, start)
    events = []
    for devices, seconds in _at_once(ctx, flat, when):
        ds = device_array(devices)
        s = float(free[ds].max())
        free[ds] = s + seconds
        events.append(Event(SYNC_NODE, Phase.SYNC, Stream.COMM, devices, s, s + seconds))
    return events


def _after_update(ctx: CostContext, flat: FlatCalls, done: np.ndarray) -> tuple[np.ndarray, list[Event]]:
    """When each device is through with the step, given when its update ends (``done``):
    under ZeRO, each bucket's all-gather of the updated shards starts once its members have
    updated them (buckets of one size and group size at once, as the flat sync's classes)."""
    finish = np.array(done, dtype=float)
    events: list[Event] = []
    if not any(b.zero for b, _ in flat):
        return finish, events        # an all-reduce leaves nothing for after the update
    for devices, seconds in _at_once(ctx, flat, SyncWhen.AFTER_UPDATE):
        ds = device_array(devices)
        start = float(finish[ds].max())
        finish[ds] = start + seconds
        events.append(Event(SYNC_NODE, Phase.SYNC, Stream.COMM, devices, start, start + seconds))
    return finish, events


def _at_once(ctx: CostContext, flat: FlatCalls, when: SyncWhen) -> list[tuple[tuple[int, ...], float]]:
    """The flat sync's calls (``ir/buckets.sync_calls``) that run ``when`` (``SYNC``: also
    the last micro-batch's of ``MICRO_BATCH``), grouped into those that run at once, as
    (devices, seconds): the calls of groups of one size and buffer size, sharing a node's
    network interface as :func:`~unity_cli.cost.moves.phase_seconds` prices them."""
    wanted = {when} | ({SyncWhen.MICRO_BATCH} if when is SyncWhen.SYNC else set())
    classes: dict[tuple[int, int], list[Move]] = {}
    for _, cs in sorted(flat, key=lambda bc: (bc[0].group, bc[0].dtype)):
        for c in cs:
            if c.when in wanted:
                classes.setdefault((len(c.group), c.nbytes), []).append(_call_move(c))
    return [(tuple(sorted({d for m in ms for d in m.group})),
             phase_seconds(ms, ctx.cluster, ctx.config.profile)[Phase.SYNC]) for ms in classes.values()]


LOSS_PASSES = {"mse": 12, "cross_entropy": 22}
"""Streaming passes ``runtime/loss.py`` makes over the output region a loss reads: MSE casts
the target, subtracts, squares, sums and scales (12); cross entropy takes the max, shifts,
exponentiates, sums, takes logs, builds the one-hot and scales (22)."""


def loss_seconds(shape: ParallelTensorShape, class_axis: int | None, device, config: CostConfig) -> float:
    """The loss of one step on a device that leads a group of the output's pieces (the
    classes of a logit row read together): its passes over that region at the device's
    memory bandwidth, and the runtime's fixed work per step, measured by the profile."""
    region = shape.piece.numel * max((len(g) for g in loss_pieces(shape, class_axis)), default=1)
    passes = LOSS_PASSES["mse" if class_axis is None else "cross_entropy"]
    t = region * config.dtype.itemsize * passes / device.memory_bandwidth
    return t + (config.profile.loss(device) if config.profile is not None else 0.0)


SYNC_BUCKETS = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
"""The bucket sizes the cost model tries for a bucketed gradient sync (PyTorch DDP's default
is 25 MiB), beside one flat all-reduce per group after backward."""
MIN_OVERLAP = 0.1
"""A measured overlap below this hides nothing a bucket's extra calls would not cost again:
the sync stays flat, and nothing else is tried."""


def sync_bucket_choices(cluster: ClusterSpec, config: CostConfig) -> tuple[int, ...]:
    """The bucket sizes a step is priced with (the fastest wins): the config's, else flat, and
    the sizes of :data:`SYNC_BUCKETS` where the profile measured an all-reduce hiding under
    compute on one of the cluster's device types."""
    if config.training.sharded:    # ZeRO's reduce-scatter runs flat, after backward
        return (0,)
    if config.sync_bucket is not None:
        return (config.sync_bucket,)
    prof = config.profile
    if prof is not None and any((ov := prof.sync_overlap(n.device)) is not None and ov >= MIN_OVERLAP
                                for n in cluster.nodes):
        return (0, *SYNC_BUCKETS)
    return (0,)


def _flat_syncs(ctx: CostContext, flat: FlatCalls) -> list[SyncClass]:
    """The gradient sync as the runtime runs it flat (``runtime/weights.py``): one all-reduce
    (under ZeRO, a reduce-scatter) per group of devices and dtype, over one flat buffer of
    every weight region the group keeps (``flat``: the buckets of ``ir/buckets.py``), not one
    per weight; groups of the same size and buffer at once (:func:`_at_once`)."""
    return [SyncClass(AFTER_BACKWARD, devices, seconds) for devices, seconds in _at_once(ctx, flat, SyncWhen.SYNC)]


def weight_syncs(st: Structure, moves: Sequence[Sequence[Move]]) -> list[WeightSync]:
    """What :func:`~unity_cli.ir.buckets.sync_buckets` needs of each trainable weight, in plan
    order, from each node's moves (``moves[i]``: node ``i``'s; the sync moves are its
    carrier's). The runtime reads the same from its program (``runtime/weights.py``)."""
    pcg = st.pcg
    return sorted((WeightSync(w, pcg.nodes[w].outputs[0].dtype.value, st.residents[w],
                              tuple((m.group, m.nbytes) for m in moves[i] if m.phase == Phase.SYNC))
                   for i, w in st.sync.items()), key=lambda x: x.weight)


def _hidden(cluster: ClusterSpec, profile: Profile | None, devices: Sequence[int]) -> float:
    """The share of a collective on ``devices`` that runs beside their compute: the least
    the profile measured for their device types (``comm.sync_overlap``; none unmeasured)."""
    if profile is None:
        return 0.0
    return min((profile.sync_overlap(t) or 0.0) for t in {cluster.device_type(d) for d in devices})


def _bucket_syncs(ctx: CostContext, weights: Sequence[WeightSync], bucket_bytes: int) -> list[SyncClass]:
    """The gradient sync bucketed as the runtime buckets it (``ir/buckets.py``, from each
    weight's sync moves), in the order the buckets start."""
    pcg, cluster, profile = ctx.pcg, ctx.cluster, ctx.config.profile
    placed: dict[tuple, int] = {}
    classes: dict[tuple, list] = {}
    for b in sync_buckets(pcg, weights, bucket_bytes):
        k = placed[(b.group, b.dtype)] = placed.get((b.group, b.dtype), -1) + 1
        classes.setdefault((-b.ready, len(b.group), b.nbytes, k), []).append(b)
    out = []
    for bs in (bs for _, bs in sorted(classes.items())):
        ds = tuple(sorted({d for b in bs for d in b.group}))
        moves = [Move(Collective.ALL_REDUCE, Phase.SYNC, b.group, b.nbytes) for b in bs]
        overlap = _hidden(cluster, profile, ds)
        copy: dict[int, float] = {}
        for b in bs:
            for d in b.group:
                copy[d] = copy.get(d, 0.0) + sync_copy_seconds(b.nbytes, cluster.device_type(d))
        out.append(SyncClass(bs[0].ready, ds, phase_seconds(moves, cluster, profile)[Phase.SYNC], overlap,
                             tuple(copy.get(d, 0.0) for d in ds)))
    return out


def _update_time(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                 cluster: ClusterSpec, config: CostConfig, synced: Sequence[Move] = (),
                 flat: FlatCalls = ()) -> np.ndarray:
    """Optimizer update: a streaming pass over each device's weights, grads and state, and
    the copy of the gradients each device syncs (``synced``, the sync moves) into their
    groups' flat buffers (where backward makes a gradient in that buffer itself,
    ``ParamStore.seeds``, the pass that zeroes it each step and backward's adding into it
    stand in that copy's place, priced as it). Under ZeRO a device updates its shard of each
    flat buffer of its groups once (``flat``: the flat sync's buckets), and each weight it
    keeps without replicas as before."""
    types, index, _ = _device_types(cluster)
    t = np.zeros(cluster.num_devices)
    if synced:
        copied = np.zeros(cluster.num_devices, dtype=np.int64)
        for m in synced:
            np.add.at(copied, device_array(m.group), m.nbytes)
        ix = np.flatnonzero(copied)
        bandwidth = np.array([ty.memory_bandwidth for ty in types])[index[ix]]
        t[ix] += sync_copy_seconds(copied[ix], bandwidth)
    sharded: dict[int, set[int]] = {}     # weight -> the devices that update it by shards
    for b, _ in flat:
        if b.zero:      # its members update their shards of its flat buffer
            for w in b.weights:
                sharded.setdefault(w, set()).update(b.group)
            shard = b.shard()
            ix = device_array(b.group)
            np.add.at(t, ix, np.array([update_seconds(shard, ty, config) for ty in types])[index[ix]])
    for i in _updated(pcg, layout):
        per_type = np.array([update_seconds(pcg.nodes[i].outputs[0].piece.numel, ty, config) for ty in types])
        skip = sharded.get(layout[i], set())
        ix = device_array(tuple(d for d in devs[i] if d not in skip) if skip else devs[i])
        np.add.at(t, ix, per_type[index[ix]])
    return t


def _updated(pcg: PCG, layout: Sequence[int | None]) -> list[int]:
    """The stored pieces of trainable weights: each is one optimizer update on its devices."""
    stored = stored_nodes(pcg, layout)
    return [i for i, n in pcg if stored[i] and layout[i] is not None
            and isinstance(w := pcg.nodes[layout[i]].op, WeightAttrs) and w.trainable]


def updates_per_device(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec,
                       config: CostConfig = CostConfig()) -> list[int]:
    """How many weight-piece updates each device's optimizer step makes (each pays the
    profile's fixed ``update_s`` once)."""
    count = np.zeros(cluster.num_devices, dtype=np.int64)
    for i in _updated(pcg, CostContext.of(pcg, cluster, config).layout):
        np.add.at(count, device_array(views[i].devices(pcg.nodes[i].outputs[0])), 1)
    return count.tolist()


@functools.lru_cache(maxsize=8)
def _device_types(cluster: ClusterSpec) -> tuple[tuple, np.ndarray, np.ndarray]:
    """The cluster's device types, each device's index among them, and each device's
    memory capacity in bytes."""
    types: list = []
    index = np.zeros(cluster.num_devices, dtype=np.intp)
    caps = np.zeros(cluster.num_devices, dtype=np.int64)
    for k, node in enumerate(cluster.nodes):
        if node.device not in types:
            types.append(node.device)
        lo = cluster.device_offsets[k]
        index[lo:lo + node.devices] = types.index(node.device)
        caps[lo:lo + node.devices] = node.device.memory_capacity
    return tuple(types), index, caps


def device_capacity(cluster: ClusterSpec, config: CostConfig) -> np.ndarray:
    """The bytes each device may hold: its memory, or ``--memory-limit`` where that is less."""
    caps = _device_types(cluster)[2]
    return caps if config.memory_limit is None else np.minimum(caps, config.memory_limit)


def update_seconds(numel: int, device, config: CostConfig, synced: bool = False) -> float:
    """The optimizer's update of one stored weight piece of ``numel`` elements on ``device``
    (``synced``: with the copy of its gradient into its group's flat buffer)."""
    passes = 3 + 2 * config.optimizer.states     # read w, g, states; write w, states
    t = numel * 4 * passes / device.memory_bandwidth
    if synced:
        t += sync_copy_seconds(numel * 4, device)
    if config.profile is not None:
        t += config.profile.update_overhead(device, config.optimizer.value)
    return t


SYNC_COPY_PASSES = 2
"""Before the all-reduce, the runtime reads each gradient a device syncs and writes it into
its group's flat buffer (``runtime/weights.py``): two streaming passes, in the optimizer's
phase of the step."""


def sync_copy_seconds(nbytes, device):
    """The copy of ``nbytes`` of gradients into a flat sync buffer on ``device`` (or, given
    arrays of bytes and of memory bandwidths, on each device)."""
    bandwidth = device if isinstance(device, np.ndarray) else device.memory_bandwidth
    return SYNC_COPY_PASSES * nbytes / bandwidth

