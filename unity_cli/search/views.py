"""Default machine views: pieces packed densely from device 0, in an axis order that keeps
the tightly coupled axes inside a node.

Innermost (stride 1) go the partial-sum axis and the non-batch dims (tensor
parallelism talks every layer), then an activation's replicas (the tensor-parallel group
that shares an input), then the batch dim; a weight's replicas go outermost, since they
only meet once a step, in the gradient all-reduce.

A Reduction or Combine that leaves fewer pieces than it reads keeps each merged piece on
the first device of the group that merged it, so a tensor-parallel group's result stays in
that group (for ``tp=T,dp=D``: batch shard ``b`` of a reduced output on device ``b*T``)
instead of being packed onto devices 0.. that belong to other groups.

Given ``ranges`` (per node, a contiguous range of devices ``(start, count)``, or None for
all of them), each node's pieces are packed the same way from the start of its range:
parallel branches of a graph then run on disjoint device groups (``groups.py``).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..cost.model import layout_sources, stored_layout
from ..ir.machine_view import MachineView, packed_view, parallel_axes
from ..ir.ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, reduces_copies
from ..ir.opspec import OpKind
from ..ir.pcg import PCG
from ..ir.shapes import ParallelTensorShape


def default_views(pcg: PCG, ranges: Sequence[tuple[int, int] | None] | None = None) -> tuple[MachineView, ...]:
    layout = layout_sources(pcg)
    out: list[MachineView] = []
    for i, n in pcg:
        shape = n.outputs[0]
        where = ranges[i] if ranges is not None else None
        merged = _merged_axis(pcg, i)
        if merged is not None and layout[n.inputs[0].node] is None:  # of a computed tensor, not a stored layout
            view = _kept_on_first(out[n.inputs[0].node], shape, *merged)
            if where is None or _inside(view, shape, where):
                out.append(view)
                continue
        r = shape.rank
        sum_axis, copy_axis = r, r + 1
        dims_inner = list(range(r - 1, 0, -1))
        src = layout[i]
        if src is not None and pcg.nodes[src].kind == OpKind.Weight:
            order = [sum_axis] + dims_inner + ([0] if r else []) + [copy_axis]
        else:
            order = [sum_axis] + dims_inner + [copy_axis] + ([0] if r else [])
        out.append(packed_view(shape, order, 0 if where is None or shape.pieces > where[1] else where[0]))
    return tuple(out)


def _inside(view: MachineView, shape: ParallelTensorShape, where: tuple[int, int]) -> bool:
    start, count = where
    return all(start <= d < start + count for d in view.devices(shape))


def _merged_axis(pcg: PCG, i: int) -> tuple[int, int] | None:
    """(parallel axis, degree) that node ``i`` merges, if it is a Reduction or Combine."""
    n = pcg.nodes[i]
    if not n.inputs:
        return None
    x = pcg.shape(n.inputs[0])
    match n.op:
        case ReductionAttrs(degree=d):
            return (x.rank + 1 if reduces_copies(x) else x.rank), d
        case CombineAttrs(dim=dim, degree=d):
            return (x.rank + 1 if dim == REPLICA_DIM else dim), d
    return None


def _kept_on_first(view: MachineView, y: ParallelTensorShape, axis: int, d: int) -> MachineView:
    """The view of ``y`` whose piece ``j`` (along ``axis``) sits where piece ``j*d`` of its input did:
    the first device of each group of ``d`` merged pieces (``MachineView.groups``)."""
    strides = list(view.strides)
    strides[axis] *= d
    return MachineView(view.start, tuple(s if a > 1 else 0 for s, a in zip(strides, parallel_axes(y), strict=True)))


def transposed_views(pcg: PCG, views: Sequence[MachineView], tp: int, dp: int) -> tuple[MachineView, ...] | None:
    """A uniform ``tp=T,dp=D`` hybrid's views (each tensor-parallel group on ``T`` consecutive
    devices: device ``g*T + t``) moved to the transposed grid, device ``t*D + g``: the data
    parallel replicas consecutive (inside a node), each tensor-parallel group strided across
    nodes. A source's layout that nothing but another layout reads is set up once and held by
    no step, so it keeps its view where its move is not a strided range. None where another
    view is not one once moved."""
    def moved(d: int) -> int:
        return (d % tp) * dp + d // tp
    layout = layout_sources(pcg)
    out = []
    for i, n in pcg:
        shape = n.outputs[0]
        old = views[i]
        start = moved(old.start)
        strides = tuple(moved(old.start + s) - start if a > 1 else 0
                        for a, s in zip(parallel_axes(shape), old.strides, strict=True))
        view = MachineView(start, strides)
        if view.devices(shape) != tuple(moved(d) for d in old.devices(shape)):
            if layout[i] is None or stored_layout(pcg, layout, i):
                return None
            view = old
        out.append(view)
    return tuple(out)
