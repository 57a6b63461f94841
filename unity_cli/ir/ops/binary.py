"""The binary (and variadic: Sum, Max, Min) elementwise functions: everything about each
in one entry of :data:`BINARY`, as ``unary.py`` does for the unary ones.

An entry holds how partial sums pass through the function (``terms``, which the
parallelization rules derive from), its meaning on arrays (``forward``, against ``xp``;
a variadic function folds it over its inputs), its gradients before they are summed back
to each input's broadcast shape (``backward``; None where the function is not
differentiable), its cost per element, and how the z3 verifier sees it. The operator
``Binary`` (``elementwise.py``), the kernels, the reference semantics and the verifier
read this table and keep none of their own.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..opspec import Opaque

VERIFIER = {"add": "add (or badd when it broadcasts)", "subtract": "add of scale(-1, b)",
            "multiply": "mul (or bmul when it broadcasts)"}
"""How the verifier encodes a function; a function it does not model says why
(:class:`~unity_cli.ir.opspec.Opaque`)."""

_NONE = Opaque("no axioms yet")
_BOOL = Opaque("a comparison or logical function with a boolean output, which the verifier does not model")


@dataclass(frozen=True)
class BinaryFn:
    terms: str                                    # partial sums: sum | product | numerator | none
    forward: Callable[[Any, Any, Any], Any]       # (a, b, xp) -> y
    backward: Callable[[Sequence[Any], Any, Any, Any], list[Any]] | None = None   # (xs, y, g, xp) -> dxs
    verifier: str | Opaque = _NONE
    flops: int = 1                                # per output element
    boolean: bool = False
    commutative: bool = False
    variadic: bool = False                        # any number of inputs (1 to 64)

    @property
    def opaque(self) -> bool:
        return isinstance(self.verifier, Opaque)


def _int_div(a: Any, b: Any, xp: Any) -> Any:
    """Integer division truncating toward zero, as C and onnxruntime do."""
    q = a // b
    return q + ((q < 0) & (q * b != a))


def _pow_grad(xs: Sequence[Any], y: Any, g: Any, xp: Any) -> list[Any]:
    a, b = xs
    pos = a > 0
    log_a = xp.where(pos, xp.log(xp.where(pos, a, 1)), 0)
    return [g * b * xp.power(a, b - 1), g * y * log_a]


def _extremum_grad(xs: Sequence[Any], y: Any, g: Any, xp: Any) -> list[Any]:
    """Max/Min: the gradient goes to the first input that attains the extremum (ties too)."""
    full, taken = [], xp.zeros(y.shape, dtype=bool)
    for x in xs:
        hit = (x == y) & ~taken
        taken = taken | hit
        full.append(g * hit)
    return full


def _comparison(f: Callable[[Any, Any, Any], Any]) -> BinaryFn:
    return BinaryFn("none", f, verifier=_BOOL, boolean=True)


BINARY: dict[str, BinaryFn] = {
    "Add": BinaryFn("sum", lambda a, b, xp: a + b, lambda xs, y, g, xp: [g] * len(xs), "add", commutative=True),
    "Sum": BinaryFn("sum", lambda a, b, xp: a + b, lambda xs, y, g, xp: [g] * len(xs), "add", commutative=True,
                    variadic=True),
    "Sub": BinaryFn("sum", lambda a, b, xp: a - b, lambda xs, y, g, xp: [g, -g], "subtract"),
    "Mul": BinaryFn("product", lambda a, b, xp: a * b, lambda xs, y, g, xp: [g * xs[1], g * xs[0]], "multiply",
                    commutative=True),
    "Div": BinaryFn("numerator", lambda a, b, xp: a / b if a.dtype.kind == "f" else _int_div(a, b, xp),
                    lambda xs, y, g, xp: [g / xs[1], -g * y / xs[1]]),
    "Pow": BinaryFn("none", lambda a, b, xp: xp.power(a, b).astype(a.dtype), _pow_grad, flops=8),
    "Max": BinaryFn("none", lambda a, b, xp: xp.maximum(a, b), _extremum_grad, commutative=True, variadic=True),
    "Min": BinaryFn("none", lambda a, b, xp: xp.minimum(a, b), _extremum_grad, commutative=True, variadic=True),
    "Equal": BinaryFn("none", lambda a, b, xp: xp.equal(a, b), verifier=_BOOL, boolean=True, commutative=True),
    "Less": _comparison(lambda a, b, xp: xp.less(a, b)),
    "Greater": _comparison(lambda a, b, xp: xp.greater(a, b)),
    "LessOrEqual": _comparison(lambda a, b, xp: xp.less_equal(a, b)),
    "GreaterOrEqual": _comparison(lambda a, b, xp: xp.greater_equal(a, b)),
    "And": BinaryFn("none", lambda a, b, xp: xp.logical_and(a, b), verifier=_BOOL, boolean=True, commutative=True),
    "Or": BinaryFn("none", lambda a, b, xp: xp.logical_or(a, b), verifier=_BOOL, boolean=True, commutative=True),
    # ONNX Mod: fmod=0 takes the sign of the divisor (Python's %), fmod=1 (Fmod, which
    # floats require) the sign of the dividend (C's fmod); neither has a useful gradient.
    "Mod": BinaryFn("none", lambda a, b, xp: xp.mod(a, b)),
    "Fmod": BinaryFn("none", lambda a, b, xp: xp.fmod(a, b)),
}
