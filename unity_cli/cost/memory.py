"""What a device holds during a training step, by part: one account that the final pricing
(``cost/model.estimate``), the solver's checks and the report read."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..cluster.spec import DeviceKind
from ..ir.ops.shape_ops import ReshapeAttrs
from ..ir.ops.sources import WeightAttrs
from ..ir.opspec import OpKind, Saved
from ..ir.pcg import PCG, TensorRef
from ..ir.recompute import Recompute, recomputed, segments
from ..ir.schedule import needs_grad, planned_loss, stored_layout
from ..ir.shapes import TensorShape
from ..ir.training import CPU_CHUNK, GPU_CHUNK, label_dtype, label_shape, shard_elements
from .moves import device_array

if TYPE_CHECKING:
    from ..cluster.spec import ClusterSpec
    from .model import CostConfig


def stored_nodes(pcg: PCG, layout: Sequence[int | None]) -> list[bool]:
    """Which nodes hold a buffer of their own during the step."""
    return [stored_layout(pcg, layout, i) if layout[i] is not None else not isinstance(n.op, ReshapeAttrs)
            for i, n in pcg]


MEMORY_PARTS = ("weights", "gradients", "optimizer", "communication buffers", "activations", "recompute workspace",
                "inputs and constants")
"""What :func:`memory_account` counts a device's bytes under."""


PART = {p: k for k, p in enumerate(MEMORY_PARTS)}


@dataclass(frozen=True)
class Scratch:
    """The optimizer's scratch buffer (``runtime/optim.py``): as large as its largest update
    (a weight, its ZeRO shard, or under ZeRO-1 a group's flat shard: all of them, added up
    per segment), at most a chunk."""

    largest: np.ndarray     # [device]: elements
    fixed: np.ndarray       # [device]: ZeRO-1's flat shards that no segment reads
    flat: np.ndarray        # [segment, device]: and each segment's
    chunk: np.ndarray       # [device]

    def bytes(self) -> np.ndarray:
        return np.minimum(np.maximum(self.largest, self.fixed + self.flat.sum(axis=0)), self.chunk) * 4


@dataclass(frozen=True)
class MemoryTable:
    """What each device holds during a step under one ZeRO stage and recomputation, by part
    and by segment (``ir/recompute.segments``), for any count of segments recomputed: a
    weight, constant or input goes with the segment of its first reader (so a graph of
    repeated blocks adds up block by block, :meth:`repeated`), an activation with its own.

    The bytes of a device are those of its busiest moment, of two kinds: the end of forward
    (every segment's bytes, with the values in flight), and backward running a segment (the
    activations of the segments after it freed, the gradients in flight, and the segment's
    workspace where it is recomputed, or ZeRO-3's gathers where it is not).

    Arrays are ``[segment, part, device]`` bytes (parts: :data:`MEMORY_PARTS`)."""

    fixed: np.ndarray       # [part, device]: what no segment reads
    kept: np.ndarray        # a segment's bytes while it is not recomputed
    again: np.ndarray       # while it is, but its workspace
    workspace: np.ndarray   # [segment, device]: alive while it is recomputed
    joint: tuple[tuple[int, int, np.ndarray], ...] = ()
    """ZeRO-3's gathered copies that readers in several segments keep, all of them recomputed:
    (first, last segment, bytes per device), held unless every such segment recomputes."""
    transient: np.ndarray | None = None
    """[device]: ZeRO-3's gathers in flight while a pass runs (the one it reads, the next
    prefetched); a recompute's are in its workspace."""
    ahead: np.ndarray | None = None
    """[device]: the most bytes of values forward has made and not yet freed that no context keeps."""
    behind: np.ndarray | None = None
    """[segment, device]: the most bytes of gradients made and not yet used while backward
    runs the segment (and the unsynced weights' gradients made by then)."""
    scratch: Scratch | None = None
    beside: bool = False
    """Whether ZeRO-3's gathers are in flight beside a recompute's workspace (selective: the
    products it keeps read their weights again in backward), or in it (full)."""

    @property
    def held(self) -> np.ndarray:
        """[part, device]: what no segment holds, the optimizer's scratch with it."""
        if self.scratch is None:
            return self.fixed
        out = self.fixed.copy()
        out[PART["optimizer"]] += self.scratch.bytes()
        return out

    def _start(self, per: np.ndarray, limit: int) -> np.ndarray:
        """``[part, device]``: every segment's bytes (``per``), and what is held beside them
        throughout: what no segment reads, and ZeRO-3's copies held across segments."""
        start = self.held + per.sum(axis=0)
        for _, last, held in self.joint:
            if limit <= last:
                start[PART["weights"]] += held
        return start

    def at(self, limit: int = 0) -> dict[str, np.ndarray]:
        """The bytes per device by part at its busiest moment (the class docstring) when the
        first ``limit`` segments recompute (0: all)."""
        n = len(self.kept)
        limit = limit or n
        per = np.where((np.arange(n) < limit)[:, None, None], self.again, self.kept)
        start = self._start(per, limit)
        transient = self.transient if self.transient is not None else 0
        best = start.copy()
        best[PART["communication buffers"]] += transient
        if self.ahead is not None:
            best[PART["activations"]] += self.ahead
        act = PART["activations"]
        later = np.concatenate([np.cumsum(per[::-1, act], axis=0)[::-1][1:], np.zeros_like(per[:1, act])])
        for s in range(n):
            moment = start.copy()
            moment[act] -= later[s]
            if self.behind is not None:
                moment[PART["gradients"]] += self.behind[s]
            ws = self.workspace[s] if s < limit else 0      # a recompute's gathers are in it, or
            both = self.beside and s < limit
            moment[PART["recompute workspace"]] += np.where(both | (ws >= transient), ws, 0)
            moment[PART["communication buffers"]] += np.where(both | (ws < transient), transient, 0)
            busier = moment.sum(axis=0) > best.sum(axis=0)
            best[:, busier] = moment[:, busier]
        return {p: best[k] for k, p in enumerate(MEMORY_PARTS)}

    def totals(self) -> np.ndarray:
        """``[limit, device]``: :meth:`at`'s sum when the first ``limit`` segments recompute,
        for every limit from 0 (all) to the count of segments."""
        n = len(self.kept)
        fixed = self.held.sum(axis=0)
        transient = self.transient if self.transient is not None else np.zeros_like(fixed)
        ahead = self.ahead if self.ahead is not None else np.zeros_like(fixed)
        if not n:
            return (fixed + transient + ahead)[None, :]
        behind = self.behind if self.behind is not None else np.zeros_like(self.workspace)
        act = PART["activations"]
        again, kept = np.cumsum(self.again.sum(axis=1), axis=0), np.cumsum(self.kept.sum(axis=1), axis=0)
        again_act, kept_act = np.cumsum(self.again[:, act], axis=0), np.cumsum(self.kept[:, act], axis=0)
        # row L-1 is ``limit`` L: the segments before L recomputed
        base = fixed + again + (kept[-1] - kept)
        for _, last, held in self.joint:
            base[:last] += held
        # backward running segment s < L (recomputed): the activations after it, (again_act[L-1]
        # - again_act[s]) + (kept_act[-1] - kept_act[L-1]), freed
        recomputing = base - again_act - (kept_act[-1] - kept_act) + \
            np.maximum.accumulate(again_act + behind + (self.workspace + transient if self.beside else
                                                        np.maximum(self.workspace, transient)), axis=0)
        # running segment s >= L (kept): kept_act[-1] - kept_act[s] freed
        tail = np.maximum.accumulate((kept_act + behind)[::-1], axis=0)[::-1]      # its best s >= L-1 ...
        keeping = np.full_like(base, np.iinfo(np.int64).min // 2)
        keeping[:-1] = base[:-1] - kept_act[-1] + transient + tail[1:]              # ... at s >= L
        out = np.empty((n + 1, fixed.shape[0]), dtype=np.int64)
        out[1:] = np.maximum(np.maximum(base + transient + ahead, recomputing), keeping)
        out[0] = out[n]
        return out

    def repeated(self, start: int, period: int, times: int) -> MemoryTable:
        """The table with the ``period`` segments before segment ``start`` (a block) repeated
        ``times`` more times after it: a graph with as many more blocks, each like it."""
        if times <= 0:
            return self
        block = slice(start - period, start)

        def grown(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a[:start], *[a[block]] * times, a[start:]])

        joint: list[tuple[int, int, np.ndarray]] = []
        for first, last, held in self.joint:
            if last < start - period:
                joint.append((first, last, held))
            elif first >= start - period and last < start:     # the block's own
                joint.extend((first + k * period, last + k * period, held) for k in range(times + 1))
            else:
                joint.append((first, last + times * period, held))
        scratch = self.scratch if self.scratch is None else replace(self.scratch, flat=grown(self.scratch.flat))
        return MemoryTable(self.fixed, grown(self.kept), grown(self.again), grown(self.workspace), tuple(joint),
                           self.transient, self.ahead, None if self.behind is None else grown(self.behind), scratch,
                           self.beside)


def memory_table(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                 cluster: ClusterSpec, config: CostConfig, segs: Sequence[Sequence[int]] | None = None,
                 grads: frozenset | None = None) -> MemoryTable:
    """Every byte a device holds (:class:`MemoryTable`, and :func:`memory_account`): each
    trainable weight's stored pieces with their gradients and optimizer state
    (``ir/training.py``: :class:`~unity_cli.ir.training.WeightBytes`, the optimizer part
    sharded over the replicas under ZeRO), constants and inputs, and every activation one
    micro-batch keeps for the backward pass (with what a kernel keeps beyond its outputs).

    Under recomputation (``ir/recompute.py``) a recomputed node keeps nothing through
    forward but the outputs that something else keeps: a reader that is not recomputed
    with it (its context), or a later segment (its input, kept for its recompute). While
    backward recomputes a segment, its nodes' outputs and contexts are alive again: the
    largest segment's is the workspace. ``segs`` and ``grads``: the graph's segments and the
    tensors whose gradient flows, where already made."""
    facts = _facts(pcg, layout)
    stored, saved, keeps, synced, scaled = facts.stored, facts.saved, facts.keeps, facts.synced, facts.scaled
    num_devices = cluster.num_devices
    per_param, stages = config.weight_bytes, config.training.stages(pcg)
    segs = segments(pcg, layout) if segs is None else segs
    grads = needs_grad(pcg, pcg.outputs[0]) if grads is None else grads
    again_sets = recomputed(pcg, layout, grads, config.training.recompute, 0, segs)
    seg_of = {i: s for s, seg in enumerate(segs) for i in seg}
    again_of = {i: s for s, seg in enumerate(again_sets) for i in seg}
    home: dict[int, int] = {}       # a source's or layout's first reader's segment
    for i in range(len(pcg) - 1, -1, -1):
        at = [seg_of[u] if u in seg_of else home[u] for u, _ in pcg.consumers[i] if u in seg_of or u in home]
        if at and i not in seg_of:
            home[i] = min(at)
    cols = _Columns(num_devices)
    sums = _Sums(len(segs), num_devices)       # fixed, kept, again, workspace: bytes per column of devices
    fixed, kept, again, workspace = sums.fixed, sums.kept, sums.again, sums.workspace
    joint = []
    first = np.zeros(num_devices, dtype=np.int64)      # ZeRO-3: the largest gathered copy alive
    second = np.zeros(num_devices, dtype=np.int64)     # for one pass, and the next largest
    first_gather: dict[int, tuple[int, tuple[np.ndarray, int]]] = {}   # a segment's first recomputed gather
    largest = np.zeros(num_devices, dtype=np.int64)                    # the largest update's elements
    flat = np.zeros((len(segs) + 1, num_devices), dtype=np.int64)      # ZeRO-1's flat shards: what no
    # segment reads, then per segment

    def both(s: int | None, part: str, c: int, nbytes: int) -> None:
        if s is None:
            sums.add(fixed, (PART[part],), c, nbytes)
        else:
            sums.add(kept, (s, PART[part]), c, nbytes)
            sums.add(again, (s, PART[part]), c, nbytes)

    outputs = set(pcg.outputs)
    own: dict[int, list[tuple[int, int, int]]] = {}   # a node's kept bytes, the node freeing them and
    # their column of devices, where its segment keeps them whether it recomputes or not
    everywhere = cols.of(np.arange(num_devices))
    for i, n in pcg:
        if n.spec.is_source and not (isinstance(n.op, WeightAttrs) and n.op.trainable):
            # every rank holds an input (a micro-batch's) or constant whole, and cuts views of it
            both(home.get(i), "inputs and constants", everywhere,
                 math.prod(n.outputs[0].sizes) * n.outputs[0].dtype.itemsize)
            continue
        if not stored[i]:
            continue
        shape = n.outputs[0]
        src = layout[i]
        c = cols.of_devices(devs[i])
        if src is not None and isinstance(pcg.nodes[src].op, WeightAttrs) and pcg.nodes[src].op.trainable:
            at, zero = cols.array(c), stages[src]
            for part, nbytes in per_param.breakdown(shape.piece.numel, shape.copy_degree, zero).items():
                if synced[src] or part != "gradients":      # an unsynced one's: made by backward
                    both(home.get(i), part, c, nbytes)
            if config.training.micro_batches > 1 and not synced[src]:   # accumulated beside backward's
                both(home.get(i), "gradients", c, per_param.grad * shape.piece.numel)
            # the optimizer's scratch: one update at a time, a flat shard of a group's (ZeRO-1) or a weight's
            if zero == 1 and shape.copy_degree > 1:
                flat_at = flat[home[i] + 1] if i in home else flat[0]
                np.add.at(flat_at, at, shard_elements(shape.piece.numel, shape.copy_degree))
            else:
                np.maximum.at(largest, at, shard_elements(shape.piece.numel, shape.copy_degree if zero else 1))
            if zero >= 3 and shape.copy_degree > 1:
                # ZeRO-3's gathered copy: alive while a pass of its readers runs (forward, the
                # backward of those not recomputed, a recompute: ir/recompute.weight_passes),
                # one at a time with the next in flight, or through backward where that pass
                # spans segments (a weight read in several); a recompute's is its workspace
                gathered = per_param.weight * shard_elements(shape.piece.numel, shape.copy_degree) * shape.copy_degree
                readers = [u for u, _ in pcg.consumers[i] if layout[u] is None]
                where = sorted({seg_of[u] for u in readers})
                if len({seg_of[u] for u in readers if u not in again_of}) > 1:
                    both(home.get(i), "weights", c, gathered)
                elif len(where) == 1:
                    np.maximum.at(second, at, np.minimum(first[at], gathered))
                    np.maximum.at(first, at, gathered)
                elif where:
                    held = np.zeros(num_devices, dtype=np.int64)
                    np.add.at(held, at, gathered)
                    joint.append((where[0], where[-1], held))
                for s in where:
                    again_in = [u for u in readers if again_of.get(u) == s]
                    if again_in:
                        sums.add(workspace, (s,), c, gathered)
                        if min(again_in) < first_gather.get(s, (len(pcg), None))[0]:
                            first_gather[s] = (min(again_in), (c, gathered))
            continue
        if src is not None:
            if scaled[i]:       # a piece of an input or constant that is no view of it: a copy
                both(home.get(i), "inputs and constants", c, shape.piece.numel * shape.dtype.itemsize)
            continue
        each = [_bytes(o.piece, config) for o in n.outputs]

        def of(js: Iterable[int], each: list[int] = each) -> int:
            return sum(each[j] for j in js)

        out = sum(each)
        extra = saved[i].extra_bytes(config.dtype.itemsize) if saved[i] is not None else 0
        final = {r.index for r in outputs if r.node == i}          # the loss's input: held to the end
        if final:
            sums.add(fixed, (PART["activations"],), c, of(final))
        mine = keeps.get(i, {})
        held = of(mine.keys() - final)
        s = seg_of[i]
        # an input its kernel keeps that another device made: the buffer it was received in
        received = []
        for k in saved[i].inputs if saved[i] is not None else ():
            r = n.inputs[k]
            if layout[r.node] is None and (away := sorted(set(devs[i]) - set(devs[r.node]))):
                received.append((cols.of(device_array(tuple(away))), _bytes(pcg.shape(r).piece, config)))
        # What a recompute reads of another segment, or of an operator not recomputed, is kept
        # until the micro-batch's backward is done (``runtime/program.StepOrder.kept``): so it
        # is not freed with its segment, the account holds it under the recompute workspace.
        redo, act = (s, PART["recompute workspace"]), (s, PART["activations"])
        if i not in again_of:
            reread = {pcg.nodes[u].inputs[k].index for u, k in pcg.consumers[i] if u in again_of} - final
            sums.add(kept, act, c, held + extra)
            sums.add(again, act, c, of(mine.keys() - final - reread) + extra)
            if reread:
                sums.add(again, redo, c, of(reread))
            own[i] = [(extra, i, c)] + [(each[j], free, c) for j, free in mine.items()
                                        if j not in final and j not in reread]
            for away, nbytes in received:
                sums.add(kept, act, away, nbytes)
                sums.add(again, act, away, nbytes)
                own[i].append((nbytes, i, away))
            continue
        sums.add(kept, act, c, held + extra)
        for away, nbytes in received:
            sums.add(kept, act, away, nbytes)
            sums.add(workspace, (s,), away, nbytes)
        if any(again_of.get(u) != s for u, _ in pcg.consumers[i]):
            sums.add(again, redo, c, out)
            sums.add(workspace, (s,), c, extra)
        else:
            sums.add(workspace, (s,), c, out + extra)
    # While a segment is recomputed, the gather that the next one recomputed (the one before
    # it) needs first is in flight (``ir/recompute.gathers``): its buffer, beside the workspace.
    order = sorted(first_gather)
    for prev, s in zip(order, order[1:]):
        c, gathered = first_gather[prev][1]
        sums.add(workspace, (s,), c, gathered)
    sums.spread(cols)
    fixed[PART["inputs and constants"]] += target_bytes(pcg, config)
    ahead, behind = _in_flight(pcg, devs, layout, stored, keeps, own, grads, synced, segs, cols, config, stages)
    return MemoryTable(fixed, kept, again, workspace, tuple(joint), first + second if stages.most >= 3 else None,
                       ahead, behind, Scratch(largest, flat[0], flat[1:], update_chunks(cluster)),
                       config.training.recompute is Recompute.SELECTIVE)


def target_bytes(pcg: PCG, config: CostConfig) -> int:
    """A micro-batch's targets, whole (every rank holds them): class ids where the loss is
    cross entropy (as ``unity run`` chooses it from the plan's ``--loss``), else the output's shape."""
    kind = planned_loss(pcg, config.loss)
    return math.prod(label_shape(kind, pcg.shape(pcg.outputs[0]).sizes)) * label_dtype(kind).itemsize


def update_chunks(cluster: ClusterSpec) -> np.ndarray:
    """Per device, the elements the optimizer updates at a time (``runtime/optim.py``): its
    scratch buffer holds at most as many."""
    return np.array([GPU_CHUNK if cluster.device_type(d).kind is DeviceKind.GPU else CPU_CHUNK
                     for d in range(cluster.num_devices)], dtype=np.int64)


def step_bytes(pcg: PCG, cluster: ClusterSpec, config: CostConfig) -> float:
    """What a device holds whatever the parallelization (as ``cost/memory.py`` counts it):
    the graph's inputs and constants whole, a micro-batch's targets, and at most the
    optimizer's scratch of its largest update (a whole weight, or under ZeRO all of them).
    Not the values and gradients in flight, which depend on the option: the pricing of the
    realized graph counts them (a bound with every tensor whole, tried, took 2 GB of room
    from BERT-large's search on 16 GB devices and made it 7x slower)."""
    sources = sum(math.prod(n.outputs[0].sizes) * n.outputs[0].dtype.itemsize for _, n in pcg
                  if n.spec.is_source and not (isinstance(n.op, WeightAttrs) and n.op.trainable))
    sizes = [math.prod(n.outputs[0].sizes) for _, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable]
    update = (max(sizes, default=0) if not config.training.sharded else sum(sizes))    # a weight, or a flat shard
    return float(sources + target_bytes(pcg, config) + 4 * min(update, int(update_chunks(cluster).max())))


def outputs_held(pcg: PCG, devs: Sequence[tuple[int, ...]], nodes: Iterable[int], config: CostConfig,
                 num_devices: int) -> np.ndarray:
    """Per device, the bytes of ``nodes``' output pieces (floats at the planner's dtype): what
    the solver's additive account holds for a resharding's buffers, all of them at once."""
    out = np.zeros(num_devices, dtype=np.int64)
    for i in nodes:
        for o in pcg.nodes[i].outputs:
            np.add.at(out, device_array(devs[i]), _bytes(o.piece, config))
    return out


def _trainable(pcg: PCG, layout: Sequence[int | None], i: int) -> bool:
    """Whether node ``i`` is a layout of a trainable weight."""
    src = layout[i]
    return src is not None and isinstance(op := pcg.nodes[src].op, WeightAttrs) and op.trainable


def _synced(pcg: PCG, layout: Sequence[int | None], stored: Sequence[bool]) -> dict[int, bool]:
    """Per trainable weight (its node), whether replicas keep some region of it, so that its
    gradient is summed in the sync's buffers; an unsynced weight's gradient is made by backward."""
    out: dict[int, bool] = {}
    for i, n in pcg:
        if stored[i] and _trainable(pcg, layout, i):
            out[layout[i]] = out.get(layout[i], False) or n.outputs[0].copy_degree > 1
    return out


def _in_flight(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None], stored: Sequence[bool],
               keeps: dict[int, dict[int, int]], own: dict[int, list[tuple[int, int, int]]], grads: frozenset,
               synced: dict[int, bool], segs: Sequence[Sequence[int]], cols: _Columns, config: CostConfig,
               stages: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray | None]:
    """What the account's parts, each a sum over the step, leave out: ``[device]``, the most
    bytes alive at one step of forward of the values no context keeps (from their node to
    their last reader; a recomputed segment's forward holds no more than its recompute, the
    workspace), less the contexts forward has not made yet, and ``[segment, device]``, the
    most bytes alive at one step of backward through each segment of the gradients made and
    not yet used: an activation's from the backward of its last reader to its node's, an
    unsynced weight's from its last reader's to the update, and under ZeRO-2/3 a replicated
    weight's from its last reader's to its first's, where it is reduce-scattered out of a
    flat buffer of its size (``ir/buckets.py``; ``stages``: each weight's ZeRO stage).
    Backward frees an operator's context (``own``) as it runs it, so a segment's count is
    of the gradients less the contexts of its operators already run then. Without segments,
    the forward's and backward's most together as the first."""
    n = len(pcg)
    changes: list[tuple[int, int, int, int]] = []      # (row, position, column, bytes): rows are
    # forward's values, backward's gradients, the contexts backward has freed, those forward has not made
    grad_bytes = config.weight_bytes.grad
    until = _until(pcg, layout)

    def alive(k: int, lo: int, hi: int, c: int, nbytes: int) -> None:
        changes.extend(((k, lo, c, nbytes), (k, hi + 1, c, -nbytes)))

    for i, node in pcg:
        readers = [u for u, _ in pcg.consumers[i]]
        last = max(readers, default=i)
        at = cols.of_devices(devs[i])
        if layout[i] is not None:
            shape = node.outputs[0]
            if not (stored[i] and readers and _trainable(pcg, layout, i)):
                continue
            if not synced[layout[i]]:
                alive(1, 0, last, at, grad_bytes * shape.piece.numel)
            elif stages[layout[i]] >= 2 and shape.copy_degree > 1:
                first = min(readers)
                alive(1, first, last, at, grad_bytes * shape.piece.numel)
                alive(1, first, first, at,
                      grad_bytes * shard_elements(shape.piece.numel, shape.copy_degree) * shape.copy_degree)
            continue
        for j, o in enumerate(node.outputs):
            nbytes = _bytes(o.piece, config)
            if stored[i] and j not in keeps.get(i, ()):
                alive(0, i, last, at, nbytes)
            if TensorRef(i, j) in grads and not node.spec.is_parallel_op:   # made by the backward of its
                # last reader (or the loss), used by its node's
                if TensorRef(i, j) in pcg.outputs:
                    alive(1, i, n, at, nbytes)
                else:
                    alive(1, i + 1, max(until[i], i), at, nbytes)
    starts = [0] + [min(seg) for seg in segs[1:]]
    first = np.searchsorted(starts, np.arange(n), side="right") - 1     # each position's segment's start
    for i, entries in own.items():
        for nbytes, free, at in entries:
            if free >= starts[first[i]]:
                alive(2, starts[first[i]], free, at, nbytes)
            alive(3, 0, i - 1, at, nbytes)
    # per column (the distinct device arrays), then per class of devices alike in every column
    delta = np.zeros((4, n + 2, max(len(cols.rows), 1)), dtype=np.int64)
    if changes:
        k, pos, c, v = (np.array(x, dtype=np.int64) for x in zip(*changes))
        np.add.at(delta, (k, pos, c), v)
    counts, cls = cols.classes()
    held = np.cumsum(delta, axis=1) @ counts                # [row, position, class]
    ahead = np.maximum((held[0] - held[3]).max(axis=0), 0)[cls]
    if not segs:
        return np.maximum(ahead, held[1].max(axis=0)[cls]), None
    # a segment's backward starts with what the one after it left (before a recompute of it)
    entry = held[1][starts[1:] + [n]]
    return ahead, np.maximum(np.maximum.reduceat(held[1] - held[2], starts, axis=0), entry)[:, cls]


@dataclass(frozen=True)
class _Facts:
    """What the account reads of a graph under one layout, whatever the step's shape."""

    stored: list[bool]              # a buffer of its own (a view, a Reshape, counted as the ledger does)
    saved: list[Saved | None]       # what each kernel keeps (``OpSpec.saved``)
    keeps: dict[int, dict[int, int]]
    synced: dict[int, bool]
    scaled: list[bool]              # a layout of a source that a Reduction of replicas scales


def _facts(pcg: PCG, layout: Sequence[int | None]) -> _Facts:
    """:class:`_Facts`, kept with the graph (it is immutable) per layout."""
    memo = pcg.__dict__.setdefault("_memory_facts", {})
    key = tuple(layout)
    if key not in memo:
        stored = [held or layout[i] is None for i, held in enumerate(stored_nodes(pcg, layout))]
        saved = [n.spec.saved(n.op, [pcg.shape(r).piece for r in n.inputs], [o.piece for o in n.outputs])
                 if layout[i] is None and not n.spec.is_parallel_op else None for i, n in pcg]
        scaled = [False] * len(pcg)
        for i, n in pcg:
            if layout[i] is not None and i != layout[i]:
                scaled[i] = n.kind == OpKind.Reduction or scaled[n.inputs[0].node]
        memo[key] = _Facts(stored, saved, _kept_outputs(pcg, stored, saved), _synced(pcg, layout, stored), scaled)
    return memo[key]


def _until(pcg: PCG, layout: Sequence[int | None]) -> list[int]:
    """Per node, the last node whose backward reads its gradient: a parallel op's readers read
    its source's (a region of it, or what the op's backward sends), so the source's is alive
    until the last of them has run backward. Kept with the graph, per layout."""
    memo = pcg.__dict__.setdefault("_until", {})
    key = tuple(layout)
    if key not in memo:
        until = list(range(len(pcg)))
        for i in range(len(pcg) - 1, -1, -1):
            for u, _ in pcg.consumers[i]:
                until[i] = max(until[i], until[u] if pcg.nodes[u].spec.is_parallel_op and layout[u] is None else u)
        memo[key] = until
    return memo[key]


class _Columns:
    """Device index arrays as columns, each distinct one once: per-device sums over a step's
    positions are made per column, then per class of devices that every column counts alike
    (a few, where a cluster has hundreds of devices)."""

    def __init__(self, num_devices: int):
        self.num_devices = num_devices
        self.index: dict[bytes, int] = {}
        self.rows: list[np.ndarray] = []      # per column, how often it names each device
        self.arrays: list[np.ndarray] = []
        self.by_id: dict[int, tuple[tuple[int, ...], int]] = {}

    def of_devices(self, devices: tuple[int, ...]) -> int:
        key = id(devices)
        if key not in self.by_id:
            self.by_id[key] = (devices, self.of(device_array(devices)))   # (kept alive: ids stay unique)
        return self.by_id[key][1]

    def of(self, at: np.ndarray) -> int:
        key = at.tobytes()
        if key not in self.index:
            self.index[key] = len(self.rows)
            self.rows.append(np.bincount(at, minlength=self.num_devices))
            self.arrays.append(at)
        return self.index[key]

    def array(self, c: int) -> np.ndarray:
        """Column ``c``'s devices, as an index array."""
        return self.arrays[c]

    def classes(self) -> tuple[np.ndarray, np.ndarray]:
        """``[column, class]`` counts and each device's class."""
        if not self.rows:
            return np.zeros((1, 1), dtype=np.int64), np.zeros(self.num_devices, dtype=np.intp)
        unique, cls = np.unique(np.stack(self.rows), axis=1, return_inverse=True)
        return unique.astype(np.int64), cls.reshape(-1)


class _Sums:
    """:class:`MemoryTable`'s arrays by part (``fixed``, ``kept``, ``again``, ``workspace``),
    added to per column of devices (:class:`_Columns`) at Python's speed, then spread onto
    the devices once: a graph has thousands of nodes, laid out on a few columns."""

    def __init__(self, segments: int, num_devices: int):
        self.fixed = np.zeros((len(MEMORY_PARTS), num_devices), dtype=np.int64)
        self.kept = np.zeros((segments, len(MEMORY_PARTS), num_devices), dtype=np.int64)
        self.again = np.zeros_like(self.kept)
        self.workspace = np.zeros((segments, num_devices), dtype=np.int64)
        self._arrays = {id(a): a for a in (self.fixed, self.kept, self.again, self.workspace)}
        self._added: dict[tuple[int, tuple[int, ...], int], int] = defaultdict(int)

    def add(self, array: np.ndarray, index: tuple[int, ...], column: int, nbytes: int) -> None:
        """``nbytes`` more on each device of ``column`` at ``array[index]``."""
        self._added[id(array), index, column] += nbytes

    def spread(self, cols: _Columns) -> None:
        for (a, index, c), nbytes in self._added.items():
            self._arrays[a][index] += nbytes * cols.rows[c]
        self._added.clear()


def _bytes(t: TensorShape, config: CostConfig) -> int:
    """A tensor's bytes, floats at the planner's activation dtype."""
    return t.numel * (config.dtype.itemsize if t.dtype.is_float else t.dtype.itemsize)


def _kept_outputs(pcg: PCG, stored: Sequence[bool], saved: Sequence[Saved | None]) -> dict[int, dict[int, int]]:
    """Per node, the outputs some context keeps for backward, each with the node whose
    backward frees it (the first in the graph of those keeping it: backward runs them last to
    first): those its own kernel keeps, those its readers' kernels keep of their inputs
    (``OpSpec.saved``; a view's, a Reshape's stored nowhere of its own, are its source's), and
    the graph's outputs, which the loss reads (freed by none: -1). The others are freed after
    their last reader."""
    out: dict[int, dict[int, int]] = {}
    for i, n in pcg:
        if saved[i] is None:
            continue
        refs = [TensorRef(i, j) for j in saved[i].outputs] + [n.inputs[k] for k in saved[i].inputs]
        for r in refs:
            while not stored[r.node] and pcg.nodes[r.node].inputs:
                r = pcg.nodes[r.node].inputs[0]
            kept = out.setdefault(r.node, {})
            kept[r.index] = min(kept.get(r.index, i), i)
    for r in pcg.outputs:
        out.setdefault(r.node, {})[r.index] = -1
    return out


def memory_account(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                   cluster: ClusterSpec, config: CostConfig) -> dict[str, np.ndarray]:
    """Every byte a device holds, by part (:data:`MEMORY_PARTS`), under ``config``'s step
    shape: :func:`memory_table` at its count of segments recomputed."""
    return memory_table(pcg, devs, layout, cluster, config).at(config.training.recompute_segments)


def memory_per_device(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                      cluster: ClusterSpec, config: CostConfig) -> list[int]:
    """Bytes per device: the sum of :func:`memory_account`'s parts."""
    return sum(memory_account(pcg, devs, layout, cluster, config).values()).tolist()
