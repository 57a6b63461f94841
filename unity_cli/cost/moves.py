"""Every byte the runtime moves in one training step, node by node.

From the runtime's own schedule (:mod:`unity_cli.ir.schedule`), a node's moves are:

* a compute op's reads of input pieces held on other devices: a point-to-point message
  forward and the read's gradient sent back in backward;
* a parallel op's step as the runtime runs it: its slices, concatenations, copies and sums
  as point-to-point messages, its broadcasts (three or more readers) and reduces (three or
  more contributors), and a ``Reduction``/``Combine`` -> ``Replicate`` pair over the same
  devices as one all-reduce / all-gather (reduce-scatter backward). The pair is priced at
  its second node, the ``Replicate``: whether it fuses depends on both ends;
* the weight-gradient all-reduces of a trainable weight's replicas (one group per region
  that several devices keep, :class:`~unity_cli.ir.schedule.ParamPlan`), at the weight's
  last stored layout;
* at the graph's output, the loss's gathering of the pieces it needs together, the
  gradients sent back, and the all-reduce of the loss value (8 bytes).

:func:`node_moves` needs only the views of the node and of :meth:`Structure.deps`: the
step simulation (``cost.model.estimate``) and the machine-mapping DP price a node with the
same call. :func:`sent_per_device` applies :func:`unity_cli.cost.comm.sent_bytes`, the
convention ``unity run`` counts by at its communicator.
"""
from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from ..cluster.collectives import Collective, sent_ratio
from ..cluster.spec import ClusterSpec
from ..ir.dtypes import DType
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import PCG, TensorRef
from ..ir.phase import MOVE_PHASES, Phase
from ..ir.schedule import (
    LOCAL,
    LOSS_VALUE_BYTES,
    CollectiveKind,
    Read,
    Schedule,
    Step,
    StepKind,
    Views,
    all_residents,
    gather_then_replicate,
    layout_sources,
    looks_like_logits,
    loss_pieces,
    needs_grad,
    read_shape,
    region_shape,
    trainable,
)
from ..ir.shapes import ParallelTensorShape
from .comm import device_nodes, groups_time, link_for

if TYPE_CHECKING:
    from .profile import Profile

PHASES = MOVE_PHASES


@dataclass(frozen=True, slots=True)
class Move:
    """One communication call of a step: ``kind`` over ``group`` (members in increasing
    order; point-to-point: ``(sender, receiver)``), passing ``nbytes`` (as
    :func:`~unity_cli.cost.comm.sent_bytes` reads it), in ``phase``."""

    kind: Collective
    phase: Phase
    group: tuple[int, ...]
    nbytes: int
    root: int = -1


@dataclass(frozen=True)
class Structure:
    """What a PCG's moves depend on besides the views: computed once per graph."""

    pcg: PCG
    layout: tuple[int | None, ...]
    pairs: dict[int, int]              # gather_then_replicate: first -> second
    second: dict[int, int]             # second -> first
    grads: frozenset[TensorRef]        # tensors whose gradient flows back
    class_axis: int | None             # the loss's class axis (cross entropy) or None (mse)
    sync: dict[int, int]               # resident that carries a weight's gradient sync -> the weight
    residents: dict[int, tuple[int, ...]]   # trainable weight -> its stored layouts
    num_devices: int
    copies: frozenset[int] = frozenset()    # where a CPU makes a transposing copy (cost.strides.copies)
    _keys: dict[int, Hashed] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(pcg: PCG, num_devices: int, loss: str = "auto", copies: frozenset[int] = frozenset()) -> Structure:
        """``loss``: ``auto`` (cross entropy when the output looks like logits, as ``unity
        run`` picks with synthetic data), ``cross_entropy`` or ``mse``; ``copies``: the
        nodes where a CPU makes a transposing copy (``cost.strides.copies``), which a
        node's price depends on."""
        layout = tuple(layout_sources(pcg))
        pairs = gather_then_replicate(pcg, layout)
        out = pcg.outputs[0]
        rank = pcg.shape(out).rank
        ce = loss == "cross_entropy" or loss == "auto" and looks_like_logits(pcg)
        sync, res = {}, {}
        stored = all_residents(pcg, layout)
        for w, n in pcg:
            if isinstance(n.op, WeightAttrs) and n.op.trainable:
                rs = tuple(stored.get(w, ()))
                res[w] = rs
                movable = [i for i in rs if not pcg.nodes[i].spec.is_source]
                sync[max(movable) if movable else w] = w
        return Structure(pcg, layout, pairs, {p: r for r, p in pairs.items()}, needs_grad(pcg, out),
                         rank - 1 if ce and rank >= 1 else None, sync, res, num_devices, copies)

    def deps(self, i: int) -> tuple[int, ...]:
        """The nodes besides ``i`` whose views :func:`node_moves` of ``i`` reads."""
        n = self.pcg.nodes[i]
        if self.layout[i] is not None:
            w = self.sync.get(i)
            return tuple(r for r in self.residents[w] if r != i) if w is not None else ()
        if i in self.pairs:
            return ()
        if i in self.second:
            j = self.second[i]
            return (j, self.pcg.nodes[j].inputs[0].node)
        return tuple(sorted({r.node for r in n.inputs}))

    def key(self, i: int) -> Hashed:
        """Everything but the views that :func:`node_moves` of ``i`` depends on, as a hashable
        value (equal nodes of two candidate graphs share it, so their prices are cached):
        the node, the shapes it reads and whether they are data, constants or weights, and
        what depends on the graph downstream: gradients, fused pairs, the loss, the stored
        layouts of the weight whose sync it carries."""
        k = self._keys.get(i)
        if k is None:
            pcg = self.pcg
            n = pcg.nodes[i]
            out = pcg.outputs[0]
            w = self.sync.get(i)
            k = (n.op, n.outputs, self._reads(i), self.active(i), tuple(r in self.grads for r in n.inputs),
                 i in self.pairs, self._pair_key(i), i in self.copies,
                 (self.class_axis, out in self.grads, self.num_devices) if i == out.node else None,
                 (pcg.nodes[w].outputs, tuple((r == i, pcg.nodes[r].outputs[0], pcg.nodes[r].spec.is_source)
                                              for r in self.residents[w])) if w is not None else None)
            k = self._keys[i] = Hashed(k)
        return k

    def _reads(self, i: int) -> tuple:
        """What a node's reads depend on upstream: each input's shape, and whether it is a
        layout (made where it is read, or a weight's stored piece)."""
        pcg = self.pcg
        return tuple((pcg.shape(r), self.layout[r.node] is not None, trainable(pcg, self.layout, r.node))
                     for r in pcg.nodes[i].inputs)

    def _pair_key(self, i: int) -> tuple | None:
        """A fused pair's second also runs its first's step when they do not fuse."""
        j = self.second.get(i)
        if j is None:
            return None
        first = self.pcg.nodes[j]
        return (first.op, first.outputs, self._reads(j), self.active(j), tuple(r in self.grads for r in first.inputs))

    def active(self, i: int) -> bool:
        """Whether backward runs for node ``i`` (a gradient reaches one of its outputs)."""
        return any(TensorRef(i, k) in self.grads for k in range(len(self.pcg.nodes[i].outputs)))


class Hashed:
    """A value whose hash is computed once: a price table is looked up by a node's key
    (:meth:`Structure.key`, deep tuples of shapes and operators) for every node of every
    candidate a search prices."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: Hashable) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or isinstance(other, Hashed) and self._hash == other._hash and self.value == other.value

    def __reduce__(self):
        return Hashed, (self.value,)     # hashed again where it lands


def itemsize(shape: ParallelTensorShape, dtype: DType) -> int:
    """Bytes per element of a tensor in flight: floats in the plan's dtype, others their own."""
    return dtype.itemsize if shape.dtype.is_float else shape.dtype.itemsize


def node_moves(st: Structure, i: int, views: Views, dtype: DType = DType.FLOAT32) -> tuple[Move, ...]:
    """What the runtime moves for node ``i`` in a step (see the module docstring); ``views``
    needs ``i`` and :meth:`Structure.deps` of it."""
    pcg = st.pcg
    n = pcg.nodes[i]
    sched = Schedule(pcg, views, st.layout)
    moves: list[Move] = []
    if st.layout[i] is not None:
        w = st.sync.get(i)
        if w is not None:
            moves += _sync_moves(st, sched, w)
    elif i in st.pairs:
        pass                           # priced with its Replicate (see the module docstring)
    elif i in st.second:
        j = st.second[i]
        fused = sched.fused_step(j, i)
        steps = [fused] if fused is not None else [sched.move_step(j), sched.move_step(i)]
        for s in steps:
            moves += step_moves(st, sched, s, dtype)
    elif n.spec.is_parallel_op:
        moves += step_moves(st, sched, sched.move_step(i), dtype)
    else:
        moves += step_moves(st, sched, sched.compute_step(i), dtype)
    if i == pcg.outputs[0].node and st.layout[i] is None:
        moves += _loss_moves(st, sched, dtype)
    return tuple(moves)


def _read_bytes(pcg: PCG, rd: Read, dtype: DType, memo: dict | None = None) -> int:
    """Bytes a read brings; ``memo`` keeps each tensor's piece, and each region's bytes, between
    the reads of a step (a region by its identity: the step holds it, and reads share one)."""
    if memo is None:
        return math.prod(read_shape(pcg, rd)) * itemsize(pcg.shape(rd.ref), dtype)
    key = (rd.ref, id(rd.region))
    hit = memo.get(key)
    if hit is None:
        shape = pcg.shape(rd.ref)
        dims = shape.piece.dims
        hit = memo[key] = math.prod(dims if rd.region is None else region_shape(rd.region, dims)) * \
            itemsize(shape, dtype)
    return hit


def step_moves(st: Structure, sched: Schedule, step: Step, dtype: DType) -> list[Move]:
    """The calls of one runtime step, forward and backward (mirrors ``runtime/executor.py``)."""
    pcg = st.pcg
    back = st.active(step.node)
    out: list[Move] = []
    if step.kind is StepKind.FUSED:
        src = step.source
        assert src is not None
        nb = pcg.shape(src).piece.numel * itemsize(pcg.shape(src), dtype)
        grad = back and src in st.grads
        for c in step.collectives:
            if c.kind is CollectiveKind.ALLREDUCE:
                out.append(Move(Collective.ALL_REDUCE, Phase.FWD, c.group, nb))
                if grad:
                    out.append(Move(Collective.ALL_REDUCE, Phase.BWD, c.group, nb))
            else:
                out.append(Move(Collective.ALL_GATHER, Phase.FWD, c.group, nb))
                if grad:
                    out.append(Move(Collective.REDUCE_SCATTER, Phase.BWD, c.group, nb))
        return out
    covered = {(ti, ri) for c in step.collectives for ti, ri in c.covered}
    memo: dict = {}
    for ti, t in enumerate(step.tasks):
        for ri, rd in enumerate(t.reads):
            if (ti, ri) in covered or rd.src in (LOCAL, t.rank):
                continue
            nb = _read_bytes(pcg, rd, dtype, memo)
            out.append(Move(Collective.P2P, Phase.FWD, (rd.src, t.rank), nb))
            if back and rd.ref in st.grads:
                out.append(Move(Collective.P2P, Phase.BWD, (t.rank, rd.src), nb))
    for c in step.collectives:
        ti, ri = c.covered[0]
        rd = step.tasks[ti].reads[ri]
        nb = _read_bytes(pcg, rd, dtype)
        grad = back and rd.ref in st.grads
        if c.kind is CollectiveKind.BCAST:
            out.append(Move(Collective.BROADCAST, Phase.FWD, c.group, nb, c.root))
            if grad:
                out.append(Move(Collective.REDUCE, Phase.BWD, c.group, nb, c.root))
        elif c.kind is CollectiveKind.REDUCE:
            out.append(Move(Collective.REDUCE, Phase.FWD, c.group, nb, c.root))
            if grad:
                out.append(Move(Collective.BROADCAST, Phase.BWD, c.group, nb, c.root))
        else:
            raise AssertionError(c.kind)
    return out


def _sync_moves(st: Structure, sched: Schedule, w: int) -> list[Move]:
    """One all-reduce per group of devices keeping the same region of weight ``w`` (in the
    weight's own dtype: the master copy's)."""
    plan = sched.param(w, st.residents[w])
    size = sched.pcg.nodes[w].outputs[0].dtype.itemsize
    out, seen = [], set()
    for rank, g in sorted(plan.group.items()):
        if len(g) > 1 and g not in seen:
            seen.add(g)
            out.append(Move(Collective.ALL_REDUCE, Phase.SYNC, g,
                            math.prod(region_shape(plan.master[rank], plan.shape)) * size))
    return out


def _loss_moves(st: Structure, sched: Schedule, dtype: DType) -> list[Move]:
    """The loss: each group's pieces to its leader, their gradients back, the loss value summed."""
    pcg = st.pcg
    out_ref = pcg.outputs[0]
    shape = pcg.shape(out_ref)
    nb = shape.piece.numel * itemsize(shape, dtype)
    grad = out_ref in st.grads
    owners = sched.owners(out_ref.node)
    out = []
    for members in loss_pieces(shape, st.class_axis):   # the groups of Schedule.loss_groups
        leader = owners[members[0]]
        for c in members[1:]:
            rank = owners[c]
            if rank != leader:
                out.append(Move(Collective.P2P, Phase.LOSS, (rank, leader), nb))
                if grad:
                    out.append(Move(Collective.P2P, Phase.LOSS, (leader, rank), nb))
    if st.num_devices > 1:
        out.append(Move(Collective.ALL_REDUCE, Phase.LOSS, tuple(range(st.num_devices)), LOSS_VALUE_BYTES))
    return out


# -- bytes and seconds ------------------------------------------------------------------------------


SYMMETRIC = frozenset({Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
                       Collective.ALL_TO_ALL})
"""Collectives in which every member sends the same number of bytes."""


@functools.lru_cache(maxsize=256)
def device_array(devices: tuple[int, ...]) -> np.ndarray:
    """``devices`` as an index array (per-device sums run in numpy: a step's cost must not
    grow with the cluster at Python's speed)."""
    return np.fromiter(devices, dtype=np.intp, count=len(devices))


def sent_per_device(moves: Iterable[Move], num_devices: int) -> list[Fraction]:
    """Bytes each device sends for ``moves`` (:func:`~unity_cli.cost.comm.sent_bytes`)."""
    total, common = _sent(moves, num_devices)
    return [Fraction(int(x), common) for x in total]


def sent_rounded_parts(parts: Iterable[tuple[Iterable[Move], int]], num_devices: int) -> tuple[int, ...]:
    """:func:`sent_per_device` of several lists of moves, each made ``times`` times per step
    (a micro-batch's moves, the sync's once), added exactly, then each device's rounded to
    whole bytes as ``round`` rounds a fraction (half to even)."""
    sums: list[tuple[list[int], int]] = []
    for moves, times in parts:
        total, den = _sent(moves, num_devices)
        sums.append(([int(x) * times for x in total], den))
    common = math.lcm(*(den for _, den in sums)) if sums else 1
    whole = [sum(v[d] * (common // den) for v, den in sums) for d in range(num_devices)]
    return tuple(round(Fraction(x, common)) for x in whole)


def _sent(moves: Iterable[Move], num_devices: int) -> tuple[np.ndarray, int]:
    """Every device's bytes sent, as numerators over one common denominator."""
    alike = Counter((m.kind, m.nbytes, m.group, m.root) for m in moves)   # a step repeats its calls
    acc: dict[int, np.ndarray] = {}   # numerators per denominator (fractions are slow)
    bound = 0                         # no device's numerator can exceed this: int64 while it fits
    senders: list[int] = []           # point-to-point messages, added at once
    sizes: list[int] = []
    for (kind, nbytes, group, root), times in alike.items():
        if kind is Collective.P2P:   # only the sender sends: gathered, then added at once
            num, _ = sent_ratio(kind, nbytes, group, group[0])
            if num:
                senders.append(group[0])
                sizes.append(num * times)
                bound += num * times
            continue
        if kind in SYMMETRIC:
            num, den = sent_ratio(kind, nbytes, group, group[0], root) if group else (0, 1)
            if num:
                bound += num * times
                np.add.at(_numerators(acc, den, num_devices, bound), device_array(group), num * times)
            continue
        for r in group:
            num, den = sent_ratio(kind, nbytes, group, r, root)
            if num:
                bound += num * times
                _numerators(acc, den, num_devices, bound)[r] += num * times
    if senders:
        v = _numerators(acc, 1, num_devices, bound)
        np.add.at(v, np.array(senders, dtype=np.intp), np.array(sizes, dtype=object if v.dtype == object
                                                                 else np.int64))
    if not acc:
        return np.zeros(num_devices, dtype=np.int64), 1
    common = math.lcm(*acc)
    if len(acc) == 1 and common in acc:
        return acc[common], common
    return sum(v.astype(object) * (common // den) for den, v in acc.items()), common


def _numerators(acc: dict[int, np.ndarray], den: int, num_devices: int, bound: int) -> np.ndarray:
    """The numerators over ``den``, widened to Python integers once int64 could overflow."""
    v = acc.get(den)
    if v is None:
        v = acc[den] = np.zeros(num_devices, dtype=np.int64)
    if bound >= 1 << 62 and v.dtype != object:
        for k in acc:
            acc[k] = acc[k].astype(object)
        v = acc[den]
    return v


def phase_seconds(moves: Sequence[Move], cluster: ClusterSpec, profile: Profile | None = None) -> dict[str, float]:
    """Seconds of each phase's moves: a step's point-to-point messages are posted together
    (:func:`p2p_seconds`), then its collectives run, the same kind over disjoint groups at
    once (:func:`~unity_cli.cost.comm.groups_time`). Each of these calls also pays the
    profile's ``call_overhead`` of its phase (the runtime's work in a call beyond its
    transfer)."""
    return {phase: calls.seconds(cluster, profile) for phase, calls in phase_calls(moves, cluster, profile).items()}


@dataclass(frozen=True)
class PhaseCalls:
    """One phase's calls as :func:`phase_seconds` prices them, in a form that prices them
    at any scale: the same calls with every message ``scale`` times larger (the resharding
    of a larger tensor with the same splits: ``search/reshard.unit_layouts``)."""

    phase: str
    p2p_latency: float                  # the slowest link's
    p2p_busiest: float                  # the busiest device's or interface's transfer seconds
    p2p: bool                           # any point-to-point messages
    classes: tuple[tuple[Collective, int, tuple[tuple[int, ...], ...]], ...]   # (kind, buffer bytes, groups)

    def seconds(self, cluster: ClusterSpec, profile: Profile | None = None, scale: int = 1) -> float:
        t = self.p2p_latency + scale * self.p2p_busiest if self.p2p else 0.0
        for kind, whole, groups in self.classes:
            t += groups_time(kind, whole * scale, cluster, groups, profile)
        if profile is not None:
            t += profile.call_overhead(self.phase) * (len(self.classes) + self.p2p)
        return t


def phase_calls(moves: Sequence[Move], cluster: ClusterSpec, profile: Profile | None = None) -> dict[str, PhaseCalls]:
    """Each phase's moves grouped into the calls :func:`phase_seconds` prices."""
    by_phase: dict[str, list[Move]] = defaultdict(list)
    for m in moves:
        by_phase[m.phase].append(m)
    out = {}
    for phase, ms in by_phase.items():
        p2p = [m for m in ms if m.kind is Collective.P2P]
        latency, busiest = _p2p_parts(p2p, cluster, profile)
        classes: dict[tuple, list[tuple[int, ...]]] = defaultdict(list)
        for m in ms:
            if m.kind is not Collective.P2P:
                classes[(m.kind, m.nbytes, len(m.group))].append(m.group)
        # comm.py's formulas take the whole buffer: for all-gather and reduce-scatter, g pieces
        out[phase] = PhaseCalls(phase, latency, busiest, bool(p2p), tuple(
            (kind, nb * g if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER) else nb, tuple(groups))
            for (kind, nb, g), groups in classes.items()))
    return out


def p2p_seconds(messages: Sequence[Move], cluster: ClusterSpec, profile: Profile | None = None) -> float:
    """Messages posted at once: the busiest device's sends or receives (each over its link),
    or the busiest node's network interface, plus the slowest link's latency."""
    if not messages:
        return 0.0
    latency, busiest = _p2p_parts(messages, cluster, profile)
    return latency + busiest


def _p2p_parts(messages: Sequence[Move], cluster: ClusterSpec, profile: Profile | None) -> tuple[float, float]:
    """(the slowest link's latency, the busiest device's or interface's transfer seconds).
    Each message takes its pair's link (:func:`_links`); each device's and each node's
    seconds are summed in the messages' order, so the sums are the same however many."""
    if not messages:
        return 0.0, 0.0
    node, bandwidth, latency = _links(cluster, profile)
    n = len(messages)
    src = np.fromiter((m.group[0] for m in messages), np.intp, n)
    dst = np.fromiter((m.group[1] for m in messages), np.intp, n)
    a, b = node[src], node[dst]
    kind = np.where(src == dst, 0, np.where(a == b, 1 + a, 1 + len(cluster.nodes)))   # self, inside node a, across
    t = np.fromiter((m.nbytes for m in messages), np.float64, n) / bandwidth[kind]
    apart = a != b
    busiest = max(float(np.bincount(src, t).max()), float(np.bincount(dst, t).max()),
                  float(np.bincount(a[apart], t[apart]).max(initial=0.0)),
                  float(np.bincount(b[apart], t[apart]).max(initial=0.0)))
    return max(0.0, float(latency[kind].max())), busiest


@functools.lru_cache(maxsize=16)
def _links(cluster: ClusterSpec, profile: Profile | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each device's node, and the bandwidth and latency of a message by its kind: 0 to
    itself, ``1 + k`` inside node ``k``, ``1 + len(nodes)`` across nodes (``comm.link_for``
    of such a pair: every pair of one kind takes the same link)."""
    node = device_nodes(cluster)
    links = [link_for(cluster, (0,), profile)]
    for k, spec in enumerate(cluster.nodes):
        first = cluster.device_offsets[k]
        links.append(link_for(cluster, (first, first + 1), profile) if spec.devices > 1 else links[0])
    apart = [cluster.device_offsets[0], cluster.device_offsets[1]] if len(cluster.nodes) > 1 else [0]
    links.append(link_for(cluster, apart, profile))
    return node, np.array([x.bandwidth for x in links]), np.array([x.latency for x in links])


def moves_of(st: Structure, views: Views, dtype: DType = DType.FLOAT32) -> list[Move]:
    """Every move of a step of the whole mapped graph."""
    return [m for i in range(len(st.pcg)) for m in node_moves(st, i, views, dtype)]


def views_for(st: Structure, i: int, views: Mapping[int, object]) -> dict[int, object]:
    """The part of ``views`` :func:`node_moves` of ``i`` reads."""
    return {k: views[k] for k in (i, *st.deps(i)) if k in views}
