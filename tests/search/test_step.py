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
from unity_cli.ir.recompute import Recompute
from unity_cli.ir.training import Training
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.baselines import hybrid_degrees, strategy_name
from unity_cli.search.optimize import HYBRID, _named_hybrid, best_hybrid, price_hybrid
from unity_cli.search.step import best_uniform, optimize_step


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
            for z in range(4):
                for r in Recompute:
                    train = Training(z, k, r)
                    name = strategy_name(tp, dp, train)
                    row = price_hybrid(_named_hybrid(name, graph_for(k), cluster, train), cluster,
                                       replace(config, training=train), mapped=True)
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
    assert hand[row.baseline.description.split(":")[0]] == pytest.approx(row.report.step_time, rel=1e-9)


def test_the_step_shape_given_is_kept_and_nothing_that_fits_is_one_error(tmp_path):
    path = tmp_path / "l.onnx"
    zoo.write("llama2-7b", path, "small")
    graph_for, c = _graphs(path, 8), load_cluster("summit-192:6")
    config = CostConfig(DType.FLOAT32, Optimizer.ADAM)
    got = best_uniform(graph_for, 8, c, config, stages=(2,), ks=[2], modes=(Recompute.FULL,))
    assert got is not None and got.training == Training(2, 2, Recompute.FULL)
    assert all(t.report.training == got.training for t in got.tried)
    result, k = optimize_step(graph_for, 8, c, config, zero=2, micro_batches=4, max_candidates=10)
    assert k == 4 and result.chosen.report.training.zero == 2 and result.chosen.report.training.micro_batches == 4
    tiny = replace(config, memory_limit=1024)
    assert best_uniform(graph_for, 8, c, tiny) is None
    with pytest.raises(InfeasibleError, match="no plan fits"):
        optimize_step(graph_for, 8, c, tiny, max_candidates=5)
