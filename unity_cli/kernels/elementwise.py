"""Elementwise kernels: Unary, Binary (ONNX broadcasting), Cast, Where and Scale.

Unary and Binary run each function's own definition (``ir/ops/unary.py``,
``ir/ops/binary.py``). Gradients of broadcast inputs are summed back to the input's shape. ``Max``/``Min``
send the gradient of a tie to the first input that attains it. ``Dropout`` is the
identity: plans train in inference semantics (as models are exported). Step functions
(``Ceil``, ``Floor``, ``Sign``, ``Not``) and the tests ``IsNaN``/``IsInf`` have zero gradient,
returned as None.
"""
from __future__ import annotations

from ..ir.ops.binary import BINARY
from ..ir.ops.unary import UNARY
from ..ir.opspec import OpKind
from .registry import register, unbroadcast


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


register(OpKind.Unary, unary_forward, unary_backward)
register(OpKind.Cast, cast_forward, cast_backward)
register(OpKind.Binary, binary_forward, binary_backward)
register(OpKind.Where, where_forward, where_backward)
register(OpKind.Scale, scale_forward, scale_backward)
