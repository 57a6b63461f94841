"""Data-movement kernels: Transpose, Reshape, Concat, Split, Slice, Expand.

On a piece, Reshape and Expand get attrs whose ``dims`` are the piece's shape (the
executor rewrites them), and the ranges of a Slice over a split dim are whole (its role
requires it), so every kernel here reads only the shapes of its arrays.
"""
from __future__ import annotations

import itertools

from ..ir.opspec import OpKind
from .registry import register, unbroadcast


def transpose_forward(op, xs, xp):
    return [xp.transpose(xs[0], op.perm)], None


def transpose_backward(op, ctx, gs, xp):
    inv = [0] * len(op.perm)
    for j, p in enumerate(op.perm):
        inv[p] = j
    return [xp.transpose(gs[0], inv)]


def reshape_forward(op, xs, xp):
    x = xs[0]
    return [x.reshape(op.dims)], x.shape


def reshape_backward(op, ctx, gs, xp):
    return [gs[0].reshape(ctx)]


def concat_forward(op, xs, xp):
    return [xp.concatenate(list(xs), axis=op.axis)], [x.shape[op.axis] for x in xs]


def concat_backward(op, ctx, gs, xp):
    return _split(gs[0], ctx, op.axis, xp)


def _split(x, sizes, axis, xp):
    bounds = list(itertools.accumulate(sizes))
    return xp.split(x, bounds[:-1], axis=axis)


def split_forward(op, xs, xp):
    return _split(xs[0], op.sizes, op.axis, xp), None


def split_backward(op, ctx, gs, xp):
    return [xp.concatenate(list(gs), axis=op.axis)]


def _slices(ranges):
    """Python slices for ``slice.indices()`` triples, whose stop of -1 with a negative
    step means "through index 0" (and whose start of -1 then means "empty")."""
    return tuple(slice(a, b if b >= 0 else None, s) if len(range(a, b, s)) else slice(0, 0)
                 for a, b, s in ranges)


def slice_forward(op, xs, xp):
    x = xs[0]
    return [x[_slices(op.ranges)]], x.shape


def slice_backward(op, ctx, gs, xp):
    g = gs[0]
    gx = xp.zeros(ctx, dtype=g.dtype)
    gx[_slices(op.ranges)] = g
    return [gx]


def expand_forward(op, xs, xp):
    x = xs[0]
    # A real array rather than broadcast_to's read-only view with zero strides.
    return [xp.ascontiguousarray(xp.broadcast_to(x, op.dims))], x.shape


def expand_backward(op, ctx, gs, xp):
    return [unbroadcast(gs[0], ctx, xp)]


register(OpKind.Transpose, transpose_forward, transpose_backward)
register(OpKind.Reshape, reshape_forward, reshape_backward)
register(OpKind.Concat, concat_forward, concat_backward)
register(OpKind.Split, split_forward, split_backward)
register(OpKind.Slice, slice_forward, slice_backward)
register(OpKind.Expand, expand_forward, expand_backward)
