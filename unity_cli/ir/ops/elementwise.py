"""Elementwise operators, with ONNX broadcasting.

A split dim passes straight through; a broadcast (size-1) dim must stay whole, and the
input is replicated across the output's shards instead. Partial sums pass through the
ops that are linear in them (``Add(a, b)`` when both hold the same partial sums,
``Mul(a, b)`` when one does, ``Div(a, b)`` when ``a`` does).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import ShapeError
from ..dtypes import DType
from ..opspec import Imported, Opaque, OpKind, OpSpec, register
from ..shapes import TensorShape
from .binary import BINARY
from .common import broadcast_dims, broadcast_roles, need_inputs, streaming_cost
from .unary import UNARY


@dataclass(frozen=True, slots=True)
class UnaryAttrs:
    """A unary elementwise function, named by its ONNX op type."""

    fn: str


@dataclass(frozen=True, slots=True)
class CastAttrs:
    to: DType


@dataclass(frozen=True, slots=True)
class BinaryAttrs:
    """A broadcasting binary (or variadic, for Sum/Max/Min) elementwise op."""

    fn: str


@dataclass(frozen=True, slots=True)
class WhereAttrs:
    pass


LINEAR_UNARY = frozenset(name for name, f in UNARY.items() if f.linear)
# Unary/Binary fns that are an ONNX op with a given attribute, not an op of their own.
FROM_ATTRIBUTE = {"GeluTanh": ("Gelu", "approximate", "tanh"), "Fmod": ("Mod", "fmod", 1)}
# IsInf's two flags (detect_positive, detect_negative; both default 1) select one of four fns.
IS_INF = {(1, 1): "IsInf", (1, 0): "IsPosInf", (0, 1): "IsNegInf", (0, 0): "IsInfNeither"}
ATTRIBUTE_VARIANTS = frozenset(FROM_ATTRIBUTE) | (frozenset(IS_INF.values()) - {"IsInf"})
"""Fns that are an ONNX op with a given attribute, not an ONNX op of their own."""
BOOL_UNARY = frozenset(name for name, f in UNARY.items() if f.boolean)
"""Unary fns with a boolean output."""


def _fn(node) -> str:
    """The fn an ONNX node computes: its op type, or a variant its attribute selects
    (``Gelu(approximate="tanh")`` is ``GeluTanh``, ``Mod(fmod=1)`` is ``Fmod``,
    ``IsInf(detect_negative=0)`` is ``IsPosInf``)."""
    if node.op_type == "IsInf":
        return IS_INF[(int(node.attrs.get("detect_positive", 1) != 0), int(node.attrs.get("detect_negative", 1) != 0))]
    for fn, (op, attr, value) in FROM_ATTRIBUTE.items():
        if node.op_type == op and node.attrs.get(attr) == value:
            return fn
    return node.op_type


@register
class Unary(OpSpec):
    kind = OpKind.Unary
    attrs_type = UnaryAttrs
    onnx_ops = tuple(sorted(set(UNARY) - ATTRIBUTE_VARIANTS))

    def from_onnx(self, node) -> Imported:
        # Dropout at export is inference-mode (identity); its ratio/training inputs are dropped.
        return Imported(UnaryAttrs(_fn(node)), (0,))

    def infer(self, attrs, inputs):
        need_inputs(attrs.fn, inputs, 1)
        if attrs.fn in BOOL_UNARY - {"Not"} and not inputs[0].dtype.is_float:
            raise ShapeError(f"{attrs.fn} takes a floating-point input, got {inputs[0].dtype.value}")
        dtype = DType.BOOL if attrs.fn in BOOL_UNARY else inputs[0].dtype
        return (TensorShape(inputs[0].dims, dtype),)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),)

    def terms(self, attrs, n):
        return ((0,),) if attrs.fn in LINEAR_UNARY else ()

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, UNARY[attrs.fn].flops)


@register
class Cast(OpSpec):
    kind = OpKind.Cast
    verifier = Opaque("a change of element type, which the verifier's single tensor sort does not model")
    attrs_type = CastAttrs
    onnx_ops = ("Cast",)

    def from_onnx(self, node) -> Imported:
        return Imported(CastAttrs(DType.from_onnx(node.attrs["to"])), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (TensorShape(inputs[0].dims, attrs.to),)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 0)


@register
class Binary(OpSpec):
    kind = OpKind.Binary
    attrs_type = BinaryAttrs
    onnx_ops = tuple(sorted(set(BINARY) - set(FROM_ATTRIBUTE)))

    def from_onnx(self, node) -> Imported:
        return Imported(BinaryAttrs(_fn(node)), tuple(range(len(node.inputs))))

    def infer(self, attrs, inputs):
        if BINARY[attrs.fn].variadic:
            need_inputs(attrs.fn, inputs, 1, 64)
        else:
            need_inputs(attrs.fn, inputs, 2)
        if attrs.fn != "Pow" and len({s.dtype for s in inputs}) > 1:
            raise ShapeError(f"{attrs.fn}: inputs have different types {[s.dtype.value for s in inputs]}")
        dtype = DType.BOOL if BINARY[attrs.fn].boolean else inputs[0].dtype
        return (TensorShape(broadcast_dims(attrs.fn, inputs), dtype),)

    def roles(self, attrs, inputs):
        out = broadcast_dims(attrs.fn, inputs)
        return tuple(broadcast_roles(s, out) for s in inputs)

    def commutative(self, attrs) -> bool:
        return BINARY[attrs.fn].commutative

    def terms(self, attrs, n):
        match BINARY[attrs.fn].terms:
            case "sum":
                return tuple((i,) for i in range(n))
            case "product":
                return (tuple(range(n)),)
            case "numerator":
                return ((0,),)
            case _:
                return ()

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, BINARY[attrs.fn].flops)


@register
class Where(OpSpec):
    kind = OpKind.Where
    verifier = Opaque("a select on a boolean mask, which the verifier's tensor sort does not model")
    attrs_type = WhereAttrs
    onnx_ops = ("Where",)

    def from_onnx(self, node) -> Imported:
        return Imported(WhereAttrs(), (0, 1, 2))

    def infer(self, attrs, inputs: Sequence[TensorShape]):
        need_inputs(self.kind, inputs, 3)
        if inputs[1].dtype != inputs[2].dtype:
            raise ShapeError(f"Where: branches have types {inputs[1].dtype.value} and {inputs[2].dtype.value}")
        return (TensorShape(broadcast_dims(self.kind, inputs), inputs[1].dtype),)

    def roles(self, attrs, inputs):
        out = broadcast_dims(self.kind, inputs)
        return tuple(broadcast_roles(s, out) for s in inputs)

    def terms(self, attrs, n):
        return ((1,), (2,))

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 1)


@dataclass(frozen=True, slots=True)
class ScaleAttrs:
    """``y = factor * x``: what ``Reduction`` of ``factor`` replicas computes (no ONNX op)."""

    factor: int


@register
class Scale(OpSpec):
    kind = OpKind.Scale
    attrs_type = ScaleAttrs

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (inputs[0],)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 1)
