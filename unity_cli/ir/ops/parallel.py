"""The parallel operators: they change how a tensor is spread, never its value.

| op                  | shape effect       | forward          | backward          |
|---------------------|--------------------|------------------|-------------------|
| Repartition(dim, d) | degree[dim] *= d   | local slice      | all-gather        |
| Combine(dim, d)     | degree[dim] /= d   | all-gather       | local slice       |
| Replicate(d)        | copy *= d          | broadcast        | sum of gradients  |
| Reduction(d)        | sum /= d           | reduce           | broadcast         |

``Reduction(d)`` of a tensor without partial sums (``sum == 1``) adds up ``d`` of its
replicas instead (``copy /= d``): its value is scaled by ``d``. So ``Replicate(d)`` then
``Reduction(d)`` is ``Scale(d)``, not the identity.

``Combine(REPLICA_DIM, d)`` (``copy /= d``) keeps one replica of each group of ``d``; its
backward hands the gradient to the kept replica (the upstream ``Replicate`` sums them).
Along an axis, ``Repartition``/``Replicate`` split each piece into ``d`` consecutive
pieces and ``Combine``/``Reduction`` merge ``d`` consecutive pieces, so the groups that
communicate are known from the shapes alone.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import ShapeError
from ..opspec import ZERO_COST, OpCost, OpKind, OpSpec, register
from ..shapes import ParallelTensorShape, TensorShape
from ..terms import Axiom, Law, Symbol

REPLICA_DIM = -1
"""``Combine``'s ``dim`` that means the copy (replica) dimension."""


@dataclass(frozen=True, slots=True)
class RepartitionAttrs:
    dim: int
    degree: int


@dataclass(frozen=True, slots=True)
class CombineAttrs:
    dim: int
    degree: int


@dataclass(frozen=True, slots=True)
class ReplicateAttrs:
    degree: int


@dataclass(frozen=True, slots=True)
class ReductionAttrs:
    degree: int


class _ParallelOp(OpSpec):
    is_parallel_op = True

    def infer(self, attrs, inputs: Sequence[TensorShape]) -> tuple[TensorShape, ...]:
        return (inputs[0],)

    def cost(self, attrs, inputs, outputs) -> OpCost:
        return ZERO_COST  # communication is costed by the cost model, not as compute

    def infer_parallel(self, attrs, inputs: Sequence[ParallelTensorShape]) -> tuple[ParallelTensorShape, ...]:
        if len(inputs) != 1:
            raise ShapeError(f"{self.kind} takes one input, got {len(inputs)}")
        if attrs.degree < 1:
            raise ShapeError(f"{self.kind} degree must be >= 1, got {attrs.degree}")
        out = self.apply(attrs, inputs[0])
        bad = out.problems()
        if bad:
            raise ShapeError(f"{self.kind}: {bad[0]}")
        return (out,)

    def apply(self, attrs, x: ParallelTensorShape) -> ParallelTensorShape:
        raise NotImplementedError


def _check_dim(kind: str, dim: int, x: ParallelTensorShape) -> None:
    if not 0 <= dim < x.rank:
        raise ShapeError(f"{kind} on dim {dim} of a rank-{x.rank} tensor")


@register
class Repartition(_ParallelOp):
    kind = OpKind.Repartition
    attrs_type = RepartitionAttrs
    symbols = (Symbol("repartition", ("I", "I", "T"), lambda run, dim, d, x: x),)
    axioms = (Axiom("repartition-id", lambda s, v: Law(s.repartition(v.ax, v.k, v.x), v.x)),)

    def encode(self, s, attrs, x, ins, outs):
        return [s.repartition(attrs.dim, attrs.degree, x[0])]

    def apply(self, attrs, x):
        _check_dim(self.kind, attrs.dim, x)
        return x.with_dim(attrs.dim, x.dims[attrs.dim].degree * attrs.degree)


@register
class Combine(_ParallelOp):
    kind = OpKind.Combine
    attrs_type = CombineAttrs
    symbols = (Symbol("combine", ("I", "I", "T"), lambda run, dim, d, x: x),)
    axioms = (Axiom("combine-id", lambda s, v: Law(s.combine(v.ax, v.k, v.x), v.x)),)

    def encode(self, s, attrs, x, ins, outs):
        return [s.combine(attrs.dim, attrs.degree, x[0])]

    def apply(self, attrs, x):
        if attrs.dim == REPLICA_DIM:
            if x.copy_degree % attrs.degree:
                raise ShapeError(f"Combine of {attrs.degree} replicas, but there are {x.copy_degree}")
            return x.with_replicas(copy_degree=x.copy_degree // attrs.degree)
        _check_dim(self.kind, attrs.dim, x)
        g = x.dims[attrs.dim].degree
        if g % attrs.degree:
            raise ShapeError(f"Combine({attrs.dim}, {attrs.degree}) of a dim split {g} ways")
        return x.with_dim(attrs.dim, g // attrs.degree)


@register
class Replicate(_ParallelOp):
    kind = OpKind.Replicate
    attrs_type = ReplicateAttrs
    symbols = (Symbol("replicate", ("I", "T"), lambda run, d, x: x),)
    axioms = (Axiom("replicate-id", lambda s, v: Law(s.replicate(v.k, v.x), v.x)),)

    def encode(self, s, attrs, x, ins, outs):
        return [s.replicate(attrs.degree, x[0])]

    def apply(self, attrs, x):
        return x.with_replicas(copy_degree=x.copy_degree * attrs.degree)


@register
class Reduction(_ParallelOp):
    kind = OpKind.Reduction
    attrs_type = ReductionAttrs
    symbols = (   # of partial sums: the value is theirs; of replicas: d times one
        Symbol("reduce_sum", ("I", "T"), lambda run, d, x: x),
        Symbol("reduce_copies", ("I", "T"), lambda run, d, x: d * x),
    )
    axioms = (
        Axiom("reduce-sum-id", lambda s, v: Law(s.reduce_sum(v.k, v.x), v.x)),
        Axiom("reduce-copies-scale", lambda s, v: Law(s.reduce_copies(v.k, v.x), s.scale(v.k, v.x))),
    )

    def encode(self, s, attrs, x, ins, outs):
        return [(s.reduce_copies if reduces_copies(ins[0]) else s.reduce_sum)(attrs.degree, x[0])]

    def apply(self, attrs, x):
        if reduces_copies(x):
            if x.copy_degree % attrs.degree:
                raise ShapeError(f"Reduction({attrs.degree}) of a tensor with {x.copy_degree} replicas")
            return x.with_replicas(copy_degree=x.copy_degree // attrs.degree)
        if x.sum_degree % attrs.degree:
            raise ShapeError(f"Reduction({attrs.degree}) of a tensor with {x.sum_degree} partial sums")
        return x.with_replicas(sum_degree=x.sum_degree // attrs.degree)


def reduces_copies(x: ParallelTensorShape) -> bool:
    """Whether a Reduction of ``x`` adds up replicas (scaling the value) rather than partial sums."""
    return x.sum_degree == 1
