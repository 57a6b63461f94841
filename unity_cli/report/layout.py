"""Drawing a DAG for the plan report: a layered layout, and the groups of repeated layers
that a large graph is collapsed into.

The layout is the classic Sugiyama recipe: longest-path layers (sources pulled next to
their first reader), a dummy point per layer an edge skips, a few barycentric sweeps to
order each layer, then each box placed at the mean position of its neighbours without
overlapping the one before it. It is computed left to right and turned top to bottom
(as DNN graphs are usually drawn: a deep chain scrolls, parallel branches spread across
the page). Everything iterates in sorted order, so the same graph always gets the same
picture.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

Point = tuple[float, float]


@dataclass(frozen=True)
class Layout:
    """Top-left corner of each box, the points each edge passes through, and the extent."""

    pos: dict[int, Point]
    routes: dict[tuple[int, int], tuple[Point, ...]]
    width: float
    height: float


def layered_layout(sizes: Mapping[int, tuple[float, float]], edges: Iterable[tuple[int, int]],
                   layer_gap: float = 30.0, node_gap: float = 16.0, margin: float = 16.0,
                   top_down: bool = True) -> Layout:
    """Place boxes of the given (width, height) so that every edge points down (or right)."""
    if not top_down:
        return _left_to_right(sizes, edges, layer_gap, node_gap, margin)
    lay = _left_to_right({v: (h, w) for v, (w, h) in sizes.items()}, edges, layer_gap, node_gap, margin)
    return Layout({v: (y, x) for v, (x, y) in lay.pos.items()},
                  {e: tuple((y, x) for x, y in pts) for e, pts in lay.routes.items()}, lay.height, lay.width)


def _left_to_right(sizes: Mapping[int, tuple[float, float]], edges: Iterable[tuple[int, int]],
                   col_gap: float, row_gap: float, margin: float, sweeps: int = 4) -> Layout:
    g = nx.DiGraph()
    g.add_nodes_from(sorted(sizes))
    g.add_edges_from(sorted({(u, v) for u, v in edges if u != v}))
    order = list(nx.lexicographical_topological_sort(g))
    layer: dict[int, int] = {}
    for v in order:
        layer[v] = max((layer[u] + 1 for u in g.predecessors(v)), default=0)
    for v in reversed(order):  # a source sits just before its first reader, not at the far left
        if g.in_degree(v) == 0 and g.out_degree(v):
            layer[v] = min(layer[w] for w in g.successors(v)) - 1

    # Dummy points split every edge that skips layers; ids past the real ones.
    nxt = max(sizes, default=0) + 1
    chain: dict[tuple[int, int], list[int]] = {}
    preds: dict[int, list[int]] = {v: [] for v in order}
    succs: dict[int, list[int]] = {v: [] for v in order}
    for u, v in sorted(g.edges()):
        path = [u]
        for k in range(layer[u] + 1, layer[v]):
            layer[nxt], preds[nxt], succs[nxt] = k, [], []
            path.append(nxt)
            nxt += 1
        path.append(v)
        chain[(u, v)] = path[1:-1]
        for a, b in zip(path, path[1:]):
            succs[a].append(b)
            preds[b].append(a)
    rank = {v: k for k, v in enumerate(order)}
    layers: list[list[int]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for v in sorted(layer, key=lambda v: (rank.get(v, len(rank) + v), v)):
        layers[layer[v]].append(v)

    index = {v: k for lay in layers for k, v in enumerate(lay)}
    for sweep in range(sweeps):
        down = sweep % 2 == 0
        seq = layers[1:] if down else layers[-2::-1]
        for lay in seq:
            near = preds if down else succs
            key = {v: (_mean([index[u] for u in near[v]], index[v]), index[v]) for v in lay}
            lay.sort(key=key.__getitem__)
            for k, v in enumerate(lay):
                index[v] = k

    def size(v: int) -> tuple[float, float]:
        return sizes.get(v, (0.0, 2.0))

    col_x, x = [], margin
    for lay in layers:
        col_x.append(x)
        x += max((size(v)[0] for v in lay), default=0.0) + col_gap
    width = x - col_gap + margin if layers else 2 * margin
    col_w = [max((size(v)[0] for v in lay), default=0.0) for lay in layers]

    cy: dict[int, float] = {}
    for lay in layers:  # first guess: stacked
        y = 0.0
        for v in lay:
            cy[v] = y + size(v)[1] / 2
            y += size(v)[1] + row_gap
    for sweep in range(3):
        down = sweep % 2 == 0
        for lay in (layers if down else layers[::-1]):
            near = preds if down else succs
            want = {v: _mean([cy[u] for u in near[v]], cy[v]) for v in lay}
            _place(lay, want, cy, size, row_gap)
    top = min((cy[v] - size(v)[1] / 2 for v in cy), default=0.0)
    bottom = max((cy[v] + size(v)[1] / 2 for v in cy), default=0.0)
    shift = margin - top
    pos: dict[int, Point] = {}
    for k, lay in enumerate(layers):
        for v in lay:
            if v in sizes:
                w, h = sizes[v]
                pos[v] = (col_x[k] + (col_w[k] - w) / 2, cy[v] - h / 2 + shift)
    routes: dict[tuple[int, int], tuple[Point, ...]] = {}
    for (u, v), dummies in chain.items():
        (ux, uy), (uw, uh) = pos[u], sizes[u]
        pts: list[Point] = [(ux + uw, uy + uh / 2)]
        for d in dummies:
            k = layer[d]
            pts += [(col_x[k], cy[d] + shift), (col_x[k] + col_w[k], cy[d] + shift)]
        pts.append((pos[v][0], pos[v][1] + sizes[v][1] / 2))
        routes[(u, v)] = tuple(pts)
    return Layout(pos, routes, width, bottom - top + 2 * margin)


def _mean(values: Sequence[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _place(lay: Sequence[int], want: Mapping[int, float], cy: dict[int, float], size, gap: float) -> None:
    """Centres as close to ``want`` as the order allows: top to bottom, each pushed below the
    last, then the whole run pulled up by half of how far it was pushed on average."""
    prev_bottom = None
    for v in lay:
        h = size(v)[1]
        y = want[v]
        if prev_bottom is not None:
            y = max(y, prev_bottom + gap + h / 2)
        cy[v] = y
        prev_bottom = y + h / 2
    if lay:
        drift = sum(cy[v] - want[v] for v in lay) / len(lay)
        for v in lay:
            cy[v] -= drift / 2


# ---------------------------------------------------------------------------------------
# Groups of repeated layers

_INDEX = re.compile(r"(?<=[A-Za-z_.])(\d+)(?=[/._][^/._])")


@dataclass(frozen=True)
class Group:
    """Nodes of repeated layers drawn as one box: ``key`` is the name up to the index."""

    key: str
    indices: tuple[int, ...]
    nodes: tuple[int, ...]
    name: str = ""             # set for groups found by structure: first … last operator

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        stem = re.split(r"[/]", self.key.rstrip("/"))[-1]
        lo, hi = self.indices[0], self.indices[-1]
        return f"{stem}{lo}–{hi} (×{len(self.indices)})"


def repeat_candidates(name: str) -> list[tuple[str, int]]:
    """(key, index) for each number in ``name`` that may count repeated layers, outermost
    first: ``/m/encoder/layer.3/attention/...`` gives ``("/m/encoder/layer.", 3)``."""
    return [(name[:m.start()], int(m.group(1))) for m in _INDEX.finditer(name)]


def find_groups(names: Mapping[int, str], edges: Iterable[tuple[int, int]], min_repeats: int = 2,
                min_size: int = 2, signatures: Mapping[int, str] | None = None) -> list[Group]:
    """Groups of nodes whose names differ only in a layer index, outermost key first.

    A key is taken when at least ``min_repeats`` indices share it, its instances hold
    ``min_size`` nodes on average, and collapsing it keeps the graph acyclic (the layers
    are contiguous). Unnamed nodes (parallel ops) join the group of their producer, or of
    all their readers. With ``signatures`` (a structural key per node), runs of identical
    blocks among the nodes left over become groups too (``res2b``, ``res2c``, … have no
    index in their names).
    """
    edges = sorted(set(edges))
    by_key: dict[str, dict[int, list[int]]] = {}
    for v in sorted(names):
        for key, idx in repeat_candidates(names[v]):
            by_key.setdefault(key, {}).setdefault(idx, []).append(v)
    preds: dict[int, list[int]] = {}
    succs: dict[int, list[int]] = {}
    for u, v in edges:
        succs.setdefault(u, []).append(v)
        preds.setdefault(v, []).append(u)
    owner: dict[int, int] = {}
    groups: list[Group] = []
    for key in sorted(by_key, key=lambda k: (len(k), k)):
        inst = by_key[key]
        members = [v for vs in inst.values() for v in vs if v not in owner]
        if len(inst) < min_repeats or len(members) < min_size * len(inst):
            continue
        inside = set(members)
        for v in sorted(names):  # unnamed nodes fed from inside (parallel ops between layers)
            if not names[v] and v not in owner and any(u in inside for u in preds.get(v, [])):
                inside.add(v)
        members = sorted(inside)
        trial = {**owner, **{v: len(groups) for v in members}}
        if _acyclic(names, edges, trial):
            owner = trial
            groups.append(Group(key, tuple(sorted(inst)), tuple(members)))
    if signatures is not None:
        for g in repeated_blocks(sorted(names), signatures, edges, set(owner), names):
            trial = {**owner, **{v: len(groups) for v in g.nodes}}
            if _acyclic(names, edges, trial):
                owner = trial
                groups.append(g)
    if not groups:
        return []
    # Other unnamed nodes follow their neighbours when that keeps the quotient acyclic.
    for v in sorted(names):
        if names[v] or v in owner:
            continue
        gp = {owner.get(u) for u in preds.get(v, [])}
        gs = {owner.get(w) for w in succs.get(v, [])}
        pick = next(iter(gp)) if len(gp) == 1 else None
        if pick is None and len(gs) == 1:
            pick = next(iter(gs))
        if pick is not None:
            trial = {**owner, v: pick}
            if _acyclic(names, edges, trial):
                owner = trial
    return [Group(g.key, g.indices, tuple(sorted(v for v, k in owner.items() if k == i)), g.name)
            for i, g in enumerate(groups)]


def repeated_blocks(order: Sequence[int], signatures: Mapping[int, str], edges: Sequence[tuple[int, int]],
                    taken: set[int], names: Mapping[int, str], max_unit: int = 3, min_nodes: int = 3) -> list[Group]:
    """Runs of structurally identical blocks: the free nodes (topological ``order`` less
    ``taken``) are cut wherever one tensor alone is live, and a unit of 1..``max_unit``
    consecutive blocks repeated at least twice is one group."""
    free = [v for v in order if v not in taken]
    pos = {v: k for k, v in enumerate(free)}
    delta = [0] * (len(free) + 2)
    inner = [(pos[u], pos[v]) for u, v in edges if u in pos and v in pos]
    last: dict[int, int] = {}
    for a, b in inner:
        last[a] = max(last.get(a, b), b)
    for a, b in last.items():  # a tensor is live from after its producer to its last reader
        delta[a + 1] += 1
        delta[b + 1] -= 1
    cuts, running = [0], 0
    for k in range(1, len(free)):
        running += delta[k]
        if running == 1:
            cuts.append(k)
    cuts.append(len(free))
    blocks = [free[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
    preds: dict[int, list[int]] = {}
    for a, b in inner:
        preds.setdefault(b, []).append(a)

    def sig(bs: Sequence[list[int]]) -> tuple:
        nodes = [v for blk in bs for v in blk]
        start = pos[nodes[0]]
        return tuple((signatures[v], tuple(sorted(p - start if p >= start else -1 for p in preds.get(pos[v], []))))
                     for v in nodes)

    out: list[Group] = []
    i = 0
    while i < len(blocks):
        best = None
        for unit in range(1, max_unit + 1):
            first = blocks[i:i + unit]
            if len(first) < unit or sum(map(len, first)) < min_nodes:
                continue
            s, reps = sig(first), 1
            while i + (reps + 1) * unit <= len(blocks) and sig(blocks[i + reps * unit:i + (reps + 1) * unit]) == s:
                reps += 1
            if reps >= 2 and (best is None or reps * unit > best[0] * best[1]):
                best = (reps, unit)
        if best is None:
            i += 1
            continue
        reps, unit = best
        nodes = tuple(sorted(v for blk in blocks[i:i + reps * unit] for v in blk))
        first = next((names[v] for v in nodes if names[v]), "")
        last = next((names[v] for v in reversed(nodes) if names[v]), "")
        label = f"{first} … {last} (×{reps})" if first else f"{reps} identical blocks"
        out.append(Group("", tuple(range(reps)), nodes, label))
        i += reps * unit
    return out


def _acyclic(names: Mapping[int, str], edges: Sequence[tuple[int, int]], owner: Mapping[int, int]) -> bool:
    q = nx.DiGraph()
    q.add_nodes_from(("g", owner[v]) if v in owner else ("n", v) for v in names)
    for u, v in edges:
        a = ("g", owner[u]) if u in owner else ("n", u)
        b = ("g", owner[v]) if v in owner else ("n", v)
        if a != b:
            q.add_edge(a, b)
    return nx.is_directed_acyclic_graph(q)
