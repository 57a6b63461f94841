"""Gather (embedding lookup) and reductions.

Splitting an embedding table by rows (``Gather`` axis 0) makes each piece look up only
the ids in its range and leave zeros elsewhere, so the output holds partial sums: the
"partition an embedding table" parallelization.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import ShapeError
from ..dtypes import DType
from ..opspec import SUM, WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, register
from ..shapes import TensorShape
from .common import need_inputs, norm_axes, norm_axis, streaming_cost


@dataclass(frozen=True, slots=True)
class GatherAttrs:
    axis: int


@dataclass(frozen=True, slots=True)
class ReduceAttrs:
    mode: str                      # "sum" | "mean" | "max" | "min"
    axes: tuple[int, ...]
    keepdims: bool = True


REDUCE_MODES = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}


@register
class Gather(OpSpec):
    kind = OpKind.Gather
    attrs_type = GatherAttrs
    onnx_ops = ("Gather",)
    weight_inputs = (0,)

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        return Imported(GatherAttrs(norm_axis("Gather", int(node.attrs.get("axis", 0)), rank)), (0, 1))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        data, idx = inputs
        if idx.dtype not in (DType.INT64, DType.INT32):
            raise ShapeError(f"Gather indices must be integers, got {idx.dtype.value}")
        a = attrs.axis
        return (TensorShape(data.dims[:a] + idx.dims + data.dims[a + 1:], data.dtype),)

    def roles(self, attrs, inputs):
        data, idx = inputs
        a, r = attrs.axis, idx.rank
        rd = tuple(d if d < a else (SUM if d == a else d + r - 1) for d in range(data.rank))
        if a != 0:
            rd = tuple(WHOLE if x == SUM else x for x in rd)
        return (rd, tuple(range(a, a + r)))

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(inputs[1].nbytes + 2 * outputs[0].nbytes)
        # Backward scatters-adds into the table: a read-modify-write of the rows touched.
        return OpCost(0.0, moved, float(outputs[0].numel), 2 * moved, 1)


@register
class Reduce(OpSpec):
    kind = OpKind.Reduce
    verifier = Opaque("a reduction over some dims: no axioms yet")
    attrs_type = ReduceAttrs
    onnx_ops = tuple(sorted(REDUCE_MODES))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        if not node.axes_raw() and node.attrs.get("noop_with_empty_axes", 0):
            axes: tuple[int, ...] = ()  # no axes + noop_with_empty_axes: the identity
        else:
            axes = node.axes(rank, default=list(range(rank)))
        return Imported(ReduceAttrs(REDUCE_MODES[node.op_type], tuple(axes), bool(node.attrs.get("keepdims", 1))),
                        (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        axes = norm_axes(self.kind, attrs.axes, x.rank)
        if attrs.keepdims:
            dims = tuple(1 if d in axes else s for d, s in enumerate(x.dims))
        else:
            dims = tuple(s for d, s in enumerate(x.dims) if d not in axes)
        return (TensorShape(dims, x.dtype),)

    def roles(self, attrs, inputs):
        x = inputs[0]
        axes = norm_axes(self.kind, attrs.axes, x.rank)
        reduced = SUM if attrs.mode == "sum" else WHOLE
        roles, j = [], 0
        for d in range(x.rank):
            if d in axes:
                roles.append(reduced)
                j += attrs.keepdims
            else:
                roles.append(j)
                j += 1
        return (tuple(roles),)

    def terms(self, attrs, n):
        return ((0,),) if attrs.mode in ("sum", "mean") else ()

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, inputs[0].numel / max(outputs[0].numel, 1))


@dataclass(frozen=True, slots=True)
class GatherNDAttrs:
    batch_dims: int = 0


@register
class GatherND(OpSpec):
    """``GatherND``: exporters emit it to pick the upper triangle of an interaction matrix."""

    kind = OpKind.GatherND
    verifier = Opaque("a multi-dim index gather: no axioms yet")
    attrs_type = GatherNDAttrs
    onnx_ops = ("GatherND",)

    def from_onnx(self, node) -> Imported:
        return Imported(GatherNDAttrs(int(node.attrs.get("batch_dims", 0))), (0, 1))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        data, idx = inputs
        b, k = attrs.batch_dims, idx.dims[-1] if idx.rank else 0
        if idx.rank < 1 or b + k > data.rank or data.dims[:b] != idx.dims[:b]:
            raise ShapeError(f"GatherND of {list(data.dims)} by indices {list(idx.dims)} (batch_dims={b})")
        return (TensorShape(idx.dims[:-1] + data.dims[b + k:], data.dtype),)

    def roles(self, attrs, inputs):
        data, idx = inputs
        b, k = attrs.batch_dims, idx.dims[-1]
        tail = idx.rank - 1
        rd = tuple(d if d < b else (WHOLE if d < b + k else tail + d - b - k) for d in range(data.rank))
        ri = tuple(d if d < b else WHOLE for d in range(idx.rank))
        return (rd, ri)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(inputs[1].nbytes + 2 * outputs[0].nbytes)
        return OpCost(0.0, moved, 0.0, 2 * moved, 1)
