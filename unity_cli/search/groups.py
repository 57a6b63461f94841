"""Parallel branches on disjoint device groups.

The inner solver (``solver.py``) lays every operator out over all the devices. Independent
branches of a graph (an Inception block's towers, DLRM's embedding tables beside its bottom
MLP) can instead run side by side, each on its own contiguous range of devices: each
device then computes, and syncs the weights of, its own branch only, and pays for the
branch's input to reach its group and for its output to leave it.

A :class:`Grouping` gives each compute operator of a plain graph its range. The branches
are the ``Parallel`` parts of the graph's series-parallel decomposition (``sp.py``); down
to ``depth`` nested ``Parallel`` parts, each splits its devices between its two sides, in
halves as the machine-mapping DP does (at a node boundary when it spans nodes) or in
proportion to the two sides' work (floating-point operations, forward and backward). The
solver solves each grouping with every operator's options on its own range's devices, and
the step simulation decides whether it beats the plan on all devices, so a grouping is
kept only where it is faster. :func:`group_ranges` carries a grouping over to the solved
graph (its parallel ops, and the weights they lay out, go where their readers are), and
``views.default_views`` packs each node's pieces into its range. A rewrite of a plan laid
out so (an activation fused after the search) keeps its groups: :func:`rewritten_views`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..cluster.spec import ClusterSpec
from ..ir.machine_view import MachineView
from ..ir.pcg import PCG, Node
from .mapping import Resources, splits
from .sp import SP, Leaf, Parallel, Series, decompose
from .views import default_views

DEPTHS = (1, 2, 3)
"""How deep the nested ``Parallel`` parts that split their devices may go: 1 splits each
region's two sides, 2 each side's two sides again (four towers on four groups), and so on."""


@dataclass(frozen=True)
class Grouping:
    """Each compute operator's device range (absent: all the devices)."""

    depth: int
    balanced: bool                          # split by the sides' work, else in halves
    ranges: tuple[tuple[int, Resources], ...]

    @property
    def name(self) -> str:
        return f"branches on disjoint devices (depth {self.depth}, {'by work' if self.balanced else 'halves'})"


def groupings(pcg: PCG, cluster: ClusterSpec) -> list[Grouping]:
    """The distinct groupings of ``pcg``'s compute operators worth solving, shallowest first
    (none when the graph has no independent branches, or one device)."""
    nodes = [i for i, n in pcg if not n.spec.is_source]
    if cluster.num_devices < 2 or len(nodes) < 2:
        return []
    tree = decompose(pcg, nodes, roots_apart=False)
    work = {i: _work(pcg, i) for i in nodes}
    out: list[Grouping] = []
    seen: set[tuple] = set()
    for depth in DEPTHS:
        for balanced in (False, True):
            ranges: dict[int, Resources] = {}
            _walk(tree, Resources(0, cluster.num_devices), depth, balanced, work, cluster, ranges)
            key = tuple(sorted(ranges.items()))
            if ranges and key not in seen:
                seen.add(key)
                out.append(Grouping(depth, balanced, key))
    return out


def _work(pcg: PCG, i: int) -> float:
    n = pcg.nodes[i]
    c = n.spec.cost(n.op, [pcg.shape(r).logical for r in n.inputs], [s.logical for s in n.outputs])
    return c.fwd_flops + c.bwd_flops


def _walk(t: SP, res: Resources, depth: int, balanced: bool, work: dict[int, float], cluster: ClusterSpec,
          ranges: dict[int, Resources]) -> None:
    match t:
        case Leaf(node=i):
            if res.count < cluster.num_devices:
                ranges[i] = res
        case Series(first=a, then=b):
            _walk(a, res, depth, balanced, work, cluster, ranges)
            _walk(b, res, depth, balanced, work, cluster, ranges)
        case Parallel(left=a, right=b):
            cut = _split(res, a, b, balanced, work, cluster) if depth > 0 else None
            x, y = cut if cut is not None else (res, res)
            _walk(a, x, depth - 1, balanced, work, cluster, ranges)
            _walk(b, y, depth - 1, balanced, work, cluster, ranges)


def _split(res: Resources, a: SP, b: SP, balanced: bool, work: dict[int, float],
           cluster: ClusterSpec) -> tuple[Resources, Resources] | None:
    """``res`` cut between the two sides (None: one device, nothing to cut)."""
    if res.count < 2:
        return None
    if not balanced:
        return splits(res, cluster)[0]
    wa, wb = (sum(work[i] for i in s.nodes) for s in (a, b))
    share = 0.5 if wa + wb <= 0 else wa / (wa + wb)
    left = min(res.count - 1, max(1, round(res.count * share)))
    return Resources(res.start, left), Resources(res.start + left, res.count - left)


def group_ranges(plain: PCG, grouping: Grouping, solved: PCG) -> tuple[tuple[int, int] | None, ...] | None:
    """Each node of ``solved`` (the solver's graph of ``plain`` under ``grouping``) as a
    device range ``(start, count)``, or None for all devices. Compute operators keep their
    grouping's range; a parallel op or a source takes the smallest range holding every
    reader's, unless it has more pieces than that holds. None: the solved graph's compute
    operators are not the plain graph's, in order."""
    ranged = dict(grouping.ranges)
    compute = [i for i, n in plain if not n.spec.is_source]
    moved = [i for i, n in solved if _computes(n)]
    if len(compute) != len(moved) or any(plain.nodes[a].op != solved.nodes[b].op
                                         for a, b in zip(compute, moved, strict=True)):
        return None
    out: list[Resources | None] = [None] * len(solved)
    for a, b in zip(compute, moved, strict=True):
        out[b] = ranged.get(a)
    _place_movers(solved, out)
    return tuple(None if r is None else (r.start, r.count) for r in out)


def _hull(ranges: Iterable[Resources | None]) -> Resources | None:
    """The smallest range holding all of ``ranges`` (None: one of them is all devices, or none given)."""
    start, end = math.inf, -math.inf
    for r in ranges:
        if r is None:
            return None
        start, end = min(start, r.start), max(end, r.start + r.count)
    return None if start == math.inf else Resources(int(start), int(end - start))


def inherited_ranges(pcg: PCG, parent: PCG, views: Sequence[MachineView],
                     devices: int) -> tuple[tuple[int, int] | None, ...] | None:
    """Each node of ``pcg`` (``parent`` rewritten: an activation fused, a bias set apart)
    as a device range, for a ``parent`` whose branches run on device groups (laid out by
    ``views``). A compute operator the rewrite kept (by name) keeps its range; one it made
    takes the smallest range holding the compute operators it reads, or, reading none,
    those that read it; parallel ops and sources go where their readers are, as in
    :func:`group_ranges`. None when every compute operator of ``parent`` is on every device
    (then the default views are the layout), or when ``pcg`` has none of its branches."""
    def producers(i: int) -> list[int]:
        return [r.node for r in pcg.nodes[i].inputs]

    names: dict[str, Resources | None] = {}
    for i, n in parent:
        if _computes(n) and n.name:
            names[n.name] = None if n.name in names else _range(views[i].devices(n.outputs[0]), devices)
    if all(r is None for r in names.values()):
        return None
    out: list[Resources | None] = [None] * len(pcg)
    open_: list[int] = []
    for i, n in pcg:
        if not _computes(n):
            continue
        if n.name in names:
            out[i] = names[n.name]
            continue
        feeds = _compute_near(pcg, producers(i), producers)
        if feeds:
            out[i] = _hull(out[p] for p in feeds)
        else:
            open_.append(i)
    for i in reversed(open_):
        users = _compute_near(pcg, _readers(pcg, i), lambda j: _readers(pcg, j))
        out[i] = _hull(out[u] for u in users) if users else None
    if all(r is None for r in out):
        return None
    _place_movers(pcg, out)
    return tuple(None if r is None else (r.start, r.count) for r in out)


def rewritten_views(pcg: PCG, parent: PCG, views: Sequence[MachineView], devices: int,
                    on_default: bool | None = None) -> tuple[MachineView, ...] | None:
    """The views of ``pcg``, ``parent`` rewritten: the default views with its branches on
    the device groups ``parent``'s had (:func:`inherited_ranges`); None where ``parent``
    is laid out by the default views, or none of its groups carry over (then the default
    views are ``pcg``'s). ``on_default``: whether ``views`` are ``parent``'s default views,
    when the caller knows (a search prices many rewrites of one parent)."""
    if on_default is None:
        on_default = tuple(views) == default_views(parent)
    if not views or on_default:
        return None
    ranges = inherited_ranges(pcg, parent, views, devices)
    return None if ranges is None else default_views(pcg, ranges)


def _range(devs: Sequence[int], devices: int) -> Resources | None:
    """The contiguous range of ``devs`` (None: they span every device)."""
    lo, hi = min(devs), max(devs)
    return None if hi - lo + 1 >= devices else Resources(lo, hi - lo + 1)


def _compute_near(g: PCG, first: Iterable[int], step) -> list[int]:
    """The compute operators among ``first``, looking through parallel ops along ``step``
    (a node's producers or its readers)."""
    out, stack = [], list(first)
    while stack:
        j = stack.pop()
        n = g.nodes[j]
        if n.spec.is_parallel_op:
            stack.extend(step(j))
        elif _computes(n):
            out.append(j)
    return out


def _computes(n: Node) -> bool:
    """Whether ``n`` is a compute operator (not a source, not a parallel op)."""
    return not (n.spec.is_source or n.spec.is_parallel_op)


def _readers(g: PCG, i: int) -> list[int]:
    return [u for u, _ in g.consumers[i]]


def _place_movers(g: PCG, out: list[Resources | None]) -> None:
    """Parallel ops and sources take the smallest range holding every reader's, unless
    they have more pieces than that holds (then all devices); in place."""
    for i in range(len(g) - 1, -1, -1):
        if not _computes(g.nodes[i]):
            held = _hull(out[j] for j in _readers(g, i))
            out[i] = held if held is not None and g.nodes[i].outputs[0].pieces <= held.count else None
