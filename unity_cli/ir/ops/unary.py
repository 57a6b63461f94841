"""The unary elementwise functions: everything about each in one entry of :data:`UNARY`.

An entry is the function's whole definition: its cost (flops per element), its meaning on
arrays (``forward``, written against ``xp``, numpy or cupy: the runtime's kernel, the
reference semantics of the rule generator and the verifier's numeric model all call it),
its gradient (``backward``; None for a step function or a test, whose gradient is zero
wherever it exists), and how the z3 verifier sees it (:data:`VERIFIER`). The operator
``Unary`` (``elementwise.py``), the kernels, ``substitutions/semantics.py`` and
``substitutions/axioms.py`` read this table and keep none of their own, so adding a
function is one entry here (and its test).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..opspec import Opaque

VERIFIER = {
    "pointwise": "an uninterpreted elementwise function ew(code, x), with the axioms every pointwise "
                 "function obeys (it commutes with transposes, slices and concatenations)",
    "relu": "its own symbol, with Relu's axioms",
    "negate": "scale(-1, x)",
    "identity": "x itself",
}
"""How the verifier encodes a function; a function it does not model says why
(:class:`~unity_cli.ir.opspec.Opaque`: no rule can mention it)."""


@dataclass(frozen=True)
class UnaryFn:
    flops: int                                    # per element (a cost-model input, not semantics)
    forward: Callable[[Any, Any], Any]            # (x, xp) -> y
    backward: Callable[[Any, Any, Any, Any], Any] | None = None   # (x, y, g, xp) -> g * dy/dx
    verifier: str | Opaque = "pointwise"
    boolean: bool = False                         # a boolean output (a test)
    activation: bool = False                      # the rule cache has fn-through-Repartition/Combine rules
    domain: str = "any"                           # where tests sample it: any | positive | away (from 0,
                                                  # where it is not differentiable)
    from_output: bool = False                     # backward needs only y: given y for x it is the same
                                                  # (a fused Gemm then keeps one tensor, not two)

    @property
    def opaque(self) -> bool:
        return isinstance(self.verifier, Opaque)

    @property
    def linear(self) -> bool:
        return self.verifier in ("negate", "identity")


_SQRT_HALF = math.sqrt(0.5)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_grad(x: Any, xp: Any) -> Any:
    """d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    t = xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


def erf(x: Any, xp: Any) -> Any:
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


def _erf32(x: Any, xp: Any) -> Any:
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


def _erf64(x: Any, xp: Any) -> Any:
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


def _sigmoid(x: Any, xp: Any) -> Any:
    e = xp.exp(-xp.abs(x))  # never overflows
    s = 1 / (1 + e)
    return xp.where(x >= 0, s, e * s)


def _mish_grad(x: Any, xp: Any) -> Any:
    """d/dx x tanh(softplus(x)) = tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x)."""
    t = xp.tanh(xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x))))
    return t + x * (1 - t * t) * _sigmoid(x, xp)


def _gelu(x: Any, xp: Any) -> Any:
    return 0.5 * x * (1 + erf(x * _SQRT_HALF, xp))


_BOOL = Opaque("a test with a boolean output, which the verifier's tensor sort does not model")

UNARY: dict[str, UnaryFn] = {
    "Relu": UnaryFn(1, lambda x, xp: xp.maximum(x, 0), lambda x, y, g, xp: g * (x > 0), "relu", activation=True,
                    domain="away", from_output=True),
    "Gelu": UnaryFn(24, _gelu, lambda x, y, g, xp: g * (0.5 * (1 + erf(x * _SQRT_HALF, xp))
                                                        + x * _INV_SQRT_2PI * xp.exp(-0.5 * x * x)),
                    activation=True),
    "GeluTanh": UnaryFn(20, lambda x, xp: 0.5 * x * (1 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))),
                        lambda x, y, g, xp: g * _gelu_tanh_grad(x, xp),
                        Opaque("Gelu's tanh approximation is not among the verifier's functions yet")),
    "Erf": UnaryFn(20, erf, lambda x, y, g, xp: g * (_TWO_OVER_SQRT_PI * xp.exp(-x * x)), activation=True),
    "Tanh": UnaryFn(20, lambda x, xp: xp.tanh(x), lambda x, y, g, xp: g * (1 - y * y), activation=True,
                   from_output=True),
    "Sigmoid": UnaryFn(8, _sigmoid, lambda x, y, g, xp: g * y * (1 - y), activation=True, from_output=True),
    "Exp": UnaryFn(8, lambda x, xp: xp.exp(x), lambda x, y, g, xp: g * y),
    "Log": UnaryFn(8, lambda x, xp: xp.log(x), lambda x, y, g, xp: g / x, domain="positive"),
    "Sqrt": UnaryFn(4, lambda x, xp: xp.sqrt(x), lambda x, y, g, xp: g / (y + y), domain="positive"),
    "Neg": UnaryFn(1, lambda x, xp: xp.negative(x), lambda x, y, g, xp: -g, "negate"),
    "Abs": UnaryFn(1, lambda x, xp: xp.abs(x), lambda x, y, g, xp: g * xp.sign(x), domain="away"),
    "Reciprocal": UnaryFn(4, lambda x, xp: 1 / x, lambda x, y, g, xp: -g * y * y, domain="positive"),
    "Softplus": UnaryFn(12, lambda x, xp: xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x))),
                        lambda x, y, g, xp: g * _sigmoid(x, xp)),
    "Mish": UnaryFn(24, lambda x, xp: x * xp.tanh(xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))),
                    lambda x, y, g, xp: g * _mish_grad(x, xp)),
    "Softsign": UnaryFn(3, lambda x, xp: x / (1 + xp.abs(x)), lambda x, y, g, xp: g / ((1 + xp.abs(x)) ** 2)),
    "Sin": UnaryFn(20, lambda x, xp: xp.sin(x), lambda x, y, g, xp: g * xp.cos(x)),
    "Cos": UnaryFn(20, lambda x, xp: xp.cos(x), lambda x, y, g, xp: -g * xp.sin(x)),
    "Identity": UnaryFn(0, lambda x, xp: x, lambda x, y, g, xp: g, "identity"),
    "Dropout": UnaryFn(2, lambda x, xp: x, lambda x, y, g, xp: g, "identity"),   # inference mode, as exported
    "Ceil": UnaryFn(1, lambda x, xp: xp.ceil(x), domain="away"),
    "Floor": UnaryFn(1, lambda x, xp: xp.floor(x), domain="away"),
    "Sign": UnaryFn(1, lambda x, xp: xp.sign(x), domain="away"),
    "Not": UnaryFn(1, lambda x, xp: xp.logical_not(x), boolean=True),
    "IsNaN": UnaryFn(1, lambda x, xp: xp.isnan(x), verifier=_BOOL, boolean=True),
    "IsInf": UnaryFn(1, lambda x, xp: xp.isinf(x), verifier=_BOOL, boolean=True),
    "IsPosInf": UnaryFn(1, lambda x, xp: x == xp.inf, verifier=_BOOL, boolean=True),
    "IsNegInf": UnaryFn(1, lambda x, xp: x == -xp.inf, verifier=_BOOL, boolean=True),
    "IsInfNeither": UnaryFn(0, lambda x, xp: xp.zeros(x.shape, dtype=bool), verifier=_BOOL, boolean=True),
}

EW_FUNCS: tuple[str, ...] = tuple(sorted(name for name, f in UNARY.items() if f.verifier == "pointwise"))
"""The verifier's ``ew(code, x)`` functions; a function's code is its index here."""


def term(s: Any, fn: str, x: Any) -> Any:
    """The verifier's term of a modelled function applied to the term ``x`` (a Unary node,
    a Gemm's fused activation), in the symbols of the signature ``s`` (``ir/terms.py``)."""
    match UNARY[fn].verifier:
        case "relu":
            return s.relu(x)
        case "negate":
            return s.scale(-1, x)
        case "identity":    # Identity, Dropout (inference mode)
            return x
        case "pointwise":
            return s.ew(EW_FUNCS.index(fn), x)
    raise AssertionError(f"{fn}: the verifier has no term for {UNARY[fn].verifier!r}")
