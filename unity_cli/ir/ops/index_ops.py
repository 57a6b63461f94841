"""Index-driven ops: TopK, OneHot, GatherElements and ScatterElements.

Each reads or writes positions along one axis that its data decide, so that axis stays
whole; every other dim is independent (an element of the output depends only on the
inputs at the same coordinate there) and may be split, provided all the inputs that
share it have the same size along it (GatherElements' and ScatterElements' indices may
be smaller than their data: then the dim's shards would not line up).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ModelError, ShapeError
from ..dtypes import DType
from ..kernel import Array, Kernel, KernelError, scatter_add
from ..opspec import WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Role, Saved, register
from ..shapes import TensorShape
from .common import need_inputs, norm_axis

INDEX_DTYPES = (DType.INT64, DType.INT32)
SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


@dataclass(frozen=True, slots=True)
class TopKAttrs:
    """The ``k`` largest (or smallest) entries along ``axis``, values then int64 indices."""

    k: int
    axis: int
    largest: bool = True
    sorted: bool = True


@dataclass(frozen=True, slots=True)
class OneHotAttrs:
    """Output ``on`` where the new ``axis`` (of the output, non-negative) equals the index, else ``off``."""

    depth: int
    axis: int


@dataclass(frozen=True, slots=True)
class GatherElementsAttrs:
    axis: int


@dataclass(frozen=True, slots=True)
class ScatterElementsAttrs:
    axis: int
    reduction: str = "none"        # one of SCATTER_REDUCTIONS


def _index_dtype(kind: str, what: str, shape: TensorShape) -> None:
    if shape.dtype not in INDEX_DTYPES:
        raise ShapeError(f"{kind} {what} must be int32 or int64, got {shape.dtype.value}")


def _elementwise_roles(axis: int, shapes: Sequence[TensorShape]) -> tuple[tuple[Role, ...], ...]:
    """The axis whole; dim ``d`` maps to output dim ``d`` where all ``shapes`` agree in size."""
    rank = shapes[0].rank
    same = [d != axis and len({s.dims[d] for s in shapes}) == 1 for d in range(rank)]
    row = tuple(d if same[d] else WHOLE for d in range(rank))
    return (row,) * len(shapes)


def _check_elements(kind: str, axis: int, data: TensorShape, idx: TensorShape) -> None:
    """``indices`` has ``data``'s rank and fits inside it off the axis (GatherElements, ScatterElements)."""
    _index_dtype(kind, "indices", idx)
    if idx.rank != data.rank:
        raise ShapeError(f"{kind}: indices {list(idx.dims)} and data {list(data.dims)} differ in rank")
    if not 0 <= axis < max(data.rank, 1):
        raise ShapeError(f"{kind}: axis {axis} is out of range for rank {data.rank}")
    if any(i > n for d, (i, n) in enumerate(zip(idx.dims, data.dims, strict=True)) if d != axis):
        raise ShapeError(f"{kind}: indices {list(idx.dims)} are larger than data {list(data.dims)} "
                         f"off axis {axis}")


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# TopK, OneHot, GatherElements and ScatterElements.
# GatherElements, ScatterElements and TopK's backward address data by flat position: the
# element of index position ``p`` is ``data.flat[t[p]]`` with ``t`` the row-major offset
# of ``p`` whose ``axis`` coordinate is replaced by the index. Scatters with repeated
# targets are made deterministic (numpy and cupy alike) by sorting the targets: each
# write gets its rank among the writes to the same position, and the writes of one rank,
# all to distinct positions, are applied together, rank after rank (the row-major order
# of indices, which is ONNX's reference order).


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
    start: Array                   # per write: where the writes to its target start
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
    start = xp.flatnonzero(new)[xp.cumsum(new) - 1]
    return _Writes(target, source, start, xp.arange(m, dtype=xp.int64) - start, last)


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
            before = seen[w.start] - cand[w.start]      # candidates of earlier targets
            first_win = cand & (seen - before == 1)
            gu_sorted = xp.where(first_win, g_at, gu_sorted)
        case _:
            raise KernelError(f"ScatterElements: unknown reduction {op.reduction!r}")
    gu = xp.zeros(w.source.size, dtype=g.dtype)
    gu[w.source] = gu_sorted
    return [gd.reshape(data.shape), None, gu.reshape(upd.shape)]


@register
class TopK(OpSpec):
    """``TopK``: Mixture-of-Experts routers pick their experts with it (a small ``k``).

    Ties go to the lower index first, as ONNX says. ``sorted=0`` allows any order; the
    kernel returns sorted order anyway. The gradient of the values goes back to the
    positions the indices name; the indices are not differentiable.
    """

    kind = OpKind.TopK
    kernel = Kernel(topk_forward, topk_backward)
    verifier = Opaque("a sort, with integer indices as its second output: no axioms yet")
    attrs_type = TopKAttrs
    onnx_ops = ("TopK",)

    def saved(self, attrs, inputs, outputs):
        """The indices output."""
        return Saved((), (1,))

    def from_onnx(self, node) -> Imported:
        a = node.attrs
        rank = node.inputs[0].shape.rank
        if node.opset >= 10:
            kv = node.const_input(1, "K").reshape(-1)
            if kv.size != 1:
                raise ModelError(f"input 1 (K) must hold one value, got {kv.size}")
            k = int(kv[0])
        elif "k" in a:
            k = int(a["k"])
        else:
            raise ModelError("attribute k is required (opset < 10)")
        axis = norm_axis("TopK", int(a.get("axis", -1)), rank)
        return Imported(TopKAttrs(k, axis, bool(a.get("largest", 1)), bool(a.get("sorted", 1))), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if not 0 <= attrs.axis < x.rank:
            raise ShapeError(f"TopK: axis {attrs.axis} is out of range for rank {x.rank}")
        n = x.dims[attrs.axis]
        if not 0 <= attrs.k <= n:
            raise ShapeError(f"TopK: k={attrs.k} is not in [0, {n}] (dim {attrs.axis} of {list(x.dims)})")
        dims = x.dims[:attrs.axis] + (attrs.k,) + x.dims[attrs.axis + 1:]
        return (TensorShape(dims, x.dtype), TensorShape(dims, DType.INT64))

    def roles(self, attrs, inputs):
        return (tuple(WHOLE if d == attrs.axis else d for d in range(inputs[0].rank)),)

    def cost(self, attrs, inputs, outputs):
        x = inputs[0]
        # A selection keeps a k-entry heap per row: about n log2(k) comparisons.
        flops = float(x.numel) * max(math.log2(max(attrs.k, 1)), 1.0)
        moved = float(x.nbytes + sum(o.nbytes for o in outputs))
        # Backward scatters the values' gradient into a zeroed input gradient.
        back = float(x.nbytes + outputs[0].nbytes + outputs[1].nbytes)
        return OpCost(flops, moved, float(outputs[0].numel), back)


@register
class OneHot(OpSpec):
    """``OneHot``: depth is read at import; ``values = [off, on]`` stays a tensor input.

    The importer makes a float ``[off, on]`` initializer a trainable weight, so values
    is an input like any other: the output is linear in it, and its gradient is the
    output gradient summed where the output is off and where it is on. The indices are
    not differentiable. A negative index counts from the end (index + depth); one
    outside ``[-depth, depth)`` gives a row that is all ``off``; float indices are
    truncated. The new axis belongs to no input, so it stays whole.
    """

    kind = OpKind.OneHot
    kernel = Kernel(onehot_forward, onehot_backward)
    verifier = Opaque("integer indices to a one-hot tensor: no axioms yet")
    attrs_type = OneHotAttrs
    onnx_ops = ("OneHot",)

    def saved(self, attrs, inputs, outputs):
        """Where each output is on."""
        return Saved(extra=(TensorShape(outputs[0].dims, DType.BOOL),))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        dv = node.const_input(1, "depth").reshape(-1)
        if dv.size != 1:
            raise ModelError(f"input 1 (depth) must hold one value, got {dv.size}")
        depth = int(dv[0])
        if depth < 1:
            raise ModelError(f"depth must be at least 1, got {depth}")
        axis = norm_axis("OneHot", int(node.attrs.get("axis", -1)), rank + 1)
        return Imported(OneHotAttrs(depth, axis), (0, 2))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        idx, values = inputs
        if not 0 <= attrs.axis <= idx.rank:
            raise ShapeError(f"OneHot: axis {attrs.axis} is out of range for an output of rank {idx.rank + 1}")
        if idx.dtype is DType.BOOL:
            raise ShapeError("OneHot indices must be numbers, not bool")
        if values.numel != 2 or values.rank != 1:
            raise ShapeError(f"OneHot values must be [off, on], got a tensor of shape {list(values.dims)}")
        dims = idx.dims[:attrs.axis] + (attrs.depth,) + idx.dims[attrs.axis:]
        return (TensorShape(dims, values.dtype),)

    def roles(self, attrs, inputs):
        return (tuple(d if d < attrs.axis else d + 1 for d in range(inputs[0].rank)), (WHOLE,))

    def terms(self, attrs, n):
        return ((1,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(inputs[0].nbytes + outputs[0].nbytes)
        # Backward sums the output gradient into two values.
        return OpCost(float(outputs[0].numel), moved, 2.0 * outputs[0].numel, float(outputs[0].nbytes))


@register
class GatherElements(OpSpec):
    """``GatherElements``: ``out[p] = data[p with p[axis] = indices[p]]``.

    Negative indices count from the end. Linear in data (partial sums pass through);
    backward scatter-adds the output gradient into data's (repeated indices add up).
    """

    kind = OpKind.GatherElements
    kernel = Kernel(gather_elements_forward, gather_elements_backward)
    verifier = Opaque("an index gather along a dim: no axioms yet (Gather's are written)")
    attrs_type = GatherElementsAttrs
    onnx_ops = ("GatherElements",)

    def saved(self, attrs, inputs, outputs):
        """The flat position each output reads."""
        return Saved(extra=(TensorShape(inputs[1].dims, DType.INT64),))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        return Imported(GatherElementsAttrs(norm_axis("GatherElements", int(node.attrs.get("axis", 0)), rank)),
                        (0, 1))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        data, idx = inputs
        _check_elements(self.kind, attrs.axis, data, idx)
        return (TensorShape(idx.dims, data.dtype),)

    def roles(self, attrs, inputs):
        return _elementwise_roles(attrs.axis, inputs)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(inputs[1].nbytes + 2 * outputs[0].nbytes)
        # Backward zeroes data's gradient and scatter-adds into it.
        back = float(inputs[0].nbytes + inputs[1].nbytes + 2 * outputs[0].nbytes)
        return OpCost(0.0, moved, float(outputs[0].numel), back)


@register
class ScatterElements(OpSpec):
    """``ScatterElements``: a copy of data with ``out[p with p[axis] = indices[p]] (op)= updates[p]``.

    With ``reduction="none"`` a position written twice keeps the last write (in the
    row-major order of indices). Gradients: ``none`` gives data the gradient with the
    written positions zeroed and each update the gradient where it landed (a write
    overwritten later gets zero); ``add`` gives data the gradient and the updates it
    gathered; ``mul`` gives data ``g * prod(updates there)`` and each update ``g *
    data * prod(the other updates there)``; ``max``/``min`` send the gradient to the one
    value that won (data on a tie with an update, else the first winning update).
    Linear in (data, updates) for ``none``/``add``, in data for ``mul``.
    """

    kind = OpKind.ScatterElements
    kernel = Kernel(scatter_elements_forward, scatter_elements_backward)
    verifier = Opaque("an index scatter: no axioms yet")
    attrs_type = ScatterElementsAttrs
    onnx_ops = ("ScatterElements",)

    def saved(self, attrs, inputs, outputs):
        """The data, the updates, the output and the sorted writes (four ids and a flag each)."""
        m = inputs[1].numel
        return Saved((0, 2), (0,), (TensorShape((4, m), DType.INT64), TensorShape((m,), DType.BOOL)))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        reduction = str(node.attrs.get("reduction", "none"))
        if reduction not in SCATTER_REDUCTIONS:
            raise ModelError(f"unknown reduction {reduction!r} (expected one of {', '.join(SCATTER_REDUCTIONS)})")
        axis = norm_axis("ScatterElements", int(node.attrs.get("axis", 0)), rank)
        return Imported(ScatterElementsAttrs(axis, reduction), (0, 1, 2))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 3)
        data, idx, upd = inputs
        if attrs.reduction not in SCATTER_REDUCTIONS:
            raise ShapeError(f"ScatterElements: unknown reduction {attrs.reduction!r}")
        _check_elements(self.kind, attrs.axis, data, idx)
        if upd.dims != idx.dims:
            raise ShapeError(f"ScatterElements: updates {list(upd.dims)} and indices {list(idx.dims)} differ in shape")
        if upd.dtype != data.dtype:
            raise ShapeError(f"ScatterElements: updates are {upd.dtype.value} but data is {data.dtype.value}")
        return (data,)

    def roles(self, attrs, inputs):
        return _elementwise_roles(attrs.axis, inputs)

    def terms(self, attrs, n):
        if attrs.reduction in ("none", "add"):
            return ((0,), (2,))
        return ((0,),) if attrs.reduction == "mul" else ()

    def cost(self, attrs, inputs, outputs):
        data, idx, upd = inputs
        moved = float(data.nbytes + idx.nbytes + upd.nbytes + outputs[0].nbytes)
        return OpCost(float(upd.numel), moved, float(upd.numel + data.numel), moved + upd.nbytes)
