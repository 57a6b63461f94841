"""Matching rules in PCGs and applying them."""
from __future__ import annotations

import numpy as np
import pytest
from test_rule_format import column_split, relu_concat

from unity_cli.ir import GraphBuilder, TensorShape
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.shape_ops import ConcatAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.substitutions.match import RewriteError, apply_match, find_matches, free_params, why_not
from unity_cli.substitutions.semantics import evaluate


def concat_relu_graph(extra_use: bool = False):
    b = GraphBuilder()
    a = b.add1(InputAttrs(TensorShape((4, 6))), name="a")
    c = b.add1(InputAttrs(TensorShape((4, 2))), name="c")
    cat = b.add1(ConcatAttrs(1), [a, c], name="cat")
    out = b.add1(UnaryAttrs("Relu"), [cat], name="relu")
    outs = [out]
    if extra_use:
        outs.append(b.add1(UnaryAttrs("Neg"), [cat], name="neg"))
    return b.build(outs)


def test_match_and_apply_preserve_values():
    g = concat_relu_graph()
    rule = relu_concat()
    ms = find_matches(g, rule)
    assert len(ms) == 1
    new = apply_match(g, ms[0])
    validate(new)
    kinds = [n.kind for _, n in new]
    assert kinds.count("Unary") == 2 and kinds.count("Concat") == 1
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(-5, 5, (4, 6)), "c": rng.integers(-5, 5, (4, 2))}
    assert np.array_equal(evaluate(g, feeds)[0], evaluate(new, feeds)[0])


def test_a_failed_match_says_why():
    g = concat_relu_graph(extra_use=True)
    rule = relu_concat()
    assert find_matches(g, rule) == []
    relu = g.find("relu")
    assert "also used outside the match" in why_not(g, rule, relu)
    assert "pattern wants Unary" in why_not(g, rule, g.find("cat"))
    wrong_axis = relu_concat().to_json()
    wrong_axis["src"]["nodes"][0]["attrs"]["axis"] = -2
    wrong_axis.pop("id")
    from unity_cli.substitutions.rule import Rule
    assert "axis=-1, pattern wants -2" in why_not(concat_relu_graph(), Rule.from_json(wrong_axis), relu)


def mlp():
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((8, 16))), name="x")
    w = b.add1(WeightAttrs(TensorShape((16, 12))), name="w")
    return b.build([b.add1(MatMulAttrs(), [x, w], name="mm")])


def test_parallelization_rule_takes_its_degree_from_the_caller():
    g = mlp()
    rule = column_split()
    assert free_params(rule) == ("d",)
    [m] = find_matches(g, rule)
    with pytest.raises(RewriteError, match="needs a value"):
        apply_match(g, m)
    new = apply_match(g, m, {"d": 4})
    validate(new)
    assert new.shape(new.outputs[0]) == g.shape(g.outputs[0])
    mm = [n for _, n in new if n.kind == "MatMul"][0]
    assert mm.outputs[0].degrees == (1, 4)
    with pytest.raises(RewriteError, match="DIVISIBLE_BY"):
        apply_match(g, m, {"d": 5})


def test_a_target_operator_with_more_pieces_than_devices_is_refused_before_the_rebuild():
    """``max_pieces`` refuses a target whose operator has more pieces than there are devices
    (the search's limit), and changes nothing where it does not bind."""
    g = mlp()
    [m] = find_matches(g, column_split())
    with pytest.raises(RewriteError, match="4 pieces, more than 2"):
        apply_match(g, m, {"d": 4}, max_pieces=2)
    assert apply_match(g, m, {"d": 4}, max_pieces=4) == apply_match(g, m, {"d": 4})


def test_rewrites_of_a_real_model_stay_valid(tiny_models):
    m = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(batch_size=4))
    matches = find_matches(m.pcg, column_split())
    assert len(matches) == 16
    for mt in matches:
        new = apply_match(m.pcg, mt, {"d": 2})
        validate(new)
        assert [new.shape(r) for r in new.outputs] == [m.pcg.shape(r) for r in m.pcg.outputs]
