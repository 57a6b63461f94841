"""Rule generation: TASO's method, extended to parallel operators.

1. **Enumerate** every graph of up to ``max_ops`` operators over a few unpartitioned
   input tensors, where every op type-checks (parallel shapes included) and no op is dead
   (every output but the last op's is consumed). Graphs are hash-consed: a node is its
   structural hash (the one ``PCG.node_hashes`` computes), so equal graphs built in
   different orders are one graph, and a partial graph is explored once.
2. **Fingerprint** each graph by its outputs' exact values on seeded integer inputs, their
   parallel shapes and the inputs it uses; graphs with equal fingerprints form a class.
   Each graph is evaluated a second time with another degree on larger inputs, so graphs
   that agree only at one degree (``Scale(x, 2)`` and ``Add(x, x)``) are not one class,
   and every rule holds with the degree as a parameter ``d``.
3. **Pair** each graph with its class's representative (fewest ops, then smallest term)
   into a candidate rule over inputs renamed by first use, with explicit constraints.
4. **Prune** redundant candidates: (1) renamings of one rule, (2) rules whose sides share
   a common subgraph, (3) rules whose sides apply the same op to equivalent operands,
   (4) trivial rules, (5) rules implied by an equivalence of subterms and a smaller rule.

The survivors go to the z3 verifier; a false candidate (a fingerprint collision) is
rejected there.
"""
from __future__ import annotations

import collections
import itertools
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ..ir.ops.elementwise import ScaleAttrs
from ..ir.ops.parallel import (
    CombineAttrs,
    ReductionAttrs,
    RepartitionAttrs,
    ReplicateAttrs,
)
from ..ir.opspec import OpKind
from ..ir.shapes import ParallelTensorShape, TensorShape
from .codec import to_pattern
from .enumeration import (  # noqa: F401  (re-exported: the generator's API)
    DEFAULT_OPS,
    Enumeration,
    GeneratorSettings,
    GNode,
    ProgressFn,
    Ref,
    enumerate_graphs,
    input_values,
)
from .rule import Constraint, Param, Pattern, PatternNode, Rule


@dataclass
class Generated:
    """The candidate rules (ordered by size, then id) and how many survived each step."""

    rules: list[Rule]
    stats: dict[str, Any] = field(default_factory=dict)

    def stats_counts(self) -> dict[str, int]:
        return {k: v for k, v in self.stats.items() if isinstance(v, int)}


# ---------------------------------------------------------------------------
# Candidate rules


PARAM = "d"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _rule_inputs(en: Enumeration, src: str, dst: str) -> dict[str, str]:
    """Rename inputs by first use, source then target, so renamings of a rule collapse."""
    return {name: LETTERS[i] for i, name in enumerate(en.input_order([src, dst]))}


def pattern_of(en: Enumeration, root: str, names: dict[str, str], params: dict[int, Param] | None) -> Pattern:
    """One side of a rule: the graph's op nodes in canonical order over renamed inputs."""
    tensors = {(n.h, 0): names[n.name] for n in en.inputs if n.name in names}
    nodes = []
    for h in en.order(root):
        n = en.nodes[h]
        ins = tuple(tensors[r] for r in n.inputs)
        outs = []
        for k in range(len(n.shapes)):
            tensors[(h, k)] = f"t{len(tensors) - len(names)}"
            outs.append(tensors[(h, k)])
        rank = en.nodes[n.inputs[0][0]].shapes[n.inputs[0][1]].rank
        nodes.append(PatternNode(n.kind, to_pattern(n.kind, n.op, rank, params), ins, tuple(outs)))
    return Pattern(tuple(nodes), tuple(tensors[(root, k)] for k in range(len(en.nodes[root].shapes))))


def make_rule(en: Enumeration, src: str, dst: str) -> Rule:
    """The rule ``src = dst`` between two enumerated graphs, with its constraints."""
    names = _rule_inputs(en, src, dst)
    d = en.settings.degree
    uses_degree = any(_degree_of(en.nodes[h].op) == d for r in (src, dst) for h in en.order(r))
    params = {d: Param(PARAM)} if uses_degree else None
    sp, dp = pattern_of(en, src, names, params), pattern_of(en, dst, names, params)
    degree_operand: Any = ("param", PARAM) if params else d
    cons = _constraints(en, src, dst, names, degree_operand)
    return Rule(tuple(names.values()), (PARAM,) if params else (), sp, dp, cons)


def _degree_of(op: Any) -> int | None:
    if isinstance(op, RepartitionAttrs | CombineAttrs | ReplicateAttrs | ReductionAttrs):
        return op.degree
    if isinstance(op, ScaleAttrs):
        return op.factor
    return None


# Symbolic sizes: a dim's size as a linear form over the rule inputs' dims.
Atom = tuple[str, int]              # (rule input, negative axis)
Form = tuple[tuple[Atom, Fraction], ...]


def _form_add(a: Form | None, b: Form | None) -> Form | None:
    if a is None or b is None:
        return None
    acc = collections.Counter(dict(a)) + collections.Counter(dict(b))
    return tuple(sorted((k, v) for k, v in acc.items() if v))


def _form_div(a: Form | None, p: int) -> Form | None:
    return None if a is None else tuple((k, v / p) for k, v in a)


class _Sizes:
    """Walks one side of a rule, tracking each dim's size as a linear form, and collects
    what the rule needs of its inputs' sizes."""

    def __init__(self, en: Enumeration, names: dict[str, str]):
        self.en = en
        self.forms: dict[Ref, list[Form | None]] = {}
        for n in en.inputs:
            if n.name in names:
                h, r = n.h, n.shapes[0].rank
                self.forms[(h, 0)] = [(((names[n.name], a - r), Fraction(1)),) for a in range(r)]
        self.equal: list[tuple[Form | None, Form | None]] = []
        self.divisible: list[Form | None] = []                 # sizes that are repartitioned
        self.aligned: list[tuple[Form | None, int]] = []       # (size, parts) of a Split
        self.contracted: list[Form | None] = []

    def walk(self, root: str) -> None:
        for h in self.en.order(root):
            n = self.en.nodes[h]
            ins = [self.forms[r] for r in n.inputs]
            outs = self._node(n, ins)
            for k in range(len(n.shapes)):
                self.forms[(h, k)] = outs[k] if outs is not None else [None] * n.shapes[k].rank

    def _node(self, n: GNode, ins: list[list[Form | None]]) -> list[list[Form | None]] | None:
        op, x = n.op, ins[0]
        match n.kind:
            case OpKind.Unary | OpKind.Scale | OpKind.Combine | OpKind.Replicate | OpKind.Reduction:
                return [list(x)]
            case OpKind.Repartition:
                self.divisible.append(x[op.dim])
                return [list(x)]
            case OpKind.Binary:
                self.equal += list(zip(x, ins[1], strict=False))
                return [list(x)]
            case OpKind.Transpose:
                return [[x[p] for p in op.perm]]
            case OpKind.MatMul if len(x) == 2 and len(ins[1]) == 2:
                self.equal.append((x[1], ins[1][0]))
                self.contracted += [x[1], ins[1][0]]
                return [[x[0], ins[1][1]]]
            case OpKind.Concat:
                out = list(x)
                for other in ins[1:]:
                    self.equal += [(a, b) for k, (a, b) in enumerate(zip(x, other, strict=False)) if k != op.axis]
                    out[op.axis] = _form_add(out[op.axis], other[op.axis])
                return [out]
            case OpKind.Split:
                parts = len(op.sizes)
                self.aligned.append((x[op.axis], parts))
                return [[_form_div(f, parts) if k == op.axis else f for k, f in enumerate(x)] for _ in op.sizes]
        return None


def _constraints(en: Enumeration, src: str, dst: str, names: dict[str, str], degree: Any) -> tuple[Constraint, ...]:
    """What the rule needs of its inputs beyond type-checking its source.

    * every input without partial sums (the rules were found on unpartitioned inputs, and
      a Reduction's meaning depends on its input's partial sums);
    * dims that are repartitioned or split divisible by the degree or the parts;
    * equal sizes where a Split must cut a Concat at its seam, and the equalities the
      target's type-checking needs that the source's does not imply;
    * in rules with a Reduction, no split of the input dims that get contracted (else a
      contraction would leave partial sums where the rule was found with none).
    """
    out: set[Constraint] = {Constraint("EQUAL", ("sum", x), 1) for x in names.values()}
    s, d = _Sizes(en, names), _Sizes(en, names)
    s.walk(src)
    d.walk(dst)
    for f in s.divisible + d.divisible:
        for atom, coef in f or ():
            m = coef.denominator
            if m > 1:
                out.add(Constraint("DIVISIBLE_BY", ("dim", *atom), m))
            out.add(Constraint("DIVISIBLE_BY", ("dim", *atom), degree))
    for f, parts in s.aligned + d.aligned:
        atoms = list(f or ())
        coefs = {c for _, c in atoms}
        if len(atoms) == 1 or len(coefs) > 1:
            for atom, coef in atoms:
                q = coef.denominator * parts // math.gcd(coef.numerator, parts)
                if q > 1:
                    out.add(Constraint("DIVISIBLE_BY", ("dim", *atom), q))
        elif atoms:
            # A Split of a Concat of equal parts: the halves fall on the seams only if equal.
            (a0, coef), rest = atoms[0], atoms[1:]
            out.update(Constraint("EQUAL", *sorted((("dim", *a0), ("dim", *a)))) for a, _ in rest)
            q = coef.denominator * parts // math.gcd(coef.numerator * len(atoms), parts)
            if q > 1:
                out.add(Constraint("DIVISIBLE_BY", ("dim", *a0), q))
    # Target equalities the source does not already force.
    uf: dict[Atom, Atom] = {}

    def find(a: Atom) -> Atom:
        while uf.get(a, a) != a:
            a = uf[a]
        return a

    def single(f: Form | None) -> tuple[Atom, Fraction] | None:
        return f[0] if f is not None and len(f) == 1 else None

    for a, b in s.equal:
        sa, sb = single(a), single(b)
        if sa and sb and sa[1] == sb[1]:
            uf[find(sa[0])] = find(sb[0])
    for a, b in d.equal:
        sa, sb = single(a), single(b)
        if sa and sb and sa[1] == sb[1] and find(sa[0]) != find(sb[0]):
            uf[find(sa[0])] = find(sb[0])
            out.add(Constraint("EQUAL", *sorted((("dim", *sa[0]), ("dim", *sb[0])))))
    kinds = {en.nodes[h].kind for r in (src, dst) for h in en.order(r)}
    if OpKind.Reduction in kinds:
        for f in s.contracted + d.contracted:
            for atom, _ in f or ():
                out.add(Constraint("EQUAL", ("degree", atom[0], atom[1]), 1))
    return tuple(sorted(out, key=lambda c: repr((c.kind, c.lhs, c.rhs))))


def _same_root(en: Enumeration, a: str, b: str) -> bool:
    """Both sides apply one op (same attributes) to pairwise equivalent operands."""
    na, nb = en.nodes[a], en.nodes[b]
    if na.is_input or nb.is_input or na.op != nb.op:
        return False
    # Operands from one node: equivalent as whole graphs (all outputs), so a rule relates them.
    return all(x[1] == y[1] and en.nodes[x[0]].fps == en.nodes[y[0]].fps
               for x, y in zip(na.inputs, nb.inputs, strict=True))


def _common_subgraph(en: Enumeration, a: str, b: str) -> bool:
    """Both sides contain an identical op applied to identical inputs."""
    return not set(en.order(a)).isdisjoint(en.order(b))


def _implied_by_subterms(en: Enumeration, src: str, dst: str) -> bool:
    """``src`` has a subterm ``S1`` and ``dst`` an equivalent one ``S2`` (a smaller rule
    ``S1 = S2``), and ``src[S1 := z] = dst[S2 := z]`` holds for a fresh input ``z`` (a
    smaller rule over at most as many inputs): together they imply ``src = dst``."""
    s = en.settings
    ok_shape = ParallelTensorShape.unpartitioned(TensorShape(tuple(s.input_dims)))
    side_a = [h for h in en.order(src) if h != src] + [n.h for n in en.inputs if n.name in en.input_order([src])]
    side_b = [h for h in en.order(dst) if h != dst] + [n.h for n in en.inputs if n.name in en.input_order([dst])]
    for h1, h2 in itertools.product(side_a, side_b):
        n1, n2 = en.nodes[h1], en.nodes[h2]
        if (n1.is_input and n2.is_input) or n1.fps != n2.fps or n1.shapes != (ok_shape,):
            continue
        for trial in range(2):
            feed = input_values(s, seed=s.seed + 10 + trial)
            z = (np.random.default_rng(s.seed + 20 + trial).integers(-4, 5, size=s.input_dims).astype(np.int64),)
            reached: set[str] = set()
            a = en.evaluate(src, feed, {h1: z}, reached)
            b = en.evaluate(dst, feed, {h2: z}, reached)
            if len(reached) + 1 > s.n_inputs or not all(np.array_equal(u, v) for u, v in zip(a, b, strict=True)):
                break
        else:
            return True
    return False


def candidate_pairs(en: Enumeration) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """Each graph paired with its class's representative (fewest ops, then smallest term
    with inputs renamed by first use, then smallest term): (graph, representative)."""
    classes: dict[str, list[str]] = {}
    for r in en.roots:
        classes.setdefault(en.graph_fingerprint(r), []).append(r)

    def rep_key(r: str) -> tuple:
        names = {x: LETTERS[i] for i, x in enumerate(en.input_order([r]))}
        return (en.nodes[r].n_ops, en.text(r, names), en.text(r))

    pairs: list[tuple[str, str]] = []
    for members in classes.values():
        if len(members) > 1:
            members = sorted(members, key=rep_key)
            pairs += [(m, members[0]) for m in members[1:]]
    stats = {"graphs": len(en.roots), "classes": len(classes),
             "classes_with_rules": sum(len(m) > 1 for m in classes.values()), "candidates": len(pairs)}
    return pairs, stats


def generate(settings: GeneratorSettings = GeneratorSettings(), progress: ProgressFn | None = None) -> Generated:
    """Enumerate, fingerprint, pair and prune (see the module docstring).

    ``progress`` is called with (done, total) now and then, in thousandths of the run.
    """
    t0 = time.monotonic()
    en = enumerate_graphs(settings, progress, (0, 500, 1000))
    pairs, stats = candidate_pairs(en)

    # (1) renamings: one rule once inputs are renamed by first use (source, then target).
    unique: dict[tuple[str, str], tuple[str, str]] = {}
    for src, dst in pairs:
        names = _rule_inputs(en, src, dst)
        unique.setdefault((en.text(src, names), en.text(dst, names)), (src, dst))
    kept = list(unique.values())
    stats["after_renamings"] = len(kept)
    # (2) common subgraphs, (3) the same op on equivalent operands: implied by smaller rules.
    kept = [(a, b) for a, b in kept if not _common_subgraph(en, a, b)]
    stats["after_common_subgraph"] = len(kept)
    kept = [(a, b) for a, b in kept if not _same_root(en, a, b)]
    stats["after_same_root"] = len(kept)
    # (4) trivial rules and rules without a source op.
    kept = [(a, b) for a, b in kept if a != b and en.nodes[a].n_ops > 0]
    stats["after_trivial"] = len(kept)
    # (5) an equivalence of subterms plus a smaller rule over a fresh input.
    survivors = []
    for i, (a, b) in enumerate(kept):
        if not _implied_by_subterms(en, a, b):
            survivors.append((a, b))
        if progress and i % 256 == 0:
            progress(500 + 400 * i // len(kept), 1000)
    stats["after_equivalent_subterms"] = len(survivors)

    rules: dict[str, Rule] = {}
    for rule in (make_rule(en, src, dst) for src, dst in survivors):
        rules.setdefault(rule.id, rule)
    stats["rules"] = len(rules)
    stats["parametric_rules"] = sum(bool(r.params) for r in rules.values())
    stats["seconds_enumeration"] = round(en.seconds, 2)
    stats["seconds"] = round(time.monotonic() - t0, 2)
    if progress:
        progress(1000, 1000)
    return Generated(sorted(rules.values(), key=lambda r: (r.size, r.id)), stats)
