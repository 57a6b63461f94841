"""The verifier accepts true rules only by a z3 proof, and rejects wrong ones with a
reason (a type error, a layout mismatch, a counterexample or z3's answer)."""
from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from unity_cli.substitutions.axioms import evaluate_term
from unity_cli.substitutions.parallel_rules import (
    D,
    add,
    binary,
    combine,
    concat,
    gather,
    make_rule,
    matmul,
    reduction,
    relu,
    repartition,
    replicate,
    scale,
    split,
    transpose,
    unary,
)
from unity_cli.substitutions.rule import Constraint, Param, Pattern, PatternNode, Rule
from unity_cli.substitutions.semantics import evaluate
from unity_cli.substitutions.verify import (
    Rejected,
    Verdict,
    check_equal,
    check_layouts,
    prove,
    random_inputs,
    terms,
    verify_all,
    verify_rule,
)


def algebraic(name, inputs, src, dst):
    return make_rule(name, inputs, src, dst, params=())


ACCEPTED = {r.name: r for r in [
    make_rule("relu-through-repartition", ("x",), relu(repartition("x", -1)), repartition(relu("x"), -1)),
    make_rule("matmul-rows-split", ("x", "W"), matmul(repartition("x", -2), replicate("W")),
              repartition(matmul("x", "W"), -2)),
    make_rule("megatron-column-then-row", ("x", "W1", "W2"), matmul(matmul("x", "W1"), "W2"),
              reduction(matmul(matmul(replicate("x"), repartition("W1", -1)), repartition("W2", -2)))),
    make_rule("contracted-split-needs-reduction", ("x", "W"), matmul("x", "W"),
              reduction(matmul(repartition("x", -1), repartition("W", -2)))),
    algebraic("concat-of-matmuls", ("x", "W1", "W2"), concat(matmul("x", "W1"), matmul("x", "W2"), axis=-1),
              matmul("x", concat("W1", "W2", axis=-1))),
    algebraic("relu-through-concat", ("a", "b"), relu(concat("a", "b", axis=-1)),
              concat(relu("a"), relu("b"), axis=-1)),
    algebraic("matmul-assoc", ("a", "b", "c"), matmul(matmul("a", "b"), "c"), matmul("a", matmul("b", "c"))),
    algebraic("matmul-factor", ("a", "b", "W"), add(matmul("a", "W"), matmul("b", "W")),
              matmul(add("a", "b"), "W")),
    make_rule("reduction-of-replicas-scales", ("x",), reduction(replicate("x")), scale("x", D)),
    # more: transposes, splits, subtraction, three-way concat, partitioned inputs
    algebraic("transpose-of-product", ("a", "b"), transpose(matmul("a", "b")),
              matmul(transpose("b"), transpose("a"))),
    algebraic("split-of-concat", ("a", "b"), split(concat("a", "b", axis=-2), -2)[1], "b"),
    algebraic("concat-of-splits", ("x",), concat(*split("x", -1), axis=-1), "x"),
    algebraic("matmul-contracted-concat", ("a", "b", "c", "e"),
              matmul(concat("a", "b", axis=-1), concat("c", "e", axis=-2)), add(matmul("a", "c"), matmul("b", "e"))),
    algebraic("sub-distributes", ("a", "b", "W"), matmul(binary("Sub", "a", "b"), "W"),
              binary("Sub", matmul("a", "W"), matmul("b", "W"))),
    algebraic("concat-three", ("a", "b", "c"), concat("a", "b", "c", axis=-1),
              concat("a", concat("b", "c", axis=-1), axis=-1)),
    algebraic("tanh-through-concat", ("a", "b"), unary("Tanh", concat("a", "b", axis=-2)),
              concat(unary("Tanh", "a"), unary("Tanh", "b"), axis=-2)),
    algebraic("add-self-is-scale", ("x",), add("x", "x"), scale("x", 2)),
    make_rule("relu-through-combine", ("x",), relu(combine("x", -1)), combine(relu("x"), -1),
              constraints=[Constraint("DIVISIBLE_BY", ("degree", "x", -1), ("param", "d"))]),
    make_rule("add-of-partial-sums", ("a", "b"), add(reduction("a"), reduction("b")), reduction(add("a", "b")),
              constraints=[Constraint("EQUAL", ("sum", "a"), ("param", "d")),
                           Constraint("EQUAL", ("sum", "b"), ("param", "d"))]),
]}

REJECTED = {r.name: (r, why) for r, why in [
    (algebraic("relu-of-sum", ("a", "b"), relu(add("a", "b")), add(relu("a"), relu("b"))), "counterexample: "),
    (make_rule("combine-instead-of-reduction", ("x", "W"), matmul("x", "W"),
               combine(matmul(repartition("x", -1), repartition("W", -2)), -1)), "does not type-check: dst fails"),
    (make_rule("combine-replicas-instead-of-reduction", ("x", "W"), matmul("x", "W"),
               combine(matmul(repartition("x", -1), repartition("W", -2)), "copy")), "does not type-check: dst fails"),
    (algebraic("concat-wrong-axis", ("a", "b"), relu(concat("a", "b", axis=-1)),
               concat(relu("a"), relu("b"), axis=-2)),
     "layouts differ: src gives float32[4,8], dst gives float32[8,4]"),
    (algebraic("matmul-commutes", ("a", "b"), matmul("a", "b"), matmul("b", "a")), "counterexample: "),
    (make_rule("reduction-of-replicas-is-identity", ("x",), reduction(replicate("x")), "x"), "counterexample: "),
    (make_rule("reduction-of-replicas-scales-by-2", ("x",), reduction(replicate("x")), scale("x", 2)),
     "counterexample: "),
    (algebraic("split-of-concat-wrong-half", ("a", "b"), split(concat("a", "b", axis=-2), -2)[0], "b"),
     "counterexample: "),
    (algebraic("transpose-of-product-unswapped", ("a", "b"), transpose(matmul("a", "b")),
               matmul(transpose("a"), transpose("b"))), "counterexample: "),
    (make_rule("relu-of-partial-sums", ("x", "W"), relu(matmul("x", "W")),
               reduction(relu(matmul(repartition("x", -1), repartition("W", -2))))), "does not type-check: dst fails"),
    (algebraic("sub-cancels-but-cannot-be-proved", ("a", "b"), binary("Sub", add("a", "b"), "a"),
               binary("Sub", "b", "a")), "counterexample: "),
    (make_rule("wrong-constraint", ("x",), relu(combine("x", -1)), combine(relu("x"), -1),
               constraints=[Constraint("EQUAL", ("rank", "x"), 7)]), "does not type-check: "),
    (algebraic("src-never-type-checks", ("a", "ids"), add(gather("a", "ids", -2), "ids"), "a"),
     "does not type-check: src: "),
]}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted(name):
    v = verify_rule(ACCEPTED[name])
    assert (v.accepted, v.reason) == (True, "proved"), v.reason
    assert v.rule_id == ACCEPTED[name].id and v.seconds > 0


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_with_a_reason(name):
    rule, why = REJECTED[name]
    v = verify_rule(rule)
    assert not v.accepted
    assert v.reason.startswith(why), v.reason


def test_counterexample_names_inputs_and_values():
    v = verify_rule(REJECTED["reduction-of-replicas-is-identity"][0])
    assert "src gives" in v.reason and "dst gives" in v.reason and "x=[[" in v.reason and "d=" in v.reason


@pytest.mark.parametrize("name", sorted(n for n, (r, why) in REJECTED.items() if why == "counterexample: "))
def test_z3_alone_does_not_prove_wrong_rules(name):
    """Without the numeric check, the proof step still refuses every wrong rule."""
    rule = REJECTED[name][0]
    with pytest.raises(Rejected, match="^z3: "):
        prove(rule, check_layouts(rule), 1000)


def test_true_rule_beyond_the_axioms_is_rejected_as_unproved():
    # Relu(x) - Relu(-x) = x holds, but no axiom says so: numbers agree, z3 gives up.
    rule = algebraic("relu-difference", ("x",), binary("Sub", relu("x"), relu(unary("Neg", "x"))), "x")
    v = verify_rule(rule)
    assert not v.accepted and v.reason.startswith("z3: unknown"), v.reason


def test_timeout_is_a_rejection(monkeypatch):
    """A search that never runs out of axiom instances (a - a breeds Scale(k, a) for ever
    larger k), with no instance limit, ends on the clock, whatever the machine's speed: a
    rule that would end otherwise (saturated E-matching answers "unknown" quickly on a fast,
    warm process) makes this test depend on the machine."""
    monkeypatch.setattr("unity_cli.substitutions.verify.MAX_INSTANCES", 10**9)
    wrong = make_rule("sub-self-loop", ("a", "b"), scale(binary("Mul", "a", binary("Sub", "b", "b")), D),
                      add(binary("Mul", scale("a", D), "b"), binary("Mul", scale("a", D), "b")))
    inst = check_layouts(wrong)[0]
    assert check_equal(terms(inst.src), terms(inst.dst), 20, max_instances=10**9) == "timeout"


def test_a_looping_search_gives_up_fast():
    # a - a breeds Scale(k, a) for ever larger k; the instance limit stops it.
    wrong = make_rule("sub-self-loop", ("a", "b"), scale(binary("Mul", "a", binary("Sub", "b", "b")), D),
                      add(binary("Mul", scale("a", D), "b"), binary("Mul", scale("a", D), "b")))
    inst = check_layouts(wrong)[0]
    # With a 10 s timeout it must stop on the instance limit, not the clock.
    assert check_equal(terms(inst.src), terms(inst.dst), 10_000).startswith("unknown (gave up after")


def test_malformed_rule_is_rejected_not_raised():
    bad_axis = algebraic("axis-out-of-range", ("a", "b"), relu(concat("a", "b", axis=-5)),
                         concat(relu("a"), relu("b"), axis=-5))
    v = verify_rule(bad_axis)
    assert not v.accepted and v.reason.startswith("does not type-check"), v.reason
    node = PatternNode("Repartition", (("degree", Param("e")), ("dim", -1)), ("x",), ("y",))
    unbound = Rule(("x",), ("d",), Pattern((node,), ("y",)), Pattern((), ("x",)))
    v = verify_rule(unbound)
    assert not v.accepted and "not bound" in v.reason


def test_verify_all_keeps_order_and_reports_progress():
    rules = [ACCEPTED["matmul-assoc"], REJECTED["matmul-commutes"][0], ACCEPTED["relu-through-concat"],
             REJECTED["concat-wrong-axis"][0], ACCEPTED["megatron-column-then-row"]]
    seen = []
    pooled = verify_all(rules, timeout_ms=1000, jobs=2, progress=lambda i, n, v: seen.append((i, n, v.rule_id)))
    alone = verify_all(rules, jobs=1)
    strip = [dataclasses.replace(v, seconds=0.0) for v in pooled]
    assert strip == [dataclasses.replace(v, seconds=0.0) for v in alone]
    assert [v.rule_id for v in pooled] == [r.id for r in rules]
    assert [v.accepted for v in pooled] == [True, False, True, False, True]
    assert seen == [(i + 1, 5, r.id) for i, r in enumerate(rules)]


def model_values(pcg, values):
    return [np.asarray(evaluate_term(t, values)) for t in terms(pcg)]


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_terms_mean_what_the_graph_computes(name):
    """The z3 term of each side, run through the axioms' numpy model, equals the reference semantics."""
    rng = np.random.default_rng(1)
    for inst in check_layouts(ACCEPTED[name]):
        values = random_inputs(inst.layout, rng)
        for pcg in (inst.src, inst.dst):
            for want, got in zip(evaluate(pcg, values), model_values(pcg, values), strict=True):
                assert np.array_equal(want, got)


# ---------------------------------------------------------------------------
# Soundness property: mutate accepted rules; whatever z3 proves agrees numerically.

SWAPS = {
    ("Unary", "fn"): ["Relu", "Neg", "Tanh", "Identity"],
    ("Binary", "fn"): ["Add", "Mul", "Sub"],
}
KIND_SWAPS = {"Repartition": "Combine", "Combine": "Repartition", "Replicate": "Reduction", "Reduction": "Replicate"}


def mutate(rule: Rule, rng: random.Random) -> Rule | None:
    side = "dst" if rng.random() < 0.7 or not rule.dst.nodes else "src"
    pat: Pattern = getattr(rule, side)
    if not pat.nodes:
        return None
    k = rng.randrange(len(pat.nodes))
    n = pat.nodes[k]
    attrs = dict(n.attrs)
    how = rng.choice(["op", "axis", "operands", "degree"])
    if how == "op":
        if n.kind in KIND_SWAPS and set(attrs) <= {"dim", "degree"}:
            kind = KIND_SWAPS[n.kind]
            attrs = {"dim": attrs.get("dim", -1), "degree": attrs["degree"]} if kind in ("Repartition", "Combine") \
                else {"degree": attrs["degree"]}
            n = PatternNode(kind, tuple(sorted(attrs.items())), n.inputs, n.outputs)
        elif (n.kind, "fn") in SWAPS:
            attrs["fn"] = rng.choice(SWAPS[(n.kind, "fn")])
        elif n.kind == "MatMul":
            n = PatternNode("Binary", (("fn", rng.choice(["Add", "Mul"])),), n.inputs, n.outputs)
        else:
            return None
    elif how == "axis":
        keys = [f for f in ("axis", "dim") if isinstance(attrs.get(f), int)]
        if not keys:
            return None
        attrs[keys[0]] = rng.choice([a for a in (-1, -2, -3) if a != attrs[keys[0]]])
    elif how == "operands":
        if len(n.inputs) < 2:
            return None
        n = PatternNode(n.kind, n.attrs, n.inputs[::-1], n.outputs)
    else:
        keys = [f for f in ("degree", "factor") if f in attrs]
        if not keys:
            return None
        attrs[keys[0]] = rng.choice([2, 3, D] if rule.params else [2, 3])
    if how in ("op", "axis", "degree") and n.kind == pat.nodes[k].kind and n.inputs == pat.nodes[k].inputs:
        n = PatternNode(n.kind, tuple(sorted(attrs.items())), n.inputs, n.outputs)
    nodes = pat.nodes[:k] + (n,) + pat.nodes[k + 1:]
    return dataclasses.replace(rule, **{side: Pattern(nodes, pat.outputs)}, name=f"{rule.name}~{how}")


def agrees(rule: Rule, seed: int) -> bool:
    rng = np.random.default_rng(seed)
    for inst in check_layouts(rule):
        for _ in range(3):
            values = {k: v * 3 if v.dtype.kind == "f" else v for k, v in random_inputs(inst.layout, rng).items()}
            for a, b in zip(model_values(inst.src, values), model_values(inst.dst, values), strict=True):
                if a.shape != b.shape or not np.allclose(a, b):
                    return False
    return True


def test_whatever_is_proved_of_a_mutant_holds():
    rng = random.Random(7)
    bases = list(ACCEPTED.values())
    proved = verified = rejected = 0
    for i in range(400):
        mutant = mutate(rng.choice(bases), rng)
        if mutant is None:
            continue
        v = verify_rule(mutant)
        if v.accepted:
            verified += 1
            assert agrees(mutant, i), f"accepted but wrong: {mutant.name} {mutant.to_json()}"
        else:
            rejected += 1
        try:
            instances = check_layouts(mutant)
            prove(mutant, instances, 1000)  # z3 alone, without the numeric filter
        except Rejected:
            continue
        proved += 1
        assert agrees(mutant, i + 1000), f"z3 proved a wrong rule: {mutant.name} {mutant.to_json()}"
    assert verified >= 10 and rejected >= 50 and proved >= verified, (verified, rejected, proved)


def test_verdict_is_a_frozen_value():
    v = Verdict("abc", True, "proved", 0.01)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.accepted = False  # type: ignore[misc]
