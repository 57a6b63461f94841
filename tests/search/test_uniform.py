"""The best uniform configuration on a graph of repeated blocks (``search/uniform.py``): laid
out and counted on the graph shortened to a few blocks, its memory is the whole graph's
exactly, its step time close to it, and the row it chooses is the brute-force best."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from ir.test_blocks import deep

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, Optimizer
from unity_cli.ir import DType
from unity_cli.ir.recompute import Recompute, segments
from unity_cli.ir.schedule import layout_sources
from unity_cli.ir.training import Training
from unity_cli.search.baselines import hybrid, hybrid_degrees, retrained, strategy_name
from unity_cli.search.optimize import HYBRID, price_hybrid
from unity_cli.search.step import attention_rewritten
from unity_cli.search.uniform import _Layout, _Uniforms, best_uniform
from unity_cli.substitutions.cache import load_cache

CONFIG = CostConfig(DType.FLOAT32, Optimizer.ADAM)


def _graphs(tmp_path, family, layers, batch):
    made = {k: deep(tmp_path, family, layers, batch // k) for k in range(1, batch + 1) if batch % k == 0}
    return made.__getitem__


@pytest.mark.parametrize("family,cluster,rewritten", [("llama", "summit-192:12", False), ("gpt", "local-cpu:3", False),
                                                      ("llama", "local-cpu:3", True)])
def test_the_shortened_tables_are_the_whole_graphs(tmp_path, family, cluster, rewritten):
    source_for, c = _graphs(tmp_path, family, 7, 6), load_cluster(cluster)
    rewrite = None
    graph_for = source_for
    if rewritten:   # every attention chain one Attention: on the whole graph, and after shortening
        rules = load_cache(None).rules

        def fn(g):
            return attention_rewritten(g, rules)[0]
        made = {}

        def graph_for(k):
            return made.setdefault(k, fn(source_for(k)))
        rewrite = (source_for, fn)
        assert graph_for(1) is not source_for(1)
    short, whole = _Uniforms(graph_for, c, CONFIG, rewrite), _Uniforms(graph_for, c, CONFIG)
    folded = 0
    for k in (1, 2):
        for tp, dp in hybrid_degrees(c.num_devices, 6 // k):
            lay = short.layout(k, tp, dp)
            if lay is None or not lay.folded:
                continue
            folded += 1
            full = _Layout(hybrid(graph_for(k), tp, dp))
            total = len(segments(full.baseline.pcg, layout_sources(full.baseline.pcg)))
            for z in range(4):
                for r in Recompute:
                    got, want = short.totals(lay, z, r), whole.totals(full, z, r)
                    assert got.shape == (total + 1, c.num_devices)
                    assert (got == want).all(), (k, tp, dp, z, r)
                    # and the table is the account the pricing makes, at every count of segments
                    for limit in (0,) if r is Recompute.NONE else (0, 1, total // 2, total - 1):
                        config = replace(CONFIG, training=Training(z, k, r, limit))
                        rep = price_hybrid(full.baseline, c, config).report
                        assert list(want[limit]) == list(rep.memory), (k, tp, dp, z, r, limit)
    assert folded >= 2


def test_a_block_too_many_or_too_few_is_caught(tmp_path):
    graph_for, c = _graphs(tmp_path, "llama", 7, 2), load_cluster("local-cpu:3")
    u = _Uniforms(graph_for, c, CONFIG)
    lay = u.layout(1, 1, 1) or u.layout(1, 3, 1)
    assert lay is not None and lay.folded
    right = u.totals(lay, 0, Recompute.NONE)
    for wrong in (lay.dropped - 1, lay.dropped + 1):
        off = replace(lay, dropped=wrong)
        assert not np.array_equal(u.totals(off, 0, Recompute.NONE), right)


@pytest.mark.parametrize("family,cluster", [("llama", "summit-192:12"), ("gpt", "local-cpu:3")])
def test_the_extrapolated_step_is_close_to_the_whole_graphs(tmp_path, family, cluster):
    graph_for, c = _graphs(tmp_path, family, 7, 6), load_cluster(cluster)
    u = _Uniforms(graph_for, c, CONFIG)
    worst, checked = 0.0, 0
    for tp, dp in hybrid_degrees(c.num_devices, 6):
        lay = u.layout(1, tp, dp)
        if lay is None or not lay.folded:
            continue
        full = hybrid(graph_for(1), tp, dp)
        for train in (Training(0, 1), Training(3, 1, Recompute.FULL), Training(1, 1, Recompute.SELECTIVE),
                      Training(2, 1, Recompute.FULL, 4)):
            got = u.priced(lay, train)
            want = price_hybrid(retrained(full, train), c, replace(CONFIG, training=train), mapped=True,
                                dp_mapped=False).report.step_time
            worst = max(worst, abs(got / want - 1))
            checked += 1
    assert checked >= 8 and worst < 0.02


def test_the_row_is_the_brute_force_best(tmp_path):
    batch = 4
    graph_for, c = _graphs(tmp_path, "llama", 6, batch), load_cluster("local-cpu:2")
    least = price_hybrid(hybrid(graph_for(1), 1, 2), c, CONFIG).report
    config = replace(CONFIG, memory_limit=int(max(least.memory) * 0.6))
    stages, modes = (0, 3), ((Recompute.NONE, 0), (Recompute.FULL, None))
    hand = {}
    for k in (d for d in range(1, batch + 1) if batch % d == 0):
        for tp, dp in hybrid_degrees(c.num_devices, batch // k):
            b = hybrid(graph_for(k), tp, dp)
            total = len(segments(b.pcg, layout_sources(b.pcg)))     # (0: every one)
            for z in stages:
                for train in [Training(z, k)] + [Training(z, k, Recompute.FULL, s) for s in range(total)]:
                    row = price_hybrid(retrained(b, train), c, replace(config, training=train), mapped=True)
                    if row.report.feasible:
                        hand[strategy_name(tp, dp, train)] = row.report.step_time
    assert hand and not any(name.count(",") == 1 for name in hand), "the squeeze left a plain step"
    got = best_uniform(graph_for, batch, c, config, stages, modes=modes)
    assert got is not None and got.row.baseline.name == HYBRID
    assert "shortened graph" in got.row.baseline.description      # (it was laid out on fewer blocks)
    assert got.row.report.feasible and max(got.row.report.memory) <= config.memory_limit
    assert got.row.report.step_time == pytest.approx(min(hand.values()), rel=1e-9), \
        (got.row.baseline.description, min(hand, key=hand.get))
