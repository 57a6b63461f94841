"""Series-parallel decomposition of a PCG's node DAG (for the machine-mapping DP).

``decompose`` returns a tree of :class:`Leaf`, :class:`Series` and :class:`Parallel`.
Independent parts become a ``Parallel``; a node every other node reaches or is reached
from splits the graph in ``Series``; a part that is neither is serialized by cutting its
topological order in two (never rejected).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..ir.pcg import PCG


@dataclass(frozen=True, slots=True)
class Leaf:
    node: int

    @property
    def nodes(self) -> frozenset[int]:
        return frozenset((self.node,))


@dataclass(frozen=True, slots=True)
class Series:
    first: SP
    then: SP
    serialized: bool = False       # made series by cutting a topological order, not by a bottleneck

    @property
    def nodes(self) -> frozenset[int]:
        return self.first.nodes | self.then.nodes


@dataclass(frozen=True, slots=True)
class Parallel:
    left: SP
    right: SP

    @property
    def nodes(self) -> frozenset[int]:
        return self.left.nodes | self.right.nodes


SP = Leaf | Series | Parallel


def decompose(pcg: PCG, nodes: Iterable[int] | None = None) -> SP:
    keep = sorted(set(range(len(pcg))) if nodes is None else set(nodes))
    preds = {i: {r.node for r in pcg.nodes[i].inputs} for i in keep}
    return _decompose(tuple(keep), preds)


def _decompose(nodes: tuple[int, ...], all_preds: dict[int, set[int]]) -> SP:
    if len(nodes) == 1:
        return Leaf(nodes[0])
    inside = set(nodes)
    preds = {i: all_preds[i] & inside for i in nodes}
    comps = _components(nodes, preds)
    if len(comps) > 1:
        tree = _decompose(comps[0], all_preds)
        for c in comps[1:]:
            tree = Parallel(tree, _decompose(c, all_preds))
        return tree
    anc = _ancestors(nodes, preds)
    desc_count = {i: 0 for i in nodes}
    for i in nodes:
        for a in anc[i]:
            desc_count[a] += 1
    n = len(nodes)
    # A bottleneck: comparable with every node (its ancestors and descendants are all others).
    cuts = [i for i in nodes if len(anc[i]) + desc_count[i] == n - 1]
    for c in cuts:
        first = tuple(sorted(anc[c] | {c}))
        then = tuple(i for i in nodes if i not in anc[c] and i != c)
        if then:
            return Series(_decompose(first, all_preds), _decompose(then, all_preds))
    if cuts:  # the only bottleneck is the last node
        c = cuts[-1]
        first = tuple(i for i in nodes if i != c)
        return Series(_decompose(first, all_preds), Leaf(c))
    half = n // 2  # nodes are in topological order: a prefix is closed under ancestors
    return Series(_decompose(nodes[:half], all_preds), _decompose(nodes[half:], all_preds), serialized=True)


def _components(nodes: tuple[int, ...], preds: dict[int, set[int]]) -> list[tuple[int, ...]]:
    parent = {i: i for i in nodes}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in nodes:
        for p in preds[i]:
            a, b = find(i), find(p)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in nodes:
        groups.setdefault(find(i), []).append(i)
    return [tuple(g) for _, g in sorted(groups.items())]


def _ancestors(nodes: tuple[int, ...], preds: dict[int, set[int]]) -> dict[int, set[int]]:
    anc: dict[int, set[int]] = {}
    for i in nodes:  # topological order
        s: set[int] = set()
        for p in preds[i]:
            s.add(p)
            s |= anc[p]
        anc[i] = s
    return anc
