"""The verified rule cache that ``unity optimize`` loads.

The repository keeps it at ``substitutions/rules.json``; the package ships the same file
as ``unity_cli/data/rules.json`` (a link in a checkout, a copy in an installed wheel).
A cache is refused when its content hash does not match its rules (edited or truncated)
or when it was proved under different axioms (stale: run ``unity verify-rules``).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .axioms import axioms_hash
from .rule import Rule, RuleError, RuleSet, load_rules
from .verify import verify_rule

PACKAGE_RULES = Path(__file__).resolve().parents[1] / "data" / "rules.json"
REPO_RULES = Path(__file__).resolve().parents[2] / "substitutions" / "rules.json"


def default_rules_path() -> Path:
    return PACKAGE_RULES


def default_output_path() -> Path:
    """Where ``unity verify-rules`` writes by default: the repo's cache in a checkout."""
    return REPO_RULES if REPO_RULES.parent.is_dir() else PACKAGE_RULES


def load_cache(path: str | os.PathLike | None = None, check_axioms: bool = True) -> RuleSet:
    p = Path(path) if path else default_rules_path()
    rules = load_rules(p)
    if not rules.sealed:
        raise RuleError(f"{p}: a rule cache needs its content_hash and every rule's id, and this one lacks "
                        "them (edited by hand?): regenerate it with 'unity verify-rules'")
    if check_axioms:
        current = axioms_hash()
        if rules.axioms_hash != current:
            raise RuleError(f"{p}: stale rule cache: it was proved under axioms {rules.axioms_hash[:12] or '?'}, "
                            f"the verifier now has {current[:12]}; regenerate it with 'unity verify-rules'")
    return rules


PROOF_TIMEOUT_MS = 60_000
"""z3's limit per rule when ``optimize`` re-proves the rules its plan applies. The proof's
work is bounded by a count (``verify.MAX_INSTANCES``); this limit is only a safety net, set
far above what any cached rule needs, so a loaded machine never fails a correct rule."""


def prove_applied(rules: RuleSet, rule_ids: Iterable[str], source: str | os.PathLike = "the rule cache",
                  timeout_ms: int = PROOF_TIMEOUT_MS) -> tuple[str, ...]:
    """Prove again, with z3, each rule a plan applies (by id, either direction), before the
    plan is written: a cache edited so that a wrong rule keeps matching ids and hashes is
    caught here. Returns the distinct ids proved, in order; a RuleError names a rule that
    does not prove (or is not in the cache)."""

    wanted = list(dict.fromkeys(rule_ids))
    found: dict[str, Rule] = {r.id: r for r in rules.rules if r.id in wanted}
    missing = set(wanted) - set(found)
    for r in rules.rules if missing else ():      # applied target -> source: the reversed rule's id
        rid = r.reversed().id
        if rid in missing:
            found[rid] = r
            missing.discard(rid)
            if not missing:
                break
    if missing:
        raise RuleError(f"{source}: the plan applies rule {sorted(missing)[0]}, which is not in it")
    for rid in wanted:
        rule = found[rid]
        verdict = verify_rule(rule, timeout_ms)
        if not verdict.accepted:
            raise RuleError(f"{source}: rule {rule.id} ({rule.name or 'unnamed'}), which the plan applies, does "
                            f"not prove: {verdict.reason}; the cache is wrong or was edited: regenerate it with "
                            "'unity verify-rules'")
    return tuple(wanted)
