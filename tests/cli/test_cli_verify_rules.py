"""`unity verify-rules`: regenerate (small), check a file, report failures with exit 1."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "substitutions"))
from test_rule_format import relu_concat  # noqa: E402

from unity_cli.substitutions.cache import PACKAGE_RULES
from unity_cli.substitutions.rule import Param, Pattern, PatternNode, Rule, RuleSet, load_rules

UNITY = str(Path(sys.executable).parent / "unity")


def run(*args):
    return subprocess.run([UNITY, *args], capture_output=True, text=True, timeout=600)


def wrong_rule() -> Rule:
    """Relu(a + b) = Relu(a) + Relu(b): false."""
    src = Pattern((PatternNode("Binary", (("fn", "Add"),), ("a", "b"), ("s",)),
                   PatternNode("Unary", (("fn", "Relu"),), ("s",), ("r",))), ("r",))
    dst = Pattern((PatternNode("Unary", (("fn", "Relu"),), ("a",), ("ra",)),
                   PatternNode("Unary", (("fn", "Relu"),), ("b",), ("rb",)),
                   PatternNode("Binary", (("fn", "Add"),), ("ra", "rb"), ("o",))), ("o",))
    return Rule(("a", "b"), (), src, dst, name="relu-add")


def not_identity() -> Rule:
    d = Param("d")
    src = Pattern((PatternNode("Replicate", (("degree", d),), ("x",), ("r",)),
                   PatternNode("Reduction", (("degree", d),), ("r",), ("y",))), ("y",))
    return Rule(("x",), ("d",), src, Pattern((), ("x",)), name="replicate-reduction-identity")


def test_regenerate_small_json(tmp_path):
    out = tmp_path / "rules.json"
    p = run("verify-rules", "--max-ops", "2", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    for key in ("rules", "verified", "rejected", "seconds", "counts", "by_size"):
        assert key in doc
    assert doc["verified"] == doc["rules"] > 100
    assert len(load_rules(out).rules) == doc["rules"]


def test_check_passes_on_every_rule_of_the_shipped_cache():
    """Every shipped rule proves again with z3 (about 20 s on two cores)."""
    p = run("verify-rules", "--check", str(PACKAGE_RULES), "--jobs", "2", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["verified"] == len(load_rules(PACKAGE_RULES).rules) and not doc["rejected"]


def test_check_fails_listing_each_wrong_rule(tmp_path):
    path = tmp_path / "bad.json"
    RuleSet((relu_concat(), wrong_rule(), not_identity())).save(path)
    p = run("verify-rules", "--check", str(path), "--json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["verified"] == 1
    rejected = {r["id"]: r["reason"] for r in doc["rejected"]}
    assert set(rejected) == {wrong_rule().id, not_identity().id}
    assert all(reason for reason in rejected.values())
    text = run("verify-rules", "--check", str(path))
    assert text.returncode == 1 and wrong_rule().id in text.stdout


def test_check_of_a_broken_file_is_one_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{")
    p = run("verify-rules", "--check", str(path))
    assert p.returncode == 1
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_optimize_loads_the_cache_and_refuses_a_stale_one(tmp_path, tiny_models):
    plan = tmp_path / "plan.json"
    p = run("optimize", str(tiny_models / "convnet_tiny.onnx"), "--cluster",
            str(Path(__file__).resolve().parents[2] / "cluster_specs" / "dgx-a100-8.yaml"), "--out", str(plan))
    assert p.returncode == 0, p.stderr
    assert json.loads(plan.read_text())["search"]["rules_loaded"] == len(load_rules(PACKAGE_RULES).rules)
    doc = json.loads(PACKAGE_RULES.read_text())
    doc["axioms_hash"] = "f" * 64
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(doc))
    p = run("optimize", str(tiny_models / "convnet_tiny.onnx"), "--rules", str(stale), "--out", str(plan))
    assert p.returncode == 1
    assert "stale rule cache" in p.stderr and "unity verify-rules" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
