"""Parallel-op sequences that turn one parallel layout of a tensor into another."""
from __future__ import annotations

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
