"""What an operator tells the z3 verifier about itself, written without z3.

A spec in ``ir/ops/`` that the verifier models says three things, beside its shapes,
parallelization and cost:

* ``encode(s, attrs, x, ins, outs)``: the terms of its outputs, written in the symbols of
  the signature ``s`` from its inputs' terms ``x`` (None where it has no term for this
  instance: the verifier then sees an uninterpreted function);
* ``symbols``: the function symbols it brings into the signature, each with its argument
  sorts and its meaning on numpy arrays (the tests check every axiom through these);
* ``axioms``: the laws whose left side its own symbol roots, as :class:`Law` s written over
  the signature and the quantified variables.

``substitutions/axioms.py`` collects them from the registry: it builds the z3 signature
from every spec's symbols and the quantified formulas from their laws. The laws here are
functions of the signature and the variables, so neither this module nor the specs
import z3 (guards such as ``v.k > 0`` are built by the operators of z3's own terms).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ShapeError


class IllTyped(ShapeError):
    """A symbol of the signature applied to arrays outside its domain."""


def need(ok: bool, what: str) -> None:
    """A symbol's domain check: raise :class:`IllTyped` unless ``ok``."""
    if not ok:
        raise IllTyped(what)


@dataclass(frozen=True)
class Symbol:
    """A function symbol of the signature: argument sorts (``"T"`` a tensor, ``"I"`` an
    integer; it returns a tensor) and its meaning, ``meaning(run, *args)``, which checks
    the symbol's domain with :func:`need` (the shape facts its name carries) and computes
    with ``run(attrs, *arrays)``, an operator's outputs by its kernel: the verifier's numeric
    model is the runtime's own implementation."""

    name: str
    args: tuple[str, ...]
    meaning: Callable[..., Any]


@dataclass(frozen=True)
class Law:
    """``guard -> lhs = rhs``; triggers on ``lhs`` (and on ``rhs`` when ``two_way``).

    A side may trigger only if every well-typed instance of it makes the other side well
    typed too (so E-matching never equates a graph's term with an ill-typed one): hence
    ``two_way=False`` where the right side does not determine the left's shapes (a
    gather's table rows, a strided conv's input size, a batched matmul's inner dims).
    """

    lhs: Any
    rhs: Any
    guard: Any = None
    two_way: bool = True


@dataclass(frozen=True)
class Axiom:
    """A named law; ``law(s, v)`` writes it over a signature and the quantified variables
    (tensors ``a b c d x y z``, integers ``ax i j k n1 n2 n3 m cfg``). Names are stable:
    they go into the rule cache's axiom hash and into proofs' reasons."""

    name: str
    law: Callable[[Any, Any], Law]
