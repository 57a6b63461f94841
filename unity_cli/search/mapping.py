"""Machine mapping: choose a machine view for every operator of a fixed PCG.

Dynamic programming over the series-parallel decomposition of the graph (``sp.py``):

* ``Series(A, B)``: try every view of the nodes of ``A`` that feed ``B`` (the boundary),
  cost ``A`` with those views required and ``B`` with them given (``B`` pays moving the
  data between views);
* ``Parallel(A, B)``: either both on the same devices (their costs add up), or on a split
  of the devices — by nodes, or by devices within a node — running side by side (the
  slower decides);
* memoized on (subgraph, devices, the views that subgraph depends on).

The objective adds, per node, its forward+backward compute and the data it moves, priced by
the cost model's own :func:`~unity_cli.cost.model.node_cost` (the moves
``cost.moves.node_moves`` lists: the runtime's reads, collectives, gradient syncs), so the DP
and the step simulation (``cost.model.estimate``, which then costs the chosen mapping) agree
on every node. A node's cost needs the views of the nodes it reads (``deps``: its inputs,
and for a fused Reduction/Combine -> Replicate pair, the pair's input); the DP fixes those
before it prices the node. A weight kept in several layouts keeps the default view for all
but the one that carries its gradient sync, so that sync stays a one-node price.
``exhaustive_map`` enumerates the same space without the DP, as the tests' oracle.
"""
from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostContext, NodeCost, node_cost
from ..ir.machine_view import MachineView, packed_view
from ..ir.opspec import attrs_key
from ..ir.pcg import PCG
from .sp import SP, Leaf, Parallel, Series, decompose
from .views import default_views

INF = math.inf
BOUNDARY_LIMIT = 16
STATE_LIMIT = 4_000


class MappingBudgetExceeded(Exception):
    """The DP would take too long on this graph; the caller keeps the default views."""


class MappingOutOfTime(MappingBudgetExceeded):
    """The DP ran past the caller's time ceiling (a cut that depends on the machine's speed)."""


@dataclass(frozen=True, slots=True, order=True)
class Resources:
    """A contiguous range of devices in the node-major device order."""

    start: int
    count: int

    def contains(self, devices) -> bool:
        return all(self.start <= d < self.start + self.count for d in devices)


def splits(res: Resources, cluster: ClusterSpec) -> list[tuple[Resources, Resources]]:
    """Ways to cut a range in two: at a node boundary when it spans nodes, else in halves."""
    if res.count < 2:
        return []
    bounds = [o for o in cluster.device_offsets if res.start < o < res.start + res.count]
    if bounds:
        mid = min(bounds, key=lambda o: abs(o - (res.start + res.count / 2)))
    else:
        mid = res.start + res.count // 2
    return [(Resources(res.start, mid - res.start), Resources(mid, res.start + res.count - mid))]


class Mapper:
    """The DP for one PCG on one cluster (see the module docstring)."""

    def __init__(self, pcg: PCG, cluster: ClusterSpec, config: CostConfig = CostConfig(), max_starts: int = 2,
                 state_limit: int = STATE_LIMIT, seconds: float | None = None):
        self.pcg, self.cluster = pcg, cluster
        self.state_limit = state_limit
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.ctx = CostContext.of(pcg, cluster, config)
        self.max_starts = max_starts
        self.defaults = default_views(pcg)
        self.sources = {i for i, n in pcg if n.spec.is_source}
        self.nodes = [i for i in range(len(pcg)) if i not in self.sources]
        st = self.ctx.structure
        # A weight's stored layouts besides the one carrying its sync keep their default view.
        self.pinned = {r: self.defaults[r] for rs in st.residents.values() for r in rs
                       if r not in self.sources and r not in st.sync}
        # preds: the DP nodes whose views a node's cost reads (always its ancestors, so the
        # series-parallel tree fixes them first); the others' views are constants.
        self.preds = {i: [p for p in st.deps(i) if p not in self.sources and p not in self.pinned]
                      for i in self.nodes}
        self.constant = {i: {p: self.defaults[p] if p in self.sources else self.pinned[p]
                             for p in st.deps(i) if p in self.sources or p in self.pinned} for i in self.nodes}
        self.succs: dict[int, list[int]] = {i: [] for i in self.nodes}
        for i in self.nodes:
            for p in self.preds[i]:
                self.succs[p].append(i)
        self.tree = decompose(pcg, self.nodes) if self.nodes else None
        self._memo: dict = {}
        self._cand: dict = {}
        self._leaf: dict = {}
        self._relevant: dict = {}
        self.states = 0

    # -- costs ---------------------------------------------------------------------

    def candidates(self, i: int, res: Resources) -> list[MachineView]:
        key = (i, res)
        if key not in self._cand:
            self._cand[key] = self._candidates(i, res)
        return self._cand[key]

    def _candidates(self, i: int, res: Resources) -> list[MachineView]:
        if i in self.pinned:
            v = self.pinned[i]
            return [v] if res.contains(v.devices(self.pcg.nodes[i].outputs[0])) else []
        shape = self.pcg.nodes[i].outputs[0]
        p = shape.pieces
        if p > res.count:
            return []
        base = self.defaults[i]
        r = shape.rank
        orders = [None, [r, r + 1] + list(range(r - 1, -1, -1))]  # default, then replicas inside dims
        out: list[MachineView] = []
        starts = [res.start + k * p for k in range(res.count // p)][: self.max_starts]
        for order in orders:
            for s in starts:
                v = MachineView(s, base.strides) if order is None else packed_view(shape, order, s)
                if res.contains(v.devices(shape)) and v not in out:
                    out.append(v)
        return out

    def reachable_candidates(self, i: int, res: Resources, depth: int) -> list[MachineView]:
        """Views node ``i`` can get when up to ``depth`` Parallel splits lie between here and it."""
        out: list[MachineView] = []
        for r in self.subranges(res, depth):
            out += [v for v in self.candidates(i, r) if v not in out]
        return out

    def subranges(self, res: Resources, depth: int) -> list[Resources]:
        out, level = [res], [res]
        for _ in range(depth):
            level = [x for r in level for pair in splits(r, self.cluster) for x in pair]
            out += [r for r in level if r not in out]
        return out

    def parallel_depth(self, t: SP) -> dict[int, int]:
        """For each node of ``t``: how many Parallel nodes lie between ``t`` and its leaf."""
        key = ("depth", id(t))
        if key not in self._relevant:
            out: dict[int, int] = {}

            def walk(s: SP, d: int) -> None:
                match s:
                    case Leaf(node=i):
                        out[i] = d
                    case Series(first=a, then=b):
                        walk(a, d)
                        walk(b, d)
                    case Parallel(left=a, right=b):
                        walk(a, d + 1)
                        walk(b, d + 1)

            walk(t, 0)
            self._relevant[key] = out
        return self._relevant[key]

    def node_cost(self, i: int, v: MachineView, views: Mapping[int, MachineView]) -> NodeCost:
        """The cost model's price of node ``i`` on view ``v``, given the views of its ``preds``."""
        key = (i, v, tuple(views[p] for p in self.preds[i]))
        c = self._leaf.get(key)
        if c is None:
            local = {**self.constant[i], **{p: views[p] for p in self.preds[i]}, i: v}
            c = self._leaf[key] = node_cost(self.ctx, i, local)
        return c

    def leaf_cost(self, i: int, v: MachineView, views: Mapping[int, MachineView]) -> float:
        return self.node_cost(i, v, views).total

    # -- the DP ----------------------------------------------------------------------

    def relevant(self, t: SP) -> frozenset[int]:
        k = id(t)
        if k not in self._relevant:
            nodes = t.nodes
            self._relevant[k] = frozenset(nodes | {p for i in nodes for p in self.preds[i]})
        return self._relevant[k]

    def signature(self, t: SP) -> tuple[str, tuple[int, ...], dict[int, int]]:
        """A structural key of a subproblem, the order of the nodes it depends on, and each
        one's place in it.

        Two subtrees with the same key (say, two identical transformer layers) have the
        same optimum for the same devices and the same views of what they read, so the DP
        solves them once: "repeated segments are solved once".
        """
        k = ("sig", id(t))
        if k in self._relevant:
            return self._relevant[k]
        inside = sorted(t.nodes)
        outside = sorted(self.relevant(t) - t.nodes)
        order = tuple(inside + outside)
        local = {n: j for j, n in enumerate(order)}
        parts = []
        for n in order:
            node = self.pcg.nodes[n]
            ins = [(local[r.node], r.index) if r.node in local else self._node_key(r.node, r.index)
                   for r in node.inputs] if n in t.nodes else []
            parts.append(f"{self._node_key(n)}|{ins}|{self._role(n, local) if n in t.nodes else ''}")
        parts.append(_tree_shape(t, local))
        sig = (hashlib.sha256("\n".join(parts).encode()).hexdigest(), order, local)
        self._relevant[k] = sig
        return sig

    def _node_key(self, n: int, source_output: int | None = None) -> str:
        """What a subproblem's key says of node ``n`` on its own (made once: a string of its
        attrs and shapes): itself, or (``source_output``) the output of it read from outside."""
        k = ("node", n, source_output)
        if k not in self._relevant:
            node = self.pcg.nodes[n]
            if source_output is not None:
                self._relevant[k] = f"source {node.outputs[source_output]} {attrs_key(node.op)}"
            else:
                layout = self.ctx.layout[n]
                trainable = layout is not None and getattr(self.pcg.nodes[layout].op, "trainable", False)
                self._relevant[k] = (f"{attrs_key(node.op)}|{'/'.join(map(str, node.outputs))}|{layout is None}|"
                                     f"{trainable}")
        return self._relevant[k]

    def _role(self, n: int, local: Mapping[int, int]) -> str:
        """What else a node's price depends on: its place in a fused pair, being the output
        the loss reads, the gradients that flow through it, the weight sync it carries and
        the fixed views it reads."""
        k = ("role", n)
        if k not in self._relevant:     # (all but the places of its predecessors: fixed with the Mapper)
            st = self.ctx.structure
            node = self.pcg.nodes[n]
            grads = [r in st.grads for r in node.inputs] + [st.active(n)]
            const = [(str(self.pcg.nodes[p].outputs[0]), v) for p, v in sorted(self.constant[n].items())]
            self._relevant[k] = (f"{n in st.pairs}|{n in st.second}|{n == self.pcg.outputs[0].node and st.class_axis}|"
                                 f"{grads}|{n in st.sync}|{const}|{self.pinned.get(n)}")
        return f"{self._relevant[k]}|{[local.get(p) for p in self.preds[n]]}"

    def solve(self, t: SP, res: Resources, fixed: Mapping[int, MachineView]) -> tuple[float, dict[int, MachineView]]:
        sig, order, where = self.signature(t)
        # the views fixed among the nodes it depends on, by their places (read off the
        # shorter of the two: a subtree deep in a long chain has many fixed around it)
        if len(fixed) < len(order):
            held = tuple(sorted((where[n], v) for n, v in fixed.items() if n in where))
        else:
            held = tuple((j, fixed[n]) for j, n in enumerate(order) if n in fixed)
        key = (sig, res, held)
        if key in self._memo:
            cost, local = self._memo[key]
            return cost, {order[j]: v for j, v in local.items()}
        best = self._solve(t, res, fixed)
        where = {n: j for j, n in enumerate(order)}
        self._memo[key] = (best[0], {where[n]: v for n, v in best[1].items()})
        return best

    def _solve(self, t: SP, res: Resources, fixed: Mapping[int, MachineView]) -> tuple[float, dict[int, MachineView]]:
        self.states += 1
        if self.states > self.state_limit:
            raise MappingBudgetExceeded(f"more than {self.state_limit} DP states")
        if self.deadline is not None and self.states % 64 == 0 and time.monotonic() > self.deadline:
            raise MappingOutOfTime("out of time")
        match t:
            case Leaf(node=i):
                best = self._leaf_solve(i, res, fixed)
            case Series(first=a, then=b):
                best = self._series(a, b, res, fixed)
            case Parallel(left=a, right=b):
                best = self._parallel(a, b, res, fixed)
        return best

    def _leaf_solve(self, i: int, res: Resources, fixed: Mapping[int, MachineView]):
        shape = self.pcg.nodes[i].outputs[0]
        options = [fixed[i]] if i in fixed else self.candidates(i, res)
        best = (INF, {})
        for v in options:
            if not res.contains(v.devices(shape)):
                continue
            c = self.leaf_cost(i, v, fixed)
            if c < best[0]:
                best = (c, {i: v})
        return best

    def _series(self, a: SP, b: SP, res: Resources, fixed: Mapping[int, MachineView]):
        bnodes = b.nodes
        boundary = [i for i in sorted(a.nodes) if any(s in bnodes for s in self.succs[i])]
        # A boundary node may end up on any sub-range a split inside ``a`` gives it.
        depth = self.parallel_depth(a)
        choices = [[fixed[i]] if i in fixed else self.reachable_candidates(i, res, depth[i]) for i in boundary]
        if math.prod(len(c) for c in choices) > BOUNDARY_LIMIT:  # keep the search tractable
            choices = [c[:1] if k >= 2 else c for k, c in enumerate(choices)]
        best = (INF, {})
        for combo in itertools.product(*choices):
            f = dict(fixed)
            f.update(zip(boundary, combo, strict=True))
            ca, ma = self.solve(a, res, f)
            if ca >= best[0]:
                continue
            cb, mb = self.solve(b, res, f)
            if ca + cb < best[0]:
                best = (ca + cb, {**ma, **mb})
        return best

    def _parallel(self, a: SP, b: SP, res: Resources, fixed: Mapping[int, MachineView]):
        ca, ma = self.solve(a, res, fixed)
        cb, mb = self.solve(b, res, fixed)
        best = (ca + cb, {**ma, **mb})
        for r1, r2 in splits(res, self.cluster):
            for x, y in ((r1, r2), (r2, r1)):
                ca, ma = self.solve(a, x, fixed)
                cb, mb = self.solve(b, y, fixed)
                if max(ca, cb) < best[0]:
                    best = (max(ca, cb), {**ma, **mb})
        return best

    def run(self) -> tuple[float, tuple[MachineView, ...]]:
        if self.tree is None:
            return 0.0, self.defaults
        cost, mapping = self.solve(self.tree, Resources(0, self.cluster.num_devices), {})
        views = tuple(mapping.get(i, self.defaults[i]) for i in range(len(self.pcg)))
        return cost, views


def _tree_shape(t: SP, local: Mapping[int, int]) -> str:
    match t:
        case Leaf(node=i):
            return str(local[i])
        case Series(first=a, then=b):
            return f"S({_tree_shape(a, local)},{_tree_shape(b, local)})"
        case Parallel(left=a, right=b):
            return f"P({_tree_shape(a, local)},{_tree_shape(b, local)})"
    raise AssertionError(t)


def dp_map(pcg: PCG, cluster: ClusterSpec, config: CostConfig = CostConfig(), seconds: float | None = None
           ) -> tuple[float, tuple[MachineView, ...]] | None:
    """The cheapest mapping the DP finds and its objective value; None if the graph is too
    tangled for the DP's state budget or ``seconds`` run out (the caller then keeps the
    default views)."""
    try:
        return Mapper(pcg, cluster, config, seconds=seconds).run()
    except (MappingBudgetExceeded, RecursionError):   # a decomposition deeper than the stack allows
        return None


def exhaustive_map(pcg: PCG, cluster: ClusterSpec, config: CostConfig = CostConfig()) -> float:
    """The optimum of the same objective over the same space, by enumeration (small graphs)."""
    m = Mapper(pcg, cluster, config)
    if m.tree is None:
        return 0.0
    best = INF
    for placement in _placements(m, m.tree, Resources(0, cluster.num_devices)):
        leaves = sorted((k, v) for k, v in placement.items() if isinstance(k, int))
        options = [m.candidates(i, r) for i, (r, _) in leaves]
        for combo in itertools.product(*options):
            views = {i: v for (i, _), v in zip(leaves, combo, strict=True)}
            best = min(best, _evaluate(m, m.tree, views, placement))
    return best


def _placements(m: Mapper, t: SP, res: Resources):
    """Every way to give each leaf a device range: per Parallel, same range or a split."""
    match t:
        case Leaf(node=i):
            yield {i: (res, ())}
        case Series(first=a, then=b):
            for pa in _placements(m, a, res):
                for pb in _placements(m, b, res):
                    yield {**pa, **pb}
        case Parallel(left=a, right=b):
            options = [(res, res, "same")] + [(x, y, "split") for r1, r2 in splits(res, m.cluster)
                                              for x, y in ((r1, r2), (r2, r1))]
            for x, y, how in options:
                for pa in _placements(m, a, x):
                    for pb in _placements(m, b, y):
                        merged = {**pa, **pb}
                        merged[("par", id(t))] = how
                        yield merged


def _evaluate(m: Mapper, t: SP, views: dict[int, MachineView], placement) -> float:
    match t:
        case Leaf(node=i):
            return m.leaf_cost(i, views[i], views)
        case Series(first=a, then=b):
            return _evaluate(m, a, views, placement) + _evaluate(m, b, views, placement)
        case Parallel(left=a, right=b):
            ca, cb = _evaluate(m, a, views, placement), _evaluate(m, b, views, placement)
            return ca + cb if placement[("par", id(t))] == "same" else max(ca, cb)
    raise AssertionError(t)
