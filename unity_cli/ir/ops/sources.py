"""Graph sources: model inputs and weights are nodes, so parallel ops apply to them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..opspec import OMIT_DEFAULT, ZERO_COST, OpCost, OpKind, OpSpec, register
from ..shapes import ParallelTensorShape, TensorShape


@dataclass(frozen=True, slots=True)
class InputAttrs:
    """A graph input (data fed each step); the node's name is the ONNX input name."""

    shape: TensorShape
    grad: bool = field(default=False, metadata={OMIT_DEFAULT: True})
    """Whether its gradient flows back: a stand-in for a tensor computed elsewhere (a
    segment's boundary, ``search/split.py``), priced as the whole graph trains it."""


@dataclass(frozen=True, slots=True)
class WeightAttrs:
    """A tensor stored with the model: a trainable weight or a constant.

    ``trainable`` weights get gradients and optimizer state; constants (folded shape
    tensors, masks, integer indices, scalars) do not.
    """

    shape: TensorShape
    trainable: bool = True
    parts: tuple[tuple[str, int], ...] = field(default=(), metadata={OMIT_DEFAULT: True})
    """A weight folded from a concatenation of the model's weights: each ``(name, size)``
    along ``part_axis``, in order (``ir/simplify.fold_weight_concats``). The runtime loads it
    from those weights and saves it back into them, so the model keeps its structure."""
    part_axis: int = field(default=0, metadata={OMIT_DEFAULT: True})


class _Source(OpSpec):
    is_source = True

    def infer(self, attrs, inputs: Sequence[TensorShape]) -> tuple[TensorShape, ...]:
        return (attrs.shape,)

    def infer_parallel(self, attrs, inputs) -> tuple[ParallelTensorShape, ...]:
        return (ParallelTensorShape.unpartitioned(attrs.shape),)

    def cost(self, attrs, inputs, outputs) -> OpCost:
        return ZERO_COST


@register
class Input(_Source):
    kind = OpKind.Input
    attrs_type = InputAttrs


@register
class Weight(_Source):
    kind = OpKind.Weight
    attrs_type = WeightAttrs
