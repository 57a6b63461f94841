"""Rules the search may skip: those that only give graphs another rule gives (equal under
the commutation-blind hash the search deduplicates by). The oracle: the graphs one search
step reaches are the same with every rule and with the kept ones."""
from __future__ import annotations

import math

import pytest

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.baselines import STRATEGIES
from unity_cli.search.joint import Found, JointSearch
from unity_cli.substitutions.cache import load_cache
from unity_cli.substitutions.equivalence import search_rules
from unity_cli.substitutions.rule import Rule


def _add(x: str, y: str, out: str, fn: str = "Add") -> dict:
    return {"op": "Binary", "attrs": {"fn": fn}, "inputs": [x, y], "outputs": [out]}


def _rule(src: list[dict], dst: list[dict], inputs=("a", "b", "c"), constraints=()) -> Rule:
    return Rule.from_json({"inputs": list(inputs), "params": [],
                           "src": {"nodes": src, "outputs": [src[-1]["outputs"][0]]},
                           "dst": {"nodes": dst, "outputs": [dst[-1]["outputs"][0]]},
                           "constraints": [list(c) for c in constraints]})


def test_a_rule_that_only_commutes_is_dropped_both_ways():
    commute = _rule([_add("a", "b", "t")], [_add("b", "a", "t")], inputs=("a", "b"))
    sub = _rule([_add("a", "b", "t", "Sub")], [_add("b", "a", "t", "Sub")], inputs=("a", "b"))
    kept = search_rules([(commute, False), (commute, True), (sub, False)])
    assert kept == [(sub, False)]   # Sub does not commute: its swap is a different graph


def test_of_equivalent_rules_the_first_stays():
    src = [_add("a", "b", "t0"), _add("t0", "c", "t1")]
    one = _rule(src, [_add("a", "c", "t0"), _add("t0", "b", "t1")])
    same = _rule(src, [_add("c", "a", "u"), _add("u", "b", "v")])            # = one, up to order and names
    renamed = _rule([_add("b", "a", "t0"), _add("t0", "c", "t1")],          # = one with a and b renamed
                    [_add("b", "c", "t0"), _add("t0", "a", "t1")])
    other = _rule(src, [_add("c", "b", "t0"), _add("t0", "a", "t1")])
    kept = search_rules([(one, False), (same, False), (renamed, False), (other, False)])
    assert kept == [(one, False), (other, False)]


def test_a_source_in_another_order_or_other_constraints_is_kept():
    """Matching reads inputs in order, so ``Mul(Add(a, b), c)`` and ``Mul(c, Add(a, b))``
    match different graphs; constraints restrict where a rule applies."""
    dst = [_add("a", "c", "t0", "Mul"), _add("b", "c", "t1", "Mul"), _add("t0", "t1", "t2")]
    left = _rule([_add("a", "b", "t0"), _add("t0", "c", "t1", "Mul")], dst)
    right = _rule([_add("a", "b", "t0"), _add("c", "t0", "t1", "Mul")], dst)
    narrow = _rule([_add("a", "b", "t0"), _add("t0", "c", "t1", "Mul")], dst,
                   constraints=[("EQUAL", ("sum", "a"), 1)])
    assert len(search_rules([(left, False), (right, False), (narrow, False)])) == 3


@pytest.fixture(scope="module")
def rules():
    return load_cache().rules


@pytest.mark.parametrize("name,strategy", [("bert_tiny.onnx", None), ("bert_tiny.onnx", "data_parallel"),
                                           ("convnet_tiny.onnx", None), ("convnet_tiny.onnx", "tensor_parallel")])
def test_one_search_step_reaches_the_same_graphs(tiny_models, cluster_dir, rules, name, strategy):
    pcg = import_model(tiny_models / name, ImportOptions(batch_size=8)).pcg
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml").first(4)
    if strategy is not None:
        pcg = STRATEGIES[strategy](pcg, cluster).pcg
    search = JointSearch(cluster, CostConfig(), rules)
    every = JointSearch(cluster, CostConfig(), rules)
    # (a one-way rule is never read backwards: its reverse makes two transposes of every one)
    every._rules = [(r, False) for r in rules] + [(r.reversed(), True) for r in rules if not r.one_way]
    every._kinds = [frozenset(n.kind for n in r.src.nodes) for r, _ in every._rules]
    assert len(search._rules) < len(every._rules)
    start = Found(pcg, (), None, "start")

    def reached(s: JointSearch) -> set[str]:
        return {f.pcg.unordered_hash for f in s._neighbours(start, math.inf)}

    here = {pcg.unordered_hash}    # already seen: a rule that only commutes gives it back
    assert reached(search) | here == reached(every) | here


def test_a_one_way_rule_is_not_searched_backwards(cluster_dir, rules):
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml").first(4)
    one_way = [r for r in rules if r.one_way]
    assert one_way and all(r.name.startswith(("transpose-swap-", "transpose-cancel-around-")) for r in one_way)
    search = JointSearch(cluster, CostConfig(), one_way)
    assert [reverse for _, reverse in search._rules] == [False] * len(one_way)
