"""Attention's rule family (``substitutions/attention_rules.py``): every form proves with the
z3 verifier, at the generic layouts and the grouped-query one; known-wrong variants are
rejected, by the numbers and by z3 alone; the Attention's terms mean what its kernel computes;
and on the zoo's small decoders each layer's chain becomes one Attention node, with the
graph's values and every weight's gradient unchanged."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from ir.graph_grads import run_graph
from onnx import numpy_helper

from unity_cli import zoo
from unity_cli.ir.opspec import OpKind
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model_proto
from unity_cli.substitutions.attention_rules import attention, attention_rule, attention_rules
from unity_cli.substitutions.axioms import evaluate_term, signature
from unity_cli.substitutions.families import FAMILY_RULES
from unity_cli.substitutions.match import apply_match, find_matches
from unity_cli.substitutions.parallel_rules import add, binary, make_rule, matmul, softmax, transpose
from unity_cli.substitutions.rule import Constraint, Rule
from unity_cli.substitutions.semantics import evaluate
from unity_cli.substitutions.verify import GROUPED_QUERY, check_layouts, random_inputs, terms, verify_rule
from unity_cli.zoo.net import WeightMode, Weights

ATTENTION_RULES = [r for r in FAMILY_RULES if r.name.startswith("attention")]   # as shipped: tagged


@pytest.mark.parametrize("rule", ATTENTION_RULES, ids=[r.name for r in ATTENTION_RULES])
def test_every_form_proves_and_at_the_grouped_query_layout_too(rule):
    v = verify_rule(rule, timeout_ms=5000)
    assert v.accepted and v.reason == "proved", v.reason
    shapes = [{t: s.sizes for t, s in inst.layout.shapes.items()} for inst in check_layouts(rule)]
    key = "kT" if "kT" in rule.inputs else "k"
    assert {"q": GROUPED_QUERY[0], key: GROUPED_QUERY[1], "v": GROUPED_QUERY[1]}.items() <= shapes[-1].items()
    assert len({tuple(len(d) for d in s.values()) for s in shapes}) == 3     # three proofs: rank 2, 3, 4


def test_the_family_and_its_rules_read_as_their_math():
    assert [r.name for r in ATTENTION_RULES] == [
        "attention-masked-scaled", "attention-masked", "attention-scaled", "attention",
        "attention-masked-scaled-pretransposed-k", "attention-masked-pretransposed-k",
        "attention-scaled-pretransposed-k", "attention-pretransposed-k"]
    assert ATTENTION_RULES[0].meta["doc"] == \
        "MatMul(Softmax(Add(Mul(MatMul(q, Transpose(k)), s), mask), -1), v) = Attention[mask, factor](q, k, v, mask, s)"
    assert [r.name for r in attention_rules()] == [r.name for r in ATTENTION_RULES]
    for r in ATTENTION_RULES:
        assert Rule.from_json(r.to_json()).id == r.id and r.meta["origin"] == "family"


_S = [Constraint("EQUAL", ("rank", "s"), 0)]
_INPUTS = ("q", "k", "v", "mask", "s")
_FULL = attention("q", "k", "v", mask="mask", factor="s")


def _scaled(scores):
    return binary("Mul", scores, "s")


_QK = matmul("q", transpose("k"))
WRONG = {
    "the scale applied after the softmax": make_rule(
        "w", _INPUTS, matmul(binary("Mul", softmax(add(_QK, "mask"), -1), "s"), "v"), _FULL, params=(), constraints=_S),
    "the mask dropped": make_rule(
        "w", _INPUTS, matmul(softmax(add(_scaled(_QK), "mask"), -1), "v"), attention("q", "k", "v", factor="s"),
        params=(), constraints=_S),
    "the softmax over the queries": make_rule(
        "w", _INPUTS, matmul(softmax(add(_scaled(_QK), "mask"), -2), "v"), _FULL, params=(), constraints=_S),
    "k not transposed": make_rule(
        "w", _INPUTS, matmul(softmax(add(_scaled(matmul("q", "k")), "mask"), -1), "v"), _FULL, params=(),
        constraints=_S),
}


@pytest.mark.parametrize("what", list(WRONG))
def test_known_wrong_variants_are_rejected(what):
    v = verify_rule(WRONG[what], timeout_ms=5000)
    assert not v.accepted and v.reason.startswith("counterexample"), v.reason


@pytest.mark.parametrize("what", list(WRONG))
def test_a_wrong_variant_is_rejected_by_z3_alone(monkeypatch, what):
    """With the numeric check skipped, the proof alone rejects it: z3 does not take an
    Attention for any chain."""
    monkeypatch.setattr("unity_cli.substitutions.verify.check_numbers", lambda rule, instances: True)
    v = verify_rule(WRONG[what], timeout_ms=5000)
    assert not v.accepted and v.reason.startswith("z3: "), v.reason


@pytest.mark.parametrize("rule", ATTENTION_RULES[:4], ids=[r.name for r in ATTENTION_RULES[:4]])
def test_the_attentions_terms_mean_what_its_kernel_computes(rule):
    """Run through the symbols' meanings, the target's terms (the Attention's, the chain it
    stands for) equal the Attention's kernel on random inputs, at every layout where its
    products are matmuls (the grouped-query one's are uninterpreted: they have no meaning
    to run)."""
    rng = np.random.default_rng(0)
    s = signature()
    for inst in check_layouts(rule)[:-1]:
        values = random_inputs(inst.layout, rng)
        (want,) = evaluate(inst.dst, values)
        (term,) = terms(inst.dst, s)
        np.testing.assert_allclose(np.asarray(evaluate_term(term, values)), want, rtol=1e-12, atol=1e-12)


# -- the zoo's decoders ----------------------------------------------------------------

def _rewritten(name: str):
    """The small model, imported for a batch of 2, the same with every match of the zoo's
    form (masked, scaled, k transposed) rewritten, one match at a time, and a feed of random
    ids and the model's values, in float64 (the kernels compute in their inputs' type)."""
    built = zoo.build(name, "small", weights=Weights(WeightMode.INLINE))
    imported = import_model_proto(built.model, ImportOptions(2))
    rule = attention_rule(masked=True, scaled=True, pretransposed=False)
    pcg, applied = imported.pcg, 0
    while matches := find_matches(pcg, rule):
        pcg = apply_match(pcg, matches[0])
        applied += 1
    validate(pcg)
    cfg = zoo.MODELS[name].small
    ids = np.random.default_rng(0).integers(0, cfg.vocab, (2, cfg.seq)).astype(np.int64)
    values = {t.name: numpy_helper.to_array(t) for t in built.model.graph.initializer}
    values |= imported.constants | imported.weight_values
    feed = {"input_ids": ids} | {n: v.astype(np.float64) if v.dtype.kind == "f" else v for n, v in values.items()}
    return imported, pcg, applied, feed


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "gpt3-175b"])
def test_each_layers_chain_becomes_one_attention_and_values_and_gradients_stay(name):
    """llama2-70b's small model is grouped-query (8 query heads, 4 key/value heads)."""
    imported, pcg, applied, feed = _rewritten(name)
    cfg = zoo.MODELS[name].small
    kinds = Counter(n.kind for _, n in pcg)
    assert applied == kinds[OpKind.Attention] == cfg.layers and not kinds[OpKind.Softmax]
    seq = cfg.seq
    for _, n in pcg:
        if n.kind == OpKind.Attention:
            q, k = (pcg.shape(r).sizes for r in n.inputs[:2])
            group = cfg.heads // getattr(cfg, "kv_heads", cfg.heads)
            assert (q[-3], k[-3]) == ((group, 1) if group > 1 else (cfg.heads, cfg.heads))
        elif not n.spec.is_source:       # no score tensor is computed any more
            assert all(o.sizes[-2:] != (seq, seq) for o in n.outputs), n.name
    (want,), want_grads = run_graph(imported.pcg, feed)
    (got,), got_grads = run_graph(pcg, feed)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    scale = max(float(np.abs(want_grads[w]).max()) for w in imported.weights)
    for w in imported.weights:      # (k's bias has no gradient: softmax ignores a shift of a row)
        np.testing.assert_allclose(got_grads[w], want_grads[w], rtol=1e-8, atol=1e-12 * scale, err_msg=w)
