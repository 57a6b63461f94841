"""Choosing a strategy: build each baseline, cost it, keep the fastest that fits in memory.

The joint substitution search (issue #4) plugs in here as one more candidate.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cluster.machine_view import MachineView
from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostReport, estimate
from ..errors import InfeasibleError, UsageError
from ..ir.pcg import PCG
from ..ir.validate import validate
from .baselines import STRATEGIES, Baseline
from .mapping import dp_map
from .views import default_views

CHOICES = ("best",) + tuple(STRATEGIES)


@dataclass(frozen=True)
class Candidate:
    baseline: Baseline
    views: tuple[MachineView, ...]
    report: CostReport


@dataclass(frozen=True)
class SearchResult:
    chosen: Candidate
    candidates: dict[str, Candidate]


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


def optimize(pcg: PCG, cluster: ClusterSpec, config: CostConfig, strategy: str = "best") -> SearchResult:
    if strategy not in CHOICES:
        raise UsageError(f"--strategy: unknown strategy {strategy!r} (choose from {', '.join(CHOICES)})")
    candidates = {name: evaluate(fn(pcg, cluster), cluster, config) for name, fn in STRATEGIES.items()}
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
