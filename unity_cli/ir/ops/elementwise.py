"""Elementwise operators, with ONNX broadcasting.

A split dim passes straight through; a broadcast (size-1) dim must stay whole, and the
input is replicated across the output's shards instead. Partial sums pass through the
ops that are linear in them (``Add(a, b)`` when both hold the same partial sums,
``Mul(a, b)`` when one does, ``Div(a, b)`` when ``a`` does).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ShapeError
from ..dtypes import DType
from ..kernel import Kernel, unbroadcast
from ..opspec import Imported, Opaque, OpKind, OpSpec, Saved, register
from ..shapes import TensorShape
from ..terms import Axiom, Law, Symbol, need
from .binary import BINARY
from .common import broadcast_dims, broadcast_roles, need_inputs, streaming_cost
from .unary import EW_FUNCS, UNARY, term


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


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Elementwise kernels: Unary, Binary (ONNX broadcasting), Cast, Where and Scale.
# Unary and Binary run each function's own definition (``ir/ops/unary.py``,
# ``ir/ops/binary.py``). Gradients of broadcast inputs are summed back to the input's shape. ``Max``/``Min``
# send the gradient of a tie to the first input that attains it. ``Dropout`` is the
# identity: plans train in inference semantics (as models are exported). Step functions
# (``Ceil``, ``Floor``, ``Sign``, ``Not``) and the tests ``IsNaN``/``IsInf`` have zero gradient,
# returned as None.


def unary_forward(op, xs, xp):
    """The function's own definition (``ir/ops/unary.py``)."""
    x = xs[0]
    y = UNARY[op.fn].forward(x, xp)
    return [y], (x, y)


def unary_backward(op, ctx, gs, xp):
    backward = UNARY[op.fn].backward
    if backward is None:       # a step function or a test: zero gradient
        return [None]
    x, y = ctx
    return [backward(x, y, gs[0], xp)]


def cast_forward(op, xs, xp):
    x = xs[0]
    return [x.astype(op.to.numpy)], x.dtype


def cast_backward(op, ctx, gs, xp):
    return [gs[0].astype(ctx)]


# ---------------------------------------------------------------------------
# Binary (and the variadic Sum / Max / Min).


def binary_forward(op, xs, xp):
    """The function's own definition (``ir/ops/binary.py``), folded over the inputs."""
    f = BINARY[op.fn].forward
    y = xs[0]
    for x in xs[1:]:
        y = f(y, x, xp)
    return [y], (tuple(xs), y)


def binary_backward(op, ctx, gs, xp):
    xs, y = ctx
    backward = BINARY[op.fn].backward
    if backward is None:       # not differentiable: no gradient flows
        return [None] * len(xs)
    return [unbroadcast(gx, x.shape, xp) for gx, x in zip(backward(xs, y, gs[0], xp), xs)]


def where_forward(op, xs, xp):
    c, a, b = xs
    return [xp.where(c, a, b)], (c, a.shape, b.shape)


def where_backward(op, ctx, gs, xp):
    c, sa, sb = ctx
    g = gs[0]
    return [None, unbroadcast(g * c, sa, xp), unbroadcast(g * ~c, sb, xp)]


def scale_forward(op, xs, xp):
    return [xs[0] * op.factor], None


def scale_backward(op, ctx, gs, xp):
    return [gs[0] * op.factor]


@register
class Unary(OpSpec):
    kind = OpKind.Unary
    kernel = Kernel(unary_forward, unary_backward)
    attrs_type = UnaryAttrs
    onnx_ops = tuple(sorted(set(UNARY) - ATTRIBUTE_VARIANTS))

    def saved(self, attrs, inputs, outputs):
        """The input and the output (the identity's output is its input)."""
        return Saved((0,), () if UNARY[attrs.fn].verifier == "identity" else (0,))

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

    def encode(self, s, attrs, x, ins, outs):
        return None if UNARY[attrs.fn].opaque else [term(s, attrs.fn, x[0])]

    symbols = (
        Symbol("relu", ("T",), lambda run, x: run(UnaryAttrs("Relu"), x)[0]),
        Symbol("ew", ("I", "T"), lambda run, code, x: run(UnaryAttrs(EW_FUNCS[code]), x)[0]),
    )
    axioms = (
        Axiom("relu-scale", lambda s, v: Law(s.relu(s.scale(v.k, v.x)), s.scale(v.k, s.relu(v.x)), v.k > 0)),
        Axiom("relu-relu", lambda s, v: Law(s.relu(s.relu(v.x)), s.relu(v.x), two_way=False)),
        Axiom("relu-square", lambda s, v: Law(s.relu(s.mul(v.x, v.x)), s.mul(v.x, v.x), two_way=False)),
        Axiom("relu-times-square", lambda s, v: Law(s.relu(s.mul(v.x, s.mul(v.y, v.y))),
                                                    s.mul(s.relu(v.x), s.mul(v.y, v.y)))),
        Axiom("relu-concat", lambda s, v: Law(s.relu(s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                              s.concat(v.ax, v.n1, v.n2, s.relu(v.a), s.relu(v.b)))),
        Axiom("ew-concat", lambda s, v: Law(s.ew(v.k, s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                            s.concat(v.ax, v.n1, v.n2, s.ew(v.k, v.a), s.ew(v.k, v.b)))),
    )


@register
class Cast(OpSpec):
    kind = OpKind.Cast
    kernel = Kernel(cast_forward, cast_backward)
    verifier = Opaque("a change of element type, which the verifier's single tensor sort does not model")
    attrs_type = CastAttrs
    onnx_ops = ("Cast",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        return Imported(CastAttrs(DType.from_onnx(node.attrs["to"])), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (TensorShape(inputs[0].dims, attrs.to),)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 0)


def _same_shapes(fn: str):
    """The meaning of the verifier's symbol for ``fn`` on two tensors of one shape."""
    def meaning(run, a, b):
        need(a.shape == b.shape, f"{fn} of shapes {a.shape} and {b.shape}")
        return run(BinaryAttrs(fn), a, b)[0]
    return meaning


def _broadcasting(fn: str):
    """The meaning of the verifier's symbol for ``fn`` on two tensors that broadcast."""
    def meaning(run, a, b):
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            need(False, f"shapes {a.shape} and {b.shape} do not broadcast")
        return run(BinaryAttrs(fn), a, b)[0]
    return meaning


@register
class Binary(OpSpec):
    kind = OpKind.Binary
    kernel = Kernel(binary_forward, binary_backward)
    attrs_type = BinaryAttrs
    onnx_ops = tuple(sorted(set(BINARY) - set(FROM_ATTRIBUTE)))

    def saved(self, attrs, inputs, outputs):
        """Every input and the output (one input: the output is that input)."""
        return Saved(tuple(range(len(inputs))), (0,) if len(inputs) > 1 else ())

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

    def encode(self, s, attrs, x, ins, outs):
        how = BINARY[attrs.fn].verifier
        if isinstance(how, Opaque):
            return None
        if how == "subtract":
            x = [x[0], s.scale(-1, x[1])]
        same = all(i.sizes == outs[0].sizes for i in ins)
        f = (s.mul if how == "multiply" else s.add) if same else (s.bmul if how == "multiply" else s.badd)
        return [functools.reduce(f, x)]

    symbols = (   # add, mul: of equal shapes; badd, bmul: broadcasting
        Symbol("add", ("T", "T"), _same_shapes("Add")), Symbol("mul", ("T", "T"), _same_shapes("Mul")),
        Symbol("badd", ("T", "T"), _broadcasting("Add")), Symbol("bmul", ("T", "T"), _broadcasting("Mul")),
    )
    axioms = (
        Axiom("add-comm", lambda s, v: Law(s.add(v.x, v.y), s.add(v.y, v.x), two_way=False)),
        Axiom("add-assoc", lambda s, v: Law(s.add(s.add(v.x, v.y), v.z), s.add(v.x, s.add(v.y, v.z)))),
        Axiom("mul-comm", lambda s, v: Law(s.mul(v.x, v.y), s.mul(v.y, v.x), two_way=False)),
        Axiom("mul-assoc", lambda s, v: Law(s.mul(s.mul(v.x, v.y), v.z), s.mul(v.x, s.mul(v.y, v.z)))),
        Axiom("mul-add", lambda s, v: Law(s.mul(v.x, s.add(v.y, v.z)), s.add(s.mul(v.x, v.y), s.mul(v.x, v.z)))),
        Axiom("badd-comm", lambda s, v: Law(s.badd(v.x, v.y), s.badd(v.y, v.x), two_way=False)),
        Axiom("bmul-comm", lambda s, v: Law(s.bmul(v.x, v.y), s.bmul(v.y, v.x), two_way=False)),
        Axiom("add-self", lambda s, v: Law(s.add(v.x, v.x), s.scale(2, v.x), two_way=False)),
        Axiom("add-scaled-self", lambda s, v: Law(s.add(s.scale(v.j, v.x), v.x), s.scale(v.j + 1, v.x),
                                                  two_way=False)),
        Axiom("add-scaled-scaled", lambda s, v: Law(s.add(s.scale(v.j, v.x), s.scale(v.k, v.x)),
                                                    s.scale(v.j + v.k, v.x), two_way=False)),
        Axiom("add-cancel", lambda s, v: Law(s.add(s.add(v.x, v.y), s.scale(-1, v.y)), v.x)),
        Axiom("scale-mul", lambda s, v: Law(s.mul(s.scale(v.k, v.x), v.y), s.scale(v.k, s.mul(v.x, v.y)))),
        Axiom("mul-relu-self", lambda s, v: Law(s.mul(v.x, s.relu(v.x)), s.mul(s.relu(v.x), s.relu(v.x)))),
        Axiom("add-concat", lambda s, v: Law(
            s.add(s.concat(v.ax, v.n1, v.n2, v.a, v.b), s.concat(v.ax, v.n1, v.n2, v.c, v.d)),
            s.concat(v.ax, v.n1, v.n2, s.add(v.a, v.c), s.add(v.b, v.d)))),
        Axiom("mul-concat", lambda s, v: Law(
            s.mul(s.concat(v.ax, v.n1, v.n2, v.a, v.b), s.concat(v.ax, v.n1, v.n2, v.c, v.d)),
            s.concat(v.ax, v.n1, v.n2, s.mul(v.a, v.c), s.mul(v.b, v.d)))),
    )



@register
class Where(OpSpec):
    kind = OpKind.Where
    kernel = Kernel(where_forward, where_backward)
    verifier = Opaque("a select on a boolean mask, which the verifier's tensor sort does not model")
    attrs_type = WhereAttrs
    onnx_ops = ("Where",)

    def saved(self, attrs, inputs, outputs):
        """The condition."""
        return Saved((0,))

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
    kernel = Kernel(scale_forward, scale_backward)
    attrs_type = ScaleAttrs

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (inputs[0],)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 1)

    def encode(self, s, attrs, x, ins, outs):
        return [s.scale(attrs.factor, x[0])]

    symbols = (Symbol("scale", ("I", "T"), lambda run, k, x: run(ScaleAttrs(k), x)[0]),)
    axioms = (
        Axiom("scale-one", lambda s, v: Law(s.scale(v.k, v.x), v.x, v.k == 1)),
        Axiom("scale-scale", lambda s, v: Law(s.scale(v.j, s.scale(v.k, v.x)), s.scale(v.j * v.k, v.x),
                                              two_way=False)),
        Axiom("scale-add", lambda s, v: Law(s.scale(v.k, s.add(v.x, v.y)),
                                            s.add(s.scale(v.k, v.x), s.scale(v.k, v.y)))),
        Axiom("scale-concat", lambda s, v: Law(s.scale(v.k, s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                               s.concat(v.ax, v.n1, v.n2, s.scale(v.k, v.a), s.scale(v.k, v.b)))),
    )
