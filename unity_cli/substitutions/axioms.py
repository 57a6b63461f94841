"""First-order axioms of the operators, for z3 (TASO's method).

Tensors are one uninterpreted sort; every operator is an uninterpreted function whose
axes, sizes and degrees are ``Int`` arguments. Each axiom is a universally quantified
equation with E-matching triggers. Each operator declares its own symbols, their numpy
meaning and its laws in its spec (``ir/ops/``, written without z3: ``ir/terms.py``);
this module collects them from the registry and makes them z3's.

Shapes are not z3's business: the verifier checks layouts exactly with the shape system
and builds terms only for well-typed graphs. Axioms must therefore hold for every
well-typed instance of their left side, and keep terms well typed. Where that needs a
shape fact, the fact is in the function symbol: ``add``/``mul`` are the same-shape ops
(broadcasting ones are ``badd``/``bmul``), ``matmul`` has equal batch dims, and
``concat(ax, n1, n2, a, b)`` / ``split(ax, n1, n2, i, x)`` carry the sizes of their parts
along ``ax`` (an axis counted from the end, as in rule patterns). Guards (``k > 0``,
``ax <= -3``) are integer conditions z3 decides on the instance.

Only E-matching instantiates axioms (no model-based instantiation), so every instance
grows out of a term of the graphs being compared. That is why a side of an equation may
trigger only if its well-typed instances make the other side well typed too (see
:class:`~unity_cli.ir.terms.Law`), and why :func:`axioms_for` may hand z3 only the axioms
whose triggers can ever match.

:data:`MODEL` gives each symbol its meaning on numpy arrays (the operators' own kernels);
:func:`evaluate_term` runs a term on arrays with it, which the tests use to check every
axiom on random tensors.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from ..ir import ops  # noqa: F401  (fill the registry)
from ..ir.opspec import all_specs
from ..ir.terms import Axiom, IllTyped, Law, Symbol
from ..kernels import forward

__all__ = ["AXIOMS", "MODEL", "SYMBOLS", "Axiom", "IllTyped", "Law", "Signature", "axiom_formulas", "axioms_for",
           "axioms_hash", "evaluate_term", "function_symbols", "quantified", "signature"]


@dataclass(frozen=True)
class Signature:
    """The sort and the function symbols that terms and axioms are written in."""

    T: z3.SortRef
    fns: Mapping[str, z3.FuncDeclRef]

    def __getattr__(self, name: str) -> z3.FuncDeclRef:
        try:
            return self.fns[name]
        except KeyError:
            raise AttributeError(name) from None

    def opaque(self, key: str, arity: int) -> z3.FuncDeclRef:
        """A function without axioms for an op the signature does not model (congruence only)."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return z3.Function(f"op_{digest}", *([self.T] * arity), self.T)


def _declared() -> tuple[dict[str, Symbol], tuple[Axiom, ...]]:
    """Every spec's symbols and axioms, in the registry's order; a symbol or an axiom
    declared twice is an error."""
    symbols: dict[str, Symbol] = {}
    axioms: list[Axiom] = []
    for kind, spec in all_specs().items():
        for sym in spec.symbols:
            if sym.name in symbols:
                raise RuntimeError(f"{kind}: the verifier's symbol {sym.name!r} is declared twice")
            symbols[sym.name] = sym
        axioms.extend(spec.axioms)
    names = [a.name for a in axioms]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RuntimeError(f"axioms named twice: {dup}")
    return symbols, tuple(axioms)


_SYMBOLS, AXIOMS = _declared()
SYMBOLS: dict[str, tuple[str, ...]] = {name: sym.args for name, sym in _SYMBOLS.items()}
"""Each function symbol's argument sorts ("T" tensor, "I" integer); every symbol returns a tensor."""


@functools.cache
def signature() -> Signature:
    T = z3.DeclareSort("Tensor")
    sorts = {"T": T, "I": z3.IntSort()}
    return Signature(T, {name: z3.Function(name, *(sorts[a] for a in args), T) for name, args in SYMBOLS.items()})


class Vars:
    """The quantified variables axioms are written with: tensors, and integers (axes,
    sizes, factors, degrees, a conv's configuration)."""

    a: z3.ExprRef
    b: z3.ExprRef
    c: z3.ExprRef
    d: z3.ExprRef
    x: z3.ExprRef
    y: z3.ExprRef
    z: z3.ExprRef
    ax: z3.ArithRef
    i: z3.ArithRef
    j: z3.ArithRef
    k: z3.ArithRef
    n1: z3.ArithRef
    n2: z3.ArithRef
    n3: z3.ArithRef
    m: z3.ArithRef
    cfg: z3.ArithRef

    def __init__(self, s: Signature) -> None:
        for name, kind in self.__annotations__.items():
            setattr(self, name, z3.Const(name, s.T) if kind.endswith("ExprRef") else z3.Int(name))


def quantified(axiom: Axiom, s: Signature) -> tuple[Law, z3.QuantifierRef]:
    """An axiom's law over ``s`` and its quantified formula: every variable bound, triggers on its sides."""
    law = axiom.law(s, Vars(s))
    body = law.lhs == law.rhs if law.guard is None else z3.Implies(law.guard, law.lhs == law.rhs)
    variables = _free_vars(body)
    patterns = [p for p in ((law.lhs, law.rhs) if law.two_way else (law.lhs,))
                if _free_vars(p) == variables and not z3.is_const(p)]
    if not patterns:
        raise AssertionError(f"axiom {axiom.name}: no side can trigger it")
    return law, z3.ForAll(sorted(variables, key=str), body, patterns=patterns)


def function_symbols(*terms: z3.ExprRef) -> frozenset[str]:
    """Names of the uninterpreted functions (not constants) that occur in some terms."""
    out, todo, seen = set(), list(terms), set()
    while todo:
        t = todo.pop()
        if t.get_id() in seen:
            continue
        seen.add(t.get_id())
        if z3.is_app(t) and t.num_args() and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out.add(t.decl().name())
        todo.extend(t.children())
    return frozenset(out)


def _free_vars(e: z3.ExprRef) -> frozenset:
    out = set()
    todo = [e]
    while todo:
        t = todo.pop()
        if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out.add(t)
        todo.extend(t.children())
    return frozenset(out)


@functools.cache
def axiom_formulas() -> tuple[z3.QuantifierRef, ...]:
    """The quantified axioms, built once per process."""
    s = signature()
    return tuple(quantified(a, s)[1] for a in AXIOMS)


@functools.cache
def _triggers() -> tuple[tuple[tuple[frozenset[str], ...], frozenset[str]], ...]:
    """Per axiom: the function symbols of each of its triggers, and of its whole body."""
    out = []
    for f in axiom_formulas():
        pats = tuple(function_symbols(f.pattern(k).arg(0)) for k in range(f.num_patterns()))
        out.append((pats, function_symbols(f.body())))
    return tuple(out)


@functools.cache
def axioms_for(symbols: frozenset[str]) -> tuple[z3.QuantifierRef, ...]:
    """The axioms E-matching can ever fire on terms over ``symbols``.

    A trigger matches only if all its function symbols occur in the E-graph, and symbols
    enter it only from the goal or from the bodies of fired axioms; so this fixpoint
    drops only axioms that could never fire, and proofs are unchanged (only faster).
    """
    have, used = set(symbols), [False] * len(AXIOMS)
    changed = True
    while changed:
        changed = False
        for k, (pats, body) in enumerate(_triggers()):
            if not used[k] and any(p <= have for p in pats):
                used[k], changed = True, True
                have |= body
    return tuple(f for f, u in zip(axiom_formulas(), used, strict=True) if u)


@functools.cache
def axioms_hash(axioms: tuple[Axiom, ...] = AXIOMS) -> str:
    """SHA-256 of the canonical text of an axiom set (a rule cache built under other axioms is
    stale): each law's sides, guard and direction, which determine its quantified formula
    (:meth:`Axiom.build`), so the hash needs no quantifiers built."""
    s = signature()
    lines = []
    for a in axioms:
        law = a.law(s, Vars(s))
        guard = "" if law.guard is None else law.guard.sexpr()
        lines.append(f"{a.name}: {law.lhs.sexpr()} = {law.rhs.sexpr()} if {guard}; two_way={law.two_way}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def _run(attrs: Any, *arrays: np.ndarray) -> list[np.ndarray]:
    return forward(attrs, list(arrays), np)[0]


MODEL: dict[str, Callable[..., np.ndarray]] = {
    name: functools.partial(sym.meaning, _run) for name, sym in _SYMBOLS.items()}
"""Each symbol's meaning on numpy arrays, as its spec declares it, by the operators' kernels."""

_ARITH: dict[int, Callable[..., Any]] = {
    z3.Z3_OP_ADD: lambda *a: sum(a), z3.Z3_OP_SUB: lambda a, b: a - b, z3.Z3_OP_UMINUS: lambda a: -a,
    z3.Z3_OP_MUL: lambda *a: int(np.prod(a)), z3.Z3_OP_LE: lambda a, b: a <= b, z3.Z3_OP_LT: lambda a, b: a < b,
    z3.Z3_OP_GE: lambda a, b: a >= b, z3.Z3_OP_GT: lambda a, b: a > b, z3.Z3_OP_EQ: lambda a, b: a == b,
    z3.Z3_OP_DISTINCT: lambda *a: len(set(a)) == len(a),
    z3.Z3_OP_AND: lambda *a: all(a), z3.Z3_OP_OR: lambda *a: any(a), z3.Z3_OP_NOT: lambda a: not a,
    z3.Z3_OP_IMPLIES: lambda a, b: (not a) or b,
}


def evaluate_term(e: z3.ExprRef, env: Mapping[str, Any]) -> Any:
    """The value of a term (or an integer/boolean condition) with its constants taken from ``env``.

    Raises :class:`IllTyped` when a symbol is applied outside its domain.
    """
    if z3.is_int_value(e):
        return e.as_long()
    if z3.is_true(e) or z3.is_false(e):
        return z3.is_true(e)
    decl = e.decl()
    if z3.is_const(e) and decl.kind() == z3.Z3_OP_UNINTERPRETED:
        return env[decl.name()]
    args = [evaluate_term(c, env) for c in e.children()]
    if decl.kind() in _ARITH:
        return _ARITH[decl.kind()](*args)
    try:
        fn = MODEL[decl.name()]
    except KeyError:
        raise NotImplementedError(f"no model of {decl.name()}") from None
    return fn(*args)
