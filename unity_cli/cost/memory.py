"""What a device holds during a training step, by part: one account that the final pricing
(``cost/model.estimate``), the solver's checks and the report read."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..ir.ops.shape_ops import ReshapeAttrs
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import PCG
from ..ir.recompute import recomputed
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


def memory_account(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                   num_devices: int, config: CostConfig) -> dict[str, np.ndarray]:
    """Every byte a device holds, by part (:data:`MEMORY_PARTS`): each trainable weight's
    stored pieces with their gradients and optimizer state (``ir/training.py``:
    :class:`~unity_cli.ir.training.WeightBytes`, the optimizer part sharded over the
    replicas under ZeRO), constants and inputs, and every activation one micro-batch keeps
    for the backward pass (with what a kernel keeps beyond its outputs).

    Under recomputation (``ir/recompute.py``) a recomputed node keeps nothing through
    forward but the outputs that something else keeps: a reader that is not recomputed
    with it (its context), or a later segment (its input, kept for its recompute). While
    backward recomputes a segment, its nodes' outputs and contexts are alive again: the
    largest segment's is the workspace."""
    acc = {part: np.zeros(num_devices, dtype=np.int64) for part in MEMORY_PARTS}
    stored = stored_nodes(pcg, layout)
    per_param, zero = config.weight_bytes, config.training.zero
    grads = needs_grad(pcg, pcg.outputs[0])
    t = config.training
    segment = {i: s for s, seg in enumerate(recomputed(pcg, layout, grads, t.recompute, t.recompute_segments))
               for i in seg}
    workspace = np.zeros((max(segment.values(), default=-1) + 1, num_devices), dtype=np.int64)
    for i, n in pcg:
        if not stored[i]:
            continue
        shape = n.outputs[0]
        src = layout[i]
        at = device_array(devs[i])
        if src is not None and isinstance(pcg.nodes[src].op, WeightAttrs) and pcg.nodes[src].op.trainable:
            for part, nbytes in per_param.breakdown(shape.piece.numel, shape.copy_degree, zero).items():
                np.add.at(acc[part], at, nbytes)
            if zero >= 3 and shape.copy_degree > 1:
                # ZeRO-3's gathered copy: kept from forward to backward by a reader that is not
                # recomputed (its context), else alive while a recompute of its readers runs
                gathered = per_param.weight * shape.piece.numel
                readers = [u for u, _ in pcg.consumers[i] if layout[u] is None]
                if any(u not in segment for u in readers):
                    np.add.at(acc["weights"], at, gathered)
                for s in {segment[u] for u in readers if u in segment}:
                    np.add.at(workspace[s], at, gathered)
            continue
        out = sum(o.piece.numel * (config.dtype.itemsize if o.dtype.is_float and
                                   not isinstance(pcg.nodes[src].op if src is not None else None, WeightAttrs)
                                   else o.dtype.itemsize) for o in n.outputs)
        kept = n.spec.saved(n.op, [pcg.shape(r).piece for r in n.inputs],
                            [o.piece for o in n.outputs]).extra_bytes(config.dtype.itemsize)
        s = segment.get(i)
        if s is None:
            np.add.at(acc["inputs and constants" if src is not None else "activations"], at, out + kept)
            continue
        if any(segment.get(u) != s for u, _ in pcg.consumers[i]):
            np.add.at(acc["activations"], at, out)
            np.add.at(workspace[s], at, kept)
        else:
            np.add.at(workspace[s], at, out + kept)
    if len(workspace):
        acc["recompute workspace"] += workspace.max(axis=0)
    return acc


def memory_per_device(pcg: PCG, devs: Sequence[tuple[int, ...]], layout: Sequence[int | None],
                      num_devices: int, config: CostConfig) -> list[int]:
    """Bytes per device: the sum of :func:`memory_account`'s parts."""
    return sum(memory_account(pcg, devs, layout, num_devices, config).values()).tolist()
