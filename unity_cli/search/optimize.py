"""Choosing a strategy: build each baseline, cost it, keep the fastest that fits in memory.

``best`` (the default) and ``unity`` run the joint substitution search (``joint.py``,
``segments.py``) started from the plain graph and every baseline, beside the two search
baselines; ``best`` then keeps the fastest plan of all, ``unity`` the joint search's.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..cluster.machine_view import MachineView, devices_used
from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostReport, estimate
from ..errors import InfeasibleError, UsageError
from ..ir.pcg import PCG
from ..ir.validate import validate
from ..substitutions.rule import Rule
from .baselines import STRATEGIES, Baseline, batch_size
from .joint import Found, JointSearch, SearchStats
from .mapping import dp_map
from .segments import search_segments
from .views import default_views

SEARCHES = ("unity", "parallel_only", "algebraic_then_parallel")
CHOICES = ("best",) + SEARCHES + tuple(STRATEGIES)


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


MAPPING_SECONDS = 2.0
"""Time the machine-mapping DP may take per strategy before the default views are kept
(a thousand-node graph such as DenseNet would otherwise spend longer mapping than searching)."""

def evaluate(baseline: Baseline, cluster: ClusterSpec, config: CostConfig,
             seconds: float | None = MAPPING_SECONDS, cache: dict | None = None) -> Candidate:
    """Cost a strategy under the default views and under the machine-mapping DP's (given at
    most ``seconds``; None: bounded by its state budget only); keep the faster. ``cache``
    keeps one run's mappings by graph: the searches often return a graph a baseline is."""
    validate(baseline.pcg)
    best = None
    cache = {} if cache is None else cache
    key = baseline.pcg.node_hashes  # views are by node position: equal graphs in another order differ
    if key not in cache:
        cache[key] = dp_map(baseline.pcg, cluster, config, seconds=seconds)
    mapped = cache[key]
    options = [default_views(baseline.pcg)] + ([mapped[1]] if mapped else [])
    for views in options:
        report = estimate(baseline.pcg, views, cluster, config)
        if best is None or _better(report, best.report):
            best = Candidate(baseline, views, report)
    return best


@dataclass
class _Evaluator:
    """How one optimize run costs a strategy: one mapping cache, and a mapping time limit
    out of the run's budget — none with a candidate cap, so that a capped plan does not
    depend on the machine's speed."""

    cluster: ClusterSpec
    config: CostConfig
    budget: float
    deadline: float
    capped: bool
    cache: dict = field(default_factory=dict)

    def __call__(self, baseline: Baseline) -> Candidate:
        seconds = None if self.capped else \
            min(MAPPING_SECONDS, 0.1 * self.budget, max(0.05, self.deadline - time.monotonic()))
        return evaluate(baseline, self.cluster, self.config, seconds, self.cache)


def _starts(pcg: PCG, candidates: dict[str, Candidate]) -> list[tuple[str, PCG, tuple]]:
    return [("plain", pcg, ())] + [(n, c.baseline.pcg, ()) for n, c in sorted(candidates.items()) if n in STRATEGIES]


def _unity(pcg, cluster, config, rules, budget, alpha, progress, candidates, cap, ev):
    """Algebraic and parallelization rules together (the joint search). A large graph is
    first solved segment by segment (half the budget); the stitched result is one more start."""
    t0 = time.monotonic()
    half = None if cap is None else max(1, cap // 2)
    seg, seg_stats = search_segments(pcg, cluster, config, rules, budget / 2, alpha, batch_size(pcg),
                                     max_candidates=half, progress=progress)
    starts = _starts(pcg, candidates) + ([("segments", seg.pcg, seg.path)] if seg is not None else [])
    left = None if cap is None else max(1, cap - seg_stats.candidates)
    search = JointSearch(cluster, config, rules, budget=max(0.0, budget - (time.monotonic() - t0)), alpha=alpha,
                         progress=progress, max_candidates=left)
    found = search.run(starts)
    return found, seg_stats + search.stats


def _parallel_only(pcg, cluster, config, rules, budget, alpha, progress, candidates, cap, ev):
    """FlexFlow-like: the same search with parallelization rules only."""
    search = JointSearch(cluster, config, [r for r in rules if r.is_parallel], budget=budget, alpha=alpha,
                         progress=progress, max_candidates=cap)
    return search.run(_starts(pcg, candidates)), search.stats


def _algebraic_then_parallel(pcg, cluster, config, rules, budget, alpha, progress, candidates, cap, ev):
    """TASO then FlexFlow: rewrite for one device with algebraic rules, then parallelize."""
    half = None if cap is None else max(1, cap // 2)
    one = JointSearch(cluster.first(1), config, [r for r in rules if not r.is_parallel], budget=budget / 2,
                      alpha=alpha, progress=progress, max_candidates=half)
    rewritten = one.run([("plain", pcg, ())])
    base = {name: ev(fn(rewritten.pcg, cluster)) for name, fn in STRATEGIES.items()}
    two = JointSearch(cluster, config, [r for r in rules if r.is_parallel], budget=budget / 2, alpha=alpha,
                      progress=progress, max_candidates=half)
    found = two.run(_starts(rewritten.pcg, base))
    stats = one.stats + two.stats
    return Found(found.pcg, found.views, found.report, found.start, rewritten.path + found.path), stats


_FROM_BASELINES = ("unity", "parallel_only")   # searches started from this run's baselines
_SEARCH = {"unity": _unity, "parallel_only": _parallel_only, "algebraic_then_parallel": _algebraic_then_parallel}


def _better(a: CostReport, b: CostReport) -> bool:
    return (not a.feasible, a.step_time) < (not b.feasible, b.step_time)


def optimize(pcg: PCG, cluster: ClusterSpec, config: CostConfig, strategy: str = "best",
             rules: Sequence[Rule] = (), budget: float = 30.0, alpha: float = 1.05,
             progress: Callable | None = None, max_candidates: int | None = None) -> SearchResult:
    if strategy not in CHOICES:
        raise UsageError(f"--strategy: unknown strategy {strategy!r} (choose from {', '.join(CHOICES)})")
    deadline = time.monotonic() + budget  # the budget covers the whole run, baselines included
    ev = _Evaluator(cluster, config, budget, deadline, capped=max_candidates is not None)
    candidates = {name: ev(fn(pcg, cluster)) for name, fn in STRATEGIES.items()}
    if strategy in SEARCHES or strategy == "best":
        # The joint search reports the two search baselines too, each with a share of the budget.
        joint = strategy in ("best", "unity")
        runs = SEARCHES if joint else (strategy,)
        shares = {"unity": 0.5, "parallel_only": 0.25, "algebraic_then_parallel": 0.25} if joint \
            else {strategy: 1.0}
        # Keep time to map each search's result; a search that ends early leaves its time to the next.
        reserve = min(len(runs) * MAPPING_SECONDS, 0.2 * budget)
        found_by = {}
        for k, name in enumerate(runs):
            cap = None if max_candidates is None else max(1, int(max_candidates * shares[name]))
            left = deadline - reserve - time.monotonic()
            share = max(0.05 * budget * shares[name], left * shares[name] / sum(shares[r] for r in runs[k:]))
            found, stats = _SEARCH[name](pcg, cluster, config, rules, share, alpha, progress, candidates, cap, ev)
            cand = ev(Baseline(name, found.pcg, devices_used(found.pcg, found.views), f"search from {found.start}"))
            if name in _FROM_BASELINES:
                # The search compares graphs under default views; mapped by the DP, a baseline it
                # started from can still come out faster. A search never returns less than its starts.
                start = min((candidates[b] for b in STRATEGIES), key=lambda c: (not c.report.feasible,
                                                                                 c.report.step_time))
                if _better(start.report, cand.report):
                    cand = Candidate(replace(start.baseline, name=name,
                                             description=f"search kept {start.baseline.name}"),
                                     start.views, start.report)
                    found = Found(start.baseline.pcg, start.views, start.report, start.baseline.name)
            candidates[name] = cand
            found_by[name] = (found, stats)
        name = _fastest(candidates) if strategy == "best" else strategy
        chosen = candidates[name]
        if not chosen.report.feasible:
            least = min(candidates.values(), key=lambda c: max(c.report.memory))
            raise InfeasibleError(f"no plan fits in device memory: the smallest found ({least.baseline.name}) "
                                  f"{least.report.infeasible}")
        found, stats = found_by.get(name, found_by[runs[0]])
        return SearchResult(chosen, candidates, found.path if name in found_by else (), stats)
    chosen = candidates[strategy]
    if not chosen.report.feasible:
        raise InfeasibleError(f"{strategy} does not fit: it {chosen.report.infeasible}")
    return SearchResult(chosen, candidates)


def _fastest(candidates: dict[str, Candidate]) -> str:
    """The fastest plan that fits (the joint search on a tie: it is the one asked for)."""
    def key(name: str) -> tuple:
        rep = candidates[name].report
        return (not rep.feasible, rep.step_time, name != "unity", name)
    return min(candidates, key=key)
