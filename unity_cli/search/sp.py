"""Series-parallel decomposition of a PCG's node DAG (for the machine-mapping DP).

``decompose`` returns a tree of :class:`Leaf`, :class:`Series` and :class:`Parallel`.
Independent parts become a ``Parallel``; a node every other node reaches or is reached
from splits the graph in ``Series``; a part that is neither is serialized by cutting its
topological order in two (never rejected).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..deadline import check
from ..ir.pcg import PCG


@dataclass(frozen=True, slots=True, eq=False)
class Leaf:
    node: int
    nodes: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", frozenset((self.node,)))


@dataclass(frozen=True, slots=True, eq=False)
class Series:
    first: SP
    then: SP
    serialized: bool = False       # made series by cutting a topological order, not by a bottleneck
    nodes: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", self.first.nodes | self.then.nodes)


@dataclass(frozen=True, slots=True, eq=False)
class Parallel:
    left: SP
    right: SP
    nodes: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", self.left.nodes | self.right.nodes)


SP = Leaf | Series | Parallel


def decompose(pcg: PCG, nodes: Iterable[int] | None = None, roots_apart: bool = True) -> SP:
    """``roots_apart``: a node without predecessors among ``nodes`` (but the first) is never
    a bottleneck, as a realized graph's stored weight layouts should not be; without it,
    branches that start at the graph's inputs are ``Parallel`` like any others."""
    keep = sorted(set(range(len(pcg))) if nodes is None else set(nodes))
    preds = {i: {r.node for r in pcg.nodes[i].inputs} for i in keep}
    return _decompose(tuple(keep), preds, roots_apart)


def _decompose(nodes: tuple[int, ...], all_preds: dict[int, set[int]], roots_apart: bool = True) -> SP:
    if len(nodes) == 1:
        return Leaf(nodes[0])
    check()

    def part(sub: tuple[int, ...]) -> SP:
        return _decompose(sub, all_preds, roots_apart)

    pos = {v: k for k, v in enumerate(nodes)}
    preds = [[pos[p] for p in all_preds[v] if p in pos] for v in nodes]
    comps = _components(nodes, {v: {nodes[p] for p in preds[k]} for k, v in enumerate(nodes)})
    if len(comps) > 1:  # a balanced tree of independent parts
        half = len(comps) // 2
        left = tuple(sorted(i for c in comps[:half] for i in c))
        right = tuple(sorted(i for c in comps[half:] for i in c))
        return Parallel(part(left), part(right))
    n = len(nodes)
    # Ancestor and descendant sets as bitmasks over positions (nodes are topologically sorted):
    # one pass each, where networkx.ancestors is a search per node (quadratic on a chain).
    anc = [0] * n
    for k in range(n):
        for p in preds[k]:
            anc[k] |= anc[p] | (1 << p)
    succs: list[list[int]] = [[] for _ in range(n)]
    for k in range(n):
        for p in preds[k]:
            succs[p].append(k)
    desc = [0] * n
    for k in range(n - 1, -1, -1):
        for s_ in succs[k]:
            desc[k] |= desc[s_] | (1 << s_)
    # A bottleneck: comparable with every node (its ancestors and descendants are all others),
    # not counting roots but the first (nodes without predecessors here: a weight's layout
    # beside a chain). A root read before the cut is its ancestor, so it goes first; one read
    # only after goes second: the second part never feeds the first.
    roots = [k for k in range(n) if not preds[k]]
    inner = (1 << n) - 1
    for k in roots[1:] if roots_apart and len(roots) < n else ():
        inner &= ~(1 << k)
    m = inner.bit_count()
    cuts = [k for k in range(n) if inner >> k & 1 and (anc[k] & inner).bit_count() + (desc[k] & inner).bit_count()
            == m - 1]
    # Cut nearest the middle, so long chains give a balanced (shallow) tree.
    cuts.sort(key=lambda k: (abs(anc[k].bit_count() + 1 - n / 2), k))
    for c in cuts:
        first_mask = anc[c] | (1 << c)
        first = tuple(nodes[k] for k in range(n) if first_mask >> k & 1)
        then = tuple(nodes[k] for k in range(n) if not first_mask >> k & 1)
        if then:
            return Series(part(first), part(then))
    if cuts:  # the only bottleneck is the last node
        c = max(cuts)
        return Series(part(tuple(v for k, v in enumerate(nodes) if k != c)), Leaf(nodes[c]))
    half = n // 2  # nodes are in topological order: a prefix is closed under ancestors
    return Series(part(nodes[:half]), part(nodes[half:]), serialized=True)


def _components(nodes: tuple[int, ...], preds: dict[int, set[int]]) -> list[tuple[int, ...]]:
    """The weakly connected parts, by union-find: networkx's connected_components needs a
    graph built per call, 1.8x slower on a 4,000-node chain, and this runs on every subset
    the recursion visits."""
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
