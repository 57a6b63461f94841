"""Array ops that rearrange or accumulate a tensor along some dims: Pad, Tile, Trilu, CumSum.

Each treats a few dims as a whole (the padded ones, the repeated ones, the matrix dims
of Trilu, the scanned axis of CumSum) and maps every other dim straight through, so
those may be split. Their constant operands (pads, repeats, k, axis) become attributes
at import. All four are linear in their data input, except Pad with a nonzero fill
value, so partial sums pass through them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ModelError, ShapeError
from ..dtypes import DType
from ..kernel import Kernel, scatter_add
from ..opspec import WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Role, Saved, register
from ..shapes import TensorShape
from .common import need_inputs, norm_axes, norm_axis, streaming_cost

PAD_MODES = ("constant", "reflect", "edge", "wrap")


@dataclass(frozen=True, slots=True)
class PadAttrs:
    """Per input dim ``(begin, end)`` elements added (negative: cropped), and how to fill them.

    ``mode`` is one of :data:`PAD_MODES`; ``value`` fills the new elements in constant mode.
    Non-constant modes crop first, then pad from the cropped tensor's edges.
    """

    mode: str
    pads: tuple[tuple[int, int], ...]
    value: float = 0.0


@dataclass(frozen=True, slots=True)
class TileAttrs:
    """How many times the input repeats along each dim."""

    repeats: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TriluAttrs:
    """Keep the upper (``j - i >= k``) or lower (``j - i <= k``) triangle of the last two dims."""

    upper: bool = True
    k: int = 0


@dataclass(frozen=True, slots=True)
class CumSumAttrs:
    """Running sum along ``axis``; ``exclusive`` leaves out the current element, ``reverse``
    sums from the end."""

    axis: int
    exclusive: bool = False
    reverse: bool = False


def _copy_cost(inputs: Sequence[TensorShape], outputs: Sequence[TensorShape], bwd_flops: float = 0.0) -> OpCost:
    moved = float(sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs))
    return OpCost(0.0, moved, bwd_flops, moved, 1)


def _ints(values) -> list[int]:
    return [int(v) for v in values.reshape(-1)]


def _scalar(node, i: int, what: str) -> int:
    v = node.const_input(i, what)
    if v.size != 1:
        raise ModelError(f"input {i} ({what}) must be a scalar, got shape {list(v.shape)}")
    return int(v.reshape(-1)[0])


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Kernels of Pad, Tile, Trilu and CumSum.
# The dims these ops rearrange are whole on every piece (their roles require it), so each
# kernel reads the sizes it needs from its arrays and the attrs' relative amounts (pads,
# repeats, k) hold on pieces unchanged.


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


@register
class Pad(OpSpec):
    """``Pad``: exporters emit it around convolutions and before Swin's windowing."""

    kind = OpKind.Pad
    kernel = Kernel(pad_forward, pad_backward)
    verifier = Opaque("no axioms yet")
    attrs_type = PadAttrs
    onnx_ops = ("Pad",)

    def saved(self, attrs, inputs, outputs):
        """Constant mode keeps nothing; the others each padded dim's source indices."""
        if attrs.mode == "constant":
            return Saved()
        return Saved(extra=tuple(TensorShape((outputs[0].dims[d],), DType.INT64)
                                 for d, (b, e) in enumerate(attrs.pads) if b > 0 or e > 0))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        mode = node.attrs.get("mode", "constant")
        if mode not in PAD_MODES:
            raise ModelError(f"unknown pad mode {mode!r} (expected one of {', '.join(PAD_MODES)})")
        if mode == "wrap" and node.opset < 19:
            raise ModelError(f"pad mode 'wrap' needs opset 19, the model has opset {node.opset}")
        if node.opset < 11:
            raw = [int(p) for p in node.attrs.get("pads", node.attrs.get("paddings", []))]
            value = float(node.attrs.get("value", 0.0))
            axes = list(range(rank))
        else:
            raw = _ints(node.const_input(1, "pads"))
            value = 0.0
            if node.has_input(2):
                v = node.const_input(2, "constant_value")
                if v.size != 1:
                    raise ModelError(f"input 2 (constant_value) must be one value, got shape {list(v.shape)}")
                value = float(v.reshape(-1)[0])
            if node.opset >= 18 and node.has_input(3):
                raw_axes = _ints(node.const_input(3, "axes"))
                try:
                    norm_axes("Pad", raw_axes, rank)  # in range and not repeated
                except ShapeError as e:
                    raise ModelError(str(e)) from None
                axes = [a % rank for a in raw_axes]  # in the model's order: pads pair with them
            else:
                axes = list(range(rank))
        if len(raw) != 2 * len(axes):
            raise ModelError(f"pads has {len(raw)} values for {len(axes)} axes (needs {2 * len(axes)})")
        pads = [(0, 0)] * rank
        for k, a in enumerate(axes):
            pads[a] = (raw[k], raw[k + len(axes)])
        return Imported(PadAttrs(mode, tuple(pads), value), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if attrs.mode not in PAD_MODES:
            raise ShapeError(f"Pad: unknown mode {attrs.mode!r}")
        if len(attrs.pads) != x.rank:
            raise ShapeError(f"Pad has {len(attrs.pads)} (begin, end) pairs for a rank-{x.rank} input")
        dims = []
        for d, (n, (b, e)) in enumerate(zip(x.dims, attrs.pads, strict=True)):
            if n + min(b, 0) + min(e, 0) < 1:
                raise ShapeError(f"Pad {list(attrs.pads[d])} crops away all of dim {d} (size {n})")
            dims.append(n + b + e)
        return (TensorShape(tuple(dims), x.dtype),)

    def roles(self, attrs, inputs):
        return (tuple(WHOLE if p != (0, 0) else d for d, p in enumerate(attrs.pads)),)

    def terms(self, attrs, n):
        # Padding with a nonzero constant adds it to every partial sum: not linear.
        return () if attrs.mode == "constant" and attrs.value != 0 else ((0,),)

    def cost(self, attrs, inputs, outputs):
        # Non-constant modes scatter-add the gradient back to the source positions.
        return _copy_cost(inputs, outputs, 0.0 if attrs.mode == "constant" else float(outputs[0].numel))


@register
class Tile(OpSpec):
    kind = OpKind.Tile
    kernel = Kernel(tile_forward, tile_backward)
    verifier = Opaque("no axioms yet")
    attrs_type = TileAttrs
    onnx_ops = ("Tile",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        if node.opset < 6:
            raise ModelError(f"Tile before opset 6 (tiles and axis inputs) is not supported, the model has "
                             f"opset {node.opset}")
        repeats = _ints(node.const_input(1, "repeats"))
        if len(repeats) != rank:
            raise ModelError(f"repeats has {len(repeats)} values for a rank-{rank} input")
        if any(r < 1 for r in repeats):
            raise ModelError(f"repeats {repeats} must all be >= 1")
        return Imported(TileAttrs(tuple(repeats)), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if len(attrs.repeats) != x.rank or any(r < 1 for r in attrs.repeats):
            raise ShapeError(f"Tile repeats {list(attrs.repeats)} do not fit a rank-{x.rank} input")
        return (TensorShape(tuple(n * r for n, r in zip(x.dims, attrs.repeats, strict=True)), x.dtype),)

    def roles(self, attrs, inputs):
        # A piece of a repeated dim tiled would not be a piece of the tiled dim.
        return (tuple(d if r == 1 else WHOLE for d, r in enumerate(attrs.repeats)),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        # Backward sums the gradient over the tiles.
        return _copy_cost(inputs, outputs, float(outputs[0].numel))


@register
class Trilu(OpSpec):
    kind = OpKind.Trilu
    kernel = Kernel(trilu_forward, trilu_backward)
    verifier = Opaque("a triangular mask: no axioms yet")
    attrs_type = TriluAttrs
    onnx_ops = ("Trilu",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        k = _scalar(node, 1, "k") if node.has_input(1) else 0
        return Imported(TriluAttrs(bool(node.attrs.get("upper", 1)), k), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if x.rank < 2:
            raise ShapeError(f"Trilu needs a rank >= 2 input, got {list(x.dims)}")
        return (x,)

    def roles(self, attrs, inputs):
        r = inputs[0].rank
        return (tuple(range(r - 2)) + (WHOLE, WHOLE),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs)


@register
class CumSum(OpSpec):
    kind = OpKind.CumSum
    kernel = Kernel(cumsum_forward, cumsum_backward)
    verifier = Opaque("a scan along a dim: no axioms yet")
    attrs_type = CumSumAttrs
    onnx_ops = ("CumSum",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        try:
            axis = norm_axis("CumSum", _scalar(node, 1, "axis"), rank)
        except ShapeError as e:
            raise ModelError(str(e)) from None
        return Imported(CumSumAttrs(axis, bool(node.attrs.get("exclusive", 0)),
                                    bool(node.attrs.get("reverse", 0))), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if not 0 <= attrs.axis < x.rank:
            raise ShapeError(f"CumSum: axis {attrs.axis} is out of range for rank {x.rank}")
        return (x,)

    def roles(self, attrs, inputs):
        roles: list[Role] = [d if d != attrs.axis else WHOLE for d in range(inputs[0].rank)]
        return (tuple(roles),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs)
