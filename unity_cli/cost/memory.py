"""What a device holds during a training step, by part: one account that the final pricing
(``cost/model.estimate``), the solver's checks and the report read."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ir.ops.shape_ops import ReshapeAttrs
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import PCG
from ..ir.recompute import recomputed, segments
from ..ir.schedule import needs_grad, stored_layout
from .moves import device_array

if TYPE_CHECKING:
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
class MemoryTable:
    """What each device holds during a step under one ZeRO stage and recomputation, by part
    and by segment (``ir/recompute.segments``), for any count of segments recomputed: a
    weight, constant or input goes with the segment of its first reader (so a graph of
    repeated blocks adds up block by block, :meth:`repeated`), an activation with its own.

    Arrays are ``[segment, part, device]`` bytes (parts: :data:`MEMORY_PARTS`)."""

    fixed: np.ndarray       # [part, device]: what no segment reads
    kept: np.ndarray        # a segment's bytes while it is not recomputed
    again: np.ndarray       # while it is, but its workspace
    workspace: np.ndarray   # [segment, device]: alive while it is recomputed
    joint: tuple[tuple[int, int, np.ndarray], ...] = ()
    """ZeRO-3's gathered copies that readers in several segments keep, all of them recomputed:
    (first, last segment, bytes per device), held unless every such segment recomputes."""
    transient: np.ndarray | None = None
    """[device]: ZeRO-3's gathers alive at the start of backward (the pass reading one, the
    next in flight), when no recompute workspace is: the larger of the two counts."""

    def _moment(self, ws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The workspace and the gathers in flight of the busiest moment of backward."""
        if self.transient is None:
            return ws, np.zeros_like(ws)
        first = ws >= self.transient
        return np.where(first, ws, 0), np.where(first, 0, self.transient)

    def at(self, limit: int = 0) -> dict[str, np.ndarray]:
        """The bytes per device by part when the first ``limit`` segments recompute (0: all)."""
        n = len(self.kept)
        active = np.arange(n) < (limit or n)
        total = self.fixed + np.where(active[:, None, None], self.again, self.kept).sum(axis=0)
        ws, flight = self._moment(self.workspace[active].max(axis=0) if active.any()
                                  else np.zeros(self.fixed.shape[1], dtype=np.int64))
        total[PART["recompute workspace"]] += ws
        total[PART["communication buffers"]] += flight
        for _, last, held in self.joint:
            if limit and limit <= last:
                total[PART["weights"]] += held
        return {p: total[k] for k, p in enumerate(MEMORY_PARTS)}

    def totals(self) -> np.ndarray:
        """``[limit, device]``: the bytes per device when the first ``limit`` segments
        recompute, for every limit from 0 (all) to the count of segments."""
        n = len(self.kept)
        fixed = self.fixed.sum(axis=0)
        if not n:
            return (fixed + sum(self._moment(np.zeros_like(fixed))))[None, :]
        again, kept = np.cumsum(self.again.sum(axis=1), axis=0), np.cumsum(self.kept.sum(axis=1), axis=0)
        ws = np.maximum.accumulate(self.workspace, axis=0)
        if self.transient is not None:
            ws = np.maximum(ws, self.transient)
        out = np.empty((n + 1, fixed.shape[0]), dtype=np.int64)
        out[1:] = fixed + again + (kept[-1] - kept) + ws
        for _, last, held in self.joint:
            out[1:last + 1] += held
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
        return MemoryTable(self.fixed, grown(self.kept), grown(self.again), grown(self.workspace), tuple(joint),
                           self.transient)


def memory_table(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                 num_devices: int, config: CostConfig, segs: Sequence[Sequence[int]] | None = None,
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
    stored = stored_nodes(pcg, layout)
    per_param, zero = config.weight_bytes, config.training.zero
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
    fixed = np.zeros((len(MEMORY_PARTS), num_devices), dtype=np.int64)
    kept = np.zeros((len(segs), len(MEMORY_PARTS), num_devices), dtype=np.int64)
    again = np.zeros_like(kept)
    workspace = np.zeros((len(segs), num_devices), dtype=np.int64)
    joint = []
    first = np.zeros(num_devices, dtype=np.int64)      # ZeRO-3: the largest gathered copy alive
    second = np.zeros(num_devices, dtype=np.int64)     # for one pass, and the next largest
    first_gather: dict[int, tuple[int, tuple[np.ndarray, int]]] = {}   # a segment's first recomputed gather

    def both(s: int | None, part: str, at: np.ndarray, nbytes) -> None:
        if s is None:
            np.add.at(fixed[PART[part]], at, nbytes)
        else:
            np.add.at(kept[s, PART[part]], at, nbytes)
            np.add.at(again[s, PART[part]], at, nbytes)

    for i, n in pcg:
        if not stored[i]:
            continue
        shape = n.outputs[0]
        src = layout[i]
        at = device_array(devs[i])
        if src is not None and isinstance(pcg.nodes[src].op, WeightAttrs) and pcg.nodes[src].op.trainable:
            for part, nbytes in per_param.breakdown(shape.piece.numel, shape.copy_degree, zero).items():
                both(home.get(i), part, at, nbytes)
            if zero >= 3 and shape.copy_degree > 1:
                # ZeRO-3's gathered copy: alive while a pass of its readers runs (forward, the
                # backward of those not recomputed, a recompute: ir/recompute.weight_passes),
                # one at a time with the next in flight, or through backward where that pass
                # spans segments (a weight read in several); a recompute's is its workspace
                gathered = per_param.weight * shape.piece.numel
                readers = [u for u, _ in pcg.consumers[i] if layout[u] is None]
                where = sorted({seg_of[u] for u in readers})
                if len({seg_of[u] for u in readers if u not in again_of}) > 1:
                    both(home.get(i), "weights", at, gathered)
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
                        np.add.at(workspace[s], at, gathered)
                        if min(again_in) < first_gather.get(s, (len(pcg), None))[0]:
                            first_gather[s] = (min(again_in), (at, gathered))
            continue
        out = sum(o.piece.numel * (config.dtype.itemsize if o.dtype.is_float and
                                   not isinstance(pcg.nodes[src].op if src is not None else None, WeightAttrs)
                                   else o.dtype.itemsize) for o in n.outputs)
        extra = n.spec.saved(n.op, [pcg.shape(r).piece for r in n.inputs],
                             [o.piece for o in n.outputs]).extra_bytes(config.dtype.itemsize)
        if src is not None:
            both(home.get(i), "inputs and constants", at, out + extra)
            continue
        s = seg_of[i]
        if i not in again_of:
            both(s, "activations", at, out + extra)
            continue
        np.add.at(kept[s, PART["activations"]], at, out + extra)
        if any(again_of.get(u) != s for u, _ in pcg.consumers[i]):
            np.add.at(again[s, PART["activations"]], at, out)
            np.add.at(workspace[s], at, extra)
        else:
            np.add.at(workspace[s], at, out + extra)
    # While a segment is recomputed, the gather that the next one recomputed (the one before
    # it) needs first is in flight (``ir/recompute.gathers``): its buffer, beside the workspace.
    order = sorted(first_gather)
    for prev, s in zip(order, order[1:]):
        at, gathered = first_gather[prev][1]
        np.add.at(workspace[s], at, gathered)
    return MemoryTable(fixed, kept, again, workspace, tuple(joint), first + second if zero >= 3 else None)


def memory_account(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                   num_devices: int, config: CostConfig) -> dict[str, np.ndarray]:
    """Every byte a device holds, by part (:data:`MEMORY_PARTS`), under ``config``'s step
    shape: :func:`memory_table` at its count of segments recomputed."""
    return memory_table(pcg, devs, layout, num_devices, config).at(config.training.recompute_segments)


def memory_per_device(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                      num_devices: int, config: CostConfig) -> list[int]:
    """Bytes per device: the sum of :func:`memory_account`'s parts."""
    return sum(memory_account(pcg, devs, layout, num_devices, config).values()).tolist()
