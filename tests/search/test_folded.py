"""The search on a graph of repeated blocks (``search/folded.py``): it runs on the graph
shortened to a few blocks, and every plan it returns is the whole graph's, priced there,
never slower than the best uniform configuration, and trains like one process."""
from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from ir.test_blocks import deep
from runtime.mpirun import run_json
from runtime.test_training_steps import cpu_spec, optimize

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, Optimizer, estimate
from unity_cli.ir import DType
from unity_cli.ir.blocks import blocks, shortened
from unity_cli.ir.ops.sources import WeightAttrs
from unity_cli.plan.plan import load_plan
from unity_cli.search import step
from unity_cli.search.folded import SEARCH_KEPT, _Lengthen, folded_search, rewritten_whole
from unity_cli.search.joint import Applied
from unity_cli.search.optimize import HYBRID
from unity_cli.search.step import attention_rewritten, optimize_step
from unity_cli.substitutions.cache import load_cache

CONFIG = CostConfig(DType.FLOAT32, Optimizer.ADAM)


def _weights(pcg):
    return sorted(n.name for _, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable)


@pytest.mark.parametrize("family,cluster,squeeze", [("llama", "summit-192:12", 0.5), ("gpt", "local-cpu:3", 1.0)])
def test_every_row_is_a_plan_of_the_whole_graph_priced_whole(tmp_path, monkeypatch, family, cluster, squeeze):
    folded = []
    monkeypatch.setattr(step, "folded_search", lambda *a: folded.append(search := folded_search(*a)) or search)
    batch = 6
    made = {k: deep(tmp_path, family, 7, batch // k) for k in (1, 2, 3, 6)}
    c = load_cluster(cluster)
    config = CONFIG
    if squeeze < 1:
        roomy, _ = optimize_step(made.__getitem__, batch, c, CONFIG, max_candidates=20)
        config = replace(CONFIG, memory_limit=int(max(roomy.chosen.report.memory) * squeeze))
    result, k = optimize_step(made.__getitem__, batch, c, config, max_candidates=20)
    whole = made[k]
    assert folded and folded[-1] is not None, "the search did not run on the shortened graph"
    train = result.chosen.report.training
    for name, row in result.candidates.items():
        pcg = row.baseline.pcg
        assert _weights(pcg) == _weights(whole), name
        assert len(pcg) >= len(whole) - 1, name       # (a rewrite may fuse nodes; no block is missing)
        again = estimate(pcg, row.views, c, replace(config, training=row.report.training))
        assert again.step_time == row.report.step_time and list(again.memory) == list(row.report.memory), name
    chosen = result.chosen.report
    assert chosen.feasible and chosen.training == train
    assert chosen.step_time <= result.candidates[HYBRID].report.step_time * (1 + 1e-12)
    if config.memory_limit:
        assert max(chosen.memory) <= config.memory_limit


def test_a_rewrite_of_the_last_kept_block_is_applied_to_every_copy(tmp_path):
    whole = deep(tmp_path, "llama", 7)
    found = blocks(whole)
    grow = _Lengthen(whole, found, SEARCH_KEPT)
    run = found.run
    last = found.segments[run.start + (SEARCH_KEPT - 1) * run.period][0]    # an operator of the last kept block
    first = found.segments[run.start][0]                                     # and one of the first
    path = (Applied("r1", "rule", False, whole.nodes[first].name), Applied("r2", "rule", False, whole.nodes[last].name))
    got = grow.path(path)
    assert got[:2] == path[:1] + path[1:2] and len(got) == 2 + run.count - SEARCH_KEPT
    likes = [found.segments[run.start + (SEARCH_KEPT - 1 + j) * run.period][0]
             for j in range(1, run.count - SEARCH_KEPT + 1)]
    assert [a.at for a in got[2:]] == [whole.nodes[i].name for i in likes]
    # a plan whose blocks were made unlike cannot be lengthened: it is refused, not guessed
    short = shortened(whole, found, SEARCH_KEPT)
    assert grow.pcg(short) is not None
    assert _weights(grow.pcg(short)[0]) == _weights(whole)
    wrong = _Lengthen(whole, replace(found, run=replace(run, count=run.count + 1)), SEARCH_KEPT)
    assert wrong.pcg(short) is None          # one block too many: a weight the model does not have


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_folded_plan_trains_like_one_process(tmp_path, ranks):
    deep(tmp_path, "llama", 6, 6)
    model = tmp_path / "llama6.onnx"
    spec = cpu_spec(tmp_path, ranks)
    plan = tmp_path / "plan.json"
    optimize(model, spec, plan, 6, "--strategy", "best", "--max-candidates", "20")
    loaded = load_plan(plan)
    # a rewrite the search made in the last block it saw is made in every layer after it
    at: dict[str, set[int]] = {}
    for a in json.loads(plan.read_text())["rewrites"]:
        if a["at"].startswith("model.layers."):
            at.setdefault(a["rule"], set()).add(int(a["at"].split(".")[2]))
    assert at, "the search rewrote nothing: this case checks nothing"
    for rule, layers in at.items():
        assert sorted(layers) == list(range(min(layers), 6)), (rule, layers)
    doc = run_json(plan, "--steps", "2", "--check", ranks=ranks)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"] == loaded.comm_bytes
    assert doc["memory_bytes"]["parts"]["measured"] == doc["memory_bytes"]["parts"]["predicted"]
    assert np.isfinite(loaded.predicted["step_time_ms"])


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_a_rewrite_of_every_layer_made_on_a_few_and_lengthened_is_the_rewrite_of_all(tmp_path, family):
    whole = deep(tmp_path, family, 7)
    rewrite = partial(attention_rewritten, rules=load_cache(None).rules)
    want, want_path = rewrite(whole)
    got, got_path = rewritten_whole(whole, rewrite)
    assert want_path and got.canonical_hash == want.canonical_hash
    assert sorted((a.rule_id, a.at) for a in got_path) == sorted((a.rule_id, a.at) for a in want_path)
    assert rewritten_whole(deep(tmp_path, family, 3), rewrite) is None      # too few layers to shorten
