"""Fusing and cancelling adjacent parallel ops, and dropping dead nodes.

``Repartition(d, a)`` then ``Repartition(d, b)`` is ``Repartition(d, a*b)``;
``Repartition(d, a)`` then ``Combine(d, a)`` is the identity (and likewise for
``Replicate`` / ``Combine(REPLICA_DIM)`` and for ``Combine`` then ``Repartition``).
"""
from __future__ import annotations

from typing import Any

from .ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from .ops.shape_ops import ReshapeAttrs
from .ops.sources import InputAttrs, WeightAttrs
from .opspec import OpKind
from .pcg import PCG, GraphBuilder, TensorRef

IDENTITY = "identity"


def _axis(op: Any) -> tuple[str, int] | None:
    """(kind of axis, index) that a parallel op changes, and in which direction."""
    match op:
        case RepartitionAttrs(dim=d):
            return ("dim", d)
        case CombineAttrs(dim=d) if d == REPLICA_DIM:
            return ("copy", 0)
        case CombineAttrs(dim=d):
            return ("dim", d)
        case ReplicateAttrs():
            return ("copy", 0)
        case ReductionAttrs():
            return ("sum", 0)
    return None


def _signed(op: Any) -> int:
    """+degree for ops that add pieces along their axis, -degree for ops that remove them."""
    grows = isinstance(op, RepartitionAttrs | ReplicateAttrs)
    return op.degree if grows else -op.degree


def _make(first: Any, net: int) -> Any:
    """A parallel op on ``first``'s axis with net effect ``net`` (a ratio as +k or -k)."""
    kind, d = _axis(first)
    if kind == "dim":
        return RepartitionAttrs(d, net) if net > 0 else CombineAttrs(d, -net)
    if kind == "copy":
        return ReplicateAttrs(net) if net > 0 else CombineAttrs(REPLICA_DIM, -net)
    return ReductionAttrs(-net)


def fuse(first: Any, second: Any) -> Any | None:
    """One op (or IDENTITY) equal to ``first`` followed by ``second``, or None."""
    a, b = _axis(first), _axis(second)
    if a is None or b is None or a != b or a[0] == "sum":
        return None  # a Reduction's axis (sums or replicas) depends on its input's shape
    x, y = _signed(first), _signed(second)
    if x > 0 and y > 0:
        return _make(first, x * y)
    if x < 0 and y < 0:
        return _make(first, x * y * -1)
    grow, shrink = (x, -y) if x > 0 else (y, -x)
    if grow == shrink:
        return IDENTITY
    if x > 0 and grow % shrink == 0:
        return _make(first, grow // shrink)
    if x > 0 and shrink % grow == 0:
        return _make(first, -(shrink // grow))
    return None  # Combine then Repartition of other degrees: different groups, keep both


def simplify(pcg: PCG) -> PCG:
    """Fuse chains of parallel ops and drop degree-1 ones and dead nodes, to a fixed point;
    fold concatenations of weights into one weight."""
    while _changes(pcg):
        pcg = prune(_pass(pcg)[0])
    return prune(fold_weight_concats(pcg))


def _foldable(pcg: PCG, i: int) -> tuple[tuple[str, int], ...] | None:
    """The parts of the weight that Concat node ``i`` would fold into, or None: every input a
    distinct, whole weight (no parallel op on it) that only this Concat reads, all trainable
    or all constant, a folded one only along the same axis."""
    n = pcg.nodes[i]
    if n.kind != OpKind.Concat or len(n.inputs) < 2 or TensorRef(i, 0) in pcg.outputs:
        return None
    ws = [pcg.nodes[r.node] for r in n.inputs]
    if len({r.node for r in n.inputs}) != len(ws) or not all(isinstance(w.op, WeightAttrs) for w in ws):
        return None
    if len({w.op.trainable for w in ws}) != 1 or any(len(pcg.consumers[r.node]) != 1 for r in n.inputs):
        return None
    parts: list[tuple[str, int]] = []
    for w in ws:
        if w.op.parts and w.op.part_axis != n.op.axis:
            return None
        parts += w.op.parts or [(w.name, w.op.shape.dims[n.op.axis])]
    return tuple(parts)


def fold_weight_concats(pcg: PCG) -> PCG:
    """Each ``Concat`` of weights becomes one weight holding the concatenation (a fused
    projection's weights are stored concatenated, not concatenated every step); the weight
    records its parts, so the runtime loads and saves the model's own initializers."""
    folds = {i: parts for i, n in pcg if n.kind == OpKind.Concat and (parts := _foldable(pcg, i))}
    if not folds:
        return pcg
    names = {n.name for _, n in pcg}
    b = GraphBuilder()
    remap: dict[TensorRef, TensorRef] = {}
    for i, n in pcg:
        if i in folds:
            name = base = "+".join(p for p, _ in folds[i])
            k = 1
            while name in names:
                name, k = f"{base}#{k}", k + 1
            names.add(name)
            trainable = pcg.nodes[n.inputs[0].node].op.trainable
            op = WeightAttrs(n.outputs[0].logical, trainable, folds[i], n.op.axis)
            remap[TensorRef(i, 0)] = b.add1(op, (), name)
            continue
        outs = b.add(n.op, [remap[r] for r in n.inputs], n.name, outputs=n.outputs)
        for k, o in enumerate(outs):
            remap[TensorRef(i, k)] = o
    return fold_weight_concats(prune(b.build([remap[r] for r in pcg.outputs])))   # a Concat of those, too


def merge_reshapes(pcg: PCG) -> tuple[PCG, int]:
    """Each ``Reshape`` of a ``Reshape`` reshapes the first one's input instead (row-major
    reshapes compose: a chain is its last shape), and one to its input's own shape is
    dropped (unless it is a graph output); returns the graph and how many Reshapes are
    gone. A chain ``[B, S, D] -> [B*S, D] -> [B, S, D]`` kept only the batch dim's
    splits through it; read as none, it keeps them all."""
    b = GraphBuilder()
    remap: dict[TensorRef, TensorRef] = {}
    outputs = set(pcg.outputs)
    for i, n in pcg:
        ins = [remap[r] for r in n.inputs]
        if n.kind == OpKind.Reshape:
            src = b.nodes[ins[0].node]
            if src.kind == OpKind.Reshape:
                ins = [src.inputs[0]]
            if b.shape(ins[0]).logical.dims == tuple(n.op.dims) and TensorRef(i, 0) not in outputs:
                remap[TensorRef(i, 0)] = ins[0]
                continue
            remap[TensorRef(i, 0)] = b.add1(ReshapeAttrs(tuple(n.op.dims)), ins, n.name)
            continue
        outs = b.add(n.op, ins, n.name, outputs=n.outputs)
        for k, o in enumerate(outs):
            remap[TensorRef(i, k)] = o
    out = prune(b.build([remap[r] for r in pcg.outputs]))
    gone = len(pcg.by_kind.get(OpKind.Reshape, ())) - len(out.by_kind.get(OpKind.Reshape, ()))
    return (out, gone) if gone else (pcg, 0)


def _changes(pcg: PCG) -> bool:
    """Whether :func:`_pass` would change ``pcg`` (a scan, not a rebuild): some parallel op
    has degree 1, or fuses with the parallel op before it that only it reads."""
    for _, n in pcg:
        if not n.spec.is_parallel_op:
            continue
        if n.op.degree == 1:
            return True
        prev_old = n.inputs[0].node
        prev = pcg.nodes[prev_old]
        if prev.spec.is_parallel_op and len(pcg.consumers[prev_old]) == 1 and fuse(prev.op, n.op) is not None:
            return True
    return False


def _pass(pcg: PCG) -> tuple[PCG, bool]:
    b = GraphBuilder()
    remap: dict[TensorRef, TensorRef] = {}
    made_by: dict[int, int] = {}   # new node id -> the old node whose output it computes
    changed = False
    for i, n in pcg:
        ins = [remap[r] for r in n.inputs]
        if n.spec.is_parallel_op:
            if n.op.degree == 1:
                remap[TensorRef(i, 0)] = ins[0]
                changed = True
                continue
            # Fuse with the new node that computes the input, if it is a parallel op made for
            # an old node read only by this one (not an earlier tensor an op was dropped onto).
            prev_old = n.inputs[0].node
            prev = b.nodes[ins[0].node]
            if (prev.spec.is_parallel_op and made_by.get(ins[0].node) == prev_old
                    and len(pcg.consumers[prev_old]) == 1):
                fused = fuse(prev.op, n.op)
                if fused is not None:
                    changed = True
                    base = prev.inputs[0]
                    if fused is IDENTITY:
                        remap[TensorRef(i, 0)] = base
                    else:
                        remap[TensorRef(i, 0)] = b.add1(fused, [base], n.name)
                        made_by[remap[TensorRef(i, 0)].node] = i
                    continue
        # Fusing parallel ops never changes a later node's shapes: keep the stored ones.
        outs = b.add(n.op, ins, n.name, outputs=n.outputs)
        made_by[outs[0].node] = i
        for k, o in enumerate(outs):
            remap[TensorRef(i, k)] = o
    return b.build([remap[r] for r in pcg.outputs]), changed


def prune(pcg: PCG) -> PCG:
    """Drop nodes nothing reads; graph outputs and graph inputs (fed every step) stay."""
    live = [isinstance(n.op, InputAttrs) for _, n in pcg]
    for r in pcg.outputs:
        live[r.node] = True
    for i in range(len(pcg) - 1, -1, -1):
        n = pcg.nodes[i]
        if live[i]:
            for r in n.inputs:
                live[r.node] = True
    if all(live):
        return pcg
    b = GraphBuilder()
    remap: dict[int, int] = {}
    for i, n in pcg:
        if live[i]:
            ins = [TensorRef(remap[r.node], r.index) for r in n.inputs]
            remap[i] = b.add(n.op, ins, n.name, outputs=n.outputs)[0].node
    return b.build([TensorRef(remap[r.node], r.index) for r in pcg.outputs])
