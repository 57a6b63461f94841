"""Choosing a strategy: build each baseline, cost it, keep the fastest that fits in memory.

``--strategy unity`` adds the joint substitution search (``joint.py``), started from the
plain graph and every baseline, as one more candidate.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..cluster.machine_view import MachineView
from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostReport, estimate
from ..errors import InfeasibleError, UsageError
from ..ir.pcg import PCG
from ..ir.validate import validate
from ..substitutions.rule import Rule
from .baselines import STRATEGIES, Baseline
from .joint import JointSearch, SearchStats
from .mapping import dp_map
from .views import default_views

CHOICES = ("best", "unity") + tuple(STRATEGIES)


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


def evaluate(baseline: Baseline, cluster: ClusterSpec, config: CostConfig) -> Candidate:
    """Cost a strategy under the default views and under the machine-mapping DP's; keep the faster."""
    validate(baseline.pcg)
    best = None
    mapped = dp_map(baseline.pcg, cluster, config)
    options = [default_views(baseline.pcg)] + ([mapped[1]] if mapped else [])
    for views in options:
        report = estimate(baseline.pcg, views, cluster, config)
        if best is None or _better(report, best.report):
            best = Candidate(baseline, views, report)
    return best


def _better(a: CostReport, b: CostReport) -> bool:
    return (not a.feasible, a.step_time) < (not b.feasible, b.step_time)


def optimize(pcg: PCG, cluster: ClusterSpec, config: CostConfig, strategy: str = "best",
             rules: Sequence[Rule] = (), budget: float = 30.0, alpha: float = 1.05,
             progress: Callable | None = None) -> SearchResult:
    if strategy not in CHOICES:
        raise UsageError(f"--strategy: unknown strategy {strategy!r} (choose from {', '.join(CHOICES)})")
    candidates = {name: evaluate(fn(pcg, cluster), cluster, config) for name, fn in STRATEGIES.items()}
    if strategy == "unity":
        search = JointSearch(cluster, config, rules, budget=budget, alpha=alpha, progress=progress)
        starts = [("plain", pcg)] + [(name, c.baseline.pcg) for name, c in sorted(candidates.items())]
        found = search.run(starts)
        devices = max((d for i, n in found.pcg for d in found.views[i].devices(n.outputs[0])), default=0) + 1
        joint = evaluate(Baseline("unity", found.pcg, devices, f"joint search from {found.start}"), cluster, config)
        candidates["unity"] = joint
        if not joint.report.feasible:
            raise InfeasibleError(f"no plan fits in device memory: the best found {joint.report.infeasible}")
        return SearchResult(joint, candidates, found.path, search.stats)
    if strategy != "best":
        chosen = candidates[strategy]
        if not chosen.report.feasible:
            raise InfeasibleError(f"{strategy} does not fit: it {chosen.report.infeasible}")
        return SearchResult(chosen, candidates)
    feasible = [c for c in candidates.values() if c.report.feasible]
    if not feasible:
        least = min(candidates.values(), key=lambda c: max(c.report.memory))
        raise InfeasibleError(f"no strategy fits in device memory: the smallest ({least.baseline.name}) "
                              f"{least.report.infeasible}")
    chosen = min(feasible, key=lambda c: (c.report.step_time, c.baseline.name))
    return SearchResult(chosen, candidates)
