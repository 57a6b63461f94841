"""The best uniform configuration: every ``tp=T,dp=D,zero=Z,mb=K,recompute=R[:S]`` a person
can write, each at the fewest micro-batches with which it fits, priced by the same model at
its best placement (``optimize.price_hybrid``); the fastest is the row the searches start
from and are held to (``search/step.py``).

Memory is a linear count (``cost/memory.MemoryTable``): per layout, ZeRO stage and
recomputation one table gives the bytes at every count of segments recomputed, so the
fewest segments that fit are read off it, and the fewest micro-batches are a bisection over
the divisors of the batch. Only what fits is simulated.

**Repeated blocks.** Where the graph is a run of identical blocks (``ir/blocks.py``: a
decoder's layers), each configuration is laid out and counted on the graph shortened to
:data:`KEPT` of its blocks: the table of the shorter is the whole graph's once the last
kept block's rows are repeated for the dropped ones, exactly, and the step time is
extrapolated from two depths, one block apart (a block costs what the block before it
does). The :data:`WHOLE` fastest by that price are then priced on the whole graph, and
only those are rows; the machine-mapping DP lays out the fastest. On a decoder of 80
layers this prices some fifty times fewer operators."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ..cluster.spec import ClusterSpec
from ..cost.memory import MemoryTable, memory_table
from ..cost.model import CostConfig, device_capacity, step_time
from ..deadline import check
from ..errors import UnityError
from ..ir.blocks import Blocks, blocks, shortened, shortened_limit
from ..ir.pcg import PCG
from ..ir.recompute import Recompute, segments
from ..ir.schedule import layout_sources, needs_grad
from ..ir.training import ZERO_STAGES, Training
from .baselines import Baseline, hybrid, hybrid_degrees, retrained
from .joint import rank
from .optimize import HYBRID, Candidate, _better, evaluate, price_hybrid
from .views import default_views, transposed_views
from .workers import fork_map, large

MAPPED_WITHIN = 1.5
"""The machine-mapping DP lays out each uniform configuration priced within this factor of
the fastest on its better grid (``optimize.price_hybrid``). Its layouts have been measured
to gain at most 1.36x over the better grid (ZeRO-3 hybrids of the small zoo decoders on 16
and 32 GPUs), so one further off is not expected to win; the DP costs what several pricings
do on a large graph, so laying out every configuration would cost more than the rest of
the search."""

KEPT = (3, 4)
"""The depths (blocks of the run kept) a graph of repeated blocks is priced at: the table
repeats the last block of the first, and the step time grows by the difference of the two
per dropped block. Three, not one: a layout can make the run's first block, and the last
(what they read, or what reads them, is outside the run), unlike the others, and a layout
whose blocks repeat has at least two alike at the first depth."""

WHOLE = 3
"""Where the graph was shortened, how many of the fastest configurations are priced on the
whole graph (each at its better grid); the fastest of them is the row."""


Rewrite = tuple[Callable[[int], PCG], Callable[[PCG], PCG]]
"""The graph before a rewrite, at each micro-batch count, and the rewrite (``step.py``: every
attention chain one Attention). Blocks are found and dropped before it, so it rewrites a
few blocks, not all of them; the whole graph is rewritten only to be priced whole."""

Mode = tuple[Recompute, int | None]
"""A recomputation and the count of segments it recomputes (0: every one; None: the fewest
with which the step fits, searched)."""

MODES: tuple[Mode, ...] = ((Recompute.NONE, 0), (Recompute.SELECTIVE, 0), (Recompute.FULL, None))
"""What the search tries: nothing recomputed, selective, and full of as few segments as fit."""


@dataclass(frozen=True)
class Uniform:
    """The best uniform configuration: its row (named ``hybrid``), its step shape, and every
    configuration priced beside it on the whole graph."""

    row: Candidate
    training: Training
    tried: tuple[Candidate, ...]


def _fewest(ks: Sequence[int], fits: Callable[[int], bool]) -> int | None:
    """The fewest micro-batches of ``ks`` (ascending) with which ``fits`` holds, given that
    it holds for every count above one that does; None if not even the most fit."""
    if ks and fits(ks[0]):
        return ks[0]
    if len(ks) < 2 or not fits(ks[-1]):
        return None
    lo, hi = -1, len(ks) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(ks[mid]) else (mid, hi)
    return ks[hi]


@dataclass(frozen=True)
class _Layout:
    """One ``tp=T,dp=D`` hybrid at one micro-batch count, as priced: on the whole graph, or
    (``deeper`` set) on the graph shortened to ``KEPT[0]`` blocks, with ``deeper`` at ``KEPT[1]``."""

    baseline: Baseline
    deeper: Baseline | None = None
    start: int = 0          # where the shortened hybrid's run starts and ends, in its segments
    end: int = 0
    period: int = 0
    dropped: int = 0        # the blocks the whole graph has beyond KEPT[0]
    micro_batches: int = 1

    @property
    def folded(self) -> bool:
        return self.deeper is not None

    @property
    def whole_end(self) -> int:
        """The segment after the run's last, on the whole graph."""
        return self.end + self.dropped * self.period

    def short_limit(self, limit: int, keep: int) -> int:
        """``limit`` (segments recomputed, of the whole graph) on the graph of ``keep`` blocks."""
        return shortened_limit(limit, self.start, self.period, self.dropped + KEPT[0] - keep) if self.folded else limit


class _Uniforms:
    """The layouts, tables and prices of one graph's uniform configurations (cached)."""

    def __init__(self, graph_for: Callable[[int], PCG], cluster: ClusterSpec, config: CostConfig,
                 rewrite: Rewrite | None = None) -> None:
        self.graph_for, self.cluster, self.config = graph_for, cluster, config
        self.source_for, self.rewrite = (graph_for, None) if rewrite is None else rewrite
        self.capacity = device_capacity(cluster, config)
        self._blocks: dict[int, Blocks] = {}
        self._layouts: dict[tuple[int, int, int], _Layout | None] = {}
        self._totals: dict[tuple, np.ndarray] = {}
        self._shorts: dict[tuple[int, int], PCG] = {}
        self._graph: dict[int, tuple] = {}

    def shaped(self, train: Training) -> CostConfig:
        return replace(self.config, training=train)

    def layout(self, k: int, tp: int, dp: int) -> _Layout | None:
        """The hybrid at ``k`` micro-batches (None: a model whose exported shapes do not
        follow that micro-batch, or a hybrid it cannot take)."""
        if (k, tp, dp) not in self._layouts:
            check()
            try:
                self._layouts[k, tp, dp] = self._laid(k, tp, dp)
            except UnityError:
                self._layouts[k, tp, dp] = None
        return self._layouts[k, tp, dp]

    def _laid(self, k: int, tp: int, dp: int) -> _Layout:
        if not self.folds(k):
            return _Layout(hybrid(self.graph_for(k), tp, dp), micro_batches=k)
        found = self._blocks[k]
        short, deeper = (hybrid(self._short(k, keep), tp, dp) for keep in KEPT)
        a, c = (blocks(b.pcg, least=keep - 1).run for b, keep in ((short, KEPT[0]), (deeper, KEPT[1])))
        if a is None or c is None or (a.start, a.period, a.end + a.period) != (c.start, c.period, c.end):
            # the hybrid's blocks are not alike: price it whole
            return _Layout(hybrid(self.graph_for(k), tp, dp), micro_batches=k)
        return _Layout(short, deeper, a.start, a.end, a.period, found.run.count - KEPT[0], k)

    def folds(self, k: int) -> bool:
        """Whether the graph at ``k`` micro-batches is laid out shortened (a run of more than
        ``KEPT[1]`` blocks; a layout may still make its blocks unlike, and be priced whole)."""
        if k not in self._blocks:
            self._blocks[k] = blocks(self.source_for(k))
        run = self._blocks[k].run
        return run is not None and run.count > KEPT[1]

    def _short(self, k: int, keep: int) -> PCG:
        """The graph at ``k`` micro-batches shortened to ``keep`` blocks (and rewritten)."""
        if (k, keep) not in self._shorts:
            short = shortened(self.source_for(k), self._blocks[k], keep)
            self._shorts[k, keep] = short if self.rewrite is None else self.rewrite(short)
        return self._shorts[k, keep]

    def totals(self, lay: _Layout, z: int, r: Recompute) -> np.ndarray:
        """``[limit, device]``: the whole graph's bytes per device with the first ``limit``
        segments recomputed (``MemoryTable.totals``)."""
        key = (id(lay), z, r)
        if key not in self._totals:
            pcg = lay.baseline.pcg
            if id(lay) not in self._graph:     # what every stage and mode reads alike
                views, layout = default_views(pcg), layout_sources(pcg)
                self._graph[id(lay)] = ([views[i].devices(n.outputs[0]) for i, n in pcg], layout,
                                        segments(pcg, layout), needs_grad(pcg, pcg.outputs[0]))
            devs, layout, segs, grads = self._graph[id(lay)]
            table: MemoryTable = memory_table(pcg, devs, layout, self.cluster,
                                              self.shaped(Training(z, lay.micro_batches, r, 0)), segs, grads)
            if lay.folded:
                table = table.repeated(lay.end, lay.period, lay.dropped)
            self._totals[key] = table.totals()
        return self._totals[key]

    def fits(self, lay: _Layout | None, z: int, r: Recompute, limit: int) -> bool:
        if lay is None:
            return False
        totals = self.totals(lay, z, r)
        return bool((totals[min(limit, len(totals) - 1)] <= self.capacity).all())

    def fewest_limit(self, lay: _Layout, z: int, r: Recompute) -> int:
        """The fewest segments recomputed (1 .. all but one) with which it fits; 0: all."""
        totals = self.totals(lay, z, r)
        ok = np.flatnonzero((totals[1:-1] <= self.capacity).all(axis=1))
        return int(ok[0]) + 1 if len(ok) else 0

    def priced(self, lay: _Layout, train: Training) -> Candidate | float:
        """The configuration on the whole graph at its better grid (a Candidate), or, where
        it is laid out shortened, its step time extrapolated to the whole (seconds)."""
        if not lay.folded:
            return price_hybrid(retrained(lay.baseline, train), self.cluster, self.shaped(train), mapped=True,
                                dp_mapped=False)
        limit = train.recompute_segments
        if limit and lay.start < limit < lay.whole_end:
            # some of the run recomputed: as far between none and all of it as it goes
            lo, hi = lay.start, lay.whole_end
            t_lo = self.priced(lay, replace(train, recompute_segments=lo) if lo else
                               replace(train, recompute=Recompute.NONE, recompute_segments=0))
            t_hi = self.priced(lay, replace(train, recompute_segments=hi))
            return t_lo + (t_hi - t_lo) * (limit - lo) / (hi - lo)
        times = [self._grids(b, replace(train, recompute_segments=lay.short_limit(limit, keep)))
                 for b, keep in ((lay.baseline, KEPT[0]), (lay.deeper, KEPT[1]))]
        grow = lay.dropped - (KEPT[1] - KEPT[0])
        return min(t2 + grow * (t2 - t1) for t1, t2 in zip(*times, strict=True))

    def _grids(self, b: Baseline, train: Training) -> list[float]:
        """The step time on the default grid and on the transposed one (where there is one)."""
        config = self.shaped(train)
        views = default_views(b.pcg)
        out = [step_time(b.pcg, views, self.cluster, config)]
        tp, dp = b.degrees or (0, 0)
        across = transposed_views(b.pcg, views, tp, dp) if tp > 1 and dp > 1 else None
        if across is not None:
            out.append(step_time(b.pcg, across, self.cluster, config))
        return out

    def whole(self, k: int, tp: int, dp: int, train: Training) -> Candidate:
        """The configuration built and priced on the whole graph at its better grid."""
        b = retrained(hybrid(self.graph_for(k), tp, dp), train)
        return price_hybrid(b, self.cluster, self.shaped(train), mapped=True, dp_mapped=False)


def best_uniform(graph_for: Callable[[int], PCG], batch: int, cluster: ClusterSpec, config: CostConfig,
                 stages: Sequence[int] = ZERO_STAGES, ks: Sequence[int] | None = None,
                 modes: Sequence[Mode] = MODES, rewrite: Rewrite | None = None) -> Uniform | None:
    """The fastest ``tp=T,dp=D,zero=Z,mb=K,recompute=R[:S]`` that fits (None: none does): every
    factorization ``T*D`` of the device count, ZeRO stage of ``stages`` and recomputation of
    ``modes``, each at the fewest micro-batches of ``ks`` (default: every divisor of the
    global ``batch``) whose micro-batch ``D`` divides, and there (where ``modes`` leaves the
    count of segments to the search) recomputing the fewest segments with which it still
    fits. Each that fits is priced at its better grid (``price_hybrid``; on a graph of
    repeated blocks, the module docstring), and those within :data:`MAPPED_WITHIN` of the
    fastest are laid out by the machine-mapping DP too.
    ``graph_for(k)`` is the graph at the micro-batch size of ``k`` micro-batches; with
    ``rewrite`` (:data:`Rewrite`), it is the rewrite of ``rewrite[0](k)``, and what is
    shortened is that graph before the rewrite."""
    n = cluster.num_devices
    ks = sorted(ks) if ks is not None else [d for d in range(1, batch + 1) if batch % d == 0]
    degrees = sorted({td for k in ks for td in hybrid_degrees(n, batch // k)})
    u = _Uniforms(graph_for, cluster, config, rewrite)

    def fits(k: int, tp: int, dp: int, z: int, r: Recompute, s: int) -> bool:
        return u.fits(u.layout(k, tp, dp), z, r, s)

    def degree(td: tuple[int, int]) -> list[tuple[tuple[int, int, int], Training, float | None]]:
        """The configurations of ``tp x dp`` that fit, each with its price where it is laid
        out shortened (a float; the others are priced whole below, in this process)."""
        tp, dp = td
        counts = [k for k in ks if (batch // k) % dp == 0]
        out = []
        for r, count in modes:
            for z in stages:
                k = _fewest(counts, partial(fits, tp=tp, dp=dp, z=z, r=r, s=count or 0))
                if k is None:
                    continue
                lay = u.layout(k, tp, dp)
                assert lay is not None
                s = count or 0
                if count is None and r is not Recompute.NONE:    # as few segments as fit
                    s = u.fewest_limit(lay, z, r)
                train = Training(z, k, r, s)
                out.append(((k, tp, dp), train, u.priced(lay, train) if lay.folded else None))
        return out

    # The degrees side by side where the cluster is large and the graph shortened
    # (workers.fork_map): each lays out, counts and prices its own configurations, and sends
    # back their prices (a layout of the whole graph would be made again here to be priced).
    found = [f for fs in fork_map(degree, degrees, large(n) and u.folds(ks[0])) for f in fs]
    if not found:
        return None
    fitting = [(at, train) for at, train, _ in found]
    priced = [u.priced(u.layout(*at), train) if p is None else p for at, train, p in found]
    within, count = MAPPED_WITHIN, f"{len(fitting)}"
    if any(isinstance(p, float) for p in priced):     # shortened: the fastest few priced whole
        order = sorted(range(len(fitting)), key=lambda i: p if isinstance(p := priced[i], float) else
                       p.report.step_time)[:WHOLE]
        fitting = [fitting[i] for i in order]
        whole = fork_map(lambda j: u.whole(*fitting[j][0], fitting[j][1]),   # side by side, as the degrees
                         [j for j, i in enumerate(order) if not isinstance(priced[i], Candidate)], large(n))
        made = iter(whole)
        priced = [p if isinstance(p := priced[i], Candidate) else next(made) for i in order]
        within, count = 1.0, f"{count}, the {len(order)} fastest on a shortened graph priced whole,"
    tried: list[Candidate] = list(priced)
    order = sorted(range(len(tried)), key=lambda i: rank(tried[i].report))
    fastest = tried[order[0]].report.step_time
    for i in order:     # the machine-mapping DP lays out those that may win by it
        if tried[i].report.step_time > fastest * within:
            break
        laid = evaluate(tried[i].baseline, cluster, u.shaped(fitting[i][1]), None, None,
                        (tried[i].views, tried[i].report))
        if _better(laid.report, tried[i].report):
            tried[i] = replace(laid, baseline=tried[i].baseline)
            fastest = min(fastest, laid.report.step_time)
    at = min(range(len(tried)), key=lambda i: rank(tried[i].report))
    won, train = tried[at], fitting[at][1]
    b = won.baseline
    others = (f"the fastest of {count} uniform configurations that fit (tp x dp = "
              f"{n}, each ZeRO stage and recomputation at its fewest micro-batches)")
    return Uniform(replace(won, baseline=replace(b, name=HYBRID, description=f"{b.description}; {others}")),
                   train, tuple(tried))
