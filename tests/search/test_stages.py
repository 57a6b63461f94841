"""Each weight's ZeRO stage, chosen for the plan the search found (``search/stages.py``):
classes of weights by shape, named by patterns that name them alone; on a run of blocks,
each try priced on the plan shortened (memory exactly the whole graph's, the step time
extrapolated, within 1 % of the whole graph's); and where a class at its own stage pays, the
plan keeps it, is priced whole, is faster than every uniform stage of its parallelization,
and trains like one process with the bytes and memory it predicts."""
from __future__ import annotations

import random
from dataclasses import replace
from fnmatch import fnmatchcase

import pytest
from ir.test_blocks import deep
from runtime.mpirun import run_json
from runtime.test_training_steps import cpu_spec, optimize

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.ir.blocks import blocks
from unity_cli.ir.machine_view import MachineView
from unity_cli.ir.recompute import Recompute
from unity_cli.ir.training import ZERO_STAGES, Training, weight_names
from unity_cli.plan.config import plan_config
from unity_cli.plan.plan import load_plan
from unity_cli.search.baselines import Baseline, hybrid
from unity_cli.search.optimize import Candidate, SearchResult
from unity_cli.search.stages import _Tries, class_patterns, restaged, weight_classes
from unity_cli.search.views import default_views


def _named(patterns, names):
    return {n for n in names if any(fnmatchcase(n, p) for p in patterns)}


def test_a_class_is_named_by_patterns_that_name_it_alone(tmp_path):
    """The small Llama's classes: each block class one pattern over every layer
    (``model.layers.*.mlp.up_proj.weight``); and on random names, where numbers do not
    tell classes apart (``w1`` of one shape, ``w2`` of another), each name itself."""
    pcg = deep(tmp_path, "llama", 5)
    names = list(weight_names(pcg).values())
    classes = weight_classes(pcg)
    assert sorted(n for c in classes for n in c) == sorted(names)
    for c in classes:
        patterns = class_patterns(c, names)
        assert _named(patterns, names) == set(c)
        assert all("*" in p for p in patterns if p.startswith("model.layers.")), patterns   # one for every layer
        assert len(patterns) <= 3, patterns
    rng = random.Random(2)
    for _ in range(200):
        every = sorted({rng.choice(["w", "layer.", "a[", "b*", "x?"]) + str(rng.randrange(12)) for _ in range(8)})
        mine = rng.sample(every, rng.randrange(1, len(every) + 1))
        assert _named(class_patterns(mine, every), every) == set(mine), (mine, every)


@pytest.mark.parametrize("tp,dp", [(1, 8), (2, 4)])
def test_tries_on_the_shortened_plan_price_the_whole_graph(tmp_path, tp, dp):
    """On a decoder of 7 layers, every try priced on the plan shortened to 3 and 4 of them:
    each device's bytes are the whole graph's, exactly, and the step time extrapolated is
    the whole graph's within 1 % (mostly to float rounding; ZeRO-3's gathers prefetched
    across blocks, 0.15 % off), whatever stage each class, recomputation and count of
    micro-batches. (What wins is priced whole before it is kept.) A plan whose blocks are
    placed unlike is not shortened."""
    pcg = deep(tmp_path, "llama", 7)
    cluster = load_cluster("dgx-a100-8")
    b = hybrid(pcg, tp, dp)
    views = default_views(b.pcg)
    tries = _Tries(Candidate(b, views, estimate(b.pcg, views, cluster, CostConfig())), cluster, CostConfig())
    assert tries.short and tries.dropped == 3
    names = list(weight_names(b.pcg).values())
    classes = [class_patterns(c, names) for c in weight_classes(b.pcg)]
    rng = random.Random(tp)
    for _ in range(8):
        mode = rng.choice([Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE])
        train = Training(rng.choice(ZERO_STAGES), rng.choice([1, 2]), mode, 0,
                         tuple((p, rng.choice(ZERO_STAGES)) for ps in classes if rng.random() < 0.5 for p in ps))
        whole = estimate(b.pcg, views, cluster, CostConfig(training=train))
        assert list(tries.memory(train)) == list(whole.memory), train
        assert tries.time(train) == pytest.approx(whole.step_time, rel=1e-2), train
    # one block placed otherwise than the others (its operators a device on): not shortened
    found = blocks(b.pcg)
    moved = set(found.segments[found.run.start + 3 * found.run.period])
    unlike = tuple(MachineView(v.start + 1, v.strides) if i in moved else v for i, v in enumerate(views))
    assert not _Tries(Candidate(b, unlike, tries.chosen.report), cluster, CostConfig()).short


def test_a_class_kept_at_its_own_stage_pays_and_trains(tiny_models, tmp_path):
    """BERT-tiny on 3 CPU ranks in 2 MiB each: the step's stage (ZeRO-2, recomputing) with
    one class of its weights at another, priced on the whole graph, faster than the plan at
    any one stage that fits; it trains like one process, bytes and memory as predicted."""
    plan = tmp_path / "plan.json"
    spec = cpu_spec(tmp_path, 3)
    optimize(tiny_models / "bert_tiny.onnx", spec, plan, 6, "--memory-limit", "2MiB")
    loaded = load_plan(plan)
    train = loaded.training
    assert train.mixed, train
    config = plan_config(loaded)
    mine = estimate(loaded.pcg, loaded.views, loaded.cluster, config)
    assert mine.feasible and mine.step_time * 1e3 == pytest.approx(loaded.predicted["step_time_ms"], rel=1e-6)
    for z in ZERO_STAGES:
        one = estimate(loaded.pcg, loaded.views, loaded.cluster,
                       replace(config, training=replace(train, zero=z, zero_by_weight=())))
        assert not one.feasible or one.step_time > mine.step_time, z
    # the walk, from the plan at its step's stage alone: not where the stage was fixed
    uniform = replace(train, zero_by_weight=())
    start = Candidate(Baseline("unity", loaded.pcg, 3, "searched"), loaded.views,
                      estimate(loaded.pcg, loaded.views, loaded.cluster, replace(config, training=uniform)))
    free = restaged(SearchResult(start, {"unity": start}), loaded.cluster, replace(config, training=Training()),
                    ZERO_STAGES)
    assert free.chosen.report.training.mixed and free.chosen.report.step_time < start.report.step_time
    fixed = restaged(SearchResult(start, {"unity": start}), loaded.cluster, replace(config, training=Training()),
                     (train.zero,))
    assert fixed.chosen.report.training == uniform
    doc = run_json(plan, "--steps", "2", "--check", ranks=3)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"] == loaded.comm_bytes
