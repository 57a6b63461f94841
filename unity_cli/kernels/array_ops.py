"""Kernels of Pad, Tile, Trilu and CumSum.

The dims these ops rearrange are whole on every piece (their roles require it), so each
kernel reads the sizes it needs from its arrays and the attrs' relative amounts (pads,
repeats, k) hold on pieces unchanged.
"""
from __future__ import annotations

import numpy as np

from ..ir.opspec import OpKind
from .registry import register, scatter_add

# ---------------------------------------------------------------------------
# Pad


def _crop(pads, shape) -> tuple[slice, ...]:
    """The part of the input that negative pads leave."""
    return tuple(slice(-min(b, 0), n + min(e, 0)) for n, (b, e) in zip(shape, pads))


def source_index(mode: str, size: int, begin: int, end: int) -> np.ndarray:
    """For each output position of a dim of ``size`` padded by ``begin, end >= 0`` in a
    non-constant mode, the input position it copies (numpy's reflect, edge and wrap)."""
    p = np.arange(-begin, size + end)
    if mode == "edge":
        return np.clip(p, 0, size - 1)
    if mode == "wrap":
        return p % size
    if mode == "reflect":
        if size == 1:
            return np.zeros_like(p)
        period = 2 * (size - 1)
        q = p % period
        return np.where(q < size, q, period - q)
    raise ValueError(f"no source index for pad mode {mode!r}")


def pad_forward(op, xs, xp):
    x = xs[0]
    crop = _crop(op.pads, x.shape)
    if op.mode == "constant":
        out_shape = tuple(n + b + e for n, (b, e) in zip(x.shape, op.pads))
        out = xp.full(out_shape, op.value, dtype=x.dtype)
        kept = x[crop]
        out[tuple(slice(max(b, 0), max(b, 0) + m) for (b, _), m in zip(op.pads, kept.shape))] = kept
        return [out], (x.shape, None)
    y = x[crop]
    gathers = []
    for d, (b, e) in enumerate(op.pads):
        if b > 0 or e > 0:
            idx = source_index(op.mode, y.shape[d], max(b, 0), max(e, 0))
            gathers.append((d, y.shape[d], idx))
            y = xp.take(y, xp.asarray(idx), axis=d)
    return [y], (x.shape, gathers)


def pad_backward(op, ctx, gs, xp):
    shape, gathers = ctx
    g = gs[0]
    gx = xp.zeros(shape, dtype=g.dtype)
    crop = _crop(op.pads, shape)
    if gathers is None:
        # Constant mode: the gradient is the slice of g over the kept input (zeros where cropped).
        kept = gx[crop].shape
        gx[crop] = g[tuple(slice(max(b, 0), max(b, 0) + m) for (b, _), m in zip(op.pads, kept))]
        return [gx]
    for d, size, idx in reversed(gathers):
        gt = xp.moveaxis(g, d, 0)
        acc = xp.zeros((size,) + gt.shape[1:], dtype=g.dtype)
        scatter_add(acc, xp.asarray(idx), gt, xp)
        g = xp.moveaxis(acc, 0, d)
    gx[crop] = g
    return [gx]


# ---------------------------------------------------------------------------
# Tile


def tile_forward(op, xs, xp):
    x = xs[0]
    return [xp.tile(x, op.repeats)], x.shape


def tile_backward(op, ctx, gs, xp):
    # Output dim d of size r*n is r tiles of n: sum over the tile index.
    split = tuple(v for r, n in zip(op.repeats, ctx) for v in (r, n))
    return [gs[0].reshape(split).sum(axis=tuple(range(0, len(split), 2)))]


# ---------------------------------------------------------------------------
# Trilu


def _triangle(op, shape, xp):
    """The mask of the kept triangle of the last two dims (broadcasts over the batch)."""
    rows, cols = shape[-2], shape[-1]
    diff = xp.arange(cols)[None, :] - xp.arange(rows)[:, None]
    return diff >= op.k if op.upper else diff <= op.k


def trilu_forward(op, xs, xp):
    x = xs[0]
    mask = _triangle(op, x.shape, xp)
    return [xp.where(mask, x, xp.zeros((), dtype=x.dtype))], None


def trilu_backward(op, ctx, gs, xp):
    g = gs[0]
    return [xp.where(_triangle(op, g.shape, xp), g, xp.zeros((), dtype=g.dtype))]


# ---------------------------------------------------------------------------
# CumSum


def cumsum(x, axis: int, exclusive: bool, reverse: bool, xp):
    """ONNX CumSum: the running sum along ``axis``, from the end if ``reverse``, leaving
    out the current element if ``exclusive`` (a shift, so integers stay exact)."""
    if reverse:
        x = xp.flip(x, axis)
    c = xp.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        head = [slice(None)] * x.ndim
        head[axis] = slice(0, x.shape[axis] - 1)
        zero_shape = x.shape[:axis] + (1,) + x.shape[axis + 1:]
        c = xp.concatenate([xp.zeros(zero_shape, dtype=c.dtype), c[tuple(head)]], axis=axis)
    if reverse:
        c = xp.flip(c, axis)
    return xp.ascontiguousarray(c)


def cumsum_forward(op, xs, xp):
    return [cumsum(xs[0], op.axis, op.exclusive, op.reverse, xp)], None


def cumsum_backward(op, ctx, gs, xp):
    # y_j sums x_i over i <= j (< j if exclusive): x_i's gradient sums g_j over j >= i
    # (> i): the same scan in the other direction.
    return [cumsum(gs[0], op.axis, op.exclusive, not op.reverse, xp)]


register(OpKind.Pad, pad_forward, pad_backward)
register(OpKind.Tile, tile_forward, tile_backward)
register(OpKind.Trilu, trilu_forward, trilu_backward)
register(OpKind.CumSum, cumsum_forward, cumsum_backward)
