"""The shipped rule cache: it loads, re-proves (a seeded sample each CI run), is detected
when stale or tampered with, and its rules rewrite real models into valid PCGs."""
from __future__ import annotations

import json
import random

import pytest

from unity_cli.ir.validate import problems
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.substitutions.cache import PACKAGE_RULES, load_cache
from unity_cli.substitutions.match import RewriteError, apply_match, find_matches, free_params
from unity_cli.substitutions.rule import RuleError
from unity_cli.substitutions.verify import verify_rule


@pytest.fixture(scope="module")
def cache():
    return load_cache()


def test_the_shipped_cache_is_big_and_current(cache):
    assert PACKAGE_RULES.resolve().is_file()
    assert len(cache.rules) >= 500
    assert len({r.id for r in cache.rules}) == len(cache.rules)
    assert cache.settings.get("max_ops", 0) >= 3


def test_a_seeded_sample_of_the_cache_reproves(cache):
    sample = random.Random(20261129).sample(list(cache.rules), 25)
    for rule in sample:
        v = verify_rule(rule, timeout_ms=5000)
        assert v.accepted, (rule.name, v.reason)


def test_stale_and_tampered_caches_are_refused(tmp_path):
    doc = json.loads(PACKAGE_RULES.read_text())
    stale = tmp_path / "stale.json"
    doc_stale = dict(doc, axioms_hash="0" * 64)
    stale.write_text(json.dumps(doc_stale))
    with pytest.raises(RuleError, match="stale rule cache"):
        load_cache(stale)
    tampered = tmp_path / "tampered.json"
    doc["rules"] = doc["rules"][:-1]
    tampered.write_text(json.dumps(doc))
    with pytest.raises(RuleError, match="content_hash"):
        load_cache(tampered)


@pytest.mark.parametrize("name", ["bert_tiny.onnx", "bert_tiny_dynamo.onnx", "convnet_tiny.onnx",
                                  "convnet_tiny_dynamo.onnx"])
def test_every_rule_applies_to_shared_models_without_an_invalid_pcg(cache, tiny_models, name):
    pcg = import_model(tiny_models / name, ImportOptions(batch_size=4)).pcg
    applied = refused = 0
    for rule in cache.rules:
        for r in (rule, rule.reversed()):
            for m in find_matches(pcg, r, limit=2):
                params = {p: 2 for p in free_params(r)}
                try:  # the search's path: no whole-graph validation inside apply_match
                    new = apply_match(pcg, m, params, check=False)
                except RewriteError:
                    refused += 1
                    continue
                assert not problems(new), (r.name, problems(new)[:1])
                assert [new.shape(o) for o in new.outputs] == [pcg.shape(o) for o in pcg.outputs]
                applied += 1
    assert applied > 0


def _wrong_cache(tmp_path):
    """A cache of one wrong rule, Relu(x) = x, with its id, content hash and axioms hash all
    recomputed: every hash matches, only a proof can tell."""
    from unity_cli.substitutions.axioms import axioms_hash
    from unity_cli.substitutions.rule import Pattern, PatternNode, Rule, RuleSet

    relu = PatternNode("Unary", (("fn", "Relu"),), ("x",), ("y",))
    wrong = Rule(("x",), (), Pattern((relu,), ("y",)), Pattern((), ("x",)), name="relu-is-identity")
    path = tmp_path / "wrong.json"
    RuleSet((wrong,), {"max_ops": 1}, axioms_hash()).save(path)
    return path, wrong


def test_a_wrong_rule_with_matching_hashes_is_caught_before_the_plan_is_written(tmp_path):
    from click.testing import CliRunner
    from models.catalog import mlp_model

    from unity_cli.cli import cli
    from unity_cli.substitutions.cache import prove_applied

    path, wrong = _wrong_cache(tmp_path)
    rules = load_cache(path)                        # every hash checks out
    with pytest.raises(RuleError, match="relu-is-identity.*does not prove"):
        prove_applied(rules, [wrong.id], path)
    model = mlp_model(tmp_path / "mlp.onnx")
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--rules", str(path), "--out", str(out),
                                 "--strategy", "unity", "--max-candidates", "20"])
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert "relu-is-identity" in r.output and "does not prove" in r.output
    assert not out.exists()


def test_the_plan_records_the_rules_it_applies_as_proved(cache):
    from unity_cli.substitutions.cache import prove_applied

    rule = next(r for r in cache.rules if r.name)
    assert prove_applied(cache, [rule.id, rule.reversed().id, rule.id]) == (rule.id, rule.reversed().id)
    with pytest.raises(RuleError, match="not in it"):
        prove_applied(cache, ["0" * 16])


def test_a_cache_without_its_hashes_is_refused(tmp_path):
    doc = json.loads(PACKAGE_RULES.read_text())
    del doc["content_hash"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    with pytest.raises(RuleError, match="content_hash and every rule's id"):
        load_cache(bare)
    doc = json.loads(PACKAGE_RULES.read_text())
    for r in doc["rules"]:
        r.pop("id")
    bare.write_text(json.dumps(doc))
    with pytest.raises(RuleError, match="content_hash and every rule's id"):
        load_cache(bare)
