"""Parallel-op sequences that turn one parallel layout of a tensor into another, and the
least such resharding that prices like it (:func:`unit_layouts`)."""
from __future__ import annotations

import math

from ..errors import ShapeError
from ..ir.ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from ..ir.pcg import GraphBuilder, TensorRef
from ..ir.shapes import ParallelTensorShape


def reshard(b: GraphBuilder, ref: TensorRef, target: ParallelTensorShape) -> TensorRef:
    """Append parallel ops to ``b`` that bring ``ref`` to ``target``'s layout.

    Order: reduce partial sums, gather over-split dims, drop surplus replicas, split
    dims, then replicate — so no step needs more pieces than the two ends.
    """
    cur = b.shape(ref)
    if cur.logical != target.logical:
        raise ShapeError(f"cannot reshard {cur} into {target}: logical shapes differ")
    if cur == target:
        return ref
    if cur.sum_degree != target.sum_degree:
        if cur.sum_degree % target.sum_degree:
            raise ShapeError(f"cannot make {target.sum_degree} partial sums out of {cur.sum_degree}")
        ref = b.add1(ReductionAttrs(cur.sum_degree // target.sum_degree), [ref])
    for d, (have, want) in enumerate(zip(b.shape(ref).degrees, target.degrees, strict=True)):
        if have > want or want % have:
            step = have // want if have > want and have % want == 0 else have
            ref = b.add1(CombineAttrs(d, step), [ref])
    cur = b.shape(ref)
    if cur.copy_degree > target.copy_degree or target.copy_degree % cur.copy_degree:
        drop = cur.copy_degree // target.copy_degree if cur.copy_degree % target.copy_degree == 0 else cur.copy_degree
        ref = b.add1(CombineAttrs(REPLICA_DIM, drop), [ref])
    for d, (have, want) in enumerate(zip(b.shape(ref).degrees, target.degrees, strict=True)):
        if want > have:
            ref = b.add1(RepartitionAttrs(d, want // have), [ref])
    cur = b.shape(ref)
    if target.copy_degree > cur.copy_degree:
        ref = b.add1(ReplicateAttrs(target.copy_degree // cur.copy_degree), [ref])
    if b.shape(ref) != target:
        raise ShapeError(f"resharding reached {b.shape(ref)} instead of {target}")
    return ref


def unit_layouts(source: ParallelTensorShape, target: ParallelTensorShape
                 ) -> tuple[ParallelTensorShape, ParallelTensorShape, int]:
    """The same resharding at the least sizes that keep every split even, and the factor
    every piece grows by at the real sizes. Splits are even (a dim's size is a multiple of
    its degree), so each dim of ``source`` -> ``target`` can shrink to the least common
    multiple of its two degrees (every degree on the way divides one of them): each piece,
    each region read and each message then shrinks by the same ``factor``, and the moves
    of the real resharding are the unit's with their bytes times ``factor``. A dim past the
    first (the batch dim, which default views place apart: ``search/views.py``) that neither
    splits (its unit size 1) is left out: no op of the resharding reads it, and pieces go
    onto devices by the split dims only, so the reshardings of tensors that differ in such
    dims are one unit. ShapeError: the two are not layouts of one tensor."""
    if source.logical != target.logical:
        raise ShapeError(f"cannot reshard {source} into {target}: logical shapes differ")
    kept, factor = [], 1
    for k, (a, b) in enumerate(zip(source.dims, target.dims, strict=True)):
        unit = math.lcm(a.degree, b.degree)
        if unit > 1 or k == 0:
            kept.append((k, unit))
        factor *= a.size // unit
    small = [ParallelTensorShape.of(tuple(u for _, u in kept), tuple(s.dims[k].degree for k, _ in kept), s.dtype,
                                    s.sum_degree, s.copy_degree) for s in (source, target)]
    return small[0], small[1], factor
