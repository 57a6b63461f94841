"""The step's shape chosen with the plan (``search/step.py``): ``best`` is never slower than
any configuration a person can write with ``--strategy tp=T,dp=D,zero=Z,mb=K,recompute=R``,
each priced as ``--strategy`` prices it (at its best placement). The oracle is brute force:
every such configuration, at every micro-batch count, on models whose plain step does not
fit, on nodes of 6 and 8 GPUs and on 3 CPU ranks."""
from __future__ import annotations

from dataclasses import replace

import pytest

from unity_cli import zoo
from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, Optimizer
from unity_cli.errors import InfeasibleError
from unity_cli.ir import DType
from unity_cli.ir.recompute import Recompute, segments
from unity_cli.ir.schedule import layout_sources
from unity_cli.ir.training import Training
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.baselines import hybrid_degrees, hybrid_name, retrained, strategy_name
from unity_cli.search.optimize import HYBRID, _named_hybrid, best_hybrid, price_hybrid
from unity_cli.search.step import attention_rewritten, best_uniform, optimize_step
from unity_cli.substitutions.cache import load_cache


def _graphs(path, batch: int):
    made = {}

    def graph_for(k: int):
        if k not in made:
            made[k] = import_model(path, ImportOptions(batch // k, {})).pcg
        return made[k]
    return graph_for


def _hand_written(graph_for, batch, cluster, config):
    """Every uniform configuration that fits, priced as ``--strategy`` prices it: {name: seconds}."""
    got = {}
    for k in (d for d in range(1, batch + 1) if batch % d == 0):
        for tp, dp in hybrid_degrees(cluster.num_devices, batch // k):
            total = len(segments(graph_for(k), layout_sources(graph_for(k))))
            laid = _named_hybrid(hybrid_name(tp, dp), graph_for(k), cluster)   # built once, named per shape
            for z in range(4):
                for r, s in [(r, 0) for r in Recompute] + [(Recompute.FULL, s) for s in range(1, total)]:
                    train = Training(z, k, r, s)
                    name = strategy_name(tp, dp, train)
                    row = price_hybrid(retrained(laid, train), cluster, replace(config, training=train), mapped=True)
                    if row.report.feasible:
                        got[name] = row.report.step_time
    return got


@pytest.mark.parametrize("model,cluster,batch,squeeze", [
    ("llama2-7b", "summit-192:12", 8, 0.5),       # two nodes of 6 GPUs
    ("llama2-70b", "local-cpu:3", 6, 0.4),         # GQA, on 3 CPU ranks
])
def test_best_is_never_slower_than_a_hand_written_configuration(tmp_path, model, cluster, batch, squeeze):
    path = tmp_path / f"{model}.onnx"
    zoo.write(model, path, "small")
    graph_for, c = _graphs(path, batch), load_cluster(cluster)
    plain = CostConfig(DType.FLOAT32, Optimizer.ADAM)
    least = best_hybrid(graph_for(1), c, plain)[0].report
    # a limit no plain uniform step fits: micro-batches, ZeRO or recomputation are needed
    config = replace(plain, memory_limit=int(max(least.memory) * squeeze))
    hand = _hand_written(graph_for, batch, c, config)
    assert hand, "the squeeze left no configuration that fits"
    assert not any(name.count(",") == 1 for name in hand), "a plain tp=T,dp=D step still fits"
    result, k = optimize_step(graph_for, batch, c, config, max_candidates=30)
    best = result.chosen.report
    assert best.feasible and max(best.memory) <= config.memory_limit
    assert best.step_time <= min(hand.values()) * (1 + 1e-9), \
        f"best {best.step_time} is slower than {min(hand, key=hand.get)} {min(hand.values())}"
    assert best.training.micro_batches == k
    # the hybrid row is the best uniform configuration, named with its step's shape
    row = result.candidates[HYBRID]
    assert row.report.step_time == pytest.approx(min(hand.values()), rel=1e-9)
    assert hand[row.baseline.description.split(": ")[0]] == pytest.approx(row.report.step_time, rel=1e-9)


def test_the_step_shape_given_is_kept_and_nothing_that_fits_is_one_error(tmp_path):
    path = tmp_path / "l.onnx"
    zoo.write("llama2-7b", path, "small")
    graph_for, c = _graphs(path, 8), load_cluster("summit-192:6")
    config = CostConfig(DType.FLOAT32, Optimizer.ADAM)
    got = best_uniform(graph_for, 8, c, config, stages=(2,), ks=[2], modes=((Recompute.FULL, 0),))
    assert got is not None and got.training == Training(2, 2, Recompute.FULL)
    assert all(t.report.training == got.training for t in got.tried)
    result, k = optimize_step(graph_for, 8, c, config, zero=2, micro_batches=4, max_candidates=10)
    assert k == 4 and result.chosen.report.training.zero == 2 and result.chosen.report.training.micro_batches == 4
    tiny = replace(config, memory_limit=1024)
    assert best_uniform(graph_for, 8, c, tiny) is None
    with pytest.raises(InfeasibleError, match="no plan fits"):
        optimize_step(graph_for, 8, c, tiny, max_candidates=5)


def test_every_attention_chain_is_rewritten_before_the_shape_is_chosen(tmp_path):
    """The memory-efficient Attention decides what fits: the step's shape is chosen on the
    graph with every chain rewritten (each rewrite in the plan's path, proved like any
    other) where that is faster, and never on a slower graph than the one given."""
    path = tmp_path / "l.onnx"
    zoo.write("llama2-70b", path, "small")
    graph_for, c = _graphs(path, 8), load_cluster("summit-192:12")
    rules = load_cache(None).rules
    g, applied = attention_rewritten(graph_for(1), rules)
    layers = sum(1 for _, n in graph_for(1) if n.kind == "Softmax")
    assert layers >= 2 and len(applied) == layers
    assert sum(1 for _, n in g if n.kind == "Attention") == layers and not any(n.kind == "Softmax" for _, n in g)
    assert attention_rewritten(g, rules) == (g, ())          # nothing left to rewrite
    assert attention_rewritten(graph_for(1), ()) == (graph_for(1), ())
    plain = CostConfig(DType.FLOAT32, Optimizer.ADAM)
    config = replace(plain, memory_limit=int(max(best_hybrid(graph_for(1), c, plain)[0].report.memory) * 0.5))
    without, _ = optimize_step(graph_for, 8, c, config, max_candidates=20)
    got, k = optimize_step(graph_for, 8, c, config, rules=rules, max_candidates=20)
    assert got.chosen.report.step_time <= without.chosen.report.step_time * (1 + 1e-9)
    made = [a for a in got.rewrites if a.rule_id in {r.id for r in rules if r.makes_attention}]
    assert len(made) == layers, [a.rule_name for a in got.rewrites]
    assert sum(1 for _, n in got.chosen.baseline.pcg if n.kind == "Attention") == layers


@pytest.mark.parametrize("model,batch", [("llama2-7b", 4), ("llama2-70b", 6), ("gpt3-175b", 4), ("bert-large", 4)])
def test_the_attention_rewrite_never_costs_a_configuration_time_or_memory(tmp_path, model, batch):
    """Why the best uniform configuration is priced on the rewritten graph only (where the
    model holds an attention chain): on every configuration, on GPUs of two kinds and in
    two dtypes, it is as fast or faster and holds as little or less."""
    path = tmp_path / f"{model}.onnx"
    zoo.write(model, path, "small")
    g = import_model(path, ImportOptions(batch, {})).pcg
    a, applied = attention_rewritten(g, load_cache(None).rules)
    assert applied and a is not g
    priced = 0
    for cluster, dtype in (("summit-192:12", DType.FLOAT32), ("dgx-a100-80:8", DType.BFLOAT16)):
        c = load_cluster(cluster)
        for tp, dp in hybrid_degrees(c.num_devices, batch):
            for train in (Training(), Training(3, 1, Recompute.FULL), Training(1, 2, Recompute.SELECTIVE)):
                config = CostConfig(dtype, Optimizer.ADAM, training=train)
                chain = price_hybrid(_named_hybrid(strategy_name(tp, dp, train), g, c, train), c, config, mapped=True)
                one = price_hybrid(_named_hybrid(strategy_name(tp, dp, train), a, c, train), c, config, mapped=True)
                assert one.report.step_time <= chain.report.step_time * (1 + 1e-9), (cluster, tp, dp, train)
                assert max(one.report.memory) <= max(chain.report.memory), (cluster, tp, dp, train)
                priced += 1
    assert priced >= 12
