"""Gather, GatherND and the reductions.

Gather and GatherND take negative indices as ONNX does (counted from the end). Beyond
ONNX, a Gather index outside ``[-n, n)`` yields zeros (and no gradient): a piece of an
embedding table split by rows looks up only the ids in its range, so the executor can
pass each piece its shifted ids with those of other pieces mapped out of range.
Backward scatters-adds into the table; indices get None.
"""
from __future__ import annotations

from ..ir.opspec import OpKind
from .registry import first_extremum, register, scatter_add


def gather_forward(op, xs, xp):
    data, idx = xs
    n = data.shape[op.axis]
    valid = (idx >= -n) & (idx < n)
    local = xp.where(valid, idx, 0)
    local = xp.where(local < 0, local + n, local)
    y = xp.take(data, local, axis=op.axis)
    if not bool(valid.all()):
        shape = (1,) * op.axis + valid.shape + (1,) * (data.ndim - op.axis - 1)
        y = y * valid.reshape(shape).astype(y.dtype)
    return [y], (data.shape, local, valid)


def gather_backward(op, ctx, gs, xp):
    shape, local, valid = ctx
    g = gs[0]
    a, r = op.axis, local.ndim
    # Bring the index dims to the front: g_t[i, prefix..., suffix...] is row local[i]'s gradient.
    g_t = xp.moveaxis(g, tuple(range(a, a + r)), tuple(range(r)))
    g_t = g_t.reshape((local.size,) + shape[:a] + shape[a + 1:])
    keep = valid.reshape(-1)
    gd = xp.zeros((shape[a],) + shape[:a] + shape[a + 1:], dtype=g.dtype)
    scatter_add(gd, local.reshape(-1)[keep], g_t[keep], xp)
    return [xp.moveaxis(gd, 0, a), None]


def _gathernd_index(data_shape, idx, b, xp):
    """The advanced index into ``data.reshape((B,) + data_shape[b:])`` that GatherND reads."""
    k = idx.shape[-1]
    batch = 1
    for d in data_shape[:b]:
        batch *= d
    flat = idx.reshape((batch, -1, k))
    m = flat.shape[1]
    rows = xp.broadcast_to(xp.arange(batch)[:, None], (batch, m))
    cols = tuple(flat[..., j] % data_shape[b + j] for j in range(k))  # negative indices count from the end
    return (batch,) + tuple(data_shape[b:]), (rows,) + cols


def gathernd_forward(op, xs, xp):
    data, idx = xs
    b = op.batch_dims
    k = idx.shape[-1]
    flat_shape, index = _gathernd_index(data.shape, idx, b, xp)
    y = data.reshape(flat_shape)[index]
    return [y.reshape(idx.shape[:-1] + data.shape[b + k:])], (data.shape, idx)


def gathernd_backward(op, ctx, gs, xp):
    shape, idx = ctx
    b, k = op.batch_dims, idx.shape[-1]
    flat_shape, index = _gathernd_index(shape, idx, b, xp)
    g = gs[0].reshape(index[0].shape + tuple(shape[b + k:]))
    gd = xp.zeros(flat_shape, dtype=g.dtype)
    scatter_add(gd, index, g, xp)
    return [gd.reshape(shape), None]


def reduce_forward(op, xs, xp):
    x = xs[0]
    axes = tuple(sorted(a % x.ndim for a in op.axes)) if x.ndim else ()
    if not axes:
        return [x], (x, axes, x)
    match op.mode:
        case "sum":
            y = x.sum(axis=axes, keepdims=True)
        case "mean":
            y = x.mean(axis=axes, keepdims=True).astype(x.dtype)
        case "max":
            y = x.max(axis=axes, keepdims=True)
        case "min":
            y = x.min(axis=axes, keepdims=True)
        case _:
            raise AssertionError(op.mode)
    out = y if op.keepdims else y.reshape(tuple(s for d, s in enumerate(x.shape) if d not in axes))
    return [out], (x, axes, y)


def reduce_backward(op, ctx, gs, xp):
    x, axes, y = ctx
    if not axes:
        return [gs[0]]
    g = gs[0].reshape(y.shape)  # back to keepdims form
    if op.mode == "sum":
        return [xp.broadcast_to(g, x.shape).copy()]
    if op.mode == "mean":
        count = 1
        for a in axes:
            count *= x.shape[a]
        return [xp.broadcast_to(g / count, x.shape).copy()]
    return [g * first_extremum(x, y, axes, xp)]


register(OpKind.Gather, gather_forward, gather_backward)
register(OpKind.GatherND, gathernd_forward, gathernd_backward)
register(OpKind.Reduce, reduce_forward, reduce_backward)
