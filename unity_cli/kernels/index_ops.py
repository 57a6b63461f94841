"""TopK, OneHot, GatherElements and ScatterElements.

GatherElements, ScatterElements and TopK's backward address data by flat position: the
element of index position ``p`` is ``data.flat[t[p]]`` with ``t`` the row-major offset
of ``p`` whose ``axis`` coordinate is replaced by the index. Scatters with repeated
targets are made deterministic (numpy and cupy alike) by sorting the targets: each
write gets its rank among the writes to the same position, and the writes of one rank,
all to distinct positions, are applied together, rank after rank (the row-major order
of indices, which is ONNX's reference order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.opspec import OpKind
from .registry import Array, KernelError, register, scatter_add


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _targets(shape: tuple[int, ...], idx: Array, axis: int, xp: Any) -> Array:
    """Flat offsets into a C-ordered array of ``shape`` of each index position (same shape as idx)."""
    n = shape[axis]
    if idx.size and bool(((idx < -n) | (idx >= n)).any()):
        raise KernelError(f"an index is outside [-{n}, {n}) along axis {axis} of a tensor of shape {list(shape)}")
    local = xp.where(idx < 0, idx + n, idx).astype(xp.int64)
    t = xp.zeros(idx.shape, dtype=xp.int64)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        if d == axis:
            coord = local
        else:
            view = [1] * idx.ndim
            view[d] = idx.shape[d]
            coord = xp.arange(idx.shape[d], dtype=xp.int64).reshape(view)
        t = t + coord * stride
        stride *= shape[d]
    return t


@dataclass(frozen=True, slots=True)
class _Writes:
    """The flat writes ``target[k] <- source[k]`` sorted by target, then by source order."""

    target: Array                  # sorted flat targets
    source: Array                  # flat positions in indices/updates, ascending within a target
    group: Array                   # per write: which distinct target it is (0, 1, ...)
    first: Array                   # per group: where it starts in the sorted writes
    rank: Array                    # per write: how many writes to its target come before it
    last: Array                    # per write: whether it is the last write to its target


def _writes(t: Array, xp: Any) -> _Writes:
    flat = t.reshape(-1)
    m = flat.size
    # Unique keys, so any sort gives the same order.
    key = xp.sort(flat * m + xp.arange(m, dtype=xp.int64))
    target, source = key // m, key % m
    new = xp.ones(m, dtype=bool)
    new[1:] = target[1:] != target[:-1]
    last = xp.ones(m, dtype=bool)
    last[:-1] = new[1:]
    group = xp.cumsum(new) - 1
    first = xp.flatnonzero(new)
    rank = xp.arange(m, dtype=xp.int64) - first[group]
    return _Writes(target, source, group, first, rank, last)


def _apply(out: Array, w: _Writes, v: Array, fn: Any) -> Array:
    """``out[target] = fn(out[target], v)`` write by write, in order; ``out`` is flat and
    owned, ``v`` holds one value per sorted write."""
    for r in range(int(w.rank.max()) + 1 if w.rank.size else 0):
        sel = w.rank == r
        tr = w.target[sel]
        out[tr] = fn(out[tr], v[sel])
    return out


# ---------------------------------------------------------------------------
# TopK


def topk_forward(op, xs, xp):
    x = xs[0]
    a, n = op.axis, x.shape[op.axis]
    stable = {"kind": "stable"} if xp.__name__ == "numpy" else {}  # cupy's sorts are always stable
    if op.largest:
        # Descending with ties to the lower index: a stable ascending sort of the
        # reversed axis, reversed back.
        order = n - 1 - xp.flip(xp.argsort(xp.flip(x, axis=a), axis=a, **stable), axis=a)
    else:
        order = xp.argsort(x, axis=a, **stable)
    idx = xp.take(order, xp.arange(op.k), axis=a).astype(xp.int64)
    values = xp.take_along_axis(x, idx, axis=a)
    return [values, idx], (x.shape, idx)


def topk_backward(op, ctx, gs, xp):
    shape, idx = ctx
    g = gs[0]
    gx = xp.zeros(_numel(shape), dtype=g.dtype)
    gx[_targets(shape, idx, op.axis, xp).reshape(-1)] = g.reshape(-1)  # distinct per row
    return [gx.reshape(shape)]


# ---------------------------------------------------------------------------
# OneHot


def onehot_forward(op, xs, xp):
    idx, values = xs
    if idx.dtype.kind == "f":
        idx = xp.trunc(idx)
    idx = idx.astype(xp.int64)
    idx = xp.where(idx < 0, idx + op.depth, idx)  # out of range stays out of range: no match below
    view = [1] * (idx.ndim + 1)
    view[op.axis] = op.depth
    hit = xp.expand_dims(idx, op.axis) == xp.arange(op.depth, dtype=xp.int64).reshape(view)
    return [xp.where(hit, values[1], values[0]).astype(values.dtype)], hit


def onehot_backward(op, ctx, gs, xp):
    hit = ctx
    g = gs[0]
    on = (g * hit).sum()
    return [None, xp.stack([g.sum() - on, on])]


# ---------------------------------------------------------------------------
# GatherElements


def gather_elements_forward(op, xs, xp):
    data, idx = xs
    t = _targets(data.shape, idx, op.axis, xp)
    return [data.reshape(-1)[t]], (data.shape, t)


def gather_elements_backward(op, ctx, gs, xp):
    shape, t = ctx
    g = gs[0]
    gd = xp.zeros(_numel(shape), dtype=g.dtype)
    scatter_add(gd, t.reshape(-1), g.reshape(-1), xp)
    return [gd.reshape(shape), None]


# ---------------------------------------------------------------------------
# ScatterElements


def scatter_elements_forward(op, xs, xp):
    data, idx, upd = xs
    t = _targets(data.shape, idx, op.axis, xp)
    w = _writes(t, xp)
    out = data.reshape(-1).copy()
    v = upd.reshape(-1)[w.source]
    match op.reduction:
        case "none":
            out[w.target[w.last]] = v[w.last]
        case "add" if xp.__name__ == "numpy" or (out.dtype.kind == "f" and out.dtype.itemsize >= 4):
            scatter_add(out, t.reshape(-1), upd.reshape(-1), xp)
        case "add":  # cupy's atomic scatter_add takes no int64 (nor int8/16, bool)
            out = _apply(out, w, v, xp.add)
        case "mul":
            out = _apply(out, w, v, xp.multiply)
        case "max":
            out = _apply(out, w, v, xp.maximum)
        case "min":
            out = _apply(out, w, v, xp.minimum)
        case _:
            raise KernelError(f"ScatterElements: unknown reduction {op.reduction!r}")
    out = out.reshape(data.shape)
    return [out], (data, upd, w, out)


def scatter_elements_backward(op, ctx, gs, xp):
    data, upd, w, out = ctx
    g = gs[0].reshape(-1)
    n = g.size
    g_at = g[w.target]                     # the output gradient where each (sorted) write landed
    gu_sorted = xp.zeros(w.target.size, dtype=g.dtype)
    match op.reduction:
        case "none":
            gd = g.copy()
            gd[w.target] = 0
            gu_sorted = xp.where(w.last, g_at, gu_sorted)
        case "add":
            gd = g
            gu_sorted = g_at
        case "mul":
            u = upd.reshape(-1)[w.source]
            zero = u == 0
            # Per target: the product of its nonzero updates and how many are zero, so
            # that "the product of the others" needs no division by zero.
            nz = _apply(xp.ones(n, dtype=g.dtype), w, xp.where(zero, 1, u), xp.multiply)
            zeros = xp.zeros(n, dtype=g.dtype)          # counts, exact in floats (cupy adds no int64)
            scatter_add(zeros, w.target, zero.astype(g.dtype), xp)
            whole = xp.where(zeros > 0, 0, nz)          # prod of all updates at each position
            gd = g * whole
            z_at, nz_at = zeros[w.target], nz[w.target]
            others = xp.where(zero, xp.where(z_at == 1, nz_at, 0),
                              xp.where(z_at == 0, nz_at / xp.where(zero, 1, u), 0))
            gu_sorted = g_at * data.reshape(-1)[w.target] * others
        case "max" | "min":
            d, o = data.reshape(-1), out.reshape(-1)
            data_wins = d == o                          # untouched positions too
            gd = xp.where(data_wins, g, 0)
            cand = (upd.reshape(-1)[w.source] == o[w.target]) & ~data_wins[w.target]
            seen = xp.cumsum(cand)
            before = seen[w.first] - cand[w.first]      # candidates of earlier groups
            first_win = cand & (seen - before[w.group] == 1)
            gu_sorted = xp.where(first_win, g_at, gu_sorted)
        case _:
            raise KernelError(f"ScatterElements: unknown reduction {op.reduction!r}")
    gu = xp.zeros(w.source.size, dtype=g.dtype)
    gu[w.source] = gu_sorted
    return [gd.reshape(data.shape), None, gu.reshape(upd.shape)]


register(OpKind.TopK, topk_forward, topk_backward)
register(OpKind.OneHot, onehot_forward, onehot_backward)
register(OpKind.GatherElements, gather_elements_forward, gather_elements_backward)
register(OpKind.ScatterElements, scatter_elements_forward, scatter_elements_backward)
