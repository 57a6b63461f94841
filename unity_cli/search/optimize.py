"""Choosing a strategy: build each baseline, cost it, keep the fastest that fits in memory.

``best`` (the default) and ``unity`` run the joint search: the algebraic rewrites of the
plain graph, each parallelized by the inner solver (``joint.SolvedSearch``, ``solver.py``),
then a short best-first search over all rules (``joint.py``) started from its plan, the
solver's, the plain graph and every baseline. A graph the solver cannot take is searched
segment by segment instead (``segments.py``). Beside it run the two search baselines:
``parallel_only`` (the inner solver alone, FlexFlow's question answered exactly) and
``algebraic_then_parallel`` (algebraic rewrites for one device, then the solver: TASO then
FlexFlow). ``best`` keeps the fastest plan of all, ``unity`` the joint search's. Every
search stops by a count of work that shrinks as the graph grows (each candidate of a
bigger graph costs more), never by the clock unless ``--budget`` sets a ceiling.

Beside data and tensor parallelism, the baselines include ``hybrid``: the fastest uniform
``tp=T,dp=D`` hybrid over every factorization ``T*D`` of the device count (``D`` dividing
the batch). ``--strategy tp=T,dp=D`` prices one the user names.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostReport, device_capacity, estimate, layout_sources, memory_per_device
from ..deadline import OutOfTime, ceiling, check
from ..errors import InfeasibleError, ShapeError, UsageError
from ..ir.machine_view import MachineView, devices_used
from ..ir.pcg import PCG
from ..ir.training import Training
from ..ir.validate import validate
from ..substitutions.rule import Rule
from .baselines import (
    STRATEGIES,
    Baseline,
    Strategy,
    batch_size,
    hybrid,
    hybrid_degrees,
    hybrid_layout,
    hybrid_name,
    is_hybrid,
    parse_hybrid,
    weighted_splits,
)
from .joint import (
    Found,
    JointSearch,
    SearchStats,
    SolvedSearch,
    faster,
    fuse_activations,
    fuse_solved,
    grouped_solved,
    unfused_activations,
)
from .mapping import Mapper, MappingBudgetExceeded, MappingOutOfTime
from .segments import search_segments
from .solver import Solution, Tables, regroup, solve
from .views import default_views, transposed_views

SEARCHES = (Strategy.UNITY, Strategy.PARALLEL_ONLY, Strategy.ALGEBRAIC_THEN_PARALLEL)
HYBRID = Strategy.HYBRID
CHOICES = (Strategy.BEST,) + SEARCHES + tuple(STRATEGIES) + (HYBRID,)
BASELINES = tuple(STRATEGIES) + (HYBRID,)
"""The rows built without a search: the searches start from them, and ``best`` is never slower."""


@dataclass(frozen=True)
class Candidate:
    baseline: Baseline
    views: tuple[MachineView, ...]
    report: CostReport


@dataclass(frozen=True)
class SearchResult:
    chosen: Candidate
    candidates: dict[str, Candidate]
    rewrites: tuple = ()
    stats: SearchStats | None = None
    hybrids: tuple[Candidate, ...] = ()   # every uniform hybrid the run priced, tp ascending
    cut_by_budget: bool = False           # the time ceiling (--budget) stopped some search or mapping
    not_priced: tuple[str, ...] = ()      # rows the time ceiling left out


FINISH_FACTOR = 2.0
"""Under a time ceiling, the time kept for writing the plan and its summary, in units of
the time pricing the first baseline took (both walk the whole graph a few times)."""

MAPPING_SECONDS = 2.0
"""Under a time ceiling (``--budget``), the most the machine-mapping DP may take per strategy
before the default views are kept. Without one the DP is bounded by its state count only."""

DEFAULT_CANDIDATES = 200
"""The default work budget: graphs the searches cost, over all of them (``--max-candidates``).
A count, not seconds, so the same inputs give the same plan on any machine under any load."""


def evaluate(baseline: Baseline, cluster: ClusterSpec, config: CostConfig,
             seconds: float | None = None, cache: dict | None = None,
             priced: tuple[tuple[MachineView, ...], CostReport] | None = None) -> Candidate:
    """Cost a strategy under the default views (``priced``: already done) and under the
    machine-mapping DP's (given at most ``seconds``; None: bounded by its state budget
    only); keep the faster. ``cache`` keeps one run's mappings by graph: the searches often
    return a graph a baseline is. When a time ceiling (``deadline.ceiling``) passes during
    the mapping, the default views' price stands."""
    check()    # not even started when the ceiling has passed
    validate(baseline.pcg)
    cache = {} if cache is None else cache
    if priced is None:
        views = default_views(baseline.pcg)
        priced = (views, estimate(baseline.pcg, views, cluster, config))
    best = Candidate(baseline, *priced)
    key = baseline.pcg.node_hashes  # views are by node position: equal graphs in another order differ
    try:
        check()
        if key not in cache:
            cache[key] = _map(baseline.pcg, cluster, config, seconds)
        mapped, _ = cache[key]
        if mapped:
            report = estimate(baseline.pcg, mapped[1], cluster, config)
            if _better(report, best.report):   # (the devices it reaches are the mapping's)
                best = Candidate(replace(baseline, devices=devices_used(baseline.pcg, mapped[1])), mapped[1], report)
    except OutOfTime:
        cache.setdefault(key, (None, True))
    return best


def _map(pcg: PCG, cluster: ClusterSpec, config: CostConfig, seconds: float | None) -> tuple:
    """(the mapping DP's result or None, whether a time ceiling cut it)."""
    try:
        return Mapper(pcg, cluster, config, seconds=seconds).run(), False
    except MappingOutOfTime:
        return None, True
    except (MappingBudgetExceeded, RecursionError):   # (a decomposition deeper than the stack allows)
        return None, False


@dataclass
class _Evaluator:
    """How one optimize run costs a strategy: one mapping cache, and, under a time ceiling
    only, a mapping time limit out of what is left of it."""

    cluster: ClusterSpec
    config: CostConfig
    budget: float | None
    deadline: float | None
    cache: dict = field(default_factory=dict)
    solved: dict = field(default_factory=dict)   # the inner solver's solution, by the graph it solved
    one_device: dict = field(default_factory=dict)   # the one-device algebraic search, by graph and work
    tables: Tables | None = None                 # the inner solver's cost tables, shared by the run
    placed: dict = field(default_factory=dict)   # the solver's views of graphs with branches on device groups

    @property
    def cut(self) -> bool:
        """Whether the time ceiling cut any mapping of this run."""
        return any(c for _, c in self.cache.values())

    def solve(self, pcg: PCG, grouped: bool = True) -> PCG | None:
        """The inner parallelization solver's graph for ``pcg`` (once per run, graph and
        ``grouped``: whether independent branches may also go on disjoint device groups;
        such a graph's views are kept in ``placed``). A graph solved both ways is solved
        flat once."""
        sol = self.solution(pcg, grouped)
        return None if sol is None else sol.pcg

    def solution(self, pcg: PCG, grouped: bool) -> Solution | None:
        key = (pcg.node_hashes, grouped)
        if key not in self.solved:
            if self.tables is None:
                self.tables = Tables(self.cluster, self.config)
            try:
                if not grouped:
                    sol = solve(pcg, self.cluster, self.config, tables=self.tables, grouped=False)
                else:
                    flat = self.solution(pcg, False)
                    sol = None if flat is None else regroup(pcg, self.cluster, self.config, flat, self.tables)
            except ShapeError:
                sol = None
            self.solved[key] = sol
            if sol is not None and sol.grouping is not None:
                self.placed[sol.pcg.node_hashes] = sol.views
        return self.solved[key]

    def __call__(self, baseline: Baseline, priced: tuple | None = None) -> Candidate:
        seconds = None if self.deadline is None else \
            min(MAPPING_SECONDS, 0.1 * self.budget, max(0.05, self.deadline - time.monotonic()))
        return evaluate(baseline, self.cluster, self.config, seconds, self.cache, priced)


def price_hybrid(baseline: Baseline, cluster: ClusterSpec, config: CostConfig, mapped: bool = False,
                 cache: dict | None = None, dp_mapped: bool = True) -> Candidate:
    """A uniform hybrid under the default views, which put each tensor-parallel group on
    consecutive devices and data parallelism across the groups (the layout it promises), and
    with ``mapped`` also on the transposed grid (its replicas inside the nodes, each group
    across them) and, with ``dp_mapped``, as the machine-mapping DP lays it out; the fastest
    kept: a configuration a person writes is priced at its best placement, as the searches'
    plans are."""
    validate(baseline.pcg)
    views = default_views(baseline.pcg)
    priced = (views, estimate(baseline.pcg, views, cluster, config))
    if not mapped:
        return Candidate(baseline, *priced)
    best = evaluate(baseline, cluster, config, None, cache, priced) if dp_mapped else Candidate(baseline, *priced)
    tp, dp = baseline.degrees or (0, 0)
    across = transposed_views(baseline.pcg, views, tp, dp) if tp > 1 and dp > 1 else None
    if across is not None:     # the replicas inside the nodes, each tensor-parallel group across them
        report = estimate(baseline.pcg, across, cluster, config)
        if _better(report, best.report):
            said = baseline.description.replace(hybrid_layout(tp, dp), hybrid_layout(tp, dp, transposed=True))
            best = Candidate(replace(baseline, description=said), across, report)
    return replace(best, baseline=replace(best.baseline, name=baseline.name))


def best_hybrid(pcg: PCG, cluster: ClusterSpec, config: CostConfig,
                mapped: bool = True) -> tuple[Candidate, tuple[Candidate, ...]]:
    """The fastest uniform ``tp=T,dp=D`` hybrid that fits, as the row ``hybrid``, and every
    one priced: all ``T*D`` = the device count with ``D`` dividing the batch (``tp=N,dp=1``
    always qualifies). One that cannot fit in device memory (a linear count, far cheaper
    than the step simulation on hundreds of devices) is not simulated, unless none fits:
    then the one needing the least memory is, so the row says what it lacks. With ``mapped``
    each is priced at its better grid (:func:`price_hybrid`), and the fastest is laid out by
    the machine-mapping DP too (one mapping: on a large graph it costs what pricing all the
    others does)."""
    degrees = hybrid_degrees(cluster.num_devices, batch_size(pcg))
    built = [hybrid(pcg, tp, dp) for tp, dp in degrees]
    need = [_peak_memory(b.pcg, cluster, config) for b in built]
    fit = [b for b, m in zip(built, need, strict=True) if m is None]
    tried = tuple(price_hybrid(b, cluster, config, mapped, dp_mapped=False) for b in fit) or \
        (price_hybrid(built[min(range(len(built)), key=lambda k: need[k])], cluster, config),)
    won = min(tried, key=lambda c: (not c.report.feasible, c.report.step_time))
    if mapped and fit:
        laid = evaluate(won.baseline, cluster, config, None, None, (won.views, won.report))
        if _better(laid.report, won.report):
            won = replace(laid, baseline=won.baseline)
            tried = tuple(won if c.baseline.name == won.baseline.name else c for c in tried)
    b = won.baseline
    tps = ", ".join(str(tp) for tp, _ in degrees)
    others = f"the fastest of {len(built)} uniform hybrids (tp = {tps}, dp = {cluster.num_devices}/tp)"
    if len(fit) < len(built):
        big = [h for h, m in zip(built, need, strict=True) if m is not None]
        others += f"; {len(big)} do not fit in memory ({', '.join(h.name.split(',')[0] for h in big)})"
    return replace(won, baseline=replace(b, name=HYBRID, description=f"{b.description}; {others}")), tried


def _peak_memory(pcg: PCG, cluster: ClusterSpec, config: CostConfig) -> int | None:
    """The most bytes a device needs under the default views when that exceeds its capacity
    (or the memory limit), else None: the same count ``estimate`` makes."""
    views = default_views(pcg)
    devs = [views[i].devices(n.outputs[0]) for i, n in pcg]
    memory = memory_per_device(pcg, devs, layout_sources(pcg), cluster, config)
    return max(memory) if (np.asarray(memory) > device_capacity(cluster, config)).any() else None


def _starts(pcg: PCG, candidates: dict[str, Candidate],
            ev: _Evaluator | None = None) -> list[tuple[str, PCG, tuple]]:
    """The plain graph, the baselines, and the inner solver's parallelization of the graph."""
    out = [("plain", pcg, ())] + [(n, c.baseline.pcg, ()) for n, c in sorted(candidates.items()) if n in BASELINES]
    solved = ev.solve(pcg) if ev is not None and not any(n.spec.is_parallel_op for _, n in pcg) else None
    return out + ([("solver", solved, ())] if solved is not None else [])


SOLVED_WORK = 600
"""The outer level's work budget: operators x solver calls (each candidate of the algebraic
search is solved whole), so a large graph gets few candidates and a small one many."""
POLISH_WORK = 4_000
"""The work budget, in operators x candidates, of the whole-graph searches that polish a
solved plan (``unity``) or rewrite for one device (``algebraic_then_parallel``): each
candidate is rewritten and simulated whole, so its price grows with the graph."""


UNSOLVED_WORK = 40_000
"""The work budget, in operators x candidates, of each whole-graph search over a graph the
inner solver has no plan for (the baselines' walk under the parallelization rules, the
polish after the segment search): each candidate is rewritten and simulated whole, so on a
decoder of thousands of operators a few candidates cost what a small graph's full budget does."""


def scaled_candidates(pcg: PCG, cap: int, work: int) -> int:
    """How many candidates a search whose candidates cost in proportion to the graph may
    cost: ``work`` over the graph's operators, at most ``cap``, at least one."""
    ops = sum(1 for _, n in pcg if not n.spec.is_source)
    return max(1, min(cap, work // max(1, ops)))


def solved_candidates(pcg: PCG, cap: int) -> int:
    """How many candidates the solver-priced algebraic search may cost: out of ``SOLVED_WORK``,
    at most a quarter of the joint search's ``cap``."""
    return scaled_candidates(pcg, cap // 4, SOLVED_WORK)


def _part(budget: float | None, share: float) -> float | None:
    """A share of a time ceiling (None: no ceiling)."""
    return None if budget is None else budget * share


POLISH_PATIENCE = 48
"""When the inner solver has parallelized the graph, the whole-graph search over every rule
that follows only polishes its plan and the baselines: it stops after this many candidates
without improvement (a count, like every stop). At 24, XDL on 48 GPUs lost the plan that
splits its big table 16 ways with no replicas to sync (8.88 ms against 10.38): the solver
uses every device for every operator, and that plan leaves some idle."""


def _unity(pcg, cluster, config, rules, budget, alpha, progress, candidates, cap, ev):
    """Algebraic and parallelization rules together (the joint search). On a plain graph,
    the outer level walks its algebraic rewrites, each parallelized by the inner solver;
    its plan, the solver's and the baselines start a short best-first search over every
    rule. A graph the solver cannot take is solved segment by segment (half the work),
    and the stitched result is one more start."""
    t0 = time.monotonic()
    starts = _starts(pcg, candidates, ev)
    solved = any(name == "solver" for name, _, _ in starts)
    stats = SearchStats()
    if solved:
        # Algebraic rewrites of the plain graph, each parallelized by the inner solver, from
        # the plain graph and from its rewriting for one device (TASO's stage, less fusions).
        # Fusions wait for the polish: fused before the parallelization is chosen, a product
        # can no longer be split by rows, and the few launches saved (more, the more devices)
        # hide the better strategies from the walk. (``_search`` holds unity to the search
        # baselines' plans, so it is never behind TASO-then-FlexFlow.)
        one, one_stats = _one_device(pcg, cluster, config, rules, _part(budget, 0.25), alpha, progress,
                                     max(1, cap // 4), ev, fuse=False)
        walked = [r for r in rules if not (r.is_parallel or r.is_fusion or r.grouped_only)]
        outer = SolvedSearch(cluster, config, walked,
                             budget=_part(budget, 0.25),
                             alpha=alpha, progress=progress, max_candidates=solved_candidates(pcg, cap),
                             solve=ev.solve, placed=ev.placed)
        won = outer.run([("plain", pcg, ()), ("rewritten for one device", one.pcg, one.path)])
        starts.append(("rewritten and solved", won.pcg, won.path))
        stats = one_stats + outer.stats
    else:
        seg, stats = search_segments(pcg, cluster, config, [r for r in rules if not r.grouped_only],
                                     _part(budget, 0.25), alpha, batch_size(pcg),
                                     max_candidates=max(1, cap // 2), progress=progress)
        if seg is not None:
            starts.append(("segments", seg.pcg, seg.path))
    left = None if budget is None else max(0.0, budget - (time.monotonic() - t0))
    rest = max(1, cap - stats.candidates)
    search = JointSearch(cluster, config, [r for r in rules if not r.grouped_only], budget=left, alpha=alpha,
                         progress=progress,
                         max_candidates=scaled_candidates(pcg, rest, POLISH_WORK if solved else UNSOLVED_WORK),
                         patience=POLISH_PATIENCE if solved else JointSearch.patience, placed=ev.placed)
    found = search.run(starts)
    found, priced = fuse_activations(found, cluster, config, rules)
    search.stats.candidates += priced
    if solved and outer.plain is not None and unfused_activations(found.pcg):
        # The walk's winner and the plain graph, each with the activations fused that pay as
        # the solver parallelizes them, then grouped: two more plans, compared, not starts
        # (the polish's patience is spent on its starts). The walk prices flat, so its winner
        # may have merged what runs faster apart on device groups (tables, sibling branches).
        try:
            for g, name, path in ((outer.plain.pcg, outer.plain.start, outer.plain.path), (pcg, "plain", ())):
                fused = fuse_solved(g, name, path, outer, rules)
                if fused is not None and _better(fused.report, found.report):
                    found = fused
        except OutOfTime:
            pass
    if solved and outer.plain is not None:
        try:   # the walk's winner (a grouped solve of a large graph costs seconds: one graph)
            got = grouped_solved(outer.plain.pcg, outer.plain.start, outer.plain.path, outer, rules)
            if got is not None and _better(got.report, found.report):
                found = got
        except OutOfTime:
            pass
    # The best may be laid out by the solver's device groups, or be a hair faster than
    # others on the default views; the fastest on the default views may still come out
    # faster once the machine-mapping DP lays them out (its parallel regions can split
    # their devices too), as ``_search`` lays out the best.
    others = [f for f in search.finalists if f.pcg.node_hashes != found.pcg.node_hashes]
    if others:
        mapped = [ev(Baseline(Strategy.UNITY, f.pcg, devices_used(f.pcg, f.views), ""), (f.views, f.report))
                  for f in [found] + others]
        best, chosen = mapped[0], None
        for f, m in zip(others, mapped[1:], strict=True):
            if faster(m.report, best.report):     # beyond float noise: a tie keeps the fewer rewrites
                best, chosen = m, f
        if chosen is not None:
            found = Found(chosen.pcg, best.views, best.report, chosen.start, chosen.path)
    return found, stats + search.stats


def _solved(pcg: PCG, cluster: ClusterSpec, config: CostConfig, ev: _Evaluator, start: str) -> Found | None:
    """The inner solver's plan for the plain graph ``pcg``, priced (None: it has none)."""
    if any(n.spec.is_parallel_op for _, n in pcg):
        return None
    g = ev.solve(pcg)
    if g is None:
        return None
    views = ev.placed.get(g.node_hashes) or default_views(g)
    return Found(g, views, estimate(g, views, cluster, config), start)


def _parallel_only(pcg, cluster, config, rules, budget, alpha, progress, candidates, cap, ev):
    """FlexFlow-like, done exactly: the inner parallelization solver alone on the plain
    graph (no algebraic rewrite). On a graph it cannot take, a search with the
    parallelization rules only, from the baselines."""
    found = _solved(pcg, cluster, config, ev, "solver")
    if found is not None:
        return found, SearchStats(candidates=1, converged=True)
    search = JointSearch(cluster, config, [r for r in rules if r.is_parallel], budget=budget, alpha=alpha,
                         progress=progress, max_candidates=scaled_candidates(pcg, cap, UNSOLVED_WORK))
    return search.run(_starts(pcg, candidates, ev)), search.stats


def _algebraic_then_parallel(pcg, cluster, config, rules, budget, alpha, progress, candidates, cap, ev):
    """TASO then FlexFlow: rewrite for one device with algebraic rules, then parallelize the
    result with the inner solver (or, on a graph it cannot take, the parallelization rules)."""
    rewritten, one_stats = _one_device(pcg, cluster, config, rules, _part(budget, 0.5), alpha, progress,
                                       max(1, cap // 2), ev)
    found = _solved(rewritten.pcg, cluster, config, ev, "solver")
    if found is not None:
        stats = one_stats + SearchStats(candidates=1, converged=True)
        return replace(found, path=rewritten.path), stats
    base = {name: ev(fn(rewritten.pcg, cluster)) for name, fn in STRATEGIES.items()}
    two = JointSearch(cluster, config, [r for r in rules if r.is_parallel], budget=_part(budget, 0.5),
                      alpha=alpha, progress=progress,
                      max_candidates=scaled_candidates(rewritten.pcg, max(1, cap // 2), UNSOLVED_WORK))
    found = two.run(_starts(rewritten.pcg, base, ev))
    return replace(found, path=rewritten.path + found.path), one_stats + two.stats


def _one_device(pcg, cluster, config, rules, budget, alpha, progress, cap, ev,
                fuse: bool = True) -> tuple[Found, SearchStats]:
    """The graph rewritten with the algebraic rules for one device (TASO), once per run, graph,
    work and ``fuse`` (whether fusions are among the rules: the joint search starts from the
    graph without them, nor the rewrites only device groups price right, ``Rule.grouped_only``;
    algebraic_then_parallel rewrites with every rule, as TASO does)."""
    key = (pcg.node_hashes, cap, fuse)
    if key not in ev.one_device:
        kept = [r for r in rules if not r.is_parallel and (fuse or not (r.is_fusion or r.grouped_only))]
        one = JointSearch(cluster.first(1), config, kept, budget=budget,
                          alpha=alpha, progress=progress, max_candidates=scaled_candidates(pcg, cap, POLISH_WORK))
        ev.one_device[key] = (one.run([("plain", pcg, ())]), one.stats)
        return ev.one_device[key]
    found, _ = ev.one_device[key]
    return found, SearchStats(converged=True)


_FROM_BASELINES = (Strategy.UNITY, Strategy.PARALLEL_ONLY)   # searches started from this run's baselines
_SEARCH = {Strategy.UNITY: _unity, Strategy.PARALLEL_ONLY: _parallel_only,
           Strategy.ALGEBRAIC_THEN_PARALLEL: _algebraic_then_parallel}


def _better(a: CostReport, b: CostReport) -> bool:
    return (not a.feasible, a.step_time) < (not b.feasible, b.step_time)


def optimize(pcg: PCG, cluster: ClusterSpec, config: CostConfig, strategy: str = Strategy.BEST,
             rules: Sequence[Rule] = (), budget: float | None = None, alpha: float = 1.05,
             progress: Callable | None = None, max_candidates: int | None = None,
             started: float | None = None,
             hybrid_row: tuple[Candidate, tuple[Candidate, ...]] | None = None) -> SearchResult:
    """The chosen plan and every row priced beside it. The searches stop by a count of work
    (``max_candidates``, default :data:`DEFAULT_CANDIDATES`); ``budget`` is an optional time
    ceiling in seconds over the whole run, from ``started`` (``time.monotonic()``; default:
    now), stopping short by :data:`FINISH_FACTOR` pricings to write the plan. A given
    ``max_candidates`` overrides it (so a capped plan never depends on the machine's speed). Under the ceiling
    the first baseline is always priced (under its default views); what the ceiling leaves
    no time for (a mapping, another baseline, the solver, a search) is left out, and
    ``SearchResult.not_priced`` names the rows that are missing for it. ``hybrid_row``: the
    ``hybrid`` row and the hybrids priced for it, already priced (``step.best_uniform``);
    default: the fastest ``tp=T,dp=D`` under ``config``'s step shape (:func:`best_hybrid`)."""
    named = _named_hybrid(strategy, pcg, cluster, config.training) if is_hybrid(strategy) else None
    if named is None and strategy not in CHOICES:
        raise UsageError(f"--strategy: unknown strategy {strategy!r} (choose from {', '.join(CHOICES)}, "
                         f"or tp=T,dp=D)")
    if max_candidates is not None:
        budget = None
    work = DEFAULT_CANDIDATES if max_candidates is None else max_candidates
    t0 = time.monotonic() if started is None else started
    # The plan of last resort (the first baseline under its default views) and a baseline
    # asked for by name are priced whatever the ceiling; the rest only while it lasts.
    first = [name for k, name in enumerate(STRATEGIES) if k == 0 or name == strategy]
    must, pricing = {}, 0.0
    for name in first:
        b = STRATEGIES[name](pcg, cluster)
        views = default_views(b.pcg)
        t1 = time.monotonic()
        must[name] = (b, (views, estimate(b.pcg, views, cluster, config)))
        pricing = max(pricing, time.monotonic() - t1)
    # Writing the plan and its summary costs about what pricing a plan does: keep that much.
    # The whole run, import included.
    deadline = None if budget is None else t0 + max(0.0, budget - FINISH_FACTOR * pricing)
    ev = _Evaluator(cluster, config, budget, deadline)
    candidates: dict[str, Candidate] = {}
    missing: list[str] = []
    with ceiling(deadline):
        for name, fn in STRATEGIES.items():
            try:
                candidates[name] = ev(*must[name]) if name in must else ev(fn(pcg, cluster))
            except OutOfTime:
                if name in must:
                    candidates[name] = Candidate(must[name][0], *must[name][1])
                else:
                    missing.append(name)
        hybrids: tuple[Candidate, ...] = ()
        if strategy not in STRATEGIES:  # the searches start from it; a named hybrid is shown beside it
            try:
                candidates[HYBRID], hybrids = hybrid_row or best_hybrid(pcg, cluster, config)
            except OutOfTime:
                missing.append(HYBRID)
        if named is not None:
            strategy = named.name
            with ceiling(None):     # asked for by name: always priced
                candidates[strategy] = price_hybrid(named, cluster, config, mapped=True, cache=ev.cache)
        if strategy in SEARCHES or strategy == Strategy.BEST:
            return _search(pcg, cluster, config, strategy, rules, budget, alpha, progress, work, deadline, ev,
                           candidates, hybrids, missing)
    chosen = candidates[strategy] if strategy in candidates else candidates[_fastest(candidates)]
    if not chosen.report.feasible:
        raise InfeasibleError(f"{strategy} does not fit: it {chosen.report.infeasible}{_short_splits(chosen.baseline)}")
    return SearchResult(chosen, candidates, hybrids=hybrids, cut_by_budget=ev.cut or bool(missing),
                        not_priced=tuple(missing))


def _search(pcg, cluster, config, strategy, rules, budget, alpha, progress, work, deadline, ev, candidates,
            hybrids, missing) -> SearchResult:
    """The searches of ``optimize`` (``best``: all three, each with a share of the work)."""
    # The joint search reports the two search baselines too, each with a share of the work.
    joint = strategy in (Strategy.BEST, Strategy.UNITY)
    # the search baselines first, so that unity is held to them (below)
    runs = (Strategy.PARALLEL_ONLY, Strategy.ALGEBRAIC_THEN_PARALLEL, Strategy.UNITY) if joint else (strategy,)
    shares = {Strategy.UNITY: 0.5, Strategy.PARALLEL_ONLY: 0.25, Strategy.ALGEBRAIC_THEN_PARALLEL: 0.25} if joint \
        else {strategy: 1.0}
    found_by = {}
    for k, name in enumerate(runs):
        cap = max(1, int(work * shares[name]))
        share = None
        if deadline is not None:
            # Keep time to map each search's result; a search that ends early leaves its time to the next.
            reserve = min(len(runs) * MAPPING_SECONDS, 0.2 * budget)
            left = deadline - reserve - time.monotonic()
            share = max(0.05 * budget * shares[name], left * shares[name] / sum(shares[r] for r in runs[k:]))
        try:
            check()
            found, stats = _SEARCH[name](pcg, cluster, config, rules, share, alpha, progress, candidates, cap, ev)
        except OutOfTime:
            missing.append(name)
            continue
        cand = ev(Baseline(name, found.pcg, devices_used(found.pcg, found.views), f"search from {found.start}"),
                  (found.views, found.report))
        if name in _FROM_BASELINES:
            # The search compares graphs under default views; mapped by the DP, a baseline it
            # started from can still come out faster. A search never returns less than its starts.
            start = min((candidates[b] for b in BASELINES if b in candidates),
                        key=lambda c: (not c.report.feasible, c.report.step_time))
            if _better(start.report, cand.report):
                cand = Candidate(replace(start.baseline, name=name,
                                         description=f"search kept {start.baseline.name}"),
                                 start.views, start.report)
                found = Found(start.baseline.pcg, start.views, start.report, start.baseline.name)
        if name == Strategy.UNITY:
            # Its space holds both search baselines' plans (the rules of each, both levels), so
            # where its walk missed theirs it keeps the faster, with the rewrites that made it.
            for other in (Strategy.PARALLEL_ONLY, Strategy.ALGEBRAIC_THEN_PARALLEL):
                if other in found_by and _better(candidates[other].report, cand.report):
                    kept = candidates[other]
                    cand = Candidate(replace(kept.baseline, name=name, description=f"search kept {other}"),
                                     kept.views, kept.report)
                    found = found_by[other][0]
        candidates[name] = cand
        found_by[name] = (found, stats)
    name = _fastest(candidates) if strategy == Strategy.BEST or strategy not in candidates else strategy
    chosen = candidates[name]
    if not chosen.report.feasible:
        least = min(candidates.values(), key=lambda c: max(c.report.memory))
        raise InfeasibleError(f"no plan fits in device memory: the smallest found ({least.baseline.name}) "
                              f"{least.report.infeasible}")
    found, stats = found_by.get(name) or next(iter(found_by.values()), (None, None))
    cut = ev.cut or bool(missing) or any(st.timed_out for _, st in found_by.values())
    return SearchResult(chosen, candidates, found.path if name in found_by else (), stats, hybrids, cut,
                        tuple(missing))


def _named_hybrid(strategy: str, pcg: PCG, cluster: ClusterSpec, training: Training = Training()) -> Baseline:
    """The hybrid ``--strategy tp=T,dp=D[,zero=Z][,mb=K]`` names (``pcg`` at the micro-batch
    size, priced under ``training``), or a one-line UsageError."""
    n = cluster.num_devices
    tp, dp = parse_hybrid(strategy, n)
    batch = batch_size(pcg)
    if batch % dp:
        fits = ", ".join(hybrid_name(t, d) for t, d in hybrid_degrees(n, batch))
        what = f"the micro-batch {batch}" if training.micro_batches > 1 else f"the batch {batch}"
        raise UsageError(f"--strategy {strategy[:200]}: dp={dp} does not divide {what}; on {n} devices "
                         f"these do: {fits}")
    return hybrid(pcg, tp, dp, training)


def _short_splits(b: Baseline) -> str:
    """Why a hybrid holds more than its degree promises: its weighted ops that split fewer
    ways than its tensor-parallel degree (their dims do not divide by it), or nothing."""
    tp = b.degrees[0] if b.degrees else 1
    splits = weighted_splits(b.pcg) if tp > 1 else []
    short = [d for _, d in splits if d < tp]
    return (f" ({len(short)} of {len(splits)} weighted ops split fewer than {tp} ways: their dims do not divide "
            f"by {tp})") if short else ""


def _fastest(candidates: dict[str, Candidate]) -> str:
    """The fastest plan that fits (the joint search on a tie: it is the one asked for)."""
    def key(name: str) -> tuple:
        rep = candidates[name].report
        return (not rep.feasible, rep.step_time, name != Strategy.UNITY, name)
    return min(candidates, key=key)
