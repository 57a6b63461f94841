"""The rule format: canonical JSON, content ids, rule files, tamper and staleness checks."""
from __future__ import annotations

import json

import pytest

from unity_cli.substitutions.rule import (
    Constraint,
    Param,
    Pattern,
    PatternNode,
    Rule,
    RuleError,
    RuleSet,
    load_rules,
)


def relu_concat() -> Rule:
    src = Pattern((PatternNode("Concat", (("axis", -1),), ("a", "b"), ("t0",)),
                   PatternNode("Unary", (("fn", "Relu"),), ("t0",), ("t1",))), ("t1",))
    dst = Pattern((PatternNode("Unary", (("fn", "Relu"),), ("a",), ("u0",)),
                   PatternNode("Unary", (("fn", "Relu"),), ("b",), ("u1",)),
                   PatternNode("Concat", (("axis", -1),), ("u0", "u1"), ("u2",))), ("u2",))
    return Rule(("a", "b"), (), src, dst, (Constraint("EQUAL", ("sum", "a"), 1),), "relu-concat")


def column_split() -> Rule:
    d = Param("d")
    src = Pattern((PatternNode("MatMul", (), ("x", "w"), ("y",)),), ("y",))
    dst = Pattern((PatternNode("Replicate", (("degree", d),), ("x",), ("x1",)),
                   PatternNode("Repartition", (("degree", d), ("dim", -1)), ("w",), ("w1",)),
                   PatternNode("MatMul", (), ("x1", "w1"), ("y1",)),
                   PatternNode("Combine", (("degree", d), ("dim", -1)), ("y1",), ("y2",))), ("y2",))
    return Rule(("x", "w"), ("d",), src, dst, (Constraint("DIVISIBLE_BY", ("dim", "w", -1), ("param", "d")),))


@pytest.mark.parametrize("make", [relu_concat, column_split])
def test_json_round_trip_keeps_the_id(make):
    r = make()
    back = Rule.from_json(json.loads(json.dumps(r.to_json())))
    assert back == r
    assert back.id == r.id
    assert back.to_json() == r.to_json()


def test_the_id_ignores_the_name_but_not_the_content():
    r = relu_concat()
    renamed = Rule(r.inputs, r.params, r.src, r.dst, r.constraints, "other name")
    assert renamed.id == r.id
    assert r.reversed().id != r.id
    assert column_split().id != r.id


def test_a_hand_edited_rule_is_refused():
    data = relu_concat().to_json()
    data["src"]["nodes"][0]["attrs"]["axis"] = -2
    with pytest.raises(RuleError, match="does not match its content"):
        Rule.from_json(data)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["src"]["nodes"][0].update(op="NoSuchOp"), "unknown op 'NoSuchOp'"),
    (lambda d: d["src"]["nodes"][1].update(inputs=["zz"]), "input 'zz' is not a rule input"),
    (lambda d: d["dst"].update(outputs=["nope"]), "'nope' is not defined"),
    (lambda d: d.pop("src"), "missing field 'src'"),
    (lambda d: d["constraints"].append(["LESS", 1, 2]), "constraints"),
    (lambda d: d["src"]["nodes"][0]["attrs"].update(axis={"param": "k"}), "parameter 'k' is not declared"),
])
def test_malformed_rules_name_the_field(edit, message):
    data = relu_concat().to_json()
    data.pop("id")
    edit(data)
    with pytest.raises(RuleError, match=message):
        Rule.from_json(data, "rules[7]")


def test_rule_file_round_trip_and_tamper_detection(tmp_path):
    rs = RuleSet((relu_concat(), column_split()), {"max_ops": 3}, "abc")
    path = tmp_path / "rules.json"
    rs.save(path)
    back = load_rules(path)
    assert [r.id for r in back.rules] == [r.id for r in rs.rules]
    assert back.axioms_hash == "abc"
    assert path.read_text() == back.dumps()
    doc = json.loads(path.read_text())
    doc["rules"].pop()
    path.write_text(json.dumps(doc))
    with pytest.raises(RuleError, match="content_hash does not match"):
        load_rules(path)
    path.write_text("{not json")
    with pytest.raises(RuleError, match="not a JSON rule file"):
        load_rules(path)
    with pytest.raises(RuleError, match="no such file"):
        load_rules(tmp_path / "missing.json")
