"""Piece-level reference semantics: run a small PCG the way devices would, piece by piece.

A parallel tensor's value is a dict from piece coordinate to array. A coordinate is a
tuple over the tensor's parallel axes ``(dim 0 .. dim r-1, sum, copy)`` (the order of
``ir.machine_view.parallel_axes``): a dim coordinate selects one of ``degree`` equal
consecutive slices, the ``sum`` pieces are partial values that add up to the logical
value, and the ``copy`` pieces are identical replicas.

Parallel ops move pieces as ``ir/ops/parallel.py`` says: along an axis, ``Repartition``
and ``Replicate`` split piece ``i`` into pieces ``i*d .. i*d+d-1`` and ``Combine`` and
``Reduction`` merge ``d`` consecutive pieces. A compute op runs once per output piece
``t``; input ``i`` reads, for each of its dims, the piece its role names (see
:func:`unity_cli.ir.pieces.input_coord`, shared with the runtime) and the logical kernel
(``semantics.reference``) runs on pieces.

This is an independent check of the logical semantics the generator and verifier use:
``assemble(evaluate_pieces(g, v)) == semantics.evaluate(g, v)`` for every small graph.
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.ops.parallel import REPLICA_DIM, reduces_copies
from ..ir.opspec import OpKind
from ..ir.pcg import PCG, Node
from ..ir.pieces import Coord, PieceError, coords, input_coord, parallel_axes, piece_attrs, task_inputs
from ..ir.pieces import with_axis as _with
from ..ir.shapes import ParallelTensorShape
from .semantics import reference

__all__ = ["Coord", "PieceError", "Pieces", "assemble", "check_pieces", "coords", "evaluate_pieces", "input_coord",
           "parallel_axes", "split_value"]

Pieces = dict[Coord, np.ndarray]


def split_value(value: np.ndarray, shape: ParallelTensorShape, rng: np.random.Generator | None = None) -> Pieces:
    """The pieces of a logical value laid out as ``shape``.

    Without ``rng`` the first partial sum holds the value and the others zeros; with it
    the partial sums are random integers adding up to the value (exact for integer data).
    """
    value = np.asarray(value)
    if value.shape != shape.sizes:
        raise ValueError(f"value of shape {value.shape} for a tensor of shape {shape}")
    piece = shape.piece.dims
    n = shape.sum_degree
    out: Pieces = {}
    for c in itertools.product(*(range(g) for g in shape.degrees)):
        block = value[tuple(slice(k * m, (k + 1) * m) for k, m in zip(c, piece, strict=True))]
        if rng is None:
            parts = [block] + [np.zeros_like(block)] * (n - 1)
        else:
            parts = [rng.integers(-4, 5, size=block.shape).astype(block.dtype) for _ in range(n - 1)]
            parts.append(block - sum(parts, np.zeros_like(block)))
        for s, part in enumerate(parts):
            for r in range(shape.copy_degree):
                out[c + (s, r)] = part
    return out


def assemble(pieces: Mapping[Coord, np.ndarray], shape: ParallelTensorShape, check: bool = True) -> np.ndarray:
    """The logical value of pieces: concatenate along dims, add partial sums, check replicas."""
    if check:
        check_pieces(pieces, shape)
    piece = shape.piece.dims
    first = pieces[(0,) * (shape.rank + 2)]
    out = np.zeros(shape.sizes, dtype=first.dtype)
    for c in coords(shape):
        if c[-1]:
            continue
        region = tuple(slice(k * n, (k + 1) * n) for k, n in zip(c[:-2], piece, strict=True))
        out[region] += pieces[c]
    return out


def check_pieces(pieces: Mapping[Coord, np.ndarray], shape: ParallelTensorShape, where: str = "") -> None:
    """Raise :class:`PieceError` unless ``pieces`` fit ``shape`` (every piece present, of the
    piece shape, and replicas equal)."""
    at = f" at {where}" if where else ""
    want = set(coords(shape))
    if set(pieces) != want:
        raise PieceError(f"pieces {sorted(pieces)} do not fit {shape}{at}")
    for c, v in pieces.items():
        if v.shape != shape.piece.dims:
            raise PieceError(f"piece {c} has shape {v.shape}, {shape} wants {shape.piece.dims}{at}")
        if c[-1] and not np.array_equal(v, pieces[c[:-1] + (0,)]):
            raise PieceError(f"replica {c} differs from replica 0{at}")


def evaluate_pieces(pcg: PCG, inputs: Mapping[str, Any], check: bool = False,
                    rng: np.random.Generator | None = None) -> list[Pieces]:
    """The pieces of the graph's outputs.

    ``inputs`` maps source names to a logical value (split with :func:`split_value` as the
    source's shape says, using ``rng`` for partial sums) or to a dict of pieces. With
    ``check`` every tensor's pieces are checked against its shape (replicas equal).
    """
    values: dict[tuple[int, int], Pieces] = {}
    for i, n in pcg:
        where = f"node {i} ({n.name or n.kind})"
        if n.spec.is_source:
            v = inputs[n.name]
            outs = [dict(v) if isinstance(v, Mapping) else split_value(v, n.outputs[0], rng)]
        else:
            args = [values[(r.node, r.index)] for r in n.inputs]
            shapes = [pcg.shape(r) for r in n.inputs]
            try:
                outs = _parallel(n, args[0], shapes[0]) if n.spec.is_parallel_op else _compute(n, args, shapes)
            except PieceError as e:
                raise PieceError(f"{e} in {where}") from None
        for k, v in enumerate(outs):
            if check:
                check_pieces(v, n.outputs[k], where)
            values[(i, k)] = v
    return [values[(r.node, r.index)] for r in pcg.outputs]


def _parallel(n: Node, x: Pieces, shape: ParallelTensorShape) -> list[Pieces]:
    """A parallel op: re-cut, merge or replicate pieces along one parallel axis."""
    op, kind, r = n.op, n.kind, shape.rank
    d = op.degree
    out: Pieces = {}
    if kind == OpKind.Repartition:
        for c, v in x.items():
            for k, part in enumerate(np.split(v, d, axis=op.dim)):
                out[_with(c, op.dim, c[op.dim] * d + k)] = part
    elif kind == OpKind.Replicate:
        for c, v in x.items():
            for k in range(d):
                out[_with(c, r + 1, c[r + 1] * d + k)] = v
    elif kind == OpKind.Combine and op.dim == REPLICA_DIM:
        for c in coords(n.outputs[0]):
            group = [x[_with(c, r + 1, c[r + 1] * d + k)] for k in range(d)]
            if any(not np.array_equal(g, group[0]) for g in group[1:]):
                raise PieceError(f"Combine of replicas {c} that differ")
            out[c] = group[0]
    elif kind == OpKind.Combine:
        for c in coords(n.outputs[0]):
            out[c] = np.concatenate([x[_with(c, op.dim, c[op.dim] * d + k)] for k in range(d)], axis=op.dim)
    elif kind == OpKind.Reduction:
        axis = r + 1 if reduces_copies(shape) else r
        for c in coords(n.outputs[0]):
            out[c] = sum(x[_with(c, axis, c[axis] * d + k)] for k in range(d))
    else:
        raise NotImplementedError(f"no piece semantics for parallel op {kind}")
    return [out]


def _compute(n: Node, args: Sequence[Pieces], shapes: Sequence[ParallelTensorShape]) -> list[Pieces]:
    """A compute op: run the logical kernel once per output piece on the pieces it reads."""
    reads = task_inputs(n, shapes)
    op = piece_attrs(n)
    outs: list[Pieces] = [{} for _ in n.outputs]
    for t in coords(n.outputs[0]):
        ins = [args[i][reads.coord(i, t)] for i in range(len(shapes))]
        for k, v in enumerate(reference(op, ins, shapes)):
            v = np.asarray(v)
            if v.shape != n.outputs[k].piece.dims:
                raise PieceError(f"{n.kind} made a piece of shape {v.shape}, expected {n.outputs[k].piece.dims}")
            outs[k][t] = v
    return outs
