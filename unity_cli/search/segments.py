"""Segment-wise joint search: solve a large graph a segment at a time, join by DP.

The graph is cut (``split.py``) into segments of bounded size. Each boundary between
two segments takes one of a few layouts (unpartitioned, or the batch split over a
node's devices or over all of them). For every segment and every pair (layout in,
layout out) the joint search runs on the segment alone, started from the baselines
applied to it; identical segments — the repeated layers of a transformer — give
identical stand-alone graphs and are solved once. A dynamic program over the boundary
layouts then picks, per segment, the solution minimizing the sum of the segments'
predicted step times, and the pieces are stitched into one graph.

The sum is an estimate (segments overlap their communication in a real step), so the
stitched graph is only a start for the whole-graph search, costed exactly like any
other candidate: splitting can make the search faster and better, never worse.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig
from ..errors import ShapeError
from ..ir.pcg import PCG
from ..ir.shapes import ParallelTensorShape, TensorShape
from ..ir.simplify import simplify
from ..ir.validate import problems
from ..substitutions.rule import Rule
from .baselines import STRATEGIES, largest_divisor_at_most, propagate
from .joint import Applied, Found, JointSearch, SearchStats
from .split import Layout, SegmentGraph, reshard_outputs, segment_graph, split, stitch

MAX_SEGMENT = 48
"""Compute nodes per segment: small enough that a segment costs in about a millisecond."""


@dataclass(frozen=True)
class Stitched:
    """The whole graph made of the chosen segment solutions, and the rewrites they applied."""

    pcg: PCG
    path: tuple[Applied, ...]


def boundary_layouts(cluster: ClusterSpec, batch: int) -> list[tuple[str, Layout]]:
    """The layouts a boundary may take: whole on one device, or the batch split over a
    node's devices or over the whole cluster (replicated when the batch dim does not divide)."""
    per_node = min(n.devices for n in cluster.nodes)
    degrees = sorted({largest_divisor_at_most(batch, per_node), largest_divisor_at_most(batch, cluster.num_devices)}
                     - {1})
    out: list[tuple[str, Layout]] = [("whole", ParallelTensorShape.unpartitioned)]
    for d in degrees:
        out.append((f"batch/{d}", _batch_layout(d)))
    return out


def _batch_layout(d: int) -> Layout:
    def layout(shape: TensorShape) -> ParallelTensorShape:
        if shape.rank and shape.dims[0] % d == 0:
            return ParallelTensorShape.of(shape.dims, (d,) + (1,) * (shape.rank - 1), shape.dtype)
        return ParallelTensorShape.of(shape.dims, (1,) * shape.rank, shape.dtype, 1, d)
    return layout


def starts_for(seg: SegmentGraph, cluster: ClusterSpec, layout_out: Layout | None) -> list[tuple[str, PCG, tuple]]:
    """The baselines applied to a segment, on one device and by each strategy, with the
    outputs brought to ``layout_out``."""
    raw = seg.pcg
    built = [("whole", lambda: propagate(raw, 1, 1, lambda n, s, w: []))]
    built += [(name, (lambda fn=fn: fn(raw, cluster).pcg)) for name, fn in sorted(STRATEGIES.items())]
    out = []
    for name, make in built:
        try:
            g = simplify(reshard_outputs(make(), seg.final, layout_out))
        except ShapeError:
            continue
        out.append((name, g, ()))
    return out


def search_segments(pcg: PCG, cluster: ClusterSpec, config: CostConfig, rules: Sequence[Rule], budget: float | None,
                    alpha: float, batch: int, max_candidates: int | None = None,
                    progress: Callable | None = None,
                    max_nodes: int = MAX_SEGMENT) -> tuple[Stitched | None, SearchStats]:
    """The stitched graph of the best per-segment solutions (None for a graph too small to
    split), and the statistics of all the segment searches together."""
    stats = SearchStats()
    segs = split(pcg, max_nodes)
    if len(segs) < 2:
        return None, stats
    stats.segments = len(segs)
    layouts = boundary_layouts(cluster, batch)
    # Every (segment, layout in, layout out) problem, keyed by its stand-alone graph.
    final_outputs = set(pcg.outputs)
    problems_of: list[dict[tuple[int, int], tuple[SegmentGraph, str]]] = []
    distinct: dict[str, tuple[SegmentGraph, Layout | None]] = {}
    for seg in segs:
        ins = range(len(layouts)) if seg.inputs else [0]
        crosses = not all(r in final_outputs for r in seg.outputs)
        outs = range(len(layouts)) if crosses else [0]
        table = {}
        for a in ins:
            info = segment_graph(pcg, seg, layouts[a][1] if seg.inputs else None)
            for c in outs:
                lout = layouts[c][1] if crosses else None
                try:
                    key = reshard_outputs(info.pcg, info.final, lout).canonical_hash
                except ShapeError:
                    continue
                distinct.setdefault(key, (info, lout))
                table[(a, c)] = (info, key)
        problems_of.append(table)
    stats.segment_problems = len(distinct)
    share = None if budget is None else budget / max(1, len(distinct))
    cap = None if max_candidates is None else max(1, max_candidates // max(1, len(distinct)))
    solved: dict[str, Found] = {}
    for key, (info, lout) in distinct.items():
        starts = starts_for(info, cluster, lout)
        if not starts:
            continue
        search = JointSearch(cluster, config, rules, budget=share, alpha=alpha, progress=progress,
                             max_candidates=cap)
        solved[key] = search.run(starts)
        stats = stats + search.stats
    # Chain DP over boundary layouts: best[k] = the cheapest solutions of the segments so
    # far that leave their boundary in layout k.
    best: dict[int, tuple[float, list[tuple[SegmentGraph, str]]]] = {0: (0.0, [])}
    for s, table in enumerate(problems_of):
        nxt: dict[int, tuple[float, list[tuple[SegmentGraph, str]]]] = {}
        for (a, c), (info, key) in sorted(table.items()):
            found = solved.get(key)
            if found is None or not found.report.feasible:
                continue
            before = best.get(a) if segs[s].inputs else min(best.values(), key=lambda v: v[0])
            if before is None:
                continue
            total = before[0] + found.report.step_time
            if c not in nxt or total < nxt[c][0]:
                nxt[c] = (total, before[1] + [(info, key)])
        if not nxt:
            return None, stats
        best = nxt
    _, chosen = min(best.values(), key=lambda v: v[0])
    parts = [(info, solved[key].pcg) for info, key in chosen]
    try:
        whole = simplify(stitch(pcg, parts))
    except ShapeError:
        return None, stats
    if problems(whole):
        return None, stats
    path = tuple(replace(a, at=info.names.get(a.at, a.at)) for info, key in chosen for a in solved[key].path)
    return Stitched(whole, path), stats
