"""Elementwise kernels: Unary, Binary (ONNX broadcasting), Cast, Where and Scale.

Gradients of broadcast inputs are summed back to the input's shape. ``Max``/``Min``
send the gradient of a tie to the first input that attains it. ``Dropout`` is the
identity: plans train in inference semantics (as models are exported). Step functions
(``Ceil``, ``Floor``, ``Sign``, ``Not``) and the tests ``IsNaN``/``IsInf`` have zero gradient,
returned as None.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .registry import Array, register, unbroadcast

_SQRT_HALF = math.sqrt(0.5)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_grad(x: Array, xp: Any) -> Array:
    """d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    t = xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


def erf(x: Array, xp: Any) -> Array:
    """The error function, in ``x``'s dtype: float64 to ~1.1e-15, float32 and narrower to
    ~4e-7 absolute (a few ulps, in half the time: GELU layers call it every step)."""
    if xp.__name__ != "numpy":
        from cupyx.scipy.special import erf as cupy_erf  # noqa: PLC0415  (only on GPUs)

        return cupy_erf(x)
    if x.dtype == xp.float64:
        return _erf64(x, xp)
    return _erf32(x.astype("float32"), xp).astype(x.dtype)


# Abramowitz & Stegun 7.1.26: erf(x) = 1 - t (a1 + t (a2 + ...)) e^-x^2, t = 1 / (1 + p x),
# |error| <= 1.5e-7 for x >= 0. Near zero, where that is a large relative error, the
# Taylor series to x^11 (truncation below 2e-8 for |x| < 0.5) takes over.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_TAYLOR = (1.0, -1 / 3, 1 / 10, -1 / 42, 1 / 216, -1 / 1320)


def _erf32(x: Array, xp: Any) -> Array:
    a = xp.abs(x)
    t = 1 / (1 + xp.float32(_AS_P) * a)
    poly = xp.float32(_AS_A[4])
    for c in _AS_A[3::-1]:
        poly = poly * t + xp.float32(c)
    far = 1 - poly * t * xp.exp(-a * a)
    z = a * a
    series = xp.float32(_TAYLOR[-1])
    for c in _TAYLOR[-2::-1]:
        series = series * z + xp.float32(c)
    near = xp.float32(_TWO_OVER_SQRT_PI) * a * series
    return xp.sign(x) * xp.where(a < 0.5, near, far)


def _erf64(x: Array, xp: Any) -> Array:
    """erf in float64 without scipy: below 2 the series
    ``erf(x) = 2/sqrt(pi) e^-x^2 sum_n (2x^2)^n x / (2n+1)!!`` (positive terms, no
    cancellation; 30 terms), above it ``1 - erfc(x)`` with erfc's continued fraction
    ``e^-x^2 / sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`` (40 levels).
    Max abs error 1.1e-15 against ``math.erf``."""
    a = xp.abs(x)
    s = xp.minimum(a, 2.0)
    z = 2.0 * s * s
    term = s
    total = s
    for n in range(1, 30):
        term = term * z / (2 * n + 1)
        total = total + term
    small = _TWO_OVER_SQRT_PI * xp.exp(-s * s) * total
    b = xp.maximum(a, 2.0)
    f = b
    for k in range(40, 0, -1):
        f = b + (k / 2) / f
    big = 1.0 - xp.exp(-b * b) / (math.sqrt(math.pi) * f)
    return xp.sign(x) * xp.where(a < 2.0, small, big)


def _sigmoid(x: Array, xp: Any) -> Array:
    e = xp.exp(-xp.abs(x))  # never overflows
    s = 1 / (1 + e)
    return xp.where(x >= 0, s, e * s)


def _gelu(x: Array, xp: Any) -> Array:
    return 0.5 * x * (1 + erf(x * _SQRT_HALF, xp))


_FWD: dict[str, Callable[[Array, Any], Array]] = {
    "Relu": lambda x, xp: xp.maximum(x, 0),
    "Gelu": _gelu,
    "GeluTanh": lambda x, xp: 0.5 * x * (1 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))),
    "Erf": erf,
    "Tanh": lambda x, xp: xp.tanh(x),
    "Sigmoid": _sigmoid,
    "Exp": lambda x, xp: xp.exp(x),
    "Log": lambda x, xp: xp.log(x),
    "Sqrt": lambda x, xp: xp.sqrt(x),
    "Neg": lambda x, xp: xp.negative(x),
    "Abs": lambda x, xp: xp.abs(x),
    "Reciprocal": lambda x, xp: 1 / x,
    "Softplus": lambda x, xp: xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x))),
    "Sin": lambda x, xp: xp.sin(x),
    "Cos": lambda x, xp: xp.cos(x),
    "Identity": lambda x, xp: x,
    "Dropout": lambda x, xp: x,
    "Ceil": lambda x, xp: xp.ceil(x),
    "Floor": lambda x, xp: xp.floor(x),
    "Sign": lambda x, xp: xp.sign(x),
    "Not": lambda x, xp: xp.logical_not(x),
    "IsNaN": lambda x, xp: xp.isnan(x),
    "IsInf": lambda x, xp: xp.isinf(x),
    "IsPosInf": lambda x, xp: x == xp.inf,
    "IsNegInf": lambda x, xp: x == -xp.inf,
    "IsInfNeither": lambda x, xp: xp.zeros(x.shape, dtype=bool),
}

# d(fn)/dx times the upstream gradient g, from x and the output y.
_BWD: dict[str, Callable[[Array, Array, Array, Any], Array]] = {
    "Relu": lambda x, y, g, xp: g * (x > 0),
    "Gelu": lambda x, y, g, xp: g * (0.5 * (1 + erf(x * _SQRT_HALF, xp)) + x * _INV_SQRT_2PI * xp.exp(-0.5 * x * x)),
    "GeluTanh": lambda x, y, g, xp: g * _gelu_tanh_grad(x, xp),
    "Erf": lambda x, y, g, xp: g * (_TWO_OVER_SQRT_PI * xp.exp(-x * x)),
    "Tanh": lambda x, y, g, xp: g * (1 - y * y),
    "Sigmoid": lambda x, y, g, xp: g * y * (1 - y),
    "Exp": lambda x, y, g, xp: g * y,
    "Log": lambda x, y, g, xp: g / x,
    "Sqrt": lambda x, y, g, xp: g / (y + y),
    "Neg": lambda x, y, g, xp: -g,
    "Abs": lambda x, y, g, xp: g * xp.sign(x),
    "Reciprocal": lambda x, y, g, xp: -g * y * y,
    "Softplus": lambda x, y, g, xp: g * _sigmoid(x, xp),
    "Sin": lambda x, y, g, xp: g * xp.cos(x),
    "Cos": lambda x, y, g, xp: -g * xp.sin(x),
    "Identity": lambda x, y, g, xp: g,
    "Dropout": lambda x, y, g, xp: g,
}
STEP_FUNCTIONS = frozenset(_FWD) - frozenset(_BWD)
"""Unary fns whose gradient is zero wherever it exists."""


def unary_forward(op, xs, xp):
    x = xs[0]
    y = _FWD[op.fn](x, xp)
    return [y], (x, y)


def unary_backward(op, ctx, gs, xp):
    if op.fn in STEP_FUNCTIONS:
        return [None]
    x, y = ctx
    return [_BWD[op.fn](x, y, gs[0], xp)]


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
