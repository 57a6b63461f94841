"""Piece coordinates: which piece of each input one piece of an operator reads.

A parallel tensor is stored as pieces. A piece's coordinate is a tuple over the tensor's
parallel axes ``(dim 0 .. dim r-1, sum, copy)``: a dim coordinate selects one of
``degree`` equal consecutive slices, the ``sum`` pieces are partial values that add up
to the logical value, and the ``copy`` pieces are identical replicas. A compute op runs
once per output piece ``t``; input ``i`` reads the piece :meth:`TaskInputs.coord` names.

These rules are shared by the reference piece semantics
(:mod:`unity_cli.substitutions.pieces`) and the distributed runtime, which runs the same
tasks on the devices of a plan.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .opspec import SUM, WHOLE, Role, spec_of
from .pcg import Node
from .shapes import ParallelTensorShape

Coord = tuple[int, ...]


class PieceError(AssertionError):
    """Pieces that break the invariants of their parallel shape (replicas that differ,
    a piece of the wrong size): a bug in a kernel or in a parallel shape rule."""


def parallel_axes(shape: ParallelTensorShape) -> tuple[int, ...]:
    """The degrees of the parallel axes, dims then sum then copy (as machine views order them)."""
    return shape.degrees + (shape.sum_degree, shape.copy_degree)


def coords(shape: ParallelTensorShape) -> Iterator[Coord]:
    """Every piece coordinate of ``shape``, row-major (the order of ``MachineView.devices``)."""
    return itertools.product(*(range(a) for a in parallel_axes(shape)))


def with_axis(c: Coord, axis: int, value: int) -> Coord:
    """``c`` with its coordinate along parallel axis ``axis`` set to ``value``."""
    return c[:axis] + (value,) + c[axis + 1:]


def piece_region(shape: ParallelTensorShape, c: Coord) -> tuple[slice, ...]:
    """The slice of the logical tensor that piece ``c`` covers (its dim coordinates)."""
    piece = shape.piece.dims
    return tuple(slice(k * n, (k + 1) * n) for k, n in zip(c[:shape.rank], piece, strict=True))


def input_coord(roles: Sequence[Role], term_has_sum: bool | None, shape: ParallelTensorShape,
                t: Coord, contracted: int) -> Coord:
    """The piece of one input that output task ``t`` reads.

    A dim with role ``j`` takes ``t[j]``, a ``SUM`` dim the contraction index, a ``WHOLE``
    dim 0. The output's sum index ``s`` is ``p * contracted + c`` for a term that contracts
    (``p`` the partial-sum index of the term's partial input, ``c`` the contraction index)
    and just ``p`` for a term that does not; an input without partial sums reads sum 0.
    ``term_has_sum`` is None for an input in no term. Any replica is as good: copy 0.
    """
    s = t[-2]
    out = []
    for role in roles:
        if role == WHOLE:
            out.append(0)
        elif role == SUM:
            out.append(s % contracted)
        else:
            out.append(t[role])
    if shape.sum_degree == 1:
        p = 0
    elif term_has_sum is None:
        raise PieceError("an input in no term holds partial sums")
    else:
        p = s // contracted if term_has_sum else s
    return tuple(out) + (p, 0)


@dataclass(frozen=True, slots=True)
class TaskInputs:
    """How the tasks of one compute node read their inputs (see :func:`task_inputs`)."""

    roles: tuple[tuple[Role, ...], ...]
    term_of: tuple[bool | None, ...]   # per input: None (in no term) or whether its term contracts
    contracted: int                    # degree of the contracted dims (1: none split)
    shapes: tuple[ParallelTensorShape, ...]

    def coord(self, i: int, t: Coord) -> Coord:
        """The piece of input ``i`` that output task ``t`` reads (copy 0)."""
        return input_coord(self.roles[i], self.term_of[i], self.shapes[i], t, self.contracted)


def task_inputs(n: Node, shapes: Sequence[ParallelTensorShape]) -> TaskInputs:
    """The reading rules of compute node ``n`` whose inputs have parallel ``shapes``."""
    spec = n.spec
    logical = [s.logical for s in shapes]
    roles = tuple(tuple(r) for r in spec.roles(n.op, logical))
    terms = spec.terms(n.op, len(shapes))
    contracted = next((s.degrees[d] for s, rs in zip(shapes, roles, strict=True)
                       for d, role in enumerate(rs) if role == SUM), 1)
    has_sum = [SUM in rs for rs in roles]
    term_of: list[bool | None] = [None] * len(shapes)
    for term in terms:
        for i in term:
            if term_of[i] is not None and shapes[i].sum_degree > 1:
                raise NotImplementedError(f"{n.kind}: input {i} with partial sums is in two terms")
            term_of[i] = any(has_sum[j] for j in term)
    return TaskInputs(roles, tuple(term_of), contracted, tuple(shapes))


def piece_op(op: Any, output: ParallelTensorShape) -> Any:
    """Attributes for running an op on one piece, given its (first) output's parallel shape
    (``OpSpec.piece_attrs``: ops that name their full output shape, Reshape and Expand, get
    the piece's; a grouped Conv its piece's groups). The runtime runs these attrs, the
    profiler times them and the cost model looks them up."""
    return spec_of(op).piece_attrs(op, output)


def piece_attrs(n: Node) -> Any:
    """:func:`piece_op` of a node."""
    return piece_op(n.op, n.outputs[0])
