"""The algebraic rule families (``substitutions/families.py``): every instance is proved by
the verifier, a known-wrong variant of each family is rejected, and each family matches the
real models it was written for and rewrites them into graphs that compute the same values."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from models.catalog import EXPORTED_DIR
from onnx import TensorProto, helper, numpy_helper

from unity_cli.ir.opspec import OpKind
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model, import_model_proto
from unity_cli.substitutions.cache import default_rules_path
from unity_cli.substitutions.families import (
    FAMILY_RULES,
    MAX_ARITY,
    concat_gemm,
    concat_linear,
    embedding_merge,
    gemm,
    layout_rules,
    permute,
    sibling_convs,
    sibling_gemms,
    sibling_matmuls,
)
from unity_cli.substitutions.match import apply_match, find_matches
from unity_cli.substitutions.parallel_rules import (
    add,
    concat,
    conv,
    gather,
    make_rule,
    matmul,
    op,
    output,
    relu,
    split,
    split_as,
    transpose,
    unary,
)
from unity_cli.substitutions.rule import Constraint, load_rules
from unity_cli.substitutions.semantics import evaluate
from unity_cli.substitutions.verify import verify_rule
from unity_cli.zoo import build as build_zoo


@pytest.mark.parametrize("rule", FAMILY_RULES, ids=[r.name for r in FAMILY_RULES])
def test_every_instance_is_proved(rule):
    v = verify_rule(rule, timeout_ms=5000)
    assert v.accepted, v.reason
    assert v.reason == "proved"


def test_every_instance_ships_in_the_rule_cache():
    shipped = {r.id for r in load_rules(default_rules_path()).rules}
    assert {r.id for r in FAMILY_RULES} <= shipped
    names = {r.name for r in FAMILY_RULES}
    assert {f"concat-linear-{MAX_ARITY}", "sibling-matmul-3", "sibling-gemm-2", "gemm-trans-b-as-matmul-add",
            "sibling-conv1x1-2", "sibling-conv3x3-4"} <= names


def _equal(names, axis):
    return [Constraint("EQUAL", ("dim", t, axis), ("dim", names[0], axis)) for t in names[1:]]


def _wrong_variants():
    a = ["a1", "a2", "a3"]
    blocks = split("W", -2, 3)
    w = ["W1", "W2", "W3"]
    yield "concat-linear, blocks in the wrong order", make_rule(
        "x", (*a, "W"), matmul(concat(*a, axis=-1), "W"),
        add(add(matmul("a1", blocks[2]), matmul("a2", blocks[1])), matmul("a3", blocks[0])),
        params=(), constraints=_equal(a, -1))
    yield "concat-linear, W split by columns", make_rule(
        "x", (*a, "W"), matmul(concat(*a, axis=-1), "W"),
        add(add(*[matmul(x, b) for x, b in zip(a[:2], split("W", -1, 3)[:2], strict=True)]),
            matmul("a3", split("W", -1, 3)[2])), params=(), constraints=_equal(a, -1))
    yield "concat-gemm, the bias added to every part", make_rule(
        "x", ("a1", "a2", "Wt", "b"), gemm(concat("a1", "a2", axis=-1), "Wt", "b", trans_b=True),
        add(gemm("a1", split("Wt", -1)[0], "b", trans_b=True), gemm("a2", split("Wt", -1)[1], "b", trans_b=True)),
        params=(), constraints=_equal(["a1", "a2"], -1))
    yield "sibling matmuls, outputs swapped", make_rule(
        "x", ("x", *w), [matmul("x", wi) for wi in w],
        [split(matmul("x", concat(*w, axis=-1)), -1, 3)[k] for k in (1, 0, 2)], params=(), constraints=_equal(w, -1))
    yield "sibling matmuls, weights stacked by rows", make_rule(
        "x", ("x", "W1", "W2"), [matmul("x", "W1"), matmul("x", "W2")],
        split(matmul("x", concat("W1", "W2", axis=-2)), -1, 2), params=(), constraints=_equal(["W1", "W2"], -1))
    rows = split_as("W", -2, [("a2", -1), ("a1", -1)])
    yield "concat-linear of unequal widths, row blocks cut in the wrong order", make_rule(
        "x", ("a1", "a2", "W"), matmul(concat("a1", "a2", axis=-1), "W"),
        add(matmul("a1", rows[0]), matmul("a2", rows[1])), params=())
    yield "sibling matmuls, split back into the widths in the wrong order", make_rule(
        "x", ("x", "W1", "W2"), [matmul("x", "W1"), matmul("x", "W2")],
        split_as(matmul("x", concat("W1", "W2", axis=-1)), -1, [("W2", -1), ("W1", -1)]), params=())
    yield "sibling convs, split back into the widths in the wrong order", make_rule(
        "x", ("x", "W1", "W2"), [conv("x", w_, (1, 1), (0, 0, 0, 0)) for w_ in ("W1", "W2")],
        split_as(conv("x", concat("W1", "W2", axis=-4), (1, 1), (0, 0, 0, 0)), -3, [("W2", -4), ("W1", -4)]),
        params=())
    yield "sibling gemms, split back into the widths in the wrong order", make_rule(
        "x", ("x", "Wt1", "Wt2", "b1", "b2"),
        [gemm("x", "Wt1", "b1", trans_b=True), gemm("x", "Wt2", "b2", trans_b=True)],
        split_as(gemm("x", concat("Wt1", "Wt2", axis=-2), concat("b1", "b2", axis=-1), trans_b=True), -1,
                 [("Wt2", -2), ("Wt1", -2)]), params=(),
        constraints=[Constraint("EQUAL", ("rank", b), 1) for b in ("b1", "b2")])
    yield "sibling gemms, biases in the wrong order", make_rule(
        "x", ("x", "Wt1", "Wt2", "b1", "b2"),
        [gemm("x", "Wt1", "b1", trans_b=True), gemm("x", "Wt2", "b2", trans_b=True)],
        split(gemm("x", concat("Wt1", "Wt2", axis=-2), concat("b2", "b1", axis=-1), trans_b=True), -1, 2),
        params=(), constraints=_equal(["Wt1", "Wt2"], -2))
    c1 = [conv("x", wi, (1, 1), (0, 0, 0, 0)) for wi in ("W1", "W2")]
    yield "sibling convs, weights stacked by input channels", make_rule(
        "x", ("x", "W1", "W2"), c1, split(conv("x", concat("W1", "W2", axis=-3), (1, 1), (0, 0, 0, 0)), -3, 2),
        params=(), constraints=_equal(["W1", "W2"], -4))
    yield "sibling convs, outputs swapped", make_rule(
        "x", ("x", "W1", "W2"), c1,
        split(conv("x", concat("W1", "W2", axis=-4), (1, 1), (0, 0, 0, 0)), -3, 2)[::-1],
        params=(), constraints=_equal(["W1", "W2"], -4))

    def grouped(x, w):
        return op(OpKind.Conv, x, w, kernel=(1, 1), strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=2)
    yield "sibling convs, grouped (stacking the weights regroups them)", make_rule(
        "x", ("x", "W1", "W2"), [grouped("x", "W1"), grouped("x", "W2")],
        split(grouped("x", concat("W1", "W2", axis=-4)), -3, 2), params=(), constraints=_equal(["W1", "W2"], -4))
    yield "gemm with trans_b, the transpose dropped", make_rule(
        "x", ("x", "Wt", "b"), gemm("x", "Wt", "b", trans_b=True), add(matmul("x", "Wt"), "b"), params=())
    yield "gemm, the bias dropped", make_rule(
        "x", ("x", "Wt", "b"), gemm("x", "Wt", "b", trans_b=True), matmul("x", transpose("Wt")), params=())
    yield "fused gemm, another activation", make_rule(
        "x", ("x", "Wt", "b"), unary("Relu", gemm("x", "Wt", "b", trans_b=True)),
        gemm("x", "Wt", "b", trans_b=True, activation="Sigmoid"), params=())
    yield "fused gemm, the activation before the bias", make_rule(
        "x", ("x", "W", "b"), add(relu(matmul("x", "W")), "b"), gemm("x", "W", "b", trans_b=False, activation="Relu"),
        params=(), constraints=[Constraint("EQUAL", ("rank", "b"), 1)])
    yield "fused gemm, the activation dropped", make_rule(
        "x", ("x", "W", "b"), unary("Tanh", add(matmul("x", "W"), "b")), gemm("x", "W", "b", trans_b=False),
        params=(), constraints=[Constraint("EQUAL", ("rank", "b"), 1)])

    batched = [Constraint("EQUAL", ("rank", "x"), 3), Constraint("EQUAL", ("rank", "W"), 2),
               Constraint("EQUAL", ("rank", "b"), 1)]
    yield "batched fused gemm, the activation before the bias", make_rule(
        "x", ("x", "W", "b"), add(unary("Gelu", matmul("x", "W")), "b"),
        gemm("x", "W", "b", trans_b=False, activation="Gelu"), params=(), constraints=batched)
    yield "batched fused gemm, another activation", make_rule(
        "x", ("x", "W", "b"), unary("Gelu", add(matmul("x", "W"), "b")),
        gemm("x", "W", "b", trans_b=False, activation="Tanh"), params=(), constraints=batched)
    yield "batched fused gemm, the weight taken transposed", make_rule(
        "x", ("x", "W", "b"), unary("Relu", add(matmul("x", "W"), "b")),
        gemm("x", "W", "b", trans_b=True, activation="Relu"), params=(), constraints=batched)

    tables = [Constraint("EQUAL", ("rank", t), 2) for t in ("T1", "T2")]

    def merged(order, ids, rows, axis=-2):
        e = op(OpKind.GroupedGather, concat(*order, axis=axis), *ids, n_outputs=2,
               rows=tuple(("dim", t, -2) for t in rows))
        return make_rule("x", ("T1", "T2", "ids1", "ids2"), [gather("T1", "ids1", -2), gather("T2", "ids2", -2)],
                         [output(e, 0), output(e, 1)], params=(), constraints=tables)
    yield "embedding merge, ids swapped", merged(("T1", "T2"), ("ids2", "ids1"), ("T1", "T2"))
    yield "embedding merge, tables of unequal rows offset in the wrong order", \
        merged(("T1", "T2"), ("ids1", "ids2"), ("T2", "T1"))
    yield "embedding merge, tables concatenated in the wrong order", \
        merged(("T2", "T1"), ("ids1", "ids2"), ("T2", "T1"))
    yield "embedding merge, tables concatenated by columns", merged(("T1", "T2"), ("ids1", "ids2"), ("T1", "T2"), -1)

    p, q = (-3, -1, -4, -2), (-2, -3, -1)     # [0, 2, 3, 1]'s tail read as 4 dims, and [0, 2, 1, 3]'s
    yield "transpose pair, undone by itself rather than its inverse", make_rule(
        "x", ("x",), permute(permute("x", p), p), "x", params=())
    yield "transpose pair, composed in the wrong order", make_rule(
        "x", ("x",), permute(permute("x", q), (-1, -2)), permute("x", (-1, -3, -2)), params=())
    yield "activation moved through the inverse transpose", make_rule(
        "x", ("x",), unary("Relu", permute("x", p)), permute(unary("Relu", "x"), (-2, -1, -4, -3)), params=())
    yield "activation moved through a transpose, changed on the way", make_rule(
        "x", ("x",), unary("Relu", permute("x", p)), permute(unary("Sigmoid", "x"), p), params=())
    yield "sum of operands transposed differently", make_rule(
        "x", ("a", "b"), add(permute("a", p), permute("b", p)), permute(add("a", "b"), q), params=())
    sm = dict(log=False, flatten=False)
    yield "softmax moved through a transpose over the same axis rather than the moved one", make_rule(
        "x", ("x",), op(OpKind.Softmax, permute("x", p), axis=-1, **sm),
        permute(op(OpKind.Softmax, "x", axis=-1, **sm), p), params=())
    ranked = [Constraint("EQUAL", ("rank", t), 4) for t in ("a", "b")]
    yield "batched product through a transpose that moves its matrix dims", make_rule(
        "x", ("a", "b"), matmul(permute("a", (-3, -4, -1, -2)), permute("b", (-3, -4, -1, -2))),
        permute(matmul("a", "b"), (-3, -4, -1, -2)), params=(), constraints=ranked)


WRONG = list(_wrong_variants())


@pytest.mark.parametrize("what,rule", WRONG, ids=[w for w, _ in WRONG])
def test_known_wrong_variants_are_rejected(what, rule):
    v = verify_rule(rule, timeout_ms=5000)
    assert not v.accepted, what
    assert v.reason.startswith(("counterexample", "does not type-check", "layouts differ", "z3: sat")), v.reason


@pytest.mark.parametrize("what", ["concat-linear, blocks in the wrong order", "embedding merge, ids swapped",
                                  "embedding merge, tables of unequal rows offset in the wrong order",
                                  "activation moved through a transpose, changed on the way",
                                  "softmax moved through a transpose over the same axis rather than the moved one",
                                  "batched product through a transpose that moves its matrix dims"])
def test_a_wrong_variant_that_only_z3_can_see_is_rejected(monkeypatch, what):
    """With the numeric check skipped, the proof alone rejects a wrong rule (z3 is not a
    rubber stamp behind the numbers)."""
    monkeypatch.setattr("unity_cli.substitutions.verify.check_numbers", lambda rule, instances: True)
    rule = dict(WRONG)[what]
    v = verify_rule(rule, timeout_ms=5000)
    assert not v.accepted and v.reason.startswith("z3: "), v.reason


def _feed(pcg, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for _, n in pcg:
        if n.spec.is_source:
            s = n.outputs[0]
            if s.dtype.value.startswith("int"):
                out[n.name] = rng.integers(0, 2, s.sizes).astype(np.int64)
            else:
                out[n.name] = rng.standard_normal(s.sizes)
    return out


def _rewrites_preserve_values(pcg, rule, expect):
    """``expect`` groups of nodes match, each once (a multi-output rule's group is one match
    from whichever member it is found); each rewrite keeps the values."""
    matches = find_matches(pcg, rule)
    assert len({frozenset(m.nodes) for m in matches}) == len(matches) == expect, (rule.name, len(matches))
    feed = _feed(pcg)
    want = evaluate(pcg, feed)
    for m in matches:
        new = apply_match(pcg, m)
        validate(new)
        got = evaluate(new, feed)
        for u, v in zip(want, got, strict=True):
            np.testing.assert_allclose(v, u, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("model", ["bert_tiny.onnx", "vit_tiny.onnx"])
def test_attention_projections_fuse(tiny_models, model):
    """Q, K and V are three MatMuls of one input in each of the 2 layers (both models)."""
    path = (tiny_models if model.startswith("bert") else EXPORTED_DIR) / model
    pcg = import_model(path, ImportOptions(batch_size=4)).pcg
    _rewrites_preserve_values(pcg, sibling_matmuls(3), 2)
    # and two of the three, anywhere among them
    assert len(find_matches(pcg, sibling_matmuls(2))) >= 2


def test_a_layer_over_embedding_bags_splits_over_them():
    """XDL: a MatMul over the concatenation of its 3 embedding bags."""
    pcg = import_model_proto_of("xdl")
    _rewrites_preserve_values(pcg, concat_linear(3), 1)
    assert not find_matches(pcg, concat_linear(2)) and not find_matches(pcg, concat_linear(4))


def test_inception_fuses_its_1x1_reductions_of_any_widths():
    """Inception-v3's modules reduce one input with several 1x1 convolutions of unequal
    widths (a 48-wide one beside two 64-wide ones): any of them fuse into one, split back
    into their widths, and the values stay."""
    pcg = import_model_proto_of("inception-v3")
    triple = sibling_convs(3, (1, 1), (0, 0, 0, 0), uneven=True)
    assert triple.grouped_only and not sibling_convs(3, (1, 1), (0, 0, 0, 0)).grouped_only
    widths = {n.op.sizes for m in find_matches(pcg, triple) for _, n in apply_match(pcg, m) if n.kind == OpKind.Split}
    assert any(len(set(w)) > 1 for w in widths), widths            # unequal parts
    _rewrites_preserve_values(pcg, triple, 3)
    assert not find_matches(pcg, sibling_convs(2, (3, 3), (1, 1, 1, 1)))   # its 3x3s read different inputs


def test_pytorch_linears_take_the_gemm_rules(tmp_path):
    """DLRM's torch export: every nn.Linear is a Gemm with transB and a bias."""
    pcg = import_model(EXPORTED_DIR / "dlrm_tiny.onnx", ImportOptions(batch_size=4)).pcg
    gemms = sum(1 for _, n in pcg if n.kind == OpKind.Gemm)
    rule = next(r for r in FAMILY_RULES if r.name == "gemm-trans-b-as-matmul-add")
    _rewrites_preserve_values(pcg, rule, gemms)
    # its top MLP's input is a concatenation of unequal parts: no Concat-Linear rule applies
    assert not any(find_matches(pcg, concat_gemm(n)) for n in range(2, MAX_ARITY + 1))


def test_an_mlp_fuses_its_activations(tmp_path):
    """DLRM's torch export: each nn.Linear + ReLU becomes one fused Gemm, values kept; a
    Gemm not followed by an activation is left alone, and a fused Gemm is never matched by
    a rule written for a plain one (its proof covered none)."""
    pcg = import_model(EXPORTED_DIR / "dlrm_tiny.onnx", ImportOptions(batch_size=4)).pcg
    relus = sum(1 for _, n in pcg if n.kind == OpKind.Unary and n.op.fn == "Relu"
                and pcg.nodes[n.inputs[0].node].kind == OpKind.Gemm)
    assert relus >= 2
    rule = next(r for r in FAMILY_RULES if r.name == "gemm-trans-b-relu-fused")
    _rewrites_preserve_values(pcg, rule, relus)
    fused = pcg
    while m := find_matches(fused, rule, limit=1):
        fused = apply_match(fused, m[0])
    assert sum(1 for _, n in fused if n.kind == OpKind.Gemm and n.op.activation == "Relu") == relus
    plain = next(r for r in FAMILY_RULES if r.name == "gemm-trans-b-as-matmul-add")
    gemms = sum(1 for _, n in fused if n.kind == OpKind.Gemm and not n.op.activation)
    assert len(find_matches(fused, plain)) == gemms


def test_sibling_gemms_and_concat_gemm_on_a_pytorch_style_graph(tmp_path):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (8, 16)), ("b1", (8,)), ("w2", (8, 16)), ("b2", (8,)), ("w3", (4, 16)), ("b3", (4,))]]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["p"], transB=1),
             helper.make_node("Gemm", ["x", "w2", "b2"], ["q"], transB=1),
             helper.make_node("Concat", ["p", "q"], ["c"], axis=1),
             helper.make_node("Gemm", ["c", "w3", "b3"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], inits)
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    pcg = import_model(path).pcg
    _rewrites_preserve_values(pcg, sibling_gemms(2), 1)
    _rewrites_preserve_values(pcg, concat_gemm(2), 1)


def import_model_proto_of(name: str):
    return import_model_proto(build_zoo(name, "small", batch_size=4).model).pcg


def test_a_transformers_feed_forward_fuses_its_activation_at_rank_3():
    """The zoo's BERT: each feed-forward layer is a rank-3 MatMul, its bias and a Gelu; the
    batched rule makes each one fused Gemm, values kept. The rank-2 rule does not match it
    (its proof was at rank 2), and the batched one matches no rank-2 product."""
    pcg = import_model_proto_of("bert-large")
    layers = sum(1 for _, n in pcg if n.kind == OpKind.Unary and n.op.fn == "Gelu")
    assert layers >= 2
    batched = next(r for r in FAMILY_RULES if r.name == "matmul-add-gelu-fused-batched")
    _rewrites_preserve_values(pcg, batched, layers)
    assert not find_matches(pcg, next(r for r in FAMILY_RULES if r.name == "matmul-add-gelu-fused"))
    mlp = import_model(EXPORTED_DIR / "dlrm_tiny.onnx", ImportOptions(batch_size=4)).pcg
    assert not any(find_matches(mlp, r) for r in FAMILY_RULES if r.name.endswith("-batched"))


@pytest.mark.parametrize("fn", ["Relu", "Gelu", "Tanh", "Sigmoid"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_a_batched_fused_gemm_computes_its_parts(fn, trans_b):
    """Forward and backward of ``Gemm[fn](x, W, b)`` with ``x`` of rank 3 equal those of
    ``fn(MatMul(x, W) + b)`` run as three kernels."""
    from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
    from unity_cli.ir.ops.linear import GemmAttrs, MatMulAttrs
    from unity_cli.kernels import backward, forward

    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((3, 5, 4)), rng.standard_normal((6, 4) if trans_b else (4, 6)), rng.standard_normal(6)
    g = rng.standard_normal((3, 5, 6))
    fused = GemmAttrs(trans_b=trans_b, activation=fn)
    (y,), ctx = forward(fused, [x, w, b], np)
    wm = w.T if trans_b else w
    (p,), c_mm = forward(MatMulAttrs(), [x, wm], np)
    (q,), c_add = forward(BinaryAttrs("Add"), [p, b], np)
    (want,), c_act = forward(UnaryAttrs(fn), [q], np)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    (gq,) = backward(UnaryAttrs(fn), c_act, [g], np)
    gp, gb = backward(BinaryAttrs("Add"), c_add, [gq], np)
    gx, gw = backward(MatMulAttrs(), c_mm, [gp], np)
    got = backward(fused, ctx, [g], np)
    for a, e in zip(got, [gx, gw.T if trans_b else gw, gb], strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)


def test_embedding_lookups_merge_into_one_table():
    """DLRM's export: its 3 tables' lookups are one match of the 3-way rule (not one per
    table), 3 pairs of the 2-way one, none of the 4-way one, and the interaction's Gather
    (along a row) never matches; each rewrite keeps the values, ids out of range included."""
    pcg = import_model(EXPORTED_DIR / "dlrm_tiny.onnx", ImportOptions(batch_size=4)).pcg
    _rewrites_preserve_values(pcg, embedding_merge(3), 1)
    _rewrites_preserve_values(pcg, embedding_merge(2), 3)
    assert not find_matches(pcg, embedding_merge(4))
    # what the rewrite made is named after what it replaced (a plan's explanation reads it)
    (m,) = find_matches(pcg, embedding_merge(3))
    new = apply_match(pcg, m)
    (merged,) = [n for _, n in new if n.kind == OpKind.GroupedGather]
    assert merged.name == "+".join(pcg.nodes[i].name for i in m.nodes)
    assert pcg.nodes[m.root].name + "/Concat" in [n.name for _, n in new if n.kind == OpKind.Concat]
    # the zoo's DLRM has tables of 50, 40 and 30 rows: they merge all the same
    _rewrites_preserve_values(import_model_proto_of("dlrm"), embedding_merge(3), 1)


def test_lookups_by_ids_of_other_shapes_do_not_merge(tiny_models):
    """BERT's word and token-type ids are [batch, seq]; its position ids are [1, seq]: only
    the first two merge."""
    pcg = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(batch_size=4)).pcg
    (m,) = find_matches(pcg, embedding_merge(2))
    assert sorted(pcg.nodes[i].name.split("/")[-2] for i in m.nodes) == ["token_type_embeddings", "word_embeddings"]
    assert not find_matches(pcg, embedding_merge(3))


def test_a_grouped_gather_computes_its_parts():
    """Forward and backward of one GroupedGather equal those of a Gather per table, with
    ids negative (counted from their own table's end) and out of range (zeros, no
    gradient); pieces of the merged table split by rows (``base``) add up to the whole."""
    import dataclasses

    from unity_cli.ir.ops.gather_reduce import GatherAttrs, GroupedGatherAttrs
    from unity_cli.kernels import backward, forward

    rng = np.random.default_rng(2)
    rows = (4, 6, 2)
    tables = [rng.standard_normal((r, 3)) for r in rows]
    ids = [np.array([[0, -1], [3, 9]]), np.array([[5, -6], [-7, 6]]), np.array([[1, -2], [2, 0]])]
    grads = [rng.standard_normal((2, 2, 3)) for _ in rows]
    op_ = GroupedGatherAttrs(rows)
    whole = np.concatenate(tables)
    outs, ctx = forward(op_, [whole, *ids], np)
    (g_whole,) = backward(op_, ctx, grads, np)[:1]
    offset = 0
    for t, i, g, y in zip(tables, ids, grads, outs, strict=True):
        (want,), c = forward(GatherAttrs(0), [t, i], np)
        np.testing.assert_array_equal(y, want)
        np.testing.assert_allclose(g_whole[offset:offset + len(t)], backward(GatherAttrs(0), c, [g], np)[0])
        offset += len(t)
    pieces = [forward(dataclasses.replace(op_, base=k * 3), [whole[k * 3:(k + 1) * 3], *ids], np) for k in range(4)]
    for j, y in enumerate(outs):
        np.testing.assert_allclose(sum(p[0][j] for p in pieces), y)
    np.testing.assert_allclose(np.concatenate([backward(dataclasses.replace(op_, base=k * 3), p[1], grads, np)[0]
                                               for k, p in enumerate(pieces)]), g_whole)


def test_a_multi_output_match_is_found_once_from_any_member(tmp_path):
    """Q, K and V: the 2-way sibling rule finds each pair once (3 pairs), backing out of a
    pair it found before to reach the third."""
    from models.families import qkv
    pcg = import_model(qkv(tmp_path / "qkv.onnx"), ImportOptions(batch_size=4)).pcg
    _rewrites_preserve_values(pcg, sibling_matmuls(2), 3)


def test_every_transpose_of_up_to_4_dims_has_its_layout_rules():
    """For each of the 23 permutations that move 2 to 4 trailing dims: the pair that undoes
    it; for the 22 besides the last-two swap (whose are the generator's), the moves through
    activations, sums and products, the pair undone around them, and the compositions with
    the last-two swap (one way); for all 23, a softmax over the last dim moved through, and
    undone around one; the batch-swap product."""
    names = [r.name for r in layout_rules()]
    assert len(names) == len(set(names))
    cancels = [r for r in layout_rules() if r.name.startswith("transpose-cancel-") and "around" not in r.name]
    assert len(cancels) == 23 and all(not r.dst.nodes for r in cancels)
    assert sum("cancel-around" in n for n in names) == 22 * 5 + 23    # Relu, Sigmoid, Tanh, Add, Mul; Softmax
    # one way: those whose reverse would match every transpose, or every activation
    assert all(r.one_way == (r.name.startswith("transpose-swap-") or "cancel-around" in r.name)
               for r in layout_rules())
    assert {"relu-through-transpose-120", "add-through-transpose-1203", "transpose-swap-after-102",
            "matmul-through-batch-transpose-1023", "softmax-through-transpose-10",
            "transpose-cancel-around-softmax-2301"} <= set(names)


def test_a_channels_last_network_sheds_its_transpose_pairs(tmp_path, cluster_dir):
    """A converter's NHWC network (a transpose to NCHW before each convolution, one back
    after): moving each activation through the transpose before it lets that transpose meet
    the next convolution's, which undoes it; the three operators are the activation alone.
    Every step keeps the values; the search removes both pairs, which parallelization alone
    cannot, and is faster for it."""
    from models.families import channels_last

    from unity_cli.cluster import load_cluster
    from unity_cli.cost.model import CostConfig
    from unity_cli.search.optimize import optimize
    from unity_cli.substitutions.cache import load_cache

    pcg = import_model(channels_last(tmp_path / "cl.onnx", 8), ImportOptions(batch_size=8)).pcg
    transposes = lambda g: sum(1 for _, n in g if n.kind == OpKind.Transpose)   # noqa: E731
    assert transposes(pcg) == 6
    through = next(r for r in FAMILY_RULES if r.name == "relu-through-transpose-120")
    cancel = next(r for r in FAMILY_RULES if r.name == "transpose-cancel-120")
    _rewrites_preserve_values(pcg, through, 3)
    moved = apply_match(pcg, find_matches(pcg, through)[0])
    assert not find_matches(pcg, cancel)           # no pair meets before the activation moves
    _rewrites_preserve_values(moved, cancel, 1)
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    rules = load_cache().rules
    res = optimize(pcg, cluster, CostConfig(), "unity", rules, max_candidates=120)
    got = res.candidates["unity"].baseline.pcg
    assert transposes(got) == 2, [n.name for _, n in got if n.kind == OpKind.Transpose]
    assert {a.rule_name for a in res.rewrites} == {"transpose-cancel-around-relu-120"}
    around = next(r for r in FAMILY_RULES if r.name == "transpose-cancel-around-relu-120")
    _rewrites_preserve_values(pcg, around, 2)
    unity, alone = res.candidates["unity"].report.step_time, res.candidates["parallel_only"].report.step_time
    assert unity < alone * 0.9, (unity, alone)


def test_a_softmax_between_a_transpose_and_its_inverse_is_the_softmax_over_the_moved_axis(tmp_path):
    """Scores computed channels-last, normalized over the last dim, transposed back: one
    softmax over the dim the transpose had put last; values kept (onnx -> imported graph)."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((5, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Softmax", ["t"], ["s"], axis=-1),
             helper.make_node("Transpose", ["s"], ["u"], perm=[0, 3, 1, 2]),
             helper.make_node("MatMul", ["u", "w"], ["y"])]
    g = helper.make_graph(nodes, "sm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6, 3])], [w])
    path = tmp_path / "sm.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    pcg = import_model(path, ImportOptions()).pcg
    rule = next(r for r in FAMILY_RULES if r.name == "transpose-cancel-around-softmax-120")
    _rewrites_preserve_values(pcg, rule, 1)
    new = apply_match(pcg, find_matches(pcg, rule)[0])
    (sm,) = [n for _, n in new if n.kind == OpKind.Softmax]
    assert sm.op.axis == 1 and not any(n.kind == OpKind.Transpose for _, n in new)
    through = next(r for r in FAMILY_RULES if r.name == "softmax-through-transpose-120")
    _rewrites_preserve_values(pcg, through, 1)


def test_uneven_sibling_rules_match_exactly_the_groups_the_equal_ones_do_not(tmp_path):
    """Attention's Q, K and V (equal widths) take the equal rule only; Inception's
    reductions of one input (two 64-wide, one 48-wide), from whichever member the match
    starts, the uneven one only (its first two parts must differ; the matcher puts an
    odd one second)."""
    from models.families import qkv, reductions

    pcg = import_model(qkv(tmp_path / "qkv.onnx"), ImportOptions(batch_size=4)).pcg
    assert find_matches(pcg, sibling_matmuls(3)) and not find_matches(pcg, sibling_matmuls(3, uneven=True))
    pcg = import_model(reductions(tmp_path / "r.onnx"), ImportOptions(batch_size=4)).pcg
    triple = find_matches(pcg, sibling_convs(3, (1, 1), (0, 0, 0, 0), uneven=True))
    assert len(triple) == 1 and not find_matches(pcg, sibling_convs(3, (1, 1), (0, 0, 0, 0)))
    assert len(find_matches(pcg, sibling_convs(2, (1, 1), (0, 0, 0, 0)))) == 1          # the two of one width
    assert len(find_matches(pcg, sibling_convs(2, (1, 1), (0, 0, 0, 0), uneven=True))) == 2   # each with the odd one


def test_a_layer_over_parts_of_unequal_widths_is_a_sum_of_layers():
    """CANDLE Uno's layer over its 7 concatenated features (4192, 1, 1, 4192 ...) and DLRM's
    top MLP over 64 + 36: the uneven Concat-Linear and Concat-Gemm match them (the equal
    ones do not), the values stay."""
    from unity_cli.substitutions.families import concat_gemm, concat_linear

    candle = import_model_proto_of("candle-uno")
    assert not any(find_matches(candle, concat_linear(n)) for n in range(2, MAX_ARITY + 1))
    _rewrites_preserve_values(candle, concat_linear(7, uneven=True), 1)
    dlrm = import_model(EXPORTED_DIR / "dlrm_tiny.onnx", ImportOptions(batch_size=4)).pcg
    _rewrites_preserve_values(dlrm, concat_gemm(2, uneven=True), 1)
