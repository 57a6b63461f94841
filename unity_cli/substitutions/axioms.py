"""First-order axioms of the operators, for z3 (TASO's method).

Tensors are one uninterpreted sort; every operator is an uninterpreted function whose
axes, sizes and degrees are ``Int`` arguments. Each axiom is a universally quantified
equation with E-matching triggers, written once, as data, in :data:`AXIOMS`.

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
:class:`Law`), and why :func:`axioms_for` may hand z3 only the axioms whose triggers can
ever match.

:data:`MODEL` gives each symbol its intended numpy meaning; :func:`evaluate_term` runs a
term on arrays with it, which the tests use to check every axiom on random tensors.
"""
from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from ..errors import ShapeError
from ..ir.ops.unary import EW_FUNCS, UNARY
from ..ir.opspec import OpKind, attrs_from_json, attrs_key, spec_by_kind
from ..ir.shapes import TensorShape
from ..kernels import forward


class IllTyped(ShapeError):
    """A symbol of the signature applied to arrays outside its domain (see :data:`MODEL`)."""


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


SYMBOLS: dict[str, tuple[str, ...]] = {
    # name: argument sorts ("T" tensor, "I" integer); every symbol returns a tensor.
    "matmul": ("T", "T"), "add": ("T", "T"), "mul": ("T", "T"), "badd": ("T", "T"), "bmul": ("T", "T"),
    "relu": ("T",), "ew": ("I", "T"), "scale": ("I", "T"), "transpose": ("T",),
    "concat": ("I", "I", "I", "T", "T"), "split": ("I", "I", "I", "I", "T"),
    "repartition": ("I", "I", "T"), "combine": ("I", "I", "T"), "replicate": ("I", "T"),
    "reduce_sum": ("I", "T"), "reduce_copies": ("I", "T"), "gather": ("I", "T", "T"), "conv": ("I", "T", "T"),
}


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


@dataclass(frozen=True)
class Law:
    """``guard -> lhs = rhs``; triggers on ``lhs`` (and on ``rhs`` when ``two_way``).

    A side may trigger only if every well-typed instance of it makes the other side well
    typed too (so E-matching never equates a graph's term with an ill-typed one): hence
    ``two_way=False`` where the right side does not determine the left's shapes (a
    gather's table rows, a strided conv's input size, a batched matmul's inner dims).
    """

    lhs: z3.ExprRef
    rhs: z3.ExprRef
    guard: z3.BoolRef | None = None
    two_way: bool = True


@dataclass(frozen=True)
class Axiom:
    """A named law; ``law`` writes it over a signature and the quantified :class:`Vars`."""

    name: str
    law: Callable[[Signature, Vars], Law]

    def build(self, s: Signature) -> tuple[Law, z3.QuantifierRef]:
        """The law and its quantified formula: every variable bound, triggers on its sides."""
        law = self.law(s, Vars(s))
        body = law.lhs == law.rhs if law.guard is None else z3.Implies(law.guard, law.lhs == law.rhs)
        variables = _free_vars(body)
        patterns = [p for p in ((law.lhs, law.rhs) if law.two_way else (law.lhs,))
                    if _free_vars(p) == variables and not z3.is_const(p)]
        if not patterns:
            raise AssertionError(f"axiom {self.name}: no side can trigger it")
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


def _ax(name: str, law: Callable[[Signature, Vars], Law]) -> Axiom:
    return Axiom(name, law)


# The axioms. Names are stable: they go into axioms_hash() and into proofs' reasons.
AXIOMS: tuple[Axiom, ...] = (
    # -- elementwise algebra (add/mul: same shape; badd/bmul: broadcasting)
    _ax("add-comm", lambda s, v: Law(s.add(v.x, v.y), s.add(v.y, v.x), two_way=False)),
    _ax("add-assoc", lambda s, v: Law(s.add(s.add(v.x, v.y), v.z), s.add(v.x, s.add(v.y, v.z)))),
    _ax("mul-comm", lambda s, v: Law(s.mul(v.x, v.y), s.mul(v.y, v.x), two_way=False)),
    _ax("mul-assoc", lambda s, v: Law(s.mul(s.mul(v.x, v.y), v.z), s.mul(v.x, s.mul(v.y, v.z)))),
    _ax("mul-add", lambda s, v: Law(s.mul(v.x, s.add(v.y, v.z)), s.add(s.mul(v.x, v.y), s.mul(v.x, v.z)))),
    _ax("badd-comm", lambda s, v: Law(s.badd(v.x, v.y), s.badd(v.y, v.x), two_way=False)),
    _ax("bmul-comm", lambda s, v: Law(s.bmul(v.x, v.y), s.bmul(v.y, v.x), two_way=False)),
    _ax("add-self", lambda s, v: Law(s.add(v.x, v.x), s.scale(2, v.x), two_way=False)),
    _ax("add-scaled-self", lambda s, v: Law(s.add(s.scale(v.j, v.x), v.x), s.scale(v.j + 1, v.x), two_way=False)),
    _ax("add-scaled-scaled", lambda s, v: Law(s.add(s.scale(v.j, v.x), s.scale(v.k, v.x)), s.scale(v.j + v.k, v.x),
                                              two_way=False)),
    _ax("add-cancel", lambda s, v: Law(s.add(s.add(v.x, v.y), s.scale(-1, v.y)), v.x)),
    _ax("scale-one", lambda s, v: Law(s.scale(v.k, v.x), v.x, v.k == 1)),
    _ax("scale-scale", lambda s, v: Law(s.scale(v.j, s.scale(v.k, v.x)), s.scale(v.j * v.k, v.x), two_way=False)),
    _ax("scale-add", lambda s, v: Law(s.scale(v.k, s.add(v.x, v.y)), s.add(s.scale(v.k, v.x), s.scale(v.k, v.y)))),
    _ax("scale-mul", lambda s, v: Law(s.mul(s.scale(v.k, v.x), v.y), s.scale(v.k, s.mul(v.x, v.y)))),
    # -- relu
    _ax("relu-scale", lambda s, v: Law(s.relu(s.scale(v.k, v.x)), s.scale(v.k, s.relu(v.x)), v.k > 0)),
    _ax("relu-relu", lambda s, v: Law(s.relu(s.relu(v.x)), s.relu(v.x), two_way=False)),
    _ax("relu-square", lambda s, v: Law(s.relu(s.mul(v.x, v.x)), s.mul(v.x, v.x), two_way=False)),
    _ax("relu-times-square", lambda s, v: Law(s.relu(s.mul(v.x, s.mul(v.y, v.y))),
                                              s.mul(s.relu(v.x), s.mul(v.y, v.y)))),
    _ax("mul-relu-self", lambda s, v: Law(s.mul(v.x, s.relu(v.x)), s.mul(s.relu(v.x), s.relu(v.x)))),
    # -- matmul (equal batch dims): associative, bilinear
    _ax("matmul-assoc", lambda s, v: Law(s.matmul(s.matmul(v.a, v.b), v.c), s.matmul(v.a, s.matmul(v.b, v.c)))),
    _ax("matmul-add-left", lambda s, v: Law(s.matmul(s.add(v.a, v.b), v.c),
                                            s.add(s.matmul(v.a, v.c), s.matmul(v.b, v.c)))),
    _ax("matmul-add-right", lambda s, v: Law(s.matmul(v.a, s.add(v.b, v.c)),
                                             s.add(s.matmul(v.a, v.b), s.matmul(v.a, v.c)))),
    _ax("matmul-scale-left", lambda s, v: Law(s.matmul(s.scale(v.k, v.a), v.b), s.scale(v.k, s.matmul(v.a, v.b)))),
    _ax("matmul-scale-right", lambda s, v: Law(s.matmul(v.a, s.scale(v.k, v.b)), s.scale(v.k, s.matmul(v.a, v.b)))),
    # -- transpose of the last two dims
    _ax("transpose-transpose", lambda s, v: Law(s.transpose(s.transpose(v.x)), v.x)),
    _ax("transpose-matmul", lambda s, v: Law(s.transpose(s.matmul(v.a, v.b)),
                                             s.matmul(s.transpose(v.b), s.transpose(v.a)))),
    _ax("transpose-add", lambda s, v: Law(s.transpose(s.add(v.a, v.b)), s.add(s.transpose(v.a), s.transpose(v.b)))),
    _ax("transpose-mul", lambda s, v: Law(s.transpose(s.mul(v.a, v.b)), s.mul(s.transpose(v.a), s.transpose(v.b)))),
    _ax("transpose-relu", lambda s, v: Law(s.transpose(s.relu(v.x)), s.relu(s.transpose(v.x)))),
    _ax("transpose-ew", lambda s, v: Law(s.transpose(s.ew(v.k, v.x)), s.ew(v.k, s.transpose(v.x)))),
    _ax("transpose-scale", lambda s, v: Law(s.transpose(s.scale(v.k, v.x)), s.scale(v.k, s.transpose(v.x)))),
    # -- concat/split: parts carry their sizes n1, n2 along ax (counted from the end)
    _ax("concat-assoc-left", lambda s, v: Law(
        s.concat(v.ax, v.n1, v.m, v.a, s.concat(v.ax, v.n2, v.n3, v.b, v.c)),
        s.concat(v.ax, v.n1 + v.n2, v.n3, s.concat(v.ax, v.n1, v.n2, v.a, v.b), v.c), v.m == v.n2 + v.n3, False)),
    _ax("concat-assoc-right", lambda s, v: Law(
        s.concat(v.ax, v.m, v.n3, s.concat(v.ax, v.n1, v.n2, v.a, v.b), v.c),
        s.concat(v.ax, v.n1, v.n2 + v.n3, v.a, s.concat(v.ax, v.n2, v.n3, v.b, v.c)), v.m == v.n1 + v.n2, False)),
    _ax("concat-interchange", lambda s, v: Law(
        s.concat(v.ax, v.m, v.n3, s.concat(v.i, v.n1, v.n2, v.a, v.b), s.concat(v.i, v.n1, v.n2, v.c, v.d)),
        s.concat(v.i, v.n1, v.n2, s.concat(v.ax, v.m, v.n3, v.a, v.c), s.concat(v.ax, v.m, v.n3, v.b, v.d)),
        v.ax != v.i)),
    _ax("split-concat-first", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, 0, s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                               v.a)),
    _ax("split-concat-second", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, 1, s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                                v.b)),
    _ax("concat-split", lambda s, v: Law(
        s.concat(v.ax, v.n1, v.n2, s.split(v.ax, v.n1, v.n2, 0, v.x), s.split(v.ax, v.n1, v.n2, 1, v.x)), v.x)),
    _ax("split-concat-across", lambda s, v: Law(
        s.split(v.ax, v.n1, v.n2, v.i, s.concat(v.j, v.m, v.n3, v.a, v.b)),
        s.concat(v.j, v.m, v.n3, s.split(v.ax, v.n1, v.n2, v.i, v.a), s.split(v.ax, v.n1, v.n2, v.i, v.b)),
        v.ax != v.j)),
    _ax("relu-concat", lambda s, v: Law(s.relu(s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                        s.concat(v.ax, v.n1, v.n2, s.relu(v.a), s.relu(v.b)))),
    _ax("ew-concat", lambda s, v: Law(s.ew(v.k, s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                      s.concat(v.ax, v.n1, v.n2, s.ew(v.k, v.a), s.ew(v.k, v.b)))),
    _ax("scale-concat", lambda s, v: Law(s.scale(v.k, s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
                                         s.concat(v.ax, v.n1, v.n2, s.scale(v.k, v.a), s.scale(v.k, v.b)))),
    _ax("add-concat", lambda s, v: Law(
        s.add(s.concat(v.ax, v.n1, v.n2, v.a, v.b), s.concat(v.ax, v.n1, v.n2, v.c, v.d)),
        s.concat(v.ax, v.n1, v.n2, s.add(v.a, v.c), s.add(v.b, v.d)))),
    _ax("mul-concat", lambda s, v: Law(
        s.mul(s.concat(v.ax, v.n1, v.n2, v.a, v.b), s.concat(v.ax, v.n1, v.n2, v.c, v.d)),
        s.concat(v.ax, v.n1, v.n2, s.mul(v.a, v.c), s.mul(v.b, v.d)))),
    _ax("matmul-concat-rows", lambda s, v: Law(s.matmul(s.concat(-2, v.n1, v.n2, v.a, v.b), v.c),
                                               s.concat(-2, v.n1, v.n2, s.matmul(v.a, v.c), s.matmul(v.b, v.c)))),
    _ax("matmul-concat-cols", lambda s, v: Law(s.matmul(v.a, s.concat(-1, v.n1, v.n2, v.b, v.c)),
                                               s.concat(-1, v.n1, v.n2, s.matmul(v.a, v.b), s.matmul(v.a, v.c)))),
    _ax("matmul-concat-batch", lambda s, v: Law(
        s.matmul(s.concat(v.ax, v.n1, v.n2, v.a, v.b), s.concat(v.ax, v.n1, v.n2, v.c, v.d)),
        s.concat(v.ax, v.n1, v.n2, s.matmul(v.a, v.c), s.matmul(v.b, v.d)), v.ax <= -3, False)),
    _ax("matmul-concat-contracted", lambda s, v: Law(
        s.matmul(s.concat(-1, v.n1, v.n2, v.a, v.b), s.concat(-2, v.n1, v.n2, v.c, v.d)),
        s.add(s.matmul(v.a, v.c), s.matmul(v.b, v.d)), two_way=False)),
    _ax("matmul-concat-contracted-left", lambda s, v: Law(
        s.matmul(s.concat(-1, v.n1, v.n2, v.a, v.b), v.c),
        s.add(s.matmul(v.a, s.split(-2, v.n1, v.n2, 0, v.c)), s.matmul(v.b, s.split(-2, v.n1, v.n2, 1, v.c))))),
    _ax("matmul-concat-contracted-right", lambda s, v: Law(
        s.matmul(v.a, s.concat(-2, v.n1, v.n2, v.b, v.c)),
        s.add(s.matmul(s.split(-1, v.n1, v.n2, 0, v.a), v.b), s.matmul(s.split(-1, v.n1, v.n2, 1, v.a), v.c)))),
    _ax("transpose-concat-last", lambda s, v: Law(s.transpose(s.concat(-1, v.n1, v.n2, v.a, v.b)),
                                                  s.concat(-2, v.n1, v.n2, s.transpose(v.a), s.transpose(v.b)))),
    _ax("transpose-concat-rows", lambda s, v: Law(s.transpose(s.concat(-2, v.n1, v.n2, v.a, v.b)),
                                                  s.concat(-1, v.n1, v.n2, s.transpose(v.a), s.transpose(v.b)))),
    _ax("transpose-concat-batch", lambda s, v: Law(
        s.transpose(s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
        s.concat(v.ax, v.n1, v.n2, s.transpose(v.a), s.transpose(v.b)), v.ax <= -3)),
    _ax("split-relu", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.relu(v.x)),
                                       s.relu(s.split(v.ax, v.n1, v.n2, v.i, v.x)))),
    _ax("split-ew", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.ew(v.k, v.x)),
                                     s.ew(v.k, s.split(v.ax, v.n1, v.n2, v.i, v.x)))),
    _ax("split-scale", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.scale(v.k, v.x)),
                                        s.scale(v.k, s.split(v.ax, v.n1, v.n2, v.i, v.x)))),
    _ax("split-add", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.add(v.x, v.y)),
                                      s.add(s.split(v.ax, v.n1, v.n2, v.i, v.x), s.split(v.ax, v.n1, v.n2, v.i, v.y)))),
    # (y spans the split dim: a y broadcast along it would stay whole, another law)
    _ax("split-badd", lambda s, v: Law(
        s.split(v.ax, v.n1, v.n2, v.i, s.badd(v.x, v.y)),
        s.badd(s.split(v.ax, v.n1, v.n2, v.i, v.x), s.split(v.ax, v.n1, v.n2, v.i, v.y)))),
    _ax("split-mul", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.mul(v.x, v.y)),
                                      s.mul(s.split(v.ax, v.n1, v.n2, v.i, v.x), s.split(v.ax, v.n1, v.n2, v.i, v.y)))),
    _ax("split-transpose-last", lambda s, v: Law(s.split(-1, v.n1, v.n2, v.i, s.transpose(v.x)),
                                                 s.transpose(s.split(-2, v.n1, v.n2, v.i, v.x)))),
    _ax("split-transpose-rows", lambda s, v: Law(s.split(-2, v.n1, v.n2, v.i, s.transpose(v.x)),
                                                 s.transpose(s.split(-1, v.n1, v.n2, v.i, v.x)))),
    _ax("split-transpose-batch", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.transpose(v.x)),
                                                  s.transpose(s.split(v.ax, v.n1, v.n2, v.i, v.x)), v.ax <= -3)),
    _ax("split-matmul-rows", lambda s, v: Law(s.split(-2, v.n1, v.n2, v.i, s.matmul(v.a, v.b)),
                                              s.matmul(s.split(-2, v.n1, v.n2, v.i, v.a), v.b))),
    _ax("split-matmul-cols", lambda s, v: Law(s.split(-1, v.n1, v.n2, v.i, s.matmul(v.a, v.b)),
                                              s.matmul(v.a, s.split(-1, v.n1, v.n2, v.i, v.b)))),
    _ax("split-matmul-batch", lambda s, v: Law(
        s.split(v.ax, v.n1, v.n2, v.i, s.matmul(v.a, v.b)),
        s.matmul(s.split(v.ax, v.n1, v.n2, v.i, v.a), s.split(v.ax, v.n1, v.n2, v.i, v.b)), v.ax <= -3)),
    # -- parallel ops: the logical value is unchanged, except a Reduction of replicas
    _ax("repartition-id", lambda s, v: Law(s.repartition(v.ax, v.k, v.x), v.x)),
    _ax("combine-id", lambda s, v: Law(s.combine(v.ax, v.k, v.x), v.x)),
    _ax("replicate-id", lambda s, v: Law(s.replicate(v.k, v.x), v.x)),
    _ax("reduce-sum-id", lambda s, v: Law(s.reduce_sum(v.k, v.x), v.x)),
    _ax("reduce-copies-scale", lambda s, v: Law(s.reduce_copies(v.k, v.x), s.scale(v.k, v.x))),
    # -- gather is linear in its table; conv is bilinear
    _ax("gather-add", lambda s, v: Law(s.gather(v.ax, s.add(v.a, v.b), v.c),
                                       s.add(s.gather(v.ax, v.a, v.c), s.gather(v.ax, v.b, v.c)), two_way=False)),
    _ax("gather-scale", lambda s, v: Law(s.gather(v.ax, s.scale(v.k, v.a), v.c),
                                         s.scale(v.k, s.gather(v.ax, v.a, v.c)))),
    _ax("conv-add-input", lambda s, v: Law(s.conv(v.cfg, s.add(v.a, v.b), v.c),
                                           s.add(s.conv(v.cfg, v.a, v.c), s.conv(v.cfg, v.b, v.c)), two_way=False)),
    _ax("conv-add-weight", lambda s, v: Law(s.conv(v.cfg, v.a, s.add(v.b, v.c)),
                                            s.add(s.conv(v.cfg, v.a, v.b), s.conv(v.cfg, v.a, v.c)))),
    _ax("conv-scale-input", lambda s, v: Law(s.conv(v.cfg, s.scale(v.k, v.a), v.b),
                                             s.scale(v.k, s.conv(v.cfg, v.a, v.b)))),
    _ax("conv-scale-weight", lambda s, v: Law(s.conv(v.cfg, v.a, s.scale(v.k, v.b)),
                                              s.scale(v.k, s.conv(v.cfg, v.a, v.b)))),
)


def _check_unique() -> None:
    names = [a.name for a in AXIOMS]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuntimeError(f"axioms named twice: {sorted(dup)}")


_check_unique()


@functools.cache
def axiom_formulas() -> tuple[z3.QuantifierRef, ...]:
    """The quantified axioms, built once per process."""
    s = signature()
    return tuple(a.build(s)[1] for a in AXIOMS)


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


# ---------------------------------------------------------------------------
# The intended meaning of each symbol, on numpy arrays.


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise IllTyped(what)


def _same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    _need(a.shape == b.shape, f"{what} of shapes {a.shape} and {b.shape}")


def _matmul(a, b):
    _need(a.ndim >= 2 and b.ndim >= 2 and a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-2],
          f"matmul of shapes {a.shape} and {b.shape}")
    return a @ b


def _axis(ax: int, x: np.ndarray) -> None:
    _need(-x.ndim <= ax <= -1, f"axis {ax} of a rank-{x.ndim} tensor")


def _concat(ax, n1, n2, a, b):
    _axis(ax, a)
    _need(a.ndim == b.ndim and a.shape[ax] == n1 and b.shape[ax] == n2,
          f"concat({ax}, {n1}, {n2}) of {a.shape}, {b.shape}")
    _need(all(p == q for k, (p, q) in enumerate(zip(a.shape, b.shape)) if k != a.ndim + ax),
          "concat: other dims differ")
    return np.concatenate([a, b], axis=ax)


def _split(ax, n1, n2, i, x):
    _axis(ax, x)
    _need(x.shape[ax] == n1 + n2 and i in (0, 1), f"split({ax}, {n1}, {n2}, {i}) of {x.shape}")
    return np.split(x, [n1], axis=ax)[i]


def _transpose(x):
    _need(x.ndim >= 2, f"transpose of a rank-{x.ndim} tensor")
    return np.swapaxes(x, -1, -2)


def _gather(ax, t, ids):
    _axis(ax, t)
    idx = np.asarray(ids).astype(np.int64)
    _need(bool(np.all((idx >= 0) & (idx < t.shape[ax]))), "gather: ids out of range")
    return np.take(t, idx, axis=ax)


def conv_config(attrs: Any) -> int:
    """The ``cfg`` integer that names a Conv's attributes in terms (reversible, see :func:`conv_attrs`)."""

    return int.from_bytes(attrs_key(attrs).encode(), "big")


def conv_attrs(cfg: int) -> Any:
    return attrs_from_json(json.loads(cfg.to_bytes((cfg.bit_length() + 7) // 8, "big").decode()))


def conv_reference(attrs: Any, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """ONNX Conv (no bias): the runtime's kernel (exact on integers); arrays of shapes the
    Conv does not take are ill-typed."""
    try:
        spec_by_kind(OpKind.Conv).infer(attrs, [TensorShape(x.shape), TensorShape(w.shape)])
    except ShapeError as e:
        raise IllTyped(str(e)) from None
    return forward(attrs, [x, w], np)[0][0]


def _ew(code, x):
    """A pointwise function's numpy model: its own definition (``ir/ops/unary.py``)."""
    return UNARY[EW_FUNCS[code]].forward(x, np)


def _elementwise(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def run(a, b):
        _same(a, b, name)
        return fn(a, b)
    return run


def _broadcasting(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def run(a, b):
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise IllTyped(f"shapes {a.shape} and {b.shape} do not broadcast") from None
        return fn(a, b)
    return run


MODEL: dict[str, Callable[..., np.ndarray]] = {
    "matmul": _matmul, "add": _elementwise("add", np.add), "mul": _elementwise("mul", np.multiply),
    "badd": _broadcasting(np.add), "bmul": _broadcasting(np.multiply), "relu": lambda x: np.maximum(x, 0),
    "ew": _ew, "scale": lambda k, x: k * x, "transpose": _transpose, "concat": _concat, "split": _split,
    "repartition": lambda ax, d, x: x, "combine": lambda ax, d, x: x, "replicate": lambda d, x: x,
    "reduce_sum": lambda d, x: x, "reduce_copies": lambda d, x: d * x, "gather": _gather,
    "conv": lambda cfg, x, w: conv_reference(conv_attrs(cfg), x, w),
}
if set(MODEL) != set(SYMBOLS):
    raise RuntimeError("every symbol of the signature needs a model")

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
