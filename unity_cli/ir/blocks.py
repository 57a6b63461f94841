"""Repeated blocks: a run of identical consecutive blocks (a decoder's layers), found by
structure, and the same graph with fewer of them.

A graph is cut into segments (``ir/recompute.segments``: in a transformer, half-blocks).
Each segment has a **key**: its operators in order, each with its attributes, its output
shapes and what it reads, where an input is said relative to the reader (an operator
``d`` segments back at position ``y`` in its segment; a weight or constant only this
segment reads, by its own structure) or, when several segments read it (a mask, a rotary
table, a tied embedding), as that one node. Two segments with equal keys compute the same
thing on different weights. A **run** is the longest stretch of blocks of ``period``
segments, each block's keys equal to the next one's (:func:`find_run`).

:func:`shortened` keeps the run's first ``keep`` blocks and drops the rest: what read the
last block reads the last kept one. A step of the shortened graph prices as the whole one
does but for the dropped blocks, each of which would cost what a kept block costs; the
searches use it to price many configurations cheaply (``search/step.py``), and price what
they choose on the whole graph.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .ops.sources import WeightAttrs
from .opspec import attrs_key
from .pcg import PCG, GraphBuilder, TensorRef
from .recompute import activation_nodes, segments
from .schedule import layout_sources

MIN_BLOCKS = 4
"""The fewest blocks a run has: fewer save too little to be worth the shortening."""

MAX_PERIOD = 8
"""The most segments a block of a run has."""


@dataclass(frozen=True, slots=True)
class Run:
    """``count`` blocks of ``period`` segments each, the first at segment ``start``."""

    start: int
    period: int
    count: int

    @property
    def end(self) -> int:
        """The segment after the run's last."""
        return self.start + self.period * self.count


@dataclass(frozen=True)
class Blocks:
    """A graph's segments (``ir/recompute.segments``), their keys and its run (None: none)."""

    segments: tuple[tuple[int, ...], ...]
    keys: tuple[tuple, ...]
    run: Run | None


def blocks(pcg: PCG, least: int = MIN_BLOCKS) -> Blocks:
    """The segments of ``pcg``, their keys and its run (of at least ``least`` blocks)."""
    segs = segments(pcg, layout_sources(pcg))
    keys = segment_keys(pcg, segs)
    return Blocks(segs, keys, find_run(keys, least))


@dataclass(frozen=True)
class _Places:
    """Where each node of a graph is: an operator's segment and position in it (``where``),
    and the segments that read each node (through layouts, for a source: ``readers``)."""

    acts: frozenset[int]
    where: dict[int, tuple[int, int]]
    readers: list[set[int]]

    @staticmethod
    def of(pcg: PCG, segs: Sequence[Sequence[int]]) -> _Places:
        where = {i: (s, y) for s, seg in enumerate(segs) for y, i in enumerate(seg)}
        acts = frozenset(activation_nodes(pcg, layout_sources(pcg)))
        readers: list[set[int]] = [set() for _ in pcg.nodes]
        for i in range(len(pcg) - 1, -1, -1):
            for u, _ in pcg.consumers[i]:
                readers[i] |= {where[u][0]} if u in acts else readers[u]
        return _Places(acts, where, readers)

    def shared(self, u: int) -> bool:
        """Whether segments other than its own read node ``u`` from more than one place (a
        mask, a rotary table, a tied embedding): a block reads it as that node, not its like."""
        own = self.where[u][0] if u in self.where else None
        return len(self.readers[u] - {own}) > 1

    def owned(self, segs: set[int]) -> list[int]:
        """The sources and layouts that only segments of ``segs`` read (and something does)."""
        return [i for i, r in enumerate(self.readers) if i not in self.acts and r and r <= segs]


def segment_keys(pcg: PCG, segs: Sequence[Sequence[int]]) -> tuple[tuple, ...]:
    """Each segment's key (the module docstring)."""
    at = _Places.of(pcg, segs)
    local: dict[int, tuple] = {}

    def own(u: int) -> tuple:
        """A source or layout node's structure (its inputs' too), not its name (nor the
        names of the weights a folded one is made of)."""
        if u not in local:
            n = pcg.nodes[u]
            op = replace(n.op, parts=tuple(("", k) for _, k in n.op.parts)) \
                if isinstance(n.op, WeightAttrs) and n.op.parts else n.op
            local[u] = (attrs_key(op), tuple(map(str, n.outputs)), tuple((own(r.node), r.index) for r in n.inputs))
        return local[u]

    keys = []
    for s, seg in enumerate(segs):
        key = []
        for i in seg:
            n = pcg.nodes[i]
            ins = []
            for r in n.inputs:
                u = r.node
                if at.shared(u):
                    ins.append(("node", u, r.index))
                elif u in at.acts:
                    t, y = at.where[u]
                    ins.append(("back", s - t, y, r.index))
                else:
                    ins.append(("own", own(u), r.index))
            key.append((attrs_key(n.op), tuple(map(str, n.outputs)), tuple(ins)))
        keys.append(tuple(key))
    return tuple(keys)


def find_run(keys: Sequence[tuple], least: int = MIN_BLOCKS) -> Run | None:
    """The run covering the most segments (the shorter period, then the earlier, on a tie)
    of at least ``least`` blocks; None if there is none."""
    best: Run | None = None
    for p in range(1, MAX_PERIOD + 1):
        s = 0
        while s + p < len(keys):
            if keys[s] != keys[s + p]:
                s += 1
                continue
            e = s
            while e + p < len(keys) and keys[e] == keys[e + p]:
                e += 1
            count = (e - s) // p + 1           # segments s .. e + p - 1, whole blocks of p
            if count >= least and (best is None or count * p > best.count * best.period):
                best = Run(s, p, count)
            s = e + 1
    return best


def shortened_limit(limit: int, start: int, period: int, dropped: int) -> int:
    """A count of segments recomputed (the first ``limit``; 0: all) of a graph, on it with
    ``dropped`` blocks of ``period`` segments fewer in its run (which starts at segment
    ``start``): what the dropped blocks recomputed comes off it, the rest stays."""
    if limit == 0 or limit <= start:
        return limit
    return max(limit - dropped * period, start)


def shortened(pcg: PCG, found: Blocks, keep: int) -> PCG:
    """``pcg`` with only the first ``keep`` blocks of its run (``found.run``, at least one
    kept): each dropped block's nodes, the weights and constants only they read, gone, and
    what read a dropped node reading its like in the last kept block instead."""
    return shortened_from(pcg, found, keep)[0]


def shortened_from(pcg: PCG, found: Blocks, keep: int) -> tuple[PCG, tuple[int, ...]]:
    """:func:`shortened`, and for each of its nodes the node of ``pcg`` it is (a plan's
    views follow it onto the shorter graph)."""
    run = found.run
    assert run is not None and 1 <= keep <= run.count
    if keep == run.count:
        return pcg, tuple(range(len(pcg)))
    at = _Places.of(pcg, found.segments)
    shift = (run.count - keep) * run.period
    gone = set(range(run.start + keep * run.period, run.end))
    # the dropped blocks' operators, and the sources and layouts only they read
    dropped = {i for i, (s, _) in at.where.items() if s in gone} | set(at.owned(gone))

    def like(i: int) -> int:
        s, y = at.where[i]
        if s - shift < run.start:
            raise ValueError(f"node {i} ({pcg.nodes[i].name or pcg.nodes[i].kind}) is read past the run's last "
                             "block: it has no like in a kept one")
        return found.segments[s - shift][y]

    b = GraphBuilder()
    new: dict[int, int] = {}

    def ref(r: TensorRef) -> TensorRef:
        return TensorRef(new[like(r.node) if r.node in dropped else r.node], r.index)

    for i, n in pcg:
        if i in dropped:
            continue
        new[i] = b.add(n.op, [ref(r) for r in n.inputs], n.name, outputs=n.outputs)[0].node
    return b.build(ref(r) for r in pcg.outputs), tuple(new)


def lengthened(pcg: PCG, found: Blocks, times: int, rename: Callable[[int, int], tuple[Any, str]] | None = None
               ) -> tuple[PCG, tuple[int, ...]]:
    """``pcg`` with ``times`` more blocks after its run (``found.run``): each a copy of the
    run's last block (its operators, and the weights and constants only it reads) that reads
    the block before it where the last block read the one before that; what read the last
    block reads the last copy. The inverse of :func:`shortened`. ``rename(j, i)``: the
    attributes and name of copy ``j``'s (1, 2, ...) like of node ``i`` (default: ``i``'s
    own; a copy's weights are the model's weights of the layer it stands for). Returns the
    graph and, per node, the node of ``pcg`` it is or copies."""
    run = found.run
    assert run is not None and times >= 0
    if times == 0:
        return pcg, tuple(range(len(pcg)))
    at = _Places.of(pcg, found.segments)
    block = set(range(run.end - run.period, run.end))
    members = sorted(at.owned(block) + [i for s in sorted(block) for i in found.segments[s]])
    last = members[-1]
    b = GraphBuilder()
    new: dict[int, int] = {}
    longer: dict[tuple[int, int], int] = {}     # (segment, position) of the longer graph -> its node
    origin: list[int] = []

    def emit(i: int, ins: list[TensorRef], named: tuple[Any, str] | None = None) -> int:
        n = pcg.nodes[i]
        op, name = named or (n.op, n.name)
        origin.append(i)
        return b.add(op, ins, name, outputs=n.outputs)[0].node

    def shifted(u: int, blocks: int, inside: bool) -> int | None:
        """The like of operator ``u`` ``blocks`` blocks on (None: ``u`` is read as itself: a
        source, a shared node, or, unless read from inside the run, a node outside it)."""
        if u not in at.where or at.shared(u) or not (inside or run.start <= at.where[u][0] < run.end):
            return None
        s, y = at.where[u]
        return longer[s + blocks * run.period, y]

    for i in range(last + 1):
        new[i] = emit(i, [TensorRef(new[r.node], r.index) for r in pcg.nodes[i].inputs])
        if i in at.where:
            longer[at.where[i]] = new[i]
    for j in range(1, times + 1):
        copy: dict[int, int] = {}
        for v in members:
            ins = []
            for r in pcg.nodes[v].inputs:
                u = copy.get(r.node)
                if u is None:
                    u = shifted(r.node, j, inside=True)
                ins.append(TensorRef(new[r.node] if u is None else u, r.index))
            copy[v] = emit(v, ins, rename(j, v) if rename else None)
            if v in at.where:
                s, y = at.where[v]
                longer[s + j * run.period, y] = copy[v]

    def ref(r: TensorRef) -> TensorRef:
        u = shifted(r.node, times, inside=False)
        return TensorRef(new[r.node] if u is None else u, r.index)

    for i in range(last + 1, len(pcg)):
        new[i] = emit(i, [ref(r) for r in pcg.nodes[i].inputs])
    return b.build(ref(r) for r in pcg.outputs), tuple(origin)


def likes(pcg: PCG, found: Blocks) -> Callable[[int, int], int | None]:
    """``like(i, j)``: the node ``j`` blocks after node ``i`` of the run (an operator at the
    same position of its segment ``j`` blocks on; a weight or constant only its block reads,
    what that operator reads in its place); None where there is none (``i`` outside the run,
    shared, or past its end)."""
    run = found.run
    assert run is not None
    at = _Places.of(pcg, found.segments)

    def like(i: int, j: int) -> int | None:
        if i in at.where:
            s, y = at.where[i]
            t = s + j * run.period
            if at.shared(i) or not (run.start <= s < run.end and run.start <= t < run.end) \
                    or y >= len(found.segments[t]):
                return None
            return found.segments[t][y]
        if not at.readers[i] or len(at.readers[i]) > 1:
            return None
        u, k = min(pcg.consumers[i])            # its first reader, and where it reads it
        twin = like(u, j)
        return None if twin is None else pcg.nodes[twin].inputs[k].node

    return like
