"""The rule generator: enumeration, fingerprints, candidate rules and their pruning."""
from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from unity_cli.errors import ShapeError
from unity_cli.ir.ops.elementwise import BinaryAttrs, ScaleAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import ReductionAttrs, RepartitionAttrs, ReplicateAttrs
from unity_cli.ir.ops.shape_ops import ConcatAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.opspec import spec_by_kind, spec_of
from unity_cli.ir.pcg import PCG, GraphBuilder, TensorRef
from unity_cli.ir.shapes import ParallelTensorShape, TensorShape
from unity_cli.substitutions.codec import build_side, to_pattern
from unity_cli.substitutions.enumeration import OPS, _op, graph_hash
from unity_cli.substitutions.generator import (
    DEFAULT_OPS,
    GeneratorSettings,
    _common_subgraph,
    _implied_by_subterms,
    _same_root,
    enumerate_graphs,
    generate,
    input_values,
)
from unity_cli.substitutions.pieces import assemble, evaluate_pieces
from unity_cli.substitutions.rule import Constraint, Param, Pattern, PatternNode, Rule, check_rule
from unity_cli.substitutions.semantics import evaluate

REPO = Path(__file__).resolve().parents[2]
SMALL = GeneratorSettings(max_ops=2)
FOCUS = GeneratorSettings(ops=("MatMul", "Add", "Relu", "Concat1", "Repartition0", "Repartition1",
                               "Replicate", "Reduction", "Scale"))


@pytest.fixture(scope="module")
def small():
    return generate(SMALL)


@pytest.fixture(scope="module")
def small_enum():
    return enumerate_graphs(SMALL)


@pytest.fixture(scope="module")
def focus():
    """The one max_ops=3 run: a restricted op set that still holds every rule asked for."""
    return generate(FOCUS)


# ---------------------------------------------------------------------------
# Rules up to renaming and direction


def _term(p: Pattern, t: str, names: dict[str, str]) -> str:
    producers = p.producers()
    if t not in producers:
        return names.setdefault(t, f"v{len(names)}")
    i, k = producers[t]
    n = p.nodes[i]
    return f"{n.kind}{n.attrs}({','.join(_term(p, x, names) for x in n.inputs)})#{k}"


def rule_key(src: Pattern, dst: Pattern) -> str:
    names: dict[str, str] = {}
    return repr(([_term(src, t, names) for t in src.outputs], [_term(dst, t, names) for t in dst.outputs]))


def find_rule(rules: list[Rule], src: Pattern, dst: Pattern) -> Rule | None:
    """A generated rule equal to ``src = dst`` up to renaming its inputs and direction."""
    want = {rule_key(src, dst), rule_key(dst, src)}
    return next((r for r in rules if rule_key(r.src, r.dst) in want), None)


def side(build) -> Pattern:
    """A pattern from a function of a GraphBuilder and three [4,4] inputs (degree 2 -> d)."""
    b = GraphBuilder()
    xs = [b.add1(InputAttrs(TensorShape((4, 4))), (), name) for name in ("a", "b", "c")]
    g = b.build([build(b, *xs)])
    names = {(i, 0): n.name for i, n in g if n.spec.is_source}
    nodes = []
    for i, n in g:
        if n.spec.is_source:
            continue
        outs = tuple(f"t{i}_{k}" for k in range(len(n.outputs)))
        names.update(((i, k), o) for k, o in enumerate(outs))
        rank = g.shape(n.inputs[0]).rank
        nodes.append(PatternNode(n.kind, to_pattern(n.kind, n.op, rank, {2: Param("d")}),
                                 tuple(names[(r.node, r.index)] for r in n.inputs), outs))
    return Pattern(tuple(nodes), tuple(names[(r.node, r.index)] for r in g.outputs))


def op(b: GraphBuilder, attrs, *xs):
    return b.add1(attrs, list(xs))


RELU, MM, ADD = UnaryAttrs("Relu"), MatMulAttrs(), BinaryAttrs("Add")
EXPECTED = {
    "relu_commutes_with_repartition": (
        lambda b, x, y, z: op(b, RELU, op(b, RepartitionAttrs(1, 2), x)),
        lambda b, x, y, z: op(b, RepartitionAttrs(1, 2), op(b, RELU, x))),
    "data_parallel_matmul": (
        lambda b, x, w, z: op(b, MM, op(b, RepartitionAttrs(0, 2), x), op(b, ReplicateAttrs(2), w)),
        lambda b, x, w, z: op(b, RepartitionAttrs(0, 2), op(b, MM, x, w))),
    "concat_of_matmuls_sharing_x": (
        lambda b, x, w1, w2: op(b, ConcatAttrs(1), op(b, MM, x, w1), op(b, MM, x, w2)),
        lambda b, x, w1, w2: op(b, MM, x, op(b, ConcatAttrs(1), w1, w2))),
    "relu_commutes_with_concat": (
        lambda b, x, y, z: op(b, RELU, op(b, ConcatAttrs(1), x, y)),
        lambda b, x, y, z: op(b, ConcatAttrs(1), op(b, RELU, x), op(b, RELU, y))),
    "matmul_associates": (
        lambda b, x, y, z: op(b, MM, op(b, MM, x, y), z),
        lambda b, x, y, z: op(b, MM, x, op(b, MM, y, z))),
    "matmul_distributes_over_add": (
        lambda b, x, y, w: op(b, ADD, op(b, MM, x, w), op(b, MM, y, w)),
        lambda b, x, y, w: op(b, MM, op(b, ADD, x, y), w)),
    "reduction_of_replicas_scales": (
        lambda b, x, y, z: op(b, ReductionAttrs(2), op(b, ReplicateAttrs(2), x)),
        lambda b, x, y, z: op(b, ScaleAttrs(2), x)),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_rule_asked_for_is_generated(focus, name):
    src, dst = (side(f) for f in EXPECTED[name])
    rule = find_rule(focus.rules, src, dst)
    assert rule is not None, f"{name} is not among {len(focus.rules)} rules"
    uses_degree = any(isinstance(v, Param) for n in src.nodes + dst.nodes for _, v in n.attrs)
    assert rule.params == (("d",) if uses_degree else ())


def test_data_parallel_rule_constrains_the_split_dim(focus):
    src, dst = (side(f) for f in EXPECTED["data_parallel_matmul"])
    rule = find_rule(focus.rules, src, dst)
    x = next(n for n in rule.src.nodes + rule.dst.nodes if n.kind == "Repartition").inputs
    x = x[0] if x[0] in rule.inputs else next(n.inputs[0] for n in rule.src.nodes + rule.dst.nodes
                                              if n.kind == "MatMul" and n.inputs[0] in rule.inputs)
    assert Constraint("DIVISIBLE_BY", ("dim", x, -2), ("param", "d")) in rule.constraints


def test_focused_run_sizes(focus):
    s = focus.stats
    assert s["graphs"] > 10_000 and 300 < s["rules"] < 3000
    assert max(r.size for r in focus.rules) == 3


# ---------------------------------------------------------------------------
# Enumeration


def test_enumerated_graphs_are_valid_distinct_and_without_dead_ops(small_enum):
    en = small_enum
    hashes = set()
    for root in en.roots:
        g = en.pcg(root)
        n = en.nodes[root]
        assert g.canonical_hash == graph_hash(n)
        hashes.add(g.canonical_hash)
        ops = [i for i, node in g if not node.spec.is_source]
        assert len(ops) == n.n_ops <= SMALL.max_ops
        assert {node.name for _, node in g if node.spec.is_source} == set(en.input_order([root]))
        last = len(g) - 1
        assert [r.node for r in g.outputs] == [last] * len(g.nodes[last].outputs)
        for i in ops[:-1]:
            read = {g.nodes[c].inputs[pos].index for c, pos in g.consumers[i]}
            assert read == set(range(len(g.nodes[i].outputs))), f"dead output in {en.text(root)}"
    assert len(hashes) == len(en.roots)
    assert sum(en.nodes[r].n_ops == 0 for r in en.roots) == SMALL.n_inputs
    assert any(len(en.nodes[r].shapes) == 2 for r in en.roots)          # a Split: both outputs


def _brute_force(settings: GeneratorSettings) -> set[str]:
    """Canonical hashes of every graph of one or two ops without dead ops, built op by op
    with GraphBuilder from scratch."""
    shape = TensorShape(settings.input_dims)
    choices = [(name, OPS[name]) for name in settings.ops]

    def build(steps) -> str | None:
        b = GraphBuilder()
        refs = [b.add1(InputAttrs(shape), (), f"x{i}") for i in range(settings.n_inputs)]
        outs: tuple = ()
        for name, ins in steps:
            args = [refs[i] for i in ins]
            attrs = _op(name, [b.shape(r) for r in args], settings.degree)
            if attrs is None:
                return None
            try:
                outs = b.add(attrs, args)
            except ShapeError:
                return None
            refs += list(outs)
        return _without_unused_inputs(b.build(outs))

    out = set()
    n = settings.n_inputs
    for name1, ar1 in choices:
        for ins1 in itertools.product(range(n), repeat=ar1):
            one = build([(name1, ins1)])
            if one is None:
                continue
            out.add(one)
            n1 = len(_op(name1, [ParallelTensorShape.unpartitioned(shape)] * ar1, 2).sizes) \
                if name1.startswith("Split") else 1
            for name2, ar2 in choices:
                for ins2 in itertools.product(range(n + n1), repeat=ar2):
                    if set(range(n, n + n1)) <= set(ins2):     # the first op's outputs are all read
                        two = build([(name1, ins1), (name2, ins2)])
                        if two is not None:
                            out.add(two)
    return out


def _without_unused_inputs(g: PCG) -> str:
    b = GraphBuilder()
    remap = {}
    for i, n in g:
        if n.spec.is_source and not g.consumers[i]:
            continue
        outs = b.add(n.op, [remap[r] for r in n.inputs], n.name, outputs=n.outputs if n.spec.is_source else None)
        remap.update((TensorRef(i, k), o) for k, o in enumerate(outs))
    return b.build([remap[r] for r in g.outputs]).canonical_hash


def test_enumeration_is_complete(small_enum):
    """Every type-correct two-op graph without dead ops is enumerated, and nothing else."""
    got = {graph_hash(small_enum.nodes[r]) for r in small_enum.roots if small_enum.nodes[r].n_ops > 0}
    assert got == _brute_force(SMALL)


def test_piece_semantics_agree_on_rule_sides(small):
    vals = input_values(SMALL)
    shape = ParallelTensorShape.unpartitioned(TensorShape(SMALL.input_dims))
    for r in small.rules[:60]:
        feed = {x: vals[f"x{i}"] for i, x in enumerate(r.inputs)}
        for p in (r.src, r.dst):
            g = build_side(p, {x: shape for x in r.inputs}, {"d": 2})
            pieces = evaluate_pieces(g, feed, check=True)
            for got, want, ref in zip(pieces, evaluate(g, feed), g.outputs, strict=True):
                np.testing.assert_array_equal(assemble(got, g.shape(ref)), want)


# ---------------------------------------------------------------------------
# Candidate rules


def holds(rule: Rule, degree: int, dims: tuple[int, ...], seed: int = 5) -> bool | None:
    """Both sides agree (shapes and values) with ``d = degree`` on random inputs of ``dims``;
    None where a side does not type-check."""
    shape = ParallelTensorShape.unpartitioned(TensorShape(dims))
    rng = np.random.default_rng(seed)
    feed = {x: rng.integers(-4, 5, size=dims).astype(np.int64) for x in rule.inputs}
    try:
        gs, gd = (build_side(p, {x: shape for x in rule.inputs}, {"d": degree}) for p in (rule.src, rule.dst))
    except ShapeError:
        return None
    if [gs.shape(r) for r in gs.outputs] != [gd.shape(r) for r in gd.outputs]:
        return False
    return all(np.array_equal(a, b) for a, b in zip(evaluate(gs, feed), evaluate(gd, feed), strict=True))


def test_every_rule_holds_where_found_and_at_another_degree(small):
    for r in small.rules:
        assert holds(r, 2, SMALL.input_dims), r
        assert holds(r, 4, (16, 16)) is not False, r


def _operand(v, shape: ParallelTensorShape, binding):
    match v:
        case int():
            return v
        case ("param", name):
            return binding[name]
        case ("dim", _, axis):
            return shape.sizes[axis]
        case ("degree", _, axis):
            return shape.degrees[axis]
        case ("sum", _):
            return shape.sum_degree
    raise AssertionError(v)


def test_constraints_hold_where_the_rules_were_found(small):
    shape = ParallelTensorShape.unpartitioned(TensorShape(SMALL.input_dims))
    for r in small.rules:
        for c in r.constraints:
            a, b = _operand(c.lhs, shape, {"d": 2}), _operand(c.rhs, shape, {"d": 2})
            assert (a == b) if c.kind == "EQUAL" else (a % b == 0), (r, c)
        for x in r.inputs:
            assert Constraint("EQUAL", ("sum", x), 1) in r.constraints


def test_rules_are_canonical_data(small):
    rules = small.rules
    assert rules
    assert len({r.id for r in rules}) == len(rules)
    assert [(r.size, r.id) for r in rules] == sorted((r.size, r.id) for r in rules)
    for r in rules:
        check_rule(r)
        assert Rule.from_json(r.to_json()) == r
        assert r.src.nodes and r.src != r.dst
        assert r.inputs == tuple("abc"[:len(r.inputs)])
        first_use = list(dict.fromkeys(t for n in r.src.nodes for t in n.inputs if t in r.inputs))
        assert set(first_use) <= set(r.inputs)
        uses = any(isinstance(v, Param) for n in r.src.nodes + r.dst.nodes for _, v in n.attrs)
        assert r.params == (("d",) if uses else ())


def test_no_rule_holds_at_one_degree_only(small):
    """Scale(x, 2) = Add(x, x), but not for every d: the fingerprint tells them apart."""
    scale = side(lambda b, x, y, z: op(b, ScaleAttrs(2), x))
    double = side(lambda b, x, y, z: op(b, ADD, x, x))
    assert find_rule(small.rules, scale, double) is None
    assert find_rule(small.rules, side(lambda b, x, y, z: op(b, ReductionAttrs(2), op(b, ReplicateAttrs(2), x))),
                     scale) is not None


def test_pruning_steps_shrink_monotonically(small):
    s = small.stats
    steps = ["candidates", "after_renamings", "after_common_subgraph", "after_same_root", "after_trivial",
             "after_equivalent_subterms", "rules"]
    counts = [s[k] for k in steps]
    assert counts == sorted(counts, reverse=True) and counts[-1] == len(small.rules)
    assert s["graphs"] >= s["classes"] >= s["classes_with_rules"]
    assert set(small.stats_counts()) >= set(steps) and all(isinstance(v, int) for v in small.stats_counts().values())


def test_pruning_predicates(small_enum):
    en = small_enum
    by_text = {en.text(r): r for r in en.roots}
    relu = "Unary[fn=Relu]"
    relu2, relu1 = by_text[f"{relu}({relu}(x0))"], by_text[f"{relu}(x0)"]
    assert _common_subgraph(en, relu2, relu1)
    assert not _implied_by_subterms(en, relu2, relu1)       # Relu(Relu(z)) != Relu(z) for all z
    ab, ba = by_text[f"{relu}(Binary[fn=Add](x0,x1))"], by_text[f"{relu}(Binary[fn=Add](x1,x0))"]
    assert _same_root(en, ab, ba) and not _common_subgraph(en, ab, ba)
    left, right = by_text["Binary[fn=Add](x1,Scale[factor=2](x0))"], by_text["Binary[fn=Add](Scale[factor=2](x0),x1)"]
    assert _implied_by_subterms(en, left, right)              # Add(x1, z) = Add(z, x1)


def test_deterministic_across_runs_and_hash_seeds(small):
    again = generate(SMALL)
    assert [r.id for r in again.rules] == [r.id for r in small.rules]
    code = ("import hashlib; from unity_cli.substitutions.generator import GeneratorSettings, generate; "
            "print(hashlib.sha256(' '.join(r.id for r in generate(GeneratorSettings(max_ops=2)).rules)"
            ".encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == hashlib.sha256(" ".join(r.id for r in small.rules).encode()).hexdigest()


def test_progress_is_reported():
    calls = []
    generate(GeneratorSettings(max_ops=1), progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1] == (1000, 1000)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_settings():
    with pytest.raises(ValueError, match="unknown generator ops"):
        GeneratorSettings(ops=("Softmax",))
    s = GeneratorSettings()
    assert s.ops == DEFAULT_OPS and s.to_json()["max_ops"] == 3


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_generator_op_is_an_ir_op_of_its_arity(name):
    """The generator's arity table agrees with the IR: each op, on rank-2 inputs of its
    arity, is an operator whose specification infers its output (so the rules it finds are
    about graphs the importer and the search build)."""
    x = ParallelTensorShape.of((4, 4), (1, 1))
    attrs = _op(name, [x] * OPS[name], 2)
    assert attrs is not None
    spec = spec_of(attrs)
    assert spec_by_kind(spec.kind) is spec
    outs = spec.infer(attrs, [x.logical] * OPS[name])   # parallel ops: the logical shape passes through
    assert outs and all(o.rank == 2 for o in outs)
