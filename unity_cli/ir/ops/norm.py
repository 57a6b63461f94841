"""Normalizations and softmax: the normalized dims must stay whole, the rest may be split.

BatchNormalization normalizes each channel over batch and space: with the batch split
each piece sees only its shard, so training needs the statistics all-reduced (the
runtime does this); channels split freely.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import ModelError, ShapeError
from ..opspec import WHOLE, Imported, OpSpec, register
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
    axis: int
    log: bool = False


@dataclass(frozen=True, slots=True)
class LRNAttrs:
    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


@register
class BatchNorm(OpSpec):
    kind = "BatchNormalization"
    attrs_type = BatchNormAttrs
    onnx_ops = ("BatchNormalization",)
    state_inputs = (3, 4)

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
    kind = "LayerNormalization"
    attrs_type = LayerNormAttrs
    onnx_ops = ("LayerNormalization",)

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


@register
class Softmax(OpSpec):
    kind = "Softmax"
    attrs_type = SoftmaxAttrs
    onnx_ops = ("Softmax", "LogSoftmax")

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        default = -1 if node.opset >= 13 else 1
        axis = norm_axis(node.op_type, int(node.attrs.get("axis", default)), rank)
        if node.opset < 13 and axis != rank - 1:
            # Before opset 13 softmax flattened [axis:] into one dim; equal to ours only on the last axis.
            raise ModelError(f"{node.op_type} (opset {node.opset}) over axis {axis} of a rank-{rank} tensor")
        return Imported(SoftmaxAttrs(axis, node.op_type == "LogSoftmax"), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (inputs[0],)

    def roles(self, attrs, inputs):
        return (tuple(WHOLE if d == attrs.axis else d for d in range(inputs[0].rank)),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 10)


@register
class LRN(OpSpec):
    kind = "LRN"
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
