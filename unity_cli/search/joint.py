"""The joint search: best-first over PCGs rewritten by the verified substitutions.

Every algebraic rewrite and every parallelization is a rule application. Candidates are
ordered by predicted step time; a candidate is expanded only while it is within
``alpha`` of the best found; graphs are deduplicated by canonical hash; the search stops
after ``max_candidates`` graphs (a count of work, so the same inputs stop at the same
candidate on any machine), after ``patience`` candidates without improvement, or, only when
the caller sets one, at its time ceiling ``budget``; it returns the best plan so far (anytime). It starts from the
plain graph and from every baseline, so it never returns anything slower than them.
Ties break on the canonical hash, so the result does not depend on PYTHONHASHSEED.
"""
from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostReport, estimate
from ..deadline import OutOfTime, check
from ..ir.machine_view import MachineView
from ..ir.ops.linear import FUSED_ACTIVATIONS
from ..ir.opspec import OpKind
from ..ir.pcg import PCG, Node, TensorRef
from ..ir.simplify import simplify
from ..substitutions.equivalence import search_rules
from ..substitutions.match import RewriteError, apply_match, find_matches, free_params
from ..substitutions.rule import Rule
from .groups import rewritten_views
from .views import default_views


@dataclass(frozen=True)
class Applied:
    """One rewrite on the path from a start graph to a candidate."""

    rule_id: str
    rule_name: str
    reverse: bool                  # applied target -> source
    at: str                        # the name (or kind) of the node the match was rooted at
    params: tuple[tuple[str, int], ...] = ()
    bought: tuple[tuple[str, float], ...] = ()   # what it saved, as the search priced it (see `saved`)


def saved(before: CostReport, after: CostReport) -> tuple[tuple[str, float], ...]:
    """What a rewrite bought: the step time, the busiest device's compute and communication
    (ms) and the largest memory per device (bytes), before less after (negative: it cost)."""
    peak = max(before.memory, default=0) - max(after.memory, default=0)
    return (("step_ms", round((before.step_time - after.step_time) * 1e3, 6)),
            ("compute_ms", round((before.compute_time - after.compute_time) * 1e3, 6)),
            ("comm_ms", round((before.comm_time - after.comm_time) * 1e3, 6)), ("memory_bytes", peak))


@dataclass(frozen=True)
class Found:
    pcg: PCG
    views: tuple[MachineView, ...]
    report: CostReport
    start: str                     # which start graph it descends from
    path: tuple[Applied, ...] = ()
    on_default: bool = True        # laid out by the default views (not the solver's device groups)


@dataclass
class SearchStats:
    candidates: int = 0            # graphs costed
    expanded: int = 0
    rules_applied: int = 0         # successful rewrites (before deduplication)
    seconds: float = 0.0
    timed_out: bool = False
    capped: bool = False           # stopped by --max-candidates
    converged: bool = False        # stopped after `patience` candidates without improvement
    segments: int = 0              # segments the graph was split into (0: searched whole)
    segment_problems: int = 0      # distinct stand-alone segment problems solved

    def __add__(self, other: SearchStats) -> SearchStats:
        """Two searches run one after the other, as one."""
        return SearchStats(candidates=self.candidates + other.candidates, expanded=self.expanded + other.expanded,
                           rules_applied=self.rules_applied + other.rules_applied,
                           seconds=self.seconds + other.seconds, timed_out=self.timed_out or other.timed_out,
                           capped=self.capped or other.capped, converged=self.converged and other.converged,
                           segments=self.segments + other.segments,
                           segment_problems=self.segment_problems + other.segment_problems)


@dataclass
class JointSearch:
    cluster: ClusterSpec
    config: CostConfig
    rules: Sequence[Rule]
    budget: float | None = None         # a time ceiling in seconds (None: none)
    max_candidates: int | None = None   # a work budget: unlike seconds, it stops the same way on every machine
    alpha: float = 1.05
    patience: int | None = 150          # stop after this many candidates without improvement (converged)
    matches_per_rule: int = 4
    degrees: tuple[int, ...] = ()
    progress: Callable[[SearchStats, float, float], None] | None = None
    placed: Mapping[tuple, tuple[MachineView, ...]] = field(default_factory=dict)
    """Views of graphs not laid out by the default views: the inner solver's with branches on
    disjoint device groups (``groups.py``), by the graph's node hashes."""
    stats: SearchStats = field(default_factory=SearchStats)
    finalists: list[Found] = field(default_factory=list, init=False)
    """The fastest candidates priced under the default views, distinct graphs, fastest first
    (:data:`FINALISTS` of them): the machine-mapping DP may lay one out faster than the best
    (it splits parallel regions over devices of their own, which the walk's prices do not see)."""
    _improved_at: int = field(default=0, init=False, repr=False)   # candidates costed at the last improvement
    _on_default: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.degrees:
            # Any divisor of the device count (6 = 2 x 3, 48 = 8 x 6), never only powers of two.
            n = self.cluster.num_devices
            self.degrees = tuple(d for d in range(2, n + 1) if n % d == 0)
        # Both directions (a one-way rule's reverse, which would match every graph it could
        # only make slower, not), less those that only give graphs another gives (same hash).
        kept = search_rules([(r, False) for r in self.rules] + [(r, True) for r in self.rules if not r.one_way])
        self._rules = [(r.reversed() if reverse else r, reverse) for r, reverse in kept]
        # The op kinds each source pattern needs: a rule whose kinds a graph lacks cannot match.
        self._kinds = [frozenset(n.kind for n in r.src.nodes) for r, _ in self._rules]

    def cost(self, pcg: PCG, parent: Found | None = None) -> tuple[tuple[MachineView, ...], CostReport]:
        """``pcg`` priced under the solver's views (``placed``), else under its ``parent``'s
        device groups (``groups.rewritten_views``), else under the default views (then
        ``_on_default`` is set)."""
        views = self.placed.get(pcg.node_hashes)
        if views is None and parent is not None:
            views = rewritten_views(pcg, parent.pcg, parent.views, self.cluster.num_devices, parent.on_default)
        self._on_default = views is None
        if views is None:
            views = default_views(pcg)
        return views, estimate(pcg, views, self.cluster, self.config)

    def _found(self, f: Found) -> None:
        if not f.on_default:
            return
        others = [g for g in self.finalists if g.pcg.node_hashes != f.pcg.node_hashes]
        same = [g for g in self.finalists if g.pcg.node_hashes == f.pcg.node_hashes]
        # the faster, then the fewer rewrites, then the smaller hash (as _better orders two)
        self.finalists = sorted(others + [_better(same[0] if same else None, f)],
                                key=lambda g: (not g.report.feasible, g.report.step_time, len(g.path),
                                               g.pcg.unordered_hash))[:FINALISTS]

    def run(self, starts: Sequence[tuple[str, PCG, tuple[Applied, ...]]]) -> Found:
        """The best graph found from ``starts`` (name, graph, the rewrites that made it)."""
        t0 = time.monotonic()
        deadline = math.inf if self.budget is None else t0 + self.budget
        seen: set[str] = set()
        heap: list = []
        best: Found | None = None
        for name, g, path in starts:
            check()
            g = simplify(g)
            if g.unordered_hash in seen:
                continue
            seen.add(g.unordered_hash)
            views, rep = self.cost(g)
            f = Found(g, views, rep, name, path, self._on_default)
            self.stats.candidates += 1
            self._found(f)
            best = _better(best, f)
            heapq.heappush(heap, (rank(rep), g.unordered_hash, f))
        assert best is not None
        self._improved_at = self.stats.candidates
        cut = False
        while heap and time.monotonic() < deadline and not self._full() and not self._stale() and not cut:
            _, _, cur = heapq.heappop(heap)
            if cur.report.step_time > self.alpha * best.report.step_time:
                continue
            self.stats.expanded += 1
            for new in self._neighbours(cur, deadline):
                h = new.pcg.unordered_hash
                if h in seen:
                    continue
                seen.add(h)
                try:
                    views, rep = self.cost(new.pcg, cur)
                except OutOfTime:    # the run's ceiling (optimize --budget) passed while pricing
                    cut = True
                    break
                self.stats.candidates += 1
                path = new.path[:-1] + (replace(new.path[-1], bought=saved(cur.report, rep)),)
                f = Found(new.pcg, views, rep, cur.start, path, self._on_default)
                self._found(f)
                if faster(rep, best.report):
                    self._improved_at = self.stats.candidates
                best = _better(best, f)
                if rep.feasible and rep.step_time <= self.alpha * best.report.step_time:
                    heapq.heappush(heap, (rank(rep), h, f))
                if self.progress:
                    self.progress(self.stats, best.report.step_time, deadline - time.monotonic())
                if time.monotonic() >= deadline or self._full() or self._stale():
                    break
        self.stats.capped = self._full()
        self.stats.converged = not self.stats.capped and self._stale()
        self.stats.timed_out = cut or bool(heap) and time.monotonic() >= deadline and not self.stats.capped \
            and not self.stats.converged
        self.stats.seconds = time.monotonic() - t0
        return best

    def _stale(self) -> bool:
        return self.patience is not None and self.stats.candidates - self._improved_at >= self.patience

    def _full(self) -> bool:
        return self.max_candidates is not None and self.stats.candidates >= self.max_candidates

    def _neighbours(self, cur: Found, deadline: float):
        g = cur.pcg
        present = g.by_kind.keys()
        for (rule, reverse), kinds in zip(self._rules, self._kinds, strict=True):
            if not kinds.issubset(present):
                continue
            if time.monotonic() >= deadline:
                return
            for m in find_matches(g, rule, limit=self.matches_per_rule):
                free = free_params(rule)
                for d in (self.degrees if free else (0,)):
                    params = {p: d for p in free}
                    try:
                        new = simplify(apply_match(g, m, params, check=False, max_pieces=self.cluster.num_devices))
                    except RewriteError:
                        continue
                    if max(n.outputs[0].pieces for _, n in new) > self.cluster.num_devices:
                        continue  # more pieces than devices: no machine view can hold it
                    self.stats.rules_applied += 1
                    node = g.nodes[m.root]
                    rid = rule.reversed().id if reverse else rule.id
                    step = Applied(rid, rule.name, reverse, node.name or node.kind, tuple(sorted(params.items())))
                    yield Found(new, (), cur.report, cur.start, cur.path + (step,))


FINALISTS = 3
"""Graphs of the default views the joint search hands the machine-mapping DP at its end
(``JointSearch.finalists``). On Inception-tiny at 32 GPUs the graph with two 1x1
convolutions fused is 0.00001 ms slower than the unfused one on the default views, and
0.48 ms against 0.63 once the DP has laid out each (its branches on devices of their own)."""


def rank(rep: CostReport) -> tuple:
    """The order plans are compared in: those that fit first, then the faster."""
    return (not rep.feasible, rep.step_time)


def faster(a: CostReport, b: CostReport) -> bool:
    """Strictly faster (or feasible where ``b`` is not), beyond float noise."""
    if a.feasible != b.feasible:
        return a.feasible
    return a.step_time < b.step_time * (1 - 1e-9)


def _better(a: Found | None, b: Found) -> Found:
    """The faster of two; on a tie (within float noise) the one with fewer rewrites, then
    the smaller hash, so a plan never carries rewrites that buy nothing."""
    if a is None:
        return b
    fa, fb = a.report.feasible, b.report.feasible
    if fa != fb:
        return b if fb else a
    ta, tb = a.report.step_time, b.report.step_time
    if abs(ta - tb) > 1e-9 * max(ta, tb):
        return b if tb < ta else a
    if len(a.path) != len(b.path):
        return b if len(b.path) < len(a.path) else a
    return b if b.pcg.unordered_hash < a.pcg.unordered_hash else a


@dataclass
class SolvedSearch(JointSearch):
    """The outer level of Unity's hierarchy: best-first over plain graphs rewritten by the
    algebraic rules, each priced by the inner parallelization solver (``solver.py``), whose
    cost tables one run shares, so a rewritten graph prices only the operators it changed.
    ``solve`` maps a plain graph to its solved graph (None: unsolvable; priced on one device)."""

    solve: Callable[..., PCG | None] | None = None
    plain: Found | None = field(default=None, init=False)
    """The walk's winner before it was solved again with device groups: a plain graph."""

    def cost(self, pcg: PCG, parent: Found | None = None) -> tuple[tuple[MachineView, ...], CostReport]:
        solved = self.solve(pcg, grouped=False)
        return super().cost(pcg if solved is None else solved)

    def run(self, starts: Sequence[tuple[str, PCG, tuple[Applied, ...]]]) -> Found:
        """The best solved graph: the search walks plain graphs, each solved with every
        operator on every device; the winner is solved again with its branches also tried
        on disjoint device groups (``groups.py``: a few more solves, once)."""
        found = super().run(starts)
        self.plain = found
        solved = self.solve(found.pcg)
        if solved is None:
            return found
        views, rep = JointSearch.cost(self, solved)
        return Found(solved, views, rep, found.start, found.path, self._on_default)


def fusing_rules(rules: Sequence[Rule]) -> list[tuple[Rule, str, bool]]:
    """The fusion rules read in the direction that fuses (an activation into its product),
    each with the id a plan cites and whether that is the stored rule reversed; in id order."""
    out = []
    for r in rules:
        if not r.is_fusion:
            continue
        into = any(k == "activation" and v for n in r.dst.nodes for k, v in n.attrs)
        out.append((r, r.id, False) if into else (r.reversed(), r.id, True))
    return sorted(out, key=lambda rr: rr[0].id)


def unfused_activations(pcg: PCG) -> bool:
    """Whether some activation a Gemm could fuse reads a product (a MatMul or Gemm, or an
    Add of one, through parallel ops) without being fused into it: only then can
    :func:`fuse_solved` find a plan the polish did not."""
    def computed(ref: TensorRef) -> Node:
        n = pcg.nodes[ref.node]
        while n.spec.is_parallel_op:
            n = pcg.nodes[n.inputs[0].node]
        return n

    def product(n: Node) -> bool:
        return n.kind in (OpKind.MatMul, OpKind.Gemm) and not getattr(n.op, "activation", "")

    for _, n in pcg:
        if n.kind == OpKind.Unary and n.op.fn in FUSED_ACTIVATIONS:
            x = computed(n.inputs[0])
            biased = x.kind == OpKind.Binary and x.op.fn == "Add" and any(product(computed(r)) for r in x.inputs)
            if product(x) or biased:
                return True
    return False


def fuse_solved(pcg: PCG, start: str, path: tuple[Applied, ...], search: SolvedSearch,
                rules: Sequence[Rule]) -> Found | None:
    """``pcg`` (a plain graph, which ``path`` made from the start graph ``start``) solved,
    with every activation fused that makes it faster *as the solver parallelizes it*;
    returns the solved graph (None: the solver has none). Each fusion is priced by solving
    the fused graph again (the run's shared tables price only what changed): first flat,
    one pass over the matches in rule order; then, with device groups, only
    the fusions that pass refused (a grouped solve costs several flat ones: BERT-large's
    24 feed-forward fusions all pay flat).

    ``fuse_activations`` fuses into a plan whose parallelization is chosen, so a product
    split by rows (partial sums, then the activation) never fuses there, even where the
    product unsplit and fused is faster; and the walk leaves fusions out, as they would
    hide its better strategies. This prices each fusion with the strategy chosen for it."""
    fusing = fusing_rules(rules)

    def priced(g: PCG, grouped: bool) -> tuple[PCG, tuple[MachineView, ...], CostReport] | None:
        return _solved_priced(search, g, grouped)

    first = priced(pcg, False)
    if first is None:
        return None
    cur, _, refused = _fusion_pass(Found(pcg, first[1], first[2], start, path), fusing, lambda g: priced(g, False),
                                   None)
    again = priced(cur.pcg, True)
    if again is None:
        return None
    cur, solved, _ = _fusion_pass(replace(cur, report=again[2]), fusing, lambda g: priced(g, True), refused, again)
    return Found(solved[0], solved[1], solved[2], cur.start, cur.path, search._on_default)


def grouped_solved(pcg: PCG, start: str, path: tuple[Applied, ...], search: SolvedSearch,
                   rules: Sequence[Rule]) -> Found | None:
    """``pcg`` (a plain graph) solved with device groups, with the rewrites only device
    groups price right (``Rule.grouped_only``: sibling fusions of unequal widths) applied
    where they make it faster so: each such rule at every match at once, one grouped solve
    per rule that matches, in id order (None: the solver has none). Flat, fusing a narrow
    branch with wide ones always looks a launch cheaper, so neither the walk nor the polish
    applies these: on Inception-tiny's reductions the fused triple looked best flat and ran
    28 % slower on device groups than the pair it hid. A grouped solve of a large graph
    costs seconds, so matches are not tried one by one (Inception-v3 at 48 GPUs took 97 s
    so, 13 s without), and none is made where no such rule matches."""
    here = sorted((r for r in rules if r.grouped_only and find_matches(pcg, r, limit=1)), key=lambda r: r.id)
    first = _solved_priced(search, pcg, True) if here else None
    if first is None:
        return None
    cur, solved = Found(pcg, first[1], first[2], start, path), first
    for rule in here:
        every = _fuse_every(cur, rule, rule.id, False, None)
        if every is None:
            continue
        got = _solved_priced(search, every.pcg, True)
        if got is not None and got[2].feasible and faster(got[2], cur.report):
            cur, solved = _batch_kept(cur, every, got), got
    return Found(solved[0], solved[1], solved[2], cur.start, cur.path, search._on_default)


def _solved_priced(search: SolvedSearch, g: PCG, grouped: bool
                   ) -> tuple[PCG, tuple[MachineView, ...], CostReport] | None:
    """``g`` (a plain graph) as the solver parallelizes it, flat or with device groups, with
    its views and report (None: the solver has none)."""
    solved = search.solve(g, grouped=grouped)
    return None if solved is None else (solved, *JointSearch.cost(search, solved))


def _batch_kept(cur: Found, every: Found, got: tuple) -> Found:
    """``every`` (``cur`` rewritten at several matches at once) as kept at its price ``got``
    (solved graph, views, report): the batch's saving shared equally among its steps."""
    new_steps = every.path[len(cur.path):]
    share = tuple((k, round(v / len(new_steps), 6) if k.endswith("_ms") else v // len(new_steps))
                  for k, v in saved(cur.report, got[2]))
    return Found(every.pcg, got[1], got[2], cur.start, cur.path + tuple(replace(a, bought=share) for a in new_steps))


def _fuse_every(cur: Found, rule: Rule, rid: str, reverse: bool, only: set | None) -> Found | None:
    """``cur``'s plain graph with every match of ``rule`` (``only``: those keys) fused,
    unpriced; None if none applies."""
    g, path, done = cur.pcg, cur.path, set()
    while (step := _next_fused(g, rule, rid, only, done)) is not None:
        m, _, new = step
        node = g.nodes[m.root]
        g, path = new, path + (Applied(rid, rule.name, reverse, node.name or node.kind),)
    return None if g is cur.pcg else replace(cur, pcg=g, path=path)


def _next_fused(g: PCG, rule: Rule, rid: str, only: set | None, tried: set) -> tuple | None:
    """The first match of ``rule`` in ``g`` not yet ``tried`` (``only``: among those keys)
    that applies, as (match, key, the fused graph); its key and those of matches that do
    not apply join ``tried``. None when no match is left."""
    while True:
        keys = ((m, _key_of(g, rid, m)) for m in find_matches(g, rule))
        m, key = next(((m, k) for m, k in keys if k not in tried and (only is None or k in only)), (None, None))
        if m is None:
            return None
        tried.add(key)
        check()
        try:
            return m, key, simplify(apply_match(g, m, check=False))
        except RewriteError:
            continue


def _key_of(g: PCG, rid: str, m) -> tuple[str, str]:
    """A match by its rule and its root's name (stable while other fusions rebuild the
    graph), or its structural hash where it has no name."""
    node = g.nodes[m.root]
    return rid, node.name or g.node_hashes[m.root]


def _fusion_pass(cur: Found, fusing: Sequence[tuple[Rule, str, bool]], price, only: set | None,
                 solved: tuple | None = None) -> tuple[Found, tuple | None, set]:
    """One pass of :func:`fuse_solved` over the fusions' matches (``only``: those keys),
    each kept if ``price`` (its solved graph, views and report) says it is faster. Returns
    the plain graph fused so, its solved graph as priced (``solved`` if none was kept), and
    the keys (rule id, root's name) of the matches refused."""
    refused: set = set()
    for rule, rid, reverse in fusing:
        if not {n.kind for n in rule.src.nodes} <= cur.pcg.by_kind.keys():
            continue
        # every match of the rule at once first: one solve where they all pay (a model's
        # layers are alike), one per match only where not all do
        every = _fuse_every(cur, rule, rid, reverse, only)
        if every is not None and len(every.path) > len(cur.path) + 1:
            got = price(every.pcg)
            if got is not None and got[2].feasible and faster(got[2], cur.report):
                cur, solved = _batch_kept(cur, every, got), got
                continue
        tried: set = set()
        # each match once (a fusion rebuilds the graph, so matches are found again)
        while (step := _next_fused(cur.pcg, rule, rid, only, tried)) is not None:
            m, key, new = step
            got = price(new)
            if got is None or not (got[2].feasible and faster(got[2], cur.report)):
                refused.add(key)
                continue
            node = cur.pcg.nodes[m.root]
            step = Applied(rid, rule.name, reverse, node.name or node.kind, (), saved(cur.report, got[2]))
            cur, solved = Found(new, got[1], got[2], cur.start, cur.path + (step,)), got
    return cur, solved, refused


def fuse_activations(found: Found, cluster: ClusterSpec, config: CostConfig, rules: Sequence[Rule]
                     ) -> tuple[Found, int]:
    """After the search, with its parallelization chosen: every activation that can run
    inside its product and makes the plan faster so, one at a time, each priced (the
    polish's patience and its matches per rule leave some unfused on large graphs; each
    saves a task and a pass over the product's output, and once the graph is parallelized
    it can no longer take a row split away: an activation after partial sums follows
    their reduction, so it does not match). A match refused is not tried again while its
    root and what feeds it stay the same (its structural hash). When the run's time ceiling
    passes, the plan fused so far stands. Returns the plan and how many graphs it priced."""
    fusing = fusing_rules(rules)
    cur, refused, priced = found, set(), 0
    try:
        while True:
            new, n = _next_fusion(cur, fusing, cluster, config, refused)
            priced += n
            if new is None:
                return cur, priced
            cur = new
    except OutOfTime:
        return cur, priced


def _next_fusion(cur: Found, fusing: Sequence[tuple[Rule, str, bool]], cluster: ClusterSpec, config: CostConfig,
                 refused: set) -> tuple[Found | None, int]:
    """``cur`` with the first fusion (in rule order, then match order) that makes it faster
    (None: none does), and how many graphs it priced; the matches it refused join ``refused``."""
    present, priced = cur.pcg.by_kind.keys(), 0
    for rule, rid, reverse in fusing:
        if not {n.kind for n in rule.src.nodes} <= present:
            continue
        for m in find_matches(cur.pcg, rule):
            at = (rule.id, cur.pcg.node_hashes[m.root])
            if at in refused:
                continue
            check()
            try:
                new = simplify(apply_match(cur.pcg, m, check=False))
            except RewriteError:
                refused.add(at)
                continue
            inherited = rewritten_views(new, cur.pcg, cur.views, cluster.num_devices, cur.on_default)
            views = inherited or default_views(new)
            rep = estimate(new, views, cluster, config)
            priced += 1
            if not (rep.feasible and faster(rep, cur.report)):
                refused.add(at)
                continue
            node = cur.pcg.nodes[m.root]
            step = Applied(rid, rule.name, reverse, node.name or node.kind, (), saved(cur.report, rep))
            return Found(new, views, rep, cur.start, cur.path + (step,), inherited is None), priced
    return None, priced
