"""Where the CPU runtime keeps a transposed tensor as a view, and where it copies one.

On the numpy backend a Transpose returns a view of its input (``transpose_forward``), and
numpy writes an elementwise result in its operands' memory order (ufuncs' ``order='K'``),
so a permuted layout travels through activations, sums, products, softmax, casts,
concatenations and slices without a copy: a channels-last network's pairs of transposes
around an activation cost their dispatch and nothing else (measured in ``unity profile``:
40 to 100 us for a Transpose of 2 MiB where its copy would be 400). The copy is made
where a Reshape reads a permuted tensor, whose dims numpy cannot merge in place (an
attention head's ``Transpose(0, 2, 1, 3)`` then ``Reshape``: the reshape is the copy).
:func:`copying_reshapes` finds those reshapes, and ``cost.model`` prices a Transpose on a
CPU device as its dispatch alone and such a Reshape as the copy. Backward, a Transpose of a
weight hands it its gradient as a transposed view, which the gradient sync's buffer copy
reads out of order (a 256 x 256 one: 69 us, against 5 us in order), so that Transpose pays
the copy backward (:func:`weight_transposes`; other permuted gradients are not followed).

On a GPU the roofline keeps pricing a Transpose as a copy, the one its first reader makes
where the backend's kernels write their outputs in row-major order (not measured here).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..cluster.spec import ClusterSpec, DeviceKind, DeviceType
from ..ir.ops.shape_ops import ReshapeAttrs, SliceAttrs, TransposeAttrs
from ..ir.ops.sources import WeightAttrs
from ..ir.opspec import OpCost, OpKind
from ..ir.pcg import PCG
from ..ir.shapes import TensorShape

FOLLOW = frozenset({OpKind.Unary, OpKind.Binary, OpKind.Scale, OpKind.Cast, OpKind.Softmax, OpKind.Where,
                    OpKind.Concat, OpKind.Replicate, OpKind.Combine, OpKind.Reduction})
"""Kinds whose outputs are fresh arrays in their inputs' memory order on numpy (elementwise
functions write in ``order='K'``, and so do a concatenation and a sum)."""
VIEWS = frozenset({OpKind.Split, OpKind.Slice, OpKind.Repartition})
"""Kinds whose outputs are views of their input, with its strides."""


def copying_reshapes(pcg: PCG) -> frozenset[int]:
    """The Reshapes that read a permuted tensor whose dims numpy cannot regroup in place:
    it copies there. Found by following, node by node, the strides (in elements) of each
    output as numpy lays it out, where a transpose or a split left them other than
    row-major (shapes as the graph has them, whole: how the runtime cuts pieces is not
    followed)."""
    strides: list[tuple[int, ...] | None] = []   # None: row-major
    copying = set()
    for i, n in pcg:
        sizes = n.outputs[0].sizes
        ins = [strides[r.node] for r in n.inputs]
        out = None
        if isinstance(n.op, TransposeAttrs):
            x = ins[0] or _row_major(pcg.shape(n.inputs[0]).sizes)
            out = tuple(x[p] for p in n.op.perm)
        elif isinstance(n.op, ReshapeAttrs) and ins[0] is not None:
            out = _reshaped(pcg.shape(n.inputs[0]).sizes, ins[0], sizes)
            if out is None:
                copying.add(i)
        elif n.spec.kind in VIEWS:
            out = ins[0] or _row_major(pcg.shape(n.inputs[0]).sizes)
            if isinstance(n.op, SliceAttrs):     # a step strides its dim further
                out = tuple(st * abs(step) for st, (_, _, step) in zip(out, n.op.ranges, strict=True))
        elif n.spec.kind in FOLLOW and any(o is not None for o in ins):
            # numpy's order='K': a fresh array in the order its full-size operands agree on
            # (a broadcast operand's dims of size 1 decide nothing)
            orders = {_order(o or _row_major(sizes), sizes) for o, r in zip(ins, n.inputs)
                      if pcg.shape(r).sizes == sizes}
            if len(orders) == 1:
                out = _dense(sizes, orders.pop())
        strides.append(None if out is None or _plain(out, sizes) else out)
    return frozenset(copying)


def weight_transposes(pcg: PCG) -> frozenset[int]:
    """The Transposes of a weight (through parallel ops): backward hands the weight its
    gradient as a transposed view, which the gradient's sync and the optimizer copy and
    read out of order (``runtime/weights.py``)."""
    def source(i: int) -> bool:
        n = pcg.nodes[i]
        while n.spec.is_parallel_op:
            n = pcg.nodes[n.inputs[0].node]
        return isinstance(n.op, WeightAttrs)

    return frozenset(i for i, n in pcg if isinstance(n.op, TransposeAttrs) and source(n.inputs[0].node))


def copies(pcg: PCG, cluster: ClusterSpec) -> frozenset[int]:
    """The nodes where the CPU runtime makes a transposing copy: :func:`copying_reshapes`
    (forward) and :func:`weight_transposes` (backward); none on a cluster without CPU
    devices, where nothing reads them (:func:`as_run`)."""
    if all(node.device.kind is not DeviceKind.CPU for node in cluster.nodes):
        return frozenset()
    return copying_reshapes(pcg) | weight_transposes(pcg)


def _row_major(sizes: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(sizes):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _plain(strides: tuple[int, ...], sizes: tuple[int, ...]) -> bool:
    """Whether the strides are row-major's (a dim of size 1 has any stride)."""
    return all(s == r or d == 1 for s, r, d in zip(strides, _row_major(sizes), sizes, strict=True))


def _order(strides: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The dims of size above 1, from outermost in memory to innermost."""
    return tuple(d for d in sorted(range(len(sizes)), key=lambda d: (-strides[d], d)) if sizes[d] != 1)


def _dense(sizes: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a fresh array whose dims of size above 1 lie in memory in ``order``."""
    out, step = [1] * len(sizes), 1
    for d in reversed(order):
        out[d] = step
        step *= sizes[d]
    return tuple(out)


def _reshaped(sizes: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of ``reshape(new)`` of an array so laid out where numpy makes it a view,
    None where it copies: each run of old dims that becomes a run of new ones must be
    contiguous in itself (numpy's ``_attempt_nocopy_reshape``, C order)."""
    if 0 in sizes:
        return _row_major(new)
    old = [(d, s) for d, s in zip(sizes, strides, strict=True) if d != 1]
    dims = [d for d, _ in old]
    out = [0] * len(new)
    oi = ni = 0
    while ni < len(new) and oi < len(old):
        oj, nj = oi + 1, ni + 1
        p_new, p_old = new[ni], dims[oi]
        while p_new != p_old:
            if p_new < p_old:
                p_new *= new[nj]
                nj += 1
            else:
                p_old *= dims[oj]
                oj += 1
        if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
            return None
        out[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni, oi = nj, oj
    for k in range(ni, len(new)):      # trailing dims of size 1
        out[k] = 1
    return tuple(out)


def as_run(cost: OpCost, kind: OpKind, device: DeviceType, copies: bool,
           inputs: Sequence[TensorShape], outputs: Sequence[TensorShape]) -> OpCost:
    """A piece's work as the runtime does it on ``device``: on a CPU, a Transpose is a view
    (its dispatch, no bytes), but one of a weight (``copies``, :func:`weight_transposes`)
    pays backward the out-of-order copy of the gradient it hands the weight; a Reshape
    that ``copies`` (:func:`copying_reshapes`) reads its input out of order and writes its
    output forward, and reshapes the gradient backward, a view."""
    if device.kind is not DeviceKind.CPU:
        return cost
    moved = float(sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs))
    if kind is OpKind.Transpose:
        return OpCost(0.0, 0.0, 0.0, moved if copies else 0.0, cost.kernels, cost.bwd_kernels, strided=True)
    if copies:
        return OpCost(0.0, moved, 0.0, 0.0, 1, 0, strided=True)
    return cost
