"""Activation recomputation: which nodes a step runs forward twice, and when.

A training step keeps, for backward, what each operator's forward leaves in its context
(its inputs or outputs, ``kernels``). Recomputing trades that memory for a second forward:
the forward pass keeps no context for a recomputed node, and backward runs the node's
forward again, just before it needs the context (Chen et al., 2016; Megatron-LM's
``--recompute-granularity full``).

The graph is cut into **segments**: contiguous runs of the activation nodes (those with a
step of their own: not sources, not layouts of sources, ``ir/schedule.py``) in node order,
cut where the fewest activations are alive (:func:`segments`: in a transformer, at each
residual stream between half-blocks; in an MLP, between layers), each holding at least
one operator that reads a trainable weight. Under ``full`` recomputation every node of a
segment whose gradient flows is recomputed, except the graph's output (the loss reads it).
Under ``selective`` the operators that read a trainable weight (the products: linear layers,
convolutions, embeddings) are not recomputed: they keep their context, so the inputs they
read stay alive, and backward recomputes only the rest (norms, activations, elementwise
work, rotary embeddings, the attention score chain and its softmax), the memory-heavy and
cheap part (Korthikanti et al., 2022; Megatron-LM's ``--recompute-granularity selective``
recomputes the attention core the same way). In both modes
backward recomputes a segment's recomputed nodes, in order, right before the backward of
the last of them, and frees them when the segment's backward is done. What a segment reads from
outside it (its input: the residual stream) stays alive from forward until then.

That order of a micro-batch's work is one value, :class:`NodeOrder` (:func:`node_order`):
the cost model's simulation walks it over the graph's nodes, and the runtime's
``StepOrder`` is it over the program's steps, which the executor runs and from which the
bytes sent and the bytes held are predicted.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum

import numpy as np

from .ops.sources import WeightAttrs
from .pcg import PCG, TensorRef


class Recompute(StrEnum):
    """What a step recomputes (the module docstring)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


def parse_recompute(text: str) -> tuple[Recompute, int]:
    """``none``, ``selective`` or ``full``, optionally ``:K`` for the first K segments only
    (``full:40``); a ValueError saying what is expected otherwise."""
    mode, sep, count = text.strip().lower().partition(":")
    expected = f"expected one of {', '.join(Recompute)}, optionally :K (the first K segments, e.g. full:40)"
    if mode not in set(Recompute) or sep and (Recompute(mode) is Recompute.NONE or not count.isascii()
                                              or not count.isdigit() or not 0 < len(count) <= 9 or int(count) < 1):
        raise ValueError(expected)
    return Recompute(mode), int(count) if sep else 0


def activation_nodes(pcg: PCG, layout: Sequence[int | None]) -> list[int]:
    """The nodes with a step of their own, in node (topological) order."""
    return [i for i, n in pcg if not n.spec.is_source and layout[i] is None]


def reads_weight(pcg: PCG, i: int, layout: Sequence[int | None]) -> bool:
    """Whether node ``i`` reads a trainable weight (directly or through a layout of it)."""
    def src(r: TensorRef) -> int:
        s = layout[r.node]
        return r.node if s is None else s

    return any(isinstance(w := pcg.nodes[src(r)].op, WeightAttrs) and w.trainable for r in pcg.nodes[i].inputs)


def segments(pcg: PCG, layout: Sequence[int | None]) -> tuple[tuple[int, ...], ...]:
    """The activation nodes in contiguous segments (the module docstring).

    A cut may fall before activation node ``a`` where the activations made before ``a``
    and read from ``a`` on (or by the loss) are as few as anywhere between the first and
    the last operator that reads a trainable weight. Runs between cuts are then joined so
    that each segment but the first holds an operator that reads a weight, starting at it."""
    acts = activation_nodes(pcg, layout)
    if not acts:
        return ()
    at = {i: k for k, i in enumerate(acts)}
    outputs = {r.node for r in pcg.outputs}
    alive = np.zeros(len(acts) + 2, dtype=np.int64)   # alive[k]: activations crossing the cut before acts[k]
    for k, i in enumerate(acts):
        readers = [at[u] for u, _ in pcg.consumers[i] if u in at]
        last = len(acts) if i in outputs else max(readers, default=k)
        if last > k:
            alive[k + 1] += 1
            alive[last + 1] -= 1
    alive = np.cumsum(alive)
    weighted = [k for k, i in enumerate(acts) if reads_weight(pcg, i, layout)]
    if len(weighted) < 2:
        return (tuple(acts),)
    least = int(alive[weighted[0] + 1:weighted[-1] + 1].min())
    cuts = [k for k in range(weighted[0] + 1, weighted[-1] + 1) if alive[k] <= least]
    runs = [acts[a:b] for a, b in zip([0, *cuts], [*cuts, len(acts)], strict=True) if b > a]
    out: list[list[int]] = []
    has_weight = False
    for run in runs:
        heavy = any(reads_weight(pcg, i, layout) for i in run)
        if out and not (heavy and has_weight):
            out[-1].extend(run)
            has_weight = has_weight or heavy
        else:
            out.append(list(run))
            has_weight = heavy
    return tuple(tuple(s) for s in out)


def recomputed(pcg: PCG, layout: Sequence[int | None], grads: frozenset[TensorRef],
               mode: Recompute, limit: int = 0, segs: Sequence[Sequence[int]] | None = None
               ) -> tuple[tuple[int, ...], ...]:
    """Per segment (:func:`segments`, in order; ``segs``: already made), the nodes backward recomputes: under
    ``full`` those whose gradient flows, but the graph's outputs; under ``selective`` those
    of them that read no trainable weight; none under ``none``. With ``limit``, only the
    first ``limit`` segments recompute (Megatron-LM's ``--recompute-num-layers``): the step
    recomputes as much as it needs to fit, and no more."""
    if mode is Recompute.NONE:
        return ()
    outputs = {r.node for r in pcg.outputs}
    selective = mode is Recompute.SELECTIVE
    return tuple(tuple(i for i in seg if i not in outputs and
                       any(TensorRef(i, k) in grads for k in range(len(pcg.nodes[i].outputs))) and
                       not (selective and reads_weight(pcg, i, layout))) if not limit or s < limit else ()
                 for s, seg in enumerate(segments(pcg, layout) if segs is None else segs))


@dataclass(frozen=True, slots=True)
class Pass:
    """A pass of a micro-batch that reads a weight: under ZeRO-3 it gathers the weight before
    ``readers[0]`` and frees it after ``readers[-1]`` (:func:`weight_passes`)."""

    kind: Action                # FORWARD, RECOMPUTE (a segment's) or BACKWARD
    readers: tuple[int, ...]    # in the order the pass reaches them


def weight_passes(pcg: PCG, layout: Sequence[int | None], again: Sequence[Sequence[int]]
                  ) -> dict[int, tuple[Pass, ...]]:
    """Per trainable weight (its source node) that something reads, the passes of a
    micro-batch that read it: the forward pass (every activation node that reads one of its
    layouts, in order), the recompute of each segment of ``again`` (:func:`recomputed`) that
    holds a reader, and the backward pass of the readers that are not recomputed (in reverse
    order), whose contexts give the weight up after the forward pass, as FSDP's do. Under
    ZeRO-3 each pass gathers the weight before its first reader and frees it after its last
    (``ir/training.py``); a recomputed reader keeps the recompute's until its backward."""
    readers: dict[int, list[int]] = {}
    for i in activation_nodes(pcg, layout):
        for w in sorted({layout[r.node] for r in pcg.nodes[i].inputs if layout[r.node] is not None}):
            if isinstance(op := pcg.nodes[w].op, WeightAttrs) and op.trainable:
                readers.setdefault(w, []).append(i)
    seg_of = {i: s for s, seg in enumerate(again) for i in seg}
    out = {}
    for w, rs in readers.items():
        by_seg: dict[int, list[int]] = {}
        for i in rs:
            if i in seg_of:
                by_seg.setdefault(seg_of[i], []).append(i)
        kept = tuple(i for i in reversed(rs) if i not in seg_of)
        out[w] = (Pass(Action.FORWARD, tuple(rs)),
                  *(Pass(Action.RECOMPUTE, tuple(by_seg[s])) for s in sorted(by_seg)),
                  *((Pass(Action.BACKWARD, kept),) if kept else ()))
    return out


@dataclass(frozen=True, slots=True)
class Gather:
    """One of ZeRO-3's gathers in a micro-batch (:func:`gathers`): ``weight`` (its source
    node) for its pass ``npass`` (an index into :func:`weight_passes`' tuple), of ``kind``,
    needed at action ``use`` of the :class:`NodeOrder` (its pass's first reader) and started
    at action ``start``, before that action runs (``start == use``: not prefetched)."""

    weight: int
    npass: int
    kind: Action
    use: int
    start: int


def gathers(order: NodeOrder, passes: Mapping[int, Sequence[Pass]]) -> tuple[Gather, ...]:
    """ZeRO-3's gathers of one micro-batch under ``order``, in the order they are needed
    (``passes``: :func:`weight_passes`), each prefetched one ahead, as FSDP's forward and
    backward prefetch: a gather starts where the one before it is needed (the first where it
    is needed itself), so it moves while the previous weight's readers compute, and at most
    one gathered weight is in flight. Gathers needed at one action start there."""
    index = {a: j for j, a in enumerate(order.actions)}
    uses = sorted((index[(p.kind, p.readers[0])], w, k, p.kind)
                  for w, ps in passes.items() for k, p in enumerate(ps) if p.readers)
    return tuple(Gather(w, k, kind, use, uses[n - 1][0] if n else use) for n, (use, w, k, kind) in enumerate(uses))


class Action(Enum):
    """One thing a micro-batch does (:class:`NodeOrder`)."""

    FORWARD = "fwd"          # a node's forward (keeping its context unless it is recomputed)
    LOSS = "loss"            # the loss, and its gradient
    RECOMPUTE = "recompute"  # a recomputed node's forward again, keeping its context
    BACKWARD = "bwd"         # a node's backward (where its gradient flows)
    DROP = "drop"            # a recomputed segment's backward is done: its values are freed


@dataclass(frozen=True)
class NodeOrder:
    """The order of one micro-batch's work over every node of a mapped graph: each forward in
    node order, the loss, then each backward in reverse, a segment's recomputes (``segments``,
    :func:`recomputed`'s non-empty ones) right before the backward of its last node, and its
    ``DROP`` right after the backward of its first (the module docstring)."""

    actions: tuple[tuple[Action, int], ...]   # (action, node); LOSS: -1; DROP: the segment's index
    segments: tuple[tuple[int, ...], ...]


def node_order(pcg: PCG, layout: Sequence[int | None], grads: frozenset[TensorRef], mode: Recompute,
               limit: int = 0) -> NodeOrder:
    """The :class:`NodeOrder` of a step of ``pcg`` under recomputation ``mode`` (of the first
    ``limit`` segments; 0: all)."""
    again = tuple(s for s in recomputed(pcg, layout, grads, mode, limit) if s)
    first = {s[-1]: j for j, s in enumerate(again)}    # backward meets a segment at its last node
    last = {s[0]: j for j, s in enumerate(again)}
    actions = [(Action.FORWARD, i) for i in range(len(pcg))] + [(Action.LOSS, -1)]
    for i in range(len(pcg) - 1, -1, -1):
        if i in first:
            actions += [(Action.RECOMPUTE, x) for x in again[first[i]]]
        actions.append((Action.BACKWARD, i))
        if i in last:
            actions.append((Action.DROP, last[i]))
    return NodeOrder(tuple(actions), again)
