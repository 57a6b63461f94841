"""Elementwise kernels: Unary, Binary (ONNX broadcasting), Cast, Where and Scale.

Gradients of broadcast inputs are summed back to the input's shape. ``Max``/``Min``
send the gradient of a tie to the first input that attains it. ``Dropout`` is the
identity: plans train in inference semantics (as models are exported). Step functions
(``Ceil``, ``Floor``, ``Sign``, ``Not``) and the tests ``IsNaN``/``IsInf`` have zero gradient,
returned as None.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...ir.ops.unary import UNARY
from .registry import Array, register, unbroadcast


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


def _int_div(a: Array, b: Array, xp: Any) -> Array:
    """Integer division truncating toward zero, as C and onnxruntime do."""
    q = a // b
    return q + ((q < 0) & (q * b != a))


_BINARY: dict[str, Callable[[Array, Array, Any], Array]] = {
    "Add": lambda a, b, xp: a + b,
    "Sub": lambda a, b, xp: a - b,
    "Mul": lambda a, b, xp: a * b,
    "Div": lambda a, b, xp: a / b if a.dtype.kind == "f" else _int_div(a, b, xp),
    "Pow": lambda a, b, xp: xp.power(a, b).astype(a.dtype),
    "Sum": lambda a, b, xp: a + b,
    "Max": lambda a, b, xp: xp.maximum(a, b),
    "Min": lambda a, b, xp: xp.minimum(a, b),
    "Equal": lambda a, b, xp: xp.equal(a, b),
    "Less": lambda a, b, xp: xp.less(a, b),
    "Greater": lambda a, b, xp: xp.greater(a, b),
    "LessOrEqual": lambda a, b, xp: xp.less_equal(a, b),
    "GreaterOrEqual": lambda a, b, xp: xp.greater_equal(a, b),
    "And": lambda a, b, xp: xp.logical_and(a, b),
    "Or": lambda a, b, xp: xp.logical_or(a, b),
    # ONNX Mod: fmod=0 takes the sign of the divisor (Python's %), fmod=1 (Fmod, which
    # floats require) the sign of the dividend (C's fmod).
    "Mod": lambda a, b, xp: xp.mod(a, b),
    "Fmod": lambda a, b, xp: xp.fmod(a, b),
}
_NOT_DIFFERENTIABLE = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Mod",
                                 "Fmod"})


def binary_forward(op, xs, xp):
    f = _BINARY[op.fn]
    y = xs[0]
    for x in xs[1:]:
        y = f(y, x, xp)
    return [y], (tuple(xs), y)


def binary_backward(op, ctx, gs, xp):
    xs, y = ctx
    g = gs[0]
    fn = op.fn
    if fn in _NOT_DIFFERENTIABLE:
        return [None] * len(xs)
    if fn in ("Add", "Sum"):
        full = [g] * len(xs)
    elif fn == "Sub":
        full = [g, -g]
    elif fn == "Mul":
        a, b = xs
        full = [g * b, g * a]
    elif fn == "Div":
        a, b = xs
        full = [g / b, -g * y / b]
    elif fn == "Pow":
        a, b = xs
        pos = a > 0
        log_a = xp.where(pos, xp.log(xp.where(pos, a, 1)), 0)
        full = [g * b * xp.power(a, b - 1), g * y * log_a]
    elif fn in ("Max", "Min"):
        full, taken = [], xp.zeros(y.shape, dtype=bool)
        for x in xs:
            hit = (x == y) & ~taken  # ties go to the first input that attains the extremum
            taken = taken | hit
            full.append(g * hit)
    else:
        raise AssertionError(fn)
    return [unbroadcast(gx, x.shape, xp) for gx, x in zip(full, xs)]


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


register("Unary", unary_forward, unary_backward)
register("Cast", cast_forward, cast_backward)
register("Binary", binary_forward, binary_backward)
register("Where", where_forward, where_backward)
register("Scale", scale_forward, scale_backward)
