"""Substitution rules as data: two small graphs over pattern variables, and constraints.

A rule says ``src(inputs) = dst(inputs)``: wherever ``src`` matches a PCG, it may be
replaced by ``dst``, output for output. Rules are written in one canonical JSON form and
identified by the hash of that form (see ``substitutions/README.md``).

Pattern attributes are written so that one rule fits tensors of any rank: axes count from
the end (``-1`` is the last dim), a transpose is the permutation of the last dims it moves,
a split names its number of equal parts, and a parallel degree may be a parameter
(``{"param": "d"}``) bound when the rule matches.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import UnityError
from ..files import write_atomic
from ..ir.opspec import _REGISTRY, OpKind
from ..jsonfile import parse_json, read_bytes


class RuleError(UnityError):
    """A rule or rule file is malformed (names the rule and the field)."""


@dataclass(frozen=True, slots=True)
class Param:
    """A rule parameter standing for an attribute value (a parallel degree)."""

    name: str


AttrValue = int | float | str | bool | tuple | Param


@dataclass(frozen=True, slots=True)
class PatternNode:
    """One operator of a pattern: kind, pattern attributes, tensor names in and out."""

    kind: str
    attrs: tuple[tuple[str, AttrValue], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def attr(self, name: str) -> AttrValue:
        return dict(self.attrs)[name]


@dataclass(frozen=True, slots=True)
class Pattern:
    nodes: tuple[PatternNode, ...]
    outputs: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.nodes)

    def producers(self) -> dict[str, tuple[int, int]]:
        return {t: (i, k) for i, n in enumerate(self.nodes) for k, t in enumerate(n.outputs)}


@dataclass(frozen=True, slots=True)
class Constraint:
    """A condition on the matched tensors.

    ``kind`` is ``EQUAL``, ``UNEQUAL``, ``DIVISIBLE_BY`` (``a % b == 0``) or ``AT_LEAST``; each operand is
    an int, ``("param", name)``, ``("dim", tensor, axis)`` (a size), ``("degree", tensor,
    axis)``, ``("sum", tensor)``, ``("copy", tensor)``, ``("rank", tensor)``, or
    ``("shape", tensor)`` (its sizes, of any rank: for ``EQUAL`` only).
    """

    kind: str
    lhs: Any
    rhs: Any


CONSTRAINT_KINDS = ("EQUAL", "UNEQUAL", "DIVISIBLE_BY", "AT_LEAST")


@dataclass(frozen=True)
class Rule:
    inputs: tuple[str, ...]
    params: tuple[str, ...]
    src: Pattern
    dst: Pattern
    constraints: tuple[Constraint, ...] = ()
    name: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @cached_property
    def id(self) -> str:
        """Content hash of the canonical encoding (the name and metadata are not part of it)."""
        return hashlib.sha256(canonical(self._body()).encode()).hexdigest()[:16]

    @property
    def size(self) -> int:
        return max(self.src.size, self.dst.size)

    @property
    def is_parallel(self) -> bool:
        return any(n.kind in PARALLEL_KINDS for n in self.src.nodes + self.dst.nodes)

    @property
    def one_way(self) -> bool:
        """Whether the search applies it left to right only: read backwards it would match
        every tensor it can make (a transpose becomes two), and only ever cost."""
        return bool(self.meta.get("one_way"))

    @property
    def grouped_only(self) -> bool:
        """Whether only searches that price with the solver's device groups apply it (not the
        outer walk, which prices flat): a sibling fusion of unequal widths (families.py)."""
        return bool(self.meta.get("grouped_only"))

    @property
    def is_fusion(self) -> bool:
        """Whether it fuses an activation into its product, or undoes that: it saves launches
        and takes away the product's split along its contracted dim."""
        return any(k == "activation" and v for n in self.src.nodes + self.dst.nodes for k, v in n.attrs)

    @property
    def makes_attention(self) -> bool:
        """Whether it makes one memory-efficient Attention of the chain an export writes
        (``attention_rules.py``): the searches apply it wherever it matches before they choose
        the step's shape (``search/step.py``), since it decides what fits."""
        return any(n.kind == OpKind.Attention for n in self.dst.nodes)

    def reversed(self) -> Rule:
        """The rule read right to left (made once per rule: every search of a run reverses
        the same rules)."""
        return self._reversed

    @cached_property
    def _reversed(self) -> Rule:
        return Rule(self.inputs, self.params, self.dst, self.src, self.constraints, self.name, self.meta)

    def _body(self) -> dict[str, Any]:
        return {
            "inputs": list(self.inputs),
            "params": list(self.params),
            "src": _pattern_json(self.src),
            "dst": _pattern_json(self.dst),
            "constraints": [[c.kind, _plain(c.lhs), _plain(c.rhs)] for c in self.constraints],
        }

    def to_json(self) -> dict[str, Any]:
        out = self._body()
        out["id"] = self.id
        out["name"] = self.name
        if self.meta:
            out["meta"] = dict(self.meta)
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any], where: str = "rule") -> Rule:
        try:
            rule = Rule(
                tuple(_str_list(data["inputs"], f"{where}.inputs")),
                tuple(_str_list(data.get("params", []), f"{where}.params")),
                _pattern_from(data["src"], f"{where}.src"),
                _pattern_from(data["dst"], f"{where}.dst"),
                tuple(_constraint_from(c, f"{where}.constraints[{i}]")
                      for i, c in enumerate(data.get("constraints", []))),
                str(data.get("name", "")),
                dict(data.get("meta", {})),
            )
        except KeyError as e:
            raise RuleError(f"{where}: missing field {e.args[0]!r}") from None
        check_rule(rule, where)
        if "id" in data and data["id"] != rule.id:
            raise RuleError(f"{where}: id {data['id']} does not match its content (hash {rule.id}); "
                            "the rule was edited by hand")
        return rule


PARALLEL_KINDS = (OpKind.Repartition, OpKind.Combine, OpKind.Replicate, OpKind.Reduction)


def canonical(data: Any) -> str:
    """The one canonical JSON text of a value: sorted keys, no spaces."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _plain(v: Any) -> Any:
    if isinstance(v, Param):
        return {"param": v.name}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    return v


def _typed(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"param"}:
        return Param(str(v["param"]))
    if isinstance(v, list):
        return tuple(_typed(x) for x in v)
    return v


def _pattern_json(p: Pattern) -> dict[str, Any]:
    return {"nodes": [{"op": n.kind, "attrs": {k: _plain(v) for k, v in n.attrs},
                       "inputs": list(n.inputs), "outputs": list(n.outputs)} for n in p.nodes],
            "outputs": list(p.outputs)}


def _str_list(v: Any, where: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise RuleError(f"{where}: expected a list of names")
    return v


def _pattern_from(data: Any, where: str) -> Pattern:
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
        raise RuleError(f"{where}: expected {{nodes: [...], outputs: [...]}}")
    nodes = []
    for i, n in enumerate(data["nodes"]):
        w = f"{where}.nodes[{i}]"
        if not isinstance(n, Mapping) or not isinstance(n.get("op"), str):
            raise RuleError(f"{w}: expected an object with an 'op'")
        attrs = n.get("attrs", {})
        if not isinstance(attrs, Mapping):
            raise RuleError(f"{w}.attrs: expected an object")
        nodes.append(PatternNode(n["op"], tuple(sorted((str(k), _typed(v)) for k, v in attrs.items())),
                                 tuple(_str_list(n.get("inputs", []), f"{w}.inputs")),
                                 tuple(_str_list(n.get("outputs", []), f"{w}.outputs"))))
    return Pattern(tuple(nodes), tuple(_str_list(data.get("outputs"), f"{where}.outputs")))


def _constraint_from(data: Any, where: str) -> Constraint:
    if not isinstance(data, list) or len(data) != 3 or data[0] not in CONSTRAINT_KINDS:
        raise RuleError(f"{where}: expected [KIND, lhs, rhs] with KIND in {', '.join(CONSTRAINT_KINDS)}")
    return Constraint(data[0], _operand(data[1]), _operand(data[2]))


def _operand(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def check_rule(rule: Rule, where: str = "rule") -> None:
    """Structural sanity: names defined before use, outputs that exist, params declared."""

    for side, p in (("src", rule.src), ("dst", rule.dst)):
        known = set(rule.inputs)
        for i, n in enumerate(p.nodes):
            w = f"{where}.{side}.nodes[{i}]"
            if n.kind not in _REGISTRY:
                raise RuleError(f"{w}: unknown op {n.kind!r}")
            for t in n.inputs:
                if t not in known:
                    raise RuleError(f"{w}: input {t!r} is not a rule input or an earlier output")
            for t in n.outputs:
                if t in known:
                    raise RuleError(f"{w}: output {t!r} is defined twice")
                known.add(t)
            for k, v in n.attrs:
                for prm in _params_in(v):
                    if prm not in rule.params:
                        raise RuleError(f"{w}.attrs.{k}: parameter {prm!r} is not declared")
        for t in p.outputs:
            if t not in known:
                raise RuleError(f"{where}.{side}.outputs: {t!r} is not defined")
    if len(rule.src.outputs) != len(rule.dst.outputs):
        raise RuleError(f"{where}: src has {len(rule.src.outputs)} outputs, dst {len(rule.dst.outputs)}")
    if not rule.src.nodes:
        raise RuleError(f"{where}.src: a source pattern needs at least one op")


def _params_in(v: Any) -> Iterable[str]:
    if isinstance(v, Param):
        yield v.name
    elif isinstance(v, tuple):
        for x in v:
            yield from _params_in(x)


# ---------------------------------------------------------------------------
# Rule files


RULES_FORMAT = "unity-rules/1"


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    axioms_hash: str = ""
    rejected: tuple[Mapping[str, Any], ...] = ()
    sealed: bool = True     # read from a file that had its content_hash and every rule's id

    def content_hash(self) -> str:
        """SHA-256 over every rule's id (itself a hash of its canonical content), name and
        metadata, in order: a change to any rule, or to their order, changes it."""
        h = hashlib.sha256()
        for r in self.rules:
            h.update(canonical([r.id, r.name, dict(r.meta)]).encode() + b"\n")
        return h.hexdigest()

    def dumps(self) -> str:
        doc = {"format": RULES_FORMAT, "settings": dict(self.settings), "axioms_hash": self.axioms_hash,
               "content_hash": self.content_hash(), "rules": [r.to_json() for r in self.rules],
               "rejected": list(self.rejected)}
        return json.dumps(doc, sort_keys=True, indent=1) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        try:
            write_atomic(path, self.dumps())
        except OSError as e:
            raise RuleError(f"{path}: cannot write: {e.strerror}") from None


def load_rules(path: str | os.PathLike) -> RuleSet:
    """Read a rule file; a malformed or hand-edited file is a RuleError naming the rule.

    A process that reads the same bytes again (a benchmark or a test run planning many
    models) gets the same, immutable, RuleSet: it is looked up by the file's SHA-256."""
    p = Path(path)
    raw = read_bytes(p, RuleError, "rule file")
    digest = hashlib.sha256(raw).digest()
    hit = _LOADED.get(digest)
    if hit is None:
        hit = _parse_rules(parse_json(raw, p, RuleError, "rule file"), p)
        if len(_LOADED) >= 4:
            _LOADED.clear()
        _LOADED[digest] = hit
    return hit


_LOADED: dict[bytes, RuleSet] = {}


def _parse_rules(doc: Any, p: Path) -> RuleSet:
    if isinstance(doc, list):  # a bare list of rules
        doc = {"format": RULES_FORMAT, "rules": doc}
    if not isinstance(doc, Mapping) or doc.get("format") != RULES_FORMAT:
        raise RuleError(f"{p}: format: expected {RULES_FORMAT!r}")
    if not isinstance(doc.get("rules"), list):
        raise RuleError(f"{p}: rules: expected a list")
    rules = tuple(Rule.from_json(r, f"{p}: rules[{i}]") for i, r in enumerate(doc["rules"]))
    sealed = "content_hash" in doc and all(isinstance(r, Mapping) and "id" in r for r in doc["rules"])
    rs = RuleSet(rules, doc.get("settings", {}), doc.get("axioms_hash", ""), tuple(doc.get("rejected", ())),
                 sealed)
    if "content_hash" in doc and doc["content_hash"] != rs.content_hash():
        raise RuleError(f"{p}: content_hash does not match the rules in it (the file was edited or truncated)")
    return rs
