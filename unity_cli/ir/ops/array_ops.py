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

from ...errors import ModelError, ShapeError
from ..opspec import WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Role, register
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


@register
class Pad(OpSpec):
    """``Pad``: exporters emit it around convolutions and before Swin's windowing."""

    kind = OpKind.Pad
    verifier = Opaque("no axioms yet")
    attrs_type = PadAttrs
    onnx_ops = ("Pad",)

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
    verifier = Opaque("no axioms yet")
    attrs_type = TileAttrs
    onnx_ops = ("Tile",)

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
    verifier = Opaque("a triangular mask: no axioms yet")
    attrs_type = TriluAttrs
    onnx_ops = ("Trilu",)

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
    verifier = Opaque("a scan along a dim: no axioms yet")
    attrs_type = CumSumAttrs
    onnx_ops = ("CumSum",)

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
