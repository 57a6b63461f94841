"""Where each weight's optimizer state, gradient and copy live: the ZeRO stages of the plan
the search chose (``ir/training.py``), chosen for its parallelization as it stands.

The search plans at one step shape (``search/step.py``). Its plan is then priced again:

1. **At each free stage** for every weight: the same parallelization with its state
   sharded otherwise; the fastest that fits is the step's stage.
2. **Per class of weights** (:func:`weight_classes`: weights of one shape and dtype, such
   as each block's ``up_proj``, which trade memory for communication alike): each class in
   turn, the fewest bytes first, at each other stage, the fastest that fits kept where it is
   faster than the step so far (``Training.zero_by_weight``, one pattern per class where the
   names allow: :func:`class_patterns`). A norm's hundreds of tiny weights may be cheaper
   kept whole than gathered and reduce-scattered one by one, while the large ones stay
   sharded; or an update on a shard may pay for one class and not for another. One pass,
   each class once: a greedy walk, not every combination (4 ** classes).

Each try counts memory before it simulates. On a graph of repeated blocks (``ir/blocks.py``),
each placed as the one before it, the plan is shortened to :data:`~.uniform.KEPT` of them,
with its views: memory is the
shortened table with the last block's rows repeated (exactly the whole graph's), and the
step time is extrapolated from two depths, as the uniform sweep prices
(``search/uniform.py``; within 1 % of the whole graph's, ``tests/search/test_stages.py``).
Where the walk ends is priced on the whole graph, and kept only if it fits and is faster
there (else the move before it, and so on), so every price shown is the whole graph's.
Every step is a count of pricings, never the clock.
"""
from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase

import numpy as np

from ..cluster.spec import ClusterSpec
from ..cost.memory import memory_table
from ..cost.model import CostConfig, device_capacity, estimate, step_time
from ..ir.blocks import Blocks, Run, blocks, likes, shortened_from, shortened_limit
from ..ir.machine_view import MachineView
from ..ir.pcg import PCG
from ..ir.recompute import segments
from ..ir.schedule import layout_sources, needs_grad
from ..ir.training import ZERO_STAGES, Training, literal, weight_names
from .joint import faster
from .optimize import Candidate, SearchResult
from .uniform import KEPT


class _Tries:
    """The chosen plan priced at other trainings (see the module docstring)."""

    def __init__(self, chosen: Candidate, cluster: ClusterSpec, config: CostConfig) -> None:
        self.chosen, self.cluster, self.config = chosen, cluster, config
        self.caps = device_capacity(cluster, config)
        pcg, views = chosen.baseline.pcg, chosen.views
        self.short: list[tuple[PCG, tuple[MachineView, ...]]] = []
        self.run: Run | None = None
        self.dropped = 0
        found = blocks(pcg)
        if found.run is not None and found.run.count > KEPT[1]:
            made = [shortened_from(pcg, found, keep) for keep in KEPT]
            runs = [blocks(p, least=keep - 1).run for (p, _), keep in zip(made, KEPT, strict=True)]
            a, c = runs
            if a is not None and c is not None and (a.start, a.period, a.end + a.period) == (c.start, c.period, c.end) \
                    and _placed_alike(pcg, views, found):
                self.short = [(p, tuple(views[o] for o in origin)) for p, origin in made]
                self.run, self.dropped = a, found.run.count - KEPT[0]
        self._tables: dict[bool, tuple] = {}

    def _shortens(self, train: Training) -> bool:
        """Whether ``train`` is priced shortened: a run to shorten, and its count of segments
        recomputed (if any) not within the run (where only the whole graph says it)."""
        limit = train.recompute_segments
        return self.run is not None and not (self.run.start < limit < self.run.end + self.dropped * self.run.period)

    def _at(self, train: Training, keep: int) -> Training:
        """``train`` on the graph of ``keep`` blocks: what the dropped blocks recomputed off its count."""
        assert self.run is not None
        limit = shortened_limit(train.recompute_segments, self.run.start, self.run.period,
                                self.dropped + KEPT[0] - keep)
        return replace(train, recompute_segments=limit)

    def fits(self, train: Training) -> bool:
        """Whether the plan fits in every device's memory under ``train``."""
        return bool((self.memory(train) <= self.caps).all())

    def memory(self, train: Training) -> np.ndarray:
        """The bytes each device holds under ``train`` (the whole graph's, exactly)."""
        short = self._shortens(train)
        if short not in self._tables:       # what every try reads alike
            pcg, views = self.short[0] if short else (self.chosen.baseline.pcg, self.chosen.views)
            layout = layout_sources(pcg)
            self._tables[short] = (pcg, [v.devices(n.outputs[0]) for v, (_, n) in zip(views, pcg, strict=True)],
                                   layout, segments(pcg, layout), needs_grad(pcg, pcg.outputs[0]))
        pcg, devs, layout, segs, grads = self._tables[short]
        table = memory_table(pcg, devs, layout, self.cluster, replace(self.config, training=train), segs, grads)
        if short:
            assert self.run is not None
            table = table.repeated(self.run.end, self.run.period, self.dropped)
        totals = table.totals()
        return totals[min(train.recompute_segments, len(totals) - 1)]

    def time(self, train: Training) -> float:
        """The step time under ``train``: the whole graph's, or extrapolated from two depths."""
        if not self._shortens(train):
            return step_time(self.chosen.baseline.pcg, self.chosen.views, self.cluster,
                             replace(self.config, training=train))
        t1, t2 = (step_time(pcg, views, self.cluster, replace(self.config, training=self._at(train, keep)))
                  for (pcg, views), keep in zip(self.short, KEPT, strict=True))
        return t2 + (self.dropped - (KEPT[1] - KEPT[0])) * (t2 - t1)

    def best(self, trains: Sequence[Training]) -> tuple[float, Training] | None:
        """The fastest of ``trains`` that fits, with its time (None: none fits)."""
        timed = [(self.time(t), k, t) for k, t in enumerate(trains) if self.fits(t)]
        if not timed:
            return None
        seconds, _, train = min(timed)
        return seconds, train

    def whole(self, train: Training, than: Candidate) -> Candidate | None:
        """The plan under ``train`` priced on the whole graph, where it fits and is faster than ``than``."""
        report = estimate(self.chosen.baseline.pcg, self.chosen.views, self.cluster,
                          replace(self.config, training=train))
        if not (report.feasible and faster(report, than.report)):
            return None
        b = self.chosen.baseline
        return Candidate(replace(b, description=f"{b.description}; {train.zero_text}"), self.chosen.views, report)


def _placed_alike(pcg: PCG, views: Sequence[MachineView], found: Blocks) -> bool:
    """Whether each block of the run is placed as the one before it (its nodes' views and
    their weights' alike): only then does a shortened plan price as the whole one."""
    like = likes(pcg, found)
    return all((k := like(i, 1)) is None or views[k] == views[i] for i in range(len(pcg)))


def restaged(result: SearchResult, cluster: ClusterSpec, config: CostConfig, stages: Sequence[int]) -> SearchResult:
    """``result`` with its chosen plan at the fastest ZeRO stage of ``stages`` that fits, and
    each class of its weights at its own where that is faster (the module docstring; not
    where ``stages`` is one: a stage the options fixed)."""
    chosen = result.chosen
    if not chosen.report.feasible:
        return result
    tries = _Tries(chosen, cluster, config)
    train = chosen.report.training
    now = tries.time(train)
    moves: list[Training] = []        # each try that made the step faster, in turn
    other = tries.best([replace(train, zero=z) for z in stages if z != train.zero])
    if other is not None and other[0] < now * (1 - 1e-9):
        now, train = other
        moves.append(train)
    # each class in turn, from the step's stage (a stage the options fixed, or stages already
    # named per weight, are kept as they are)
    pcg = chosen.baseline.pcg
    walk = len(stages) > 1 and not train.zero_by_weight
    names = list(weight_names(pcg).values())
    classes = [class_patterns(c, names) for c in weight_classes(pcg)] if walk else []
    for patterns in classes if len(classes) > 1 else ():     # (one class: its stage is the step's)
        got = tries.best([replace(train, zero_by_weight=train.zero_by_weight + tuple((p, z) for p in patterns))
                          for z in ZERO_STAGES if z != train.zero])
        if got is not None and got[0] < now * (1 - 1e-9):
            now, train = got
            moves.append(train)
    # the last priced on the whole graph (where it was shortened, one before it if not faster there)
    best = next((won for t in reversed(moves) if (won := tries.whole(t, chosen)) is not None), chosen)
    if best is chosen:
        return result
    rows = {name: (best if c is chosen else c) for name, c in result.candidates.items()}
    return replace(result, chosen=best, candidates=rows)


def weight_classes(pcg: PCG) -> list[list[str]]:
    """The trainable weights' names by shape and dtype, the class of the fewest bytes first:
    weights alike trade memory for communication alike (each block of a decoder holds one
    of each of its classes)."""
    groups: dict[tuple, list[str]] = {}
    nbytes: dict[tuple, int] = {}
    for i, name in weight_names(pcg).items():
        shape = pcg.nodes[i].outputs[0]
        key = (shape.sizes, shape.dtype.value)
        groups.setdefault(key, []).append(name)
        nbytes[key] = nbytes.get(key, 0) + math.prod(shape.sizes) * shape.dtype.itemsize
    return [groups[key] for key in sorted(groups, key=lambda key: (nbytes[key], key))]


def class_patterns(names: Sequence[str], every: Collection[str]) -> tuple[str, ...]:
    """Patterns (``ir/training.Training.zero_by_weight``) that name ``names`` and no other
    of ``every``: a name with each run of digits made ``*`` (``layers.*.mlp.up.weight``)
    where that names no weight outside, else the name itself."""
    mine, out, covered, refused = set(names), [], set(), set()
    for name in names:
        if name in covered:
            continue
        pattern = re.sub(r"\d+", "*", literal(name))
        hits = set() if pattern in refused else {other for other in every if fnmatchcase(other, pattern)}
        if not hits or not hits <= mine:      # (names whose digits are no layer's: each its own)
            refused.add(pattern)
            pattern, hits = literal(name), {name}
        out.append(pattern)
        covered |= hits
    return tuple(out)
