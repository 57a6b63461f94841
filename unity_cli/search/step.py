"""The step's shape, chosen with the plan: ZeRO stage, micro-batches and recomputation.

:func:`optimize.optimize` plans one graph at one step shape (``ir/training.py``).
:func:`optimize_step` chooses the shape too, in two moves:

1. **The best uniform configuration** (``search/uniform.py``): every configuration a person
   can write with ``--strategy tp=T,dp=D,zero=Z,mb=K,recompute=R``, each at the fewest
   micro-batches with which it fits in device memory, priced by the same model at its best
   placement (``optimize.price_hybrid``); on a graph of repeated blocks, laid out and
   priced on fewer of them first.
2. **One search** at that configuration's shape, with the configuration as the ``hybrid``
   row, which the searches start from and the chosen plan is held to: unity's plan is never
   slower than the best configuration a person could write, priced by the same model. The
   chosen plan is then priced at each free ZeRO stage (the same parallelization, its state
   sharded otherwise), and each class of its weights at its own (``search/stages.py``).

Where the graph holds an attention chain, both moves run on the graph with every chain made
one memory-efficient Attention (:func:`attention_rewritten`: the verified rules of
``substitutions/attention_rules.py``, applied wherever they match), as ``--strategy``
prices a configuration a person writes (people train with FlashAttention), and its
rewrites head the plan's path (proved before the plan is written, as every rewrite is). The
rewrite changes what fits, and so the shape and the parallelization; no uniform
configuration is slower or needs more memory with it (``tests/search/test_step.py`` holds
the rewritten graph to that on every configuration of the small decoders), so the graph
as given is not priced beside it.

Where no uniform configuration fits, the search itself looks for the shape: the fewest
micro-batches with which its plan fits, at the leanest stage, without and with
recomputation. Every step is a count of pricings and searches, never the clock.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig
from ..deadline import OutOfTime, ceiling
from ..errors import InfeasibleError, UsageError
from ..ir.pcg import PCG
from ..ir.recompute import Recompute, segments
from ..ir.schedule import layout_sources
from ..ir.training import ZERO_STAGES, Training, unmatched, weight_names
from ..ir.validate import validate
from ..substitutions.match import RewriteError, apply_match, find_matches
from ..substitutions.rule import Rule
from .baselines import Strategy
from .folded import folded_search, rewritten_whole
from .joint import Applied
from .optimize import SEARCHES, SearchResult, optimize
from .stages import restaged
from .uniform import MODES, Mode, _fewest, best_uniform

__all__ = ["MODES", "Mode", "attention_rewritten", "best_uniform", "optimize_step"]

UNIFORM_SHARE = 0.25
"""Under a time ceiling (``--budget``), the share of it the best uniform configuration may
take; past it the searches plan the plain step (one micro-batch, nothing recomputed)."""


def attention_rewritten(pcg: PCG, rules: Sequence[Rule]) -> tuple[PCG, tuple[Applied, ...]]:
    """``pcg`` with every rule that makes a memory-efficient Attention (``Rule.makes_attention``)
    applied wherever it matches, the longest chains first, and the rewrites in order (each
    proved like any other before a plan is written)."""
    path: list[Applied] = []
    for rule in sorted((r for r in rules if r.makes_attention), key=lambda r: (-len(r.src.nodes), r.id)):
        refused = 0      # matches in order; one refused (a mask that needs a gradient) stays
        while len(ms := find_matches(pcg, rule, limit=refused + 1)) > refused:
            node = pcg.nodes[ms[refused].root]
            try:
                pcg = apply_match(pcg, ms[refused], check=False)
            except RewriteError:
                refused += 1
                continue
            path.append(Applied(rule.id, rule.name, False, node.name or node.kind))
    if path:
        validate(pcg)
    return pcg, tuple(path)


def has_attention(pcg: PCG, rules: Sequence[Rule]) -> bool:
    """Whether ``pcg`` holds a chain a rule makes one memory-efficient Attention of."""
    return any(find_matches(pcg, r, limit=1) for r in rules if r.makes_attention)


def optimize_step(graph_for: Callable[[int], PCG], batch: int, cluster: ClusterSpec, config: CostConfig,
                  strategy: str = Strategy.BEST, zero: int | None = None, micro_batches: int | None = None,
                  recompute: Mode | None = None, zero_by_weight: tuple[tuple[str, int], ...] = (),
                  **search: Any) -> tuple[SearchResult, int]:
    """:func:`optimize.optimize` with the step's shape chosen too (see the module
    docstring), and the micro-batches it chose. ``graph_for(k)`` is the graph at the
    micro-batch size of ``k`` micro-batches of the global ``batch``; ``search`` is
    ``optimize``'s other options. What is given (``--strategy ...,zero=Z,mb=K,recompute=R``
    gives all three; ``--zero``, ``--micro-batches``, ``--recompute``) is kept; a strategy
    that is not a search takes the defaults for the rest, and is priced on the graph with
    every attention chain one memory-efficient Attention (as Megatron-LM and FSDP users
    train, with FlashAttention), so a search is held to what people really run."""
    if micro_batches is not None and batch % micro_batches:
        raise UsageError(f"mb={micro_batches} (--micro-batches): {micro_batches} micro-batches do not divide the "
                         f"batch {batch} (--batch-size is the global batch of a step)")
    if recompute is not None and recompute[1]:     # a count of segments given: one the model has
        _check_segments(graph_for(micro_batches or 1), recompute)
    if strategy not in SEARCHES and strategy != Strategy.BEST:
        # A configuration a person writes (or a baseline), priced as people train: with a
        # memory-efficient attention (FlashAttention) wherever the model holds the chain.
        r, count = recompute or (Recompute.NONE, 0)
        train = Training(zero or 0, micro_batches or 1, r, count or 0, zero_by_weight)
        k = train.micro_batches
        _check_names(graph_for(k), zero_by_weight)
        graph, path = attention_rewritten(graph_for(k), search.get("rules", ()))
        result = optimize(graph, cluster, replace(config, training=train), strategy, **search)
        return replace(result, rewrites=path + tuple(result.rewrites)), k
    stages = ZERO_STAGES if zero is None else (zero,)
    ks = [micro_batches] if micro_batches is not None else [d for d in range(1, batch + 1) if batch % d == 0]
    modes = MODES if recompute is None else (recompute,)
    rewritten: dict[int, tuple[PCG, tuple[Applied, ...]]] = {}
    rewrite = partial(attention_rewritten, rules=search.get("rules", ()))

    def attention_for(k: int) -> PCG:
        if k not in rewritten:     # (a decoder's layers rewritten as one, lengthened)
            rewritten[k] = rewritten_whole(graph_for(k), rewrite) or rewrite(graph_for(k))
        return rewritten[k][0]

    # A configuration a person writes, priced as ``--strategy`` prices it: where the model
    # holds an attention chain, with every chain one memory-efficient Attention.
    attention = has_attention(graph_for(ks[0]), search.get("rules", ()))
    graph = attention_for if attention else graph_for
    budget = search.get("budget")
    try:
        with ceiling(None if budget is None else (search.get("started") or time.monotonic()) + UNIFORM_SHARE * budget):
            uniform = best_uniform(graph, batch, cluster, config, stages, ks, modes,
                                   (graph_for, lambda g: rewrite(g)[0]) if attention else None)
    except OutOfTime:   # the searches plan the plain step with the time left
        train = Training(stages[0], ks[0], modes[0][0], modes[0][1] or 0)
        return optimize(graph_for(ks[0]), cluster, replace(config, training=train), strategy, **search), ks[0]
    if uniform is None:
        return _searched_shape(graph_for, cluster, config, strategy, stages, ks, modes, search)
    train = uniform.training
    k = train.micro_batches
    result = folded_search(graph(k), cluster, config, uniform, strategy, search) or \
        optimize(graph(k), cluster, replace(config, training=train), strategy,
                 hybrid_row=(uniform.row, uniform.tried), **search)
    if attention:  # every row was priced on the rewritten graph
        result = replace(result, rewrites=rewritten[k][1] + tuple(result.rewrites))
    return (restaged(result, cluster, config, stages) if zero is None else result), k


def _check_names(pcg: PCG, by_weight: Sequence[tuple[str, int]]) -> None:
    """A UsageError naming the first ``zero[PATTERN]=Z`` whose pattern names no trainable
    weight of ``pcg``, with some names it has."""
    k = unmatched(by_weight, pcg)
    if k is not None:
        names = list(weight_names(pcg).values())
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        pattern, z = by_weight[k]
        raise UsageError(f"--strategy zero[{pattern}]={z}: {pattern!r} names no trainable weight of the "
                         f"model (its weights: {shown or 'none'})")


def _check_segments(pcg: PCG, recompute: Mode) -> None:
    """A UsageError where the count of segments to recompute (``recompute=full:S``) is more
    than ``pcg`` has, naming how many it has."""
    mode, count = recompute
    have = len(segments(pcg, layout_sources(pcg)))
    if count > have:
        raise UsageError(f"recompute={mode.value}:{count}: the model has {have} segment{'s' * (have != 1)} to "
                         f"recompute (give at most {have}, or {mode.value} for every one)")


def _searched_shape(graph_for, cluster, config, strategy, stages, ks, modes, search) -> tuple[SearchResult, int]:
    """Where no uniform configuration fits: the fewest micro-batches with which the search's
    plan fits at the leanest stage, by bisection, without recomputation and with it (each
    where free), the faster kept; its plan priced at each free stage."""
    tried: dict[Training, SearchResult | InfeasibleError] = {}

    def attempt(train: Training) -> SearchResult | None:
        if train not in tried:
            try:
                tried[train] = optimize(graph_for(train.micro_batches), cluster, replace(config, training=train),
                                        strategy, **search)
            except InfeasibleError as e:
                tried[train] = e
        got = tried[train]
        return None if isinstance(got, InfeasibleError) else got

    least = max(stages)     # the stage that needs the least memory
    found: list[tuple[SearchResult, int]] = []
    for r, count in modes:
        k = _fewest(ks, lambda k, r=r, c=count or 0: attempt(Training(least, k, r, c)) is not None)
        if k is not None:
            res = attempt(Training(least, k, r, count or 0))
            assert res is not None
            found.append((restaged(res, cluster, config, stages), k))
    if not found:
        raise next(e for e in tried.values() if isinstance(e, InfeasibleError))
    return min(found, key=lambda f: f[0].chosen.report.step_time)
