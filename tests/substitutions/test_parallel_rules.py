"""The hand-written parallelization rules: all proved by the verifier, well formed, and
their wrong variants rejected."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.substitutions.axioms import evaluate_term
from unity_cli.substitutions.parallel_rules import (
    PARALLEL_RULES,
    combine,
    gather,
    make_rule,
    matmul,
    rank_is,
    reduction,
    relu,
    repartition,
    replicate,
)
from unity_cli.substitutions.rule import Rule
from unity_cli.substitutions.verify import check_layouts, random_inputs, terms, verify_rule

BY_NAME = {r.name: r for r in PARALLEL_RULES}


def test_names_and_ids_are_unique():
    assert len(BY_NAME) == len(PARALLEL_RULES)
    assert len({r.id for r in PARALLEL_RULES}) == len(PARALLEL_RULES)


def test_the_classic_parallelizations_are_there():
    for name in ("matmul-split-output", "matmul-split-rows", "matmul-split-contracted", "megatron-mlp",
                 "megatron-mlp-relu", "embedding-split-rows", "embedding-split-columns", "relu-through-combine-1",
                 "add-split-1", "add-partial-sums", "conv3x3-split-output-channels", "conv3x3-split-input-channels",
                 "conv1x1-split-batch"):
        assert name in BY_NAME, name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_is_proved(name):
    v = verify_rule(BY_NAME[name])
    assert (v.accepted, v.reason) == (True, "proved"), v.reason


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_is_well_formed_data(name):
    r = BY_NAME[name]
    assert r.params == ("d",) and r.is_parallel and r.meta.get("doc")
    again = Rule.from_json(r.to_json())
    assert again == r and again.id == r.id


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_rule_agrees_on_numbers_at_every_degree(name):
    """Independently of the verifier's own check: the terms' numpy model at d = 2 and 3."""
    rng = np.random.default_rng(3)
    instances = check_layouts(BY_NAME[name])
    assert {inst.layout.binding["d"] for inst in instances} == {2, 3}
    for inst in instances:
        values = random_inputs(inst.layout, rng)
        for t_src, t_dst in zip(terms(inst.src), terms(inst.dst), strict=True):
            assert np.array_equal(evaluate_term(t_src, values), evaluate_term(t_dst, values))


def test_megatron_leaves_partial_sums_before_its_reduction():
    for inst in check_layouts(BY_NAME["megatron-mlp"]):
        d = inst.layout.binding["d"]
        (red,) = [n for _, n in inst.dst if n.kind == "Reduction"]
        before = inst.dst.shape(red.inputs[0])
        assert (before.sum_degree, before.copy_degree, before.pieces) == (d, 1, d)
        assert not inst.dst.shape(inst.dst.outputs[0]).is_partitioned


WRONG = {
    "contracted-split-with-combine": make_rule(
        "contracted-split-with-combine", ("x", "W"), matmul("x", "W"),
        combine(matmul(repartition("x", -1), repartition("W", -2)), -1)),
    "megatron-without-reduction": make_rule(
        "megatron-without-reduction", ("x", "W1", "W2"), matmul(matmul("x", "W1"), "W2"),
        matmul(matmul(replicate("x"), repartition("W1", -1)), repartition("W2", -2))),
    "megatron-relu-after-row-split": make_rule(
        "megatron-relu-after-row-split", ("x", "W1", "W2"), relu(matmul(matmul("x", "W1"), "W2")),
        reduction(relu(matmul(matmul(replicate("x"), repartition("W1", -1)), repartition("W2", -2))))),
    "embedding-rows-with-combine": make_rule(
        "embedding-rows-with-combine", ("table", "ids"), gather("table", "ids", -2),
        combine(gather(repartition("table", -2), replicate("ids"), -2), -2), constraints=[rank_is("table", 2)]),
    "column-split-without-replicated-input": make_rule(
        "column-split-without-replicated-input", ("x", "W"), matmul("x", "W"),
        combine(matmul("x", repartition("W", -1)), -1)),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_parallelization_is_rejected(name):
    v = verify_rule(WRONG[name])
    assert not v.accepted
    assert v.reason.startswith(("does not type-check", "layouts differ")), v.reason
