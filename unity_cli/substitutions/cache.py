"""The verified rule cache that ``unity optimize`` loads.

The repository keeps it at ``substitutions/rules.json``; the package ships the same file
as ``unity_cli/data/rules.json`` (a link in a checkout, a copy in an installed wheel).
A cache is refused when its content hash does not match its rules (edited or truncated)
or when it was proved under different axioms (stale: run ``unity verify-rules``).
"""
from __future__ import annotations

import os
from pathlib import Path

from .rule import RuleError, RuleSet, load_rules

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
    if check_axioms:
        from .axioms import axioms_hash

        current = axioms_hash()
        if rules.axioms_hash != current:
            raise RuleError(f"{p}: stale rule cache: it was proved under axioms {rules.axioms_hash[:12] or '?'}, "
                            f"the verifier now has {current[:12]}; regenerate it with 'unity verify-rules'")
    return rules
