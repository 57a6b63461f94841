"""The search on a graph of repeated blocks: run on the graph shortened to a few of them,
each plan lengthened back to the whole graph and priced there.

A decoder of 80 layers is 80 copies of one block (``ir/blocks.py``). The searches
(``optimize.optimize``) walk rewrites and parallelizations of the graph shortened to
:data:`SEARCH_KEPT` blocks, with the best uniform configuration's row laid out on it as
their start and bar. What the dropped blocks would hold is taken off the memory the search
may use: the row's bytes on the whole graph less its bytes on the shortened one. Each row
the searches return is then lengthened (``blocks.lengthened``: the last block of its run
copied for each dropped one, each copy reading the weights of the layer it stands for and
every rewrite of that block applied to it too) and priced on the whole graph, which is the
only price shown. A plan whose blocks the search made unlike, so that it cannot be
lengthened, or that comes out slower on the whole graph than the best uniform configuration
(priced whole), gives way to that configuration, as any search is held to it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, device_capacity, estimate
from ..ir.blocks import Blocks, blocks, lengthened, likes, shortened, shortened_limit
from ..ir.machine_view import devices_used
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import PCG
from ..ir.validate import validate
from .baselines import Strategy, hybrid, retrained
from .joint import Applied, faster
from .optimize import BASELINES, HYBRID, Candidate, SearchResult, _fastest, optimize, price_hybrid
from .uniform import Uniform
from .workers import fork_map, large

SEARCH_KEPT = 3
"""The blocks of the run the searches see: the first (what it reads comes from outside the
run), a middle one, and the last (what reads it is outside too)."""


def _weights(pcg: PCG) -> list[str]:
    """The model's trainable weights a graph reads (those a folded weight is made of too)."""
    return sorted(name for _, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable
                  for name in ([p for p, _ in n.op.parts] or [n.name]))


class _Lengthen:
    """Plans of the shortened graph made plans of the whole one."""

    def __init__(self, whole: PCG, found: Blocks, kept: int) -> None:
        self.whole, self.found, self.kept = whole, found, kept
        self.times = found.run.count - kept
        self.like = likes(whole, found)
        self.at = {}
        for i, n in whole:
            self.at.setdefault(n.name, i)
        self.names = _weights(whole)

    def name(self, name: str, j: int) -> str:
        """The name of the whole graph's like, ``j`` blocks on, of its node ``name`` (itself
        where there is none: a node the search made)."""
        w = self.at.get(name)
        twin = None if w is None else self.like(w, j)
        return name if twin is None else self.whole.nodes[twin].name

    def rename(self, j: int, v: int, pcg: PCG) -> tuple[Any, str]:
        n = pcg.nodes[v]
        if isinstance(n.op, WeightAttrs) and n.op.parts:  # folded from the layer's weights: from the copy's
            parts = tuple((self.name(p, j), k) for p, k in n.op.parts)
            return replace(n.op, parts=parts), "+".join(p for p, _ in parts)   # (named as simplify names it)
        return n.op, self.name(n.name, j)

    def pcg(self, pcg: PCG) -> tuple[PCG, tuple[int, ...]] | None:
        """``pcg`` lengthened, and per node the node it copies; None where its blocks are not
        alike, or the copies would not read the whole graph's weights, each once."""
        found = blocks(pcg, least=2)
        if found.run is None:
            return None
        longer, origin = lengthened(pcg, found, self.times, lambda j, v: self.rename(j, v, pcg))
        stored = [n.name for _, n in longer if isinstance(n.op, WeightAttrs) and n.op.trainable]
        if _weights(longer) != self.names or len(set(stored)) < len(stored):
            return None
        validate(longer)
        return longer, origin

    def path(self, path: tuple[Applied, ...]) -> tuple[Applied, ...]:
        """The rewrites, each one of the last kept block applied to every copy of it too."""
        run, out = self.found.run, []
        last = run.start + (self.kept - 1) * run.period
        where = {i: s for s, seg in enumerate(self.found.segments) for i in seg}
        for a in path:
            out.append(a)
            w = self.at.get(a.at)
            if w is not None and last <= where.get(w, -1) < last + run.period:
                out += [replace(a, at=self.whole.nodes[t].name)
                        for j in range(1, self.times + 1) if (t := self.like(w, j)) is not None]
        return tuple(out)


def _folded(whole: PCG) -> Blocks | None:
    """``whole``'s blocks, where its run has more than :data:`SEARCH_KEPT` to drop."""
    found = blocks(whole)
    return found if found.run is not None and found.run.count > SEARCH_KEPT else None


def rewritten_whole(whole: PCG, rewrite: Callable[[PCG], tuple[PCG, tuple[Applied, ...]]]
                    ) -> tuple[PCG, tuple[Applied, ...]] | None:
    """``rewrite(whole)``, made on ``whole`` shortened to :data:`SEARCH_KEPT` blocks and
    lengthened back (a rewrite of every layer, such as the attention rewrite, then rewrites
    a few, not all of them); None where ``whole`` has no run of more, or the rewritten
    graph's blocks are not alike."""
    found = _folded(whole)
    if found is None:
        return None
    short, path = rewrite(shortened(whole, found, SEARCH_KEPT))
    grow = _Lengthen(whole, found, SEARCH_KEPT)
    made = grow.pcg(short)
    return None if made is None else (made[0], grow.path(path))


def folded_search(whole: PCG, cluster: ClusterSpec, config: CostConfig, uniform: Uniform, strategy: str,
                  search: dict[str, Any]) -> SearchResult | None:
    """The search of ``whole`` at the best uniform configuration's step shape, run on it
    shortened (the module docstring); None where it has no run of more than
    :data:`SEARCH_KEPT` blocks, or the shortened row leaves no memory to search in."""
    found = _folded(whole)
    if found is None:
        return None
    short = shortened(whole, found, SEARCH_KEPT)
    train, row = uniform.training, uniform.row
    tp, dp = row.baseline.degrees or (0, 0)
    if not tp:
        return None
    laid = hybrid(short, tp, dp)
    limit = train.recompute_segments
    if limit:       # the same layers recomputed: those the dropped blocks held come off the count
        run = blocks(laid.pcg, least=2).run
        if run is not None:
            limit = shortened_limit(limit, run.start, run.period, found.run.count - SEARCH_KEPT)
    train_short = replace(train, recompute_segments=limit)
    short_row = price_hybrid(retrained(laid, train_short), cluster, replace(config, training=train_short),
                             mapped=True, dp_mapped=False)
    short_row = replace(short_row, baseline=replace(short_row.baseline, name=HYBRID,
                                                    description=row.baseline.description))
    extra = np.asarray(row.report.memory) - np.asarray(short_row.report.memory)
    room = int((device_capacity(cluster, config) - extra).min())
    if room <= 0:
        return None
    shaped = replace(config, training=train_short, memory_limit=room)
    got = optimize(short, cluster, shaped, strategy, hybrid_row=(short_row, ()), **search)
    grow = _Lengthen(whole, found, SEARCH_KEPT)
    whole_config = replace(config, training=train)
    rows: dict[str, Candidate] = {HYBRID: row}
    missing = list(got.not_priced)
    # rows that are one plan are lengthened and priced once, side by side where the cluster is large
    firsts: dict[tuple, Candidate] = {}
    for name, cand in got.candidates.items():
        if name != HYBRID:
            firsts.setdefault((cand.baseline.pcg.node_hashes, cand.views), cand)

    def lengthened_priced(cand: Candidate) -> tuple | None:
        made = grow.pcg(cand.baseline.pcg)
        if made is None:
            return None
        longer, origin = made
        views = tuple(cand.views[o] for o in origin)
        return longer, views, estimate(longer, views, cluster, whole_config)

    priced = dict(zip(firsts, fork_map(lengthened_priced, list(firsts.values()), large(cluster.num_devices)),
                      strict=True))
    for name, cand in got.candidates.items():
        if name == HYBRID:
            continue
        key = (cand.baseline.pcg.node_hashes, cand.views)
        if priced[key] is None:
            missing.append(name)
            continue
        longer, views, report = priced[key]
        rows[name] = Candidate(replace(cand.baseline, pcg=longer, devices=devices_used(longer, views)), views, report)
    # the short search's choice (its rewrites are known) or a row without rewrites, the
    # fastest on the whole graph; held to the best uniform configuration, as every search is
    name = got.chosen.baseline.name if strategy == Strategy.BEST else strategy
    plain = {HYBRID, name, *BASELINES, Strategy.PARALLEL_ONLY}
    if strategy == Strategy.BEST:
        name = _fastest({n: c for n, c in rows.items() if n in plain})
    chosen = rows.get(name)
    path: tuple[Applied, ...] = grow.path(tuple(got.rewrites)) if name == got.chosen.baseline.name else ()
    if chosen is None or faster(row.report, chosen.report):
        chosen = Candidate(replace(row.baseline, name=name, description=f"search kept {HYBRID}"),
                           row.views, row.report)
        rows[name] = chosen
        path = ()
        missing = [m for m in missing if m != name]
    return replace(got, chosen=chosen, candidates=rows, rewrites=path, hybrids=uniform.tried,
                   not_priced=tuple(missing))
