"""What ``unity verify-rules`` does: generate, prove, write the cache; or re-prove a file."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ir.opspec import OpKind
from .axioms import axioms_hash
from .cache import default_output_path
from .families import FAMILY_RULES
from .generator import GeneratorSettings, generate
from .parallel_rules import PARALLEL_RULES
from .rule import Param, Pattern, Rule, RuleSet, load_rules
from .verify import verify_all

ProgressFn = Callable[[int, int], None]


@dataclass
class Report:
    rules: int = 0
    verified: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    counts: dict[str, Any] = field(default_factory=dict)
    by_size: dict[str, int] = field(default_factory=dict)
    out: str | None = None

    def rejected_by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(r["reason"].split(":")[0] for r in self.rejected).items()))

    def to_json(self) -> dict[str, Any]:
        return {"rules": self.rules, "verified": self.verified, "rejected": self.rejected,
                "rejected_by_reason": self.rejected_by_reason(), "seconds": round(self.seconds, 3),
                "counts": self.counts, "by_size": self.by_size, "out": self.out}

    def summary(self) -> str:
        lines = []
        for k, v in self.counts.items():
            lines.append(f"{k.replace('_', ' '):<28}{v:>10}")
        lines.append(f"{'verified':<28}{self.verified:>10}")
        lines.append(f"{'rejected':<28}{len(self.rejected):>10}")
        for reason, n in self.rejected_by_reason().items():
            lines.append(f"  {reason:<26}{n:>10}")
        if self.by_size:
            sizes = ", ".join(f"{k}: {v}" for k, v in self.by_size.items())
            lines.append(f"{'verified rules by size':<28}{sizes:>10}")
        lines.append(f"{'seconds':<28}{self.seconds:>10.1f}")
        if self.out:
            lines.append(f"wrote {self.rules} rules to {self.out}")
        if self.rejected and not self.out:
            lines.append("failed:")
            lines += [f"  {r['id']}  {r['reason']}" for r in self.rejected]
        return "\n".join(lines)


def pretty(p: Pattern, inputs: Sequence[str] = ()) -> str:
    """A one-line term for a pattern's first output, e.g. ``Relu(Concat(a, b, axis=-1))``."""
    producers = p.producers()

    def term(t: str) -> str:
        if t not in producers:
            return t
        i, k = producers[t]
        n = p.nodes[i]
        name = dict(n.attrs).get("fn", n.kind) if n.kind in (OpKind.Unary, OpKind.Binary) else n.kind
        args = [term(x) for x in n.inputs]
        args += [f"{a}={_fmt(v)}" for a, v in n.attrs if a != "fn"]
        sel = f"[{k}]" if len(n.outputs) > 1 else ""
        return f"{name}({', '.join(args)}){sel}"

    return ", ".join(term(t) for t in p.outputs)


def _fmt(v: Any) -> str:
    if isinstance(v, Param):
        return v.name
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt(x) for x in v) + ")"
    return str(v)


def named(rule: Rule) -> Rule:
    if rule.name:
        return rule
    return Rule(rule.inputs, rule.params, rule.src, rule.dst, rule.constraints,
                f"{pretty(rule.src)} = {pretty(rule.dst)}", rule.meta)


def regenerate(max_ops: int, out_path: str | None, timeout_ms: int, jobs: int, progress: ProgressFn) -> Report:
    t0 = time.monotonic()
    settings = GeneratorSettings(max_ops=max_ops)
    gen = generate(settings, progress=progress)
    candidates = [named(r) for r in gen.rules] + [named(r) for r in PARALLEL_RULES + FAMILY_RULES]
    seen: dict[str, Rule] = {}
    for r in candidates:
        seen.setdefault(r.id, r)
    candidates = sorted(seen.values(), key=lambda r: (r.size, r.id))
    verdicts = verify_all(candidates, timeout_ms, jobs=jobs, progress=progress)
    kept = [r for r, v in zip(candidates, verdicts, strict=True) if v.accepted]
    rejected = [{"id": v.rule_id, "reason": v.reason} for v in verdicts if not v.accepted]
    report = Report(rules=len(kept), verified=len(kept), rejected=rejected)
    report.counts = {**gen.stats_counts(), "hand_written_parallel_rules": len(PARALLEL_RULES),
                     "rule_family_instances": len(FAMILY_RULES),
                     "candidates_verified": len(candidates)}
    report.by_size = {f"{k} ops": v for k, v in sorted(Counter(r.size for r in kept).items())}
    out = Path(out_path) if out_path else default_output_path()
    doc_settings = {**settings.to_json(), "timeout_ms": timeout_ms}
    RuleSet(tuple(kept), doc_settings, axioms_hash(), tuple(rejected)).save(out)
    report.out = str(out)
    report.seconds = time.monotonic() - t0
    return report


def check_file(path: str, timeout_ms: int, jobs: int, progress: ProgressFn) -> Report:
    t0 = time.monotonic()
    rules = load_rules(path).rules
    verdicts = verify_all(list(rules), timeout_ms, jobs=jobs, progress=progress)
    rejected = [{"id": v.rule_id, "reason": v.reason} for v in verdicts if not v.accepted]
    report = Report(rules=len(rules), verified=len(rules) - len(rejected), rejected=rejected)
    report.counts = {"rules_in_file": len(rules)}
    report.seconds = time.monotonic() - t0
    return report
