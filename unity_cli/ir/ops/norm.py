"""Normalizations, softmax and hardmax: the normalized dims must stay whole, the rest may be split.

BatchNormalization normalizes each channel over batch and space: with the batch split
each piece sees only its shard, so training needs the statistics all-reduced (the
runtime does this); channels split freely.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import ShapeError
from ..opspec import WHOLE, Imported, Opaque, OpKind, OpSpec, register
from .common import need_inputs, norm_axis, streaming_cost


@dataclass(frozen=True, slots=True)
class BatchNormAttrs:
    epsilon: float = 1e-5
    momentum: float = 0.9


@dataclass(frozen=True, slots=True)
class LayerNormAttrs:
    axis: int                      # normalized dims are [axis, rank)
    epsilon: float = 1e-5


@dataclass(frozen=True, slots=True)
class SoftmaxAttrs:
    """Softmax (``log``: LogSoftmax) over dim ``axis``, or with ``flatten`` over dims
    ``[axis, rank)`` jointly: ONNX before opset 13 flattens the input to 2-D at ``axis``."""

    axis: int
    log: bool = False
    flatten: bool = False


@dataclass(frozen=True, slots=True)
class HardmaxAttrs:
    """One-hot of the first maximum over dim ``axis`` (``flatten``: dims ``[axis, rank)``,
    in row-major order), as for :class:`SoftmaxAttrs`."""

    axis: int
    flatten: bool = False


def normalized_dims(attrs: SoftmaxAttrs | HardmaxAttrs, rank: int) -> tuple[int, ...]:
    """The dims a Softmax or Hardmax normalizes over."""
    return tuple(range(attrs.axis, rank)) if attrs.flatten else (attrs.axis,)


def _softmax_axis(node) -> tuple[int, bool]:
    """``(axis, flatten)`` of an ONNX Softmax, LogSoftmax or Hardmax node. Before opset 13
    these normalize over ``[axis, rank)`` (default axis 1), since then over ``axis``
    (default -1); over the last dim the two agree and the attrs say ``flatten=False``."""
    rank = node.inputs[0].shape.rank
    old = node.opset < 13
    axis = norm_axis(node.op_type, int(node.attrs.get("axis", 1 if old else -1)), rank)
    return axis, old and axis < rank - 1


@dataclass(frozen=True, slots=True)
class LRNAttrs:
    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


@register
class BatchNorm(OpSpec):
    kind = OpKind.BatchNormalization
    verifier = Opaque("a normalization with running statistics: no axioms yet")
    attrs_type = BatchNormAttrs
    onnx_ops = ("BatchNormalization",)
    state_inputs = (3, 4)
    weight_inputs = (1, 2)

    def from_onnx(self, node) -> Imported:
        a = node.attrs
        return Imported(BatchNormAttrs(float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.9))), (0, 1, 2, 3, 4))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 5)
        x = inputs[0]
        if x.rank < 2:
            raise ShapeError(f"BatchNormalization needs an [N, C, ...] input, got {list(x.dims)}")
        for i, p in enumerate(inputs[1:], 1):
            if p.dims != (x.dims[1],):
                raise ShapeError(f"BatchNormalization input {i} is {list(p.dims)}, expected [{x.dims[1]}]")
        return (x,)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),) + ((1,),) * 4

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs[:1], outputs, 5, bwd_factor=2.5)


@register
class LayerNorm(OpSpec):
    kind = OpKind.LayerNormalization
    verifier = Opaque("a normalization over the last dims: no axioms yet")
    attrs_type = LayerNormAttrs
    onnx_ops = ("LayerNormalization",)
    weight_inputs = (1, 2)

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        axis = norm_axis(node.op_type, int(node.attrs.get("axis", -1)), rank)
        return Imported(LayerNormAttrs(axis, float(node.attrs.get("epsilon", 1e-5))), tuple(range(len(node.inputs))))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1, 3)
        x = inputs[0]
        norm = x.dims[attrs.axis:]
        for i, p in enumerate(inputs[1:], 1):
            if tuple(p.dims) != norm[len(norm) - p.rank:] or p.rank > len(norm):
                raise ShapeError(f"LayerNormalization input {i} is {list(p.dims)}, expected {list(norm)}")
        return (x,)

    def roles(self, attrs, inputs):
        x = inputs[0]
        rx = tuple(range(attrs.axis)) + (WHOLE,) * (x.rank - attrs.axis)
        return (rx,) + tuple((WHOLE,) * p.rank for p in inputs[1:])

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs[:1], outputs, 8, bwd_factor=2.5)


class _Normalizing(OpSpec):
    """An op over the normalized dims of one input (see :func:`normalized_dims`), which
    must stay whole; the other dims split freely."""

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        rank = inputs[0].rank
        if not 0 <= attrs.axis < max(rank, 1):
            raise ShapeError(f"{self.kind}: axis {attrs.axis} is out of range for rank {rank}")
        return (inputs[0],)

    def roles(self, attrs, inputs):
        norm = normalized_dims(attrs, inputs[0].rank)
        return (tuple(WHOLE if d in norm else d for d in range(inputs[0].rank)),)


@register
class Softmax(_Normalizing):
    kind = OpKind.Softmax
    verifier = Opaque("a normalization along one dim: its axioms (commuting with splits of the other dims) "
                      "are not written yet")
    attrs_type = SoftmaxAttrs
    onnx_ops = ("Softmax", "LogSoftmax")

    def from_onnx(self, node) -> Imported:
        axis, flatten = _softmax_axis(node)
        return Imported(SoftmaxAttrs(axis, node.op_type == "LogSoftmax", flatten), (0,))

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 10)


@register
class Hardmax(_Normalizing):
    """Not differentiable: its gradient is zero wherever it exists."""

    kind = OpKind.Hardmax
    verifier = Opaque("a normalization along one dim, like Softmax: no axioms yet")
    attrs_type = HardmaxAttrs
    onnx_ops = ("Hardmax",)

    def from_onnx(self, node) -> Imported:
        return Imported(HardmaxAttrs(*_softmax_axis(node)), (0,))

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 3, bwd_factor=0.0)


@register
class LRN(OpSpec):
    kind = OpKind.LRN
    verifier = Opaque("a windowed normalization over channels: no axioms yet")
    attrs_type = LRNAttrs
    onnx_ops = ("LRN",)

    def from_onnx(self, node) -> Imported:
        a = node.attrs
        return Imported(LRNAttrs(int(a["size"]), float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)),
                                 float(a.get("bias", 1.0))), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (inputs[0],)

    def roles(self, attrs, inputs):
        return ((0, WHOLE) + tuple(range(2, inputs[0].rank)),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 3 * attrs.size + 10)
