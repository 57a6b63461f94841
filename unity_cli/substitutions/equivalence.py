"""Which rule applications can only give graphs another one gives.

The search deduplicates candidates by ``PCG.unordered_hash``, which is blind to the input
order of commutative operators. So a rule whose two sides differ only in such an order
(``Add(a, b) = Add(b, a)``) rewrites every graph into one already seen, and two rules with
the same source pattern whose targets differ only so (``Add(Add(a, b), c) = Add(Add(a, c),
b)`` and ``= Add(Add(c, a), b)``) rewrite every match into the same graph. ``search_rules``
drops both kinds before a search starts: the search visits the same graphs in the same
order, without building the ones it would throw away.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from ..ir.opspec import spec_by_kind
from .rule import Constraint, Pattern, PatternNode, Rule


def search_rules(rules: Iterable[tuple[Rule, bool]]) -> list[tuple[Rule, bool]]:
    """``rules`` (a rule and whether it is applied reversed, in search order) without the
    ones that never rewrite a graph into one the search has not seen: a rule whose sides
    are equal up to commutative input order, and a rule equivalent to an earlier one (the
    same source pattern up to names, the same constraints, a target equal up to that
    order). The first of equivalent rules stays, so the kept rules find the same graphs.
    Pass each rule as it is, with ``True`` for its reverse: the answer is cached by rule."""
    kept, seen = [], set()
    for rule, reverse in rules:
        key = _cached_key(rule, reverse)
        if key is not None:
            src, dst, _ = key
            if src == dst or key in seen:
                continue
            seen.add(key)
        kept.append((rule, reverse))
    return kept


_KEYS: dict[tuple[int, bool], tuple[Rule, tuple | None]] = {}
KEYS_LIMIT = 100_000


def _cached_key(rule: Rule, reverse: bool) -> tuple | None:
    """:func:`_key` of ``rule`` (reversed when ``reverse``), computed once per rule object:
    every search of a run filters the same rules."""
    hit = _KEYS.get((id(rule), reverse))
    if hit is not None and hit[0] is rule:
        return hit[1]
    if len(_KEYS) > KEYS_LIMIT:
        _KEYS.clear()
    key = _key(rule.reversed() if reverse else rule)
    _KEYS[(id(rule), reverse)] = (rule, key)
    return key


def _key(rule: Rule) -> tuple | None:
    """(the source's commutation-blind terms, the target's, the exact source pattern and
    constraints), all with tensors renamed by first use in the source; None when a
    constraint names a tensor the source lacks (such a rule is kept as it is)."""
    names: dict[str, str] = {}
    for t in [t for n in rule.src.nodes for t in n.inputs + n.outputs] + list(rule.inputs):
        names.setdefault(t, f"v{len(names)}")   # by first use: Add(b, a) is Add(a, b) renamed
    src = _terms(rule.src, rule.inputs, names)
    dst = _terms(rule.dst, rule.inputs, names)
    try:
        constraints = tuple(_renamed_constraint(c, names) for c in rule.constraints)
    except KeyError:
        return None
    exact = (tuple((n.kind, n.attrs, tuple(names[t] for t in n.inputs), tuple(names[t] for t in n.outputs))
                   for n in rule.src.nodes), tuple(names[t] for t in rule.src.outputs))
    return src, dst, (exact, rule.params, constraints)


def _terms(p: Pattern, inputs: Sequence[str], names: dict[str, str]) -> tuple[str, ...]:
    """Each output of ``p`` as a term over the rule's inputs, commutative arguments sorted."""
    made = {t: (n, k) for n in p.nodes for k, t in enumerate(n.outputs)}
    memo: dict[str, str] = {}

    def term(t: str) -> str:
        if t in inputs:
            return "$" + names[t]
        if t not in memo:
            node, k = made[t]
            args = [term(x) for x in node.inputs]
            if _commutative(node):
                args.sort()
            memo[t] = f"{node.kind}{node.attrs!r}[{k}]({','.join(args)})"
        return memo[t]

    return tuple(term(t) for t in p.outputs)


def _commutative(node: PatternNode) -> bool:
    """Whether the operator reads its inputs in any order (asked of its spec)."""
    return _commutative_op(node.kind, node.attrs)


@functools.lru_cache(maxsize=4096)
def _commutative_op(kind: str, pattern_attrs: tuple) -> bool:
    spec = spec_by_kind(kind)
    try:
        attrs = spec.attrs_type(**dict(pattern_attrs))
    except (TypeError, ValueError):
        return False    # pattern attributes that are not the op's fields (axes, parts): not commutative
    return spec.commutative(attrs)


def _renamed_constraint(c: Constraint, names: dict[str, str]) -> tuple:
    return (c.kind, _renamed(c.lhs, names), _renamed(c.rhs, names))


def _renamed(operand: Any, names: dict[str, str]) -> Any:
    if isinstance(operand, tuple | list) and operand and operand[0] in ("dim", "degree", "sum", "copy", "rank"):
        return (operand[0], names[operand[1]], *operand[2:])
    return operand if not isinstance(operand, list) else tuple(operand)
