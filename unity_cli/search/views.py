"""Default machine views: pieces packed densely from device 0, in an axis order that keeps
the tightly coupled axes inside a node.

Innermost (stride 1) go the partial-sum axis and the non-batch dims (tensor
parallelism talks every layer), then an activation's replicas (the tensor-parallel group
that shares an input), then the batch dim; a weight's replicas go outermost, since they
only meet once a step, in the gradient all-reduce.
"""
from __future__ import annotations

from ..cluster.machine_view import MachineView, packed_view
from ..cost.model import layout_sources
from ..ir.pcg import PCG


def default_views(pcg: PCG) -> tuple[MachineView, ...]:
    layout = layout_sources(pcg)
    out = []
    for i, n in pcg:
        shape = n.outputs[0]
        r = shape.rank
        sum_axis, copy_axis = r, r + 1
        dims_inner = list(range(r - 1, 0, -1))
        src = layout[i]
        if src is not None and pcg.nodes[src].kind == "Weight":
            order = [sum_axis] + dims_inner + ([0] if r else []) + [copy_axis]
        else:
            order = [sum_axis] + dims_inner + [copy_axis] + ([0] if r else [])
        out.append(packed_view(shape, order))
    return tuple(out)
