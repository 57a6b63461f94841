"""Properties of the parallel shape rules: the parallel ops, their fusion, the
role-derived inference of ordinary ops, reshape roles and the canonical hash."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from unity_cli.errors import ShapeError
from unity_cli.ir import DType, GraphBuilder, ParallelTensorShape, TensorShape
from unity_cli.ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import (
    REPLICA_DIM,
    CombineAttrs,
    ReductionAttrs,
    RepartitionAttrs,
    ReplicateAttrs,
)
from unity_cli.ir.ops.shape_ops import ReshapeAttrs, reshape_roles
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.opspec import infer_parallel, input_layout, spec_of
from unity_cli.ir.simplify import IDENTITY, fuse, simplify
from unity_cli.ir.validate import validate

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SIZES = st.sampled_from([1, 2, 3, 4, 6, 8, 12])
DEGREES = st.sampled_from([1, 2, 3, 4])


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def apply(op, x: ParallelTensorShape) -> ParallelTensorShape:
    (out,) = spec_of(op).infer_parallel(op, [x])
    return out


@st.composite
def parallel_shapes(draw, max_rank: int = 4, replicas: bool = True) -> ParallelTensorShape:
    sizes = draw(st.lists(SIZES, min_size=1, max_size=max_rank))
    degrees = [draw(st.sampled_from(divisors(s))) for s in sizes]
    s = draw(DEGREES) if replicas else 1
    c = draw(DEGREES) if replicas else 1
    return ParallelTensorShape.of(tuple(sizes), tuple(degrees), DType.FLOAT32, s, c)


# ---------------------------------------------------------------------------
# (a) Repartition/Combine and Replicate/Combine(REPLICA_DIM) undo each other.


@FAST
@given(parallel_shapes(), st.data())
def test_repartition_then_combine_is_identity(x, data):
    d = data.draw(st.integers(0, x.rank - 1), label="dim")
    k = data.draw(st.sampled_from(divisors(x.sizes[d] // x.degrees[d])), label="degree")
    y = apply(RepartitionAttrs(d, k), x)
    assert y.degrees[d] == x.degrees[d] * k
    assert apply(CombineAttrs(d, k), y) == x


@FAST
@given(parallel_shapes(), DEGREES)
def test_replicate_then_combine_replicas_is_identity(x, k):
    y = apply(ReplicateAttrs(k), x)
    assert y.copy_degree == x.copy_degree * k
    assert apply(CombineAttrs(REPLICA_DIM, k), y) == x


def _prefix_graph(x: ParallelTensorShape) -> tuple[GraphBuilder, object]:
    """A graph whose last tensor has shape ``x`` (sum degree 1): an Input, then one
    Repartition per split dim, then a Replicate."""
    b = GraphBuilder()
    ref = b.add1(InputAttrs(x.logical), (), "x")
    for d, g in enumerate(x.degrees):
        if g > 1:
            ref = b.add1(RepartitionAttrs(d, g), [ref])
    if x.copy_degree > 1:
        ref = b.add1(ReplicateAttrs(x.copy_degree), [ref])
    assert b.shape(ref) == x
    return b, ref


@FAST
@given(parallel_shapes(replicas=False), DEGREES, st.data())
def test_simplify_removes_a_repartition_combine_pair(x, copy, data):
    x = x.with_replicas(copy_degree=copy)
    d = data.draw(st.integers(0, x.rank - 1), label="dim")
    k = data.draw(st.sampled_from(divisors(x.sizes[d] // x.degrees[d])), label="degree")
    b, ref = _prefix_graph(x)
    base = b.build([b.add1(UnaryAttrs("Relu"), [ref])])
    b, ref = _prefix_graph(x)
    ref = b.add1(RepartitionAttrs(d, k), [ref], "rep")
    ref = b.add1(CombineAttrs(d, k), [ref], "comb")
    g = b.build([b.add1(UnaryAttrs("Relu"), [ref])])
    s = simplify(g)
    validate(s)
    assert s.shape(s.outputs[0]) == g.shape(g.outputs[0]) == base.shape(base.outputs[0])
    assert s.canonical_hash == simplify(base).canonical_hash
    assert len(s) <= len(base)


@FAST
@given(parallel_shapes(replicas=False), DEGREES, DEGREES)
def test_simplify_removes_a_replicate_combine_pair(x, copy, k):
    x = x.with_replicas(copy_degree=copy)
    b, ref = _prefix_graph(x)
    base = b.build([b.add1(UnaryAttrs("Relu"), [ref])])
    b, ref = _prefix_graph(x)
    ref = b.add1(ReplicateAttrs(k), [ref])
    ref = b.add1(CombineAttrs(REPLICA_DIM, k), [ref])
    g = b.build([b.add1(UnaryAttrs("Relu"), [ref])])
    s = simplify(g)
    validate(s)
    assert s.shape(s.outputs[0]) == x.with_replicas()
    assert s.canonical_hash == simplify(base).canonical_hash


def test_simplify_of_a_lone_pair_leaves_the_source():
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 6))), (), "x")
    y = b.add1(CombineAttrs(1, 3), [b.add1(RepartitionAttrs(1, 3), [x])])
    s = simplify(b.build([y]))
    assert [n.kind for _, n in s] == ["Input"]
    assert s.shape(s.outputs[0]) == ParallelTensorShape.of((4, 6), (1, 1))


# ---------------------------------------------------------------------------
# (b) Pieces.


@FAST
@given(parallel_shapes())
def test_pieces_formula(x):
    assert x.pieces == math.prod(x.degrees) * x.sum_degree * x.copy_degree
    assert x.piece.numel * math.prod(x.degrees) == x.logical.numel
    assert not x.problems()


@FAST
@given(parallel_shapes(), st.data())
def test_parallel_ops_scale_pieces_as_the_table_says(x, data):
    d = data.draw(st.integers(0, x.rank - 1), label="dim")
    k = data.draw(st.sampled_from(divisors(x.sizes[d] // x.degrees[d])), label="k")
    assert apply(RepartitionAttrs(d, k), x).pieces == x.pieces * k
    k = data.draw(st.sampled_from(divisors(x.degrees[d])), label="combine")
    assert apply(CombineAttrs(d, k), x).pieces == x.pieces // k
    k = data.draw(DEGREES, label="replicate")
    assert apply(ReplicateAttrs(k), x).pieces == x.pieces * k
    k = data.draw(st.sampled_from(divisors(x.copy_degree)), label="combine replicas")
    assert apply(CombineAttrs(REPLICA_DIM, k), x).pieces == x.pieces // k
    k = data.draw(st.sampled_from(divisors(x.sum_degree)), label="reduction")
    y = apply(ReductionAttrs(k), x)
    assert y.pieces == x.pieces // k and y.sum_degree == x.sum_degree // k


@FAST
@given(parallel_shapes(), st.sampled_from(["Relu", "Neg", "Exp"]))
def test_unary_preserves_pieces_and_degrees(x, fn):
    op = UnaryAttrs(fn)
    if fn != "Neg" and x.sum_degree > 1:
        with pytest.raises(ShapeError, match="not linear"):
            apply(op, x)
        return
    y = apply(op, x)
    assert y == x


@FAST
@given(parallel_shapes(), st.data())
def test_illegal_parallel_ops_are_rejected(x, data):
    d = data.draw(st.integers(0, x.rank - 1), label="dim")
    bad = [k for k in range(2, 7) if (x.sizes[d] // x.degrees[d]) % k]
    if bad:
        with pytest.raises(ShapeError, match="not divisible"):
            apply(RepartitionAttrs(d, data.draw(st.sampled_from(bad))), x)
    bad = [k for k in range(2, 7) if x.degrees[d] % k]
    if bad:
        with pytest.raises(ShapeError):
            apply(CombineAttrs(d, data.draw(st.sampled_from(bad))), x)
    with pytest.raises(ShapeError):
        apply(RepartitionAttrs(x.rank, 1), x)
    if x.sum_degree > 1:  # partial sums are reduced first; there are not twice as many
        with pytest.raises(ShapeError):
            apply(ReductionAttrs(x.sum_degree * 2), x)
    else:  # without partial sums a Reduction adds up replicas, which must be there
        bad = [k for k in range(2, 7) if x.copy_degree % k]
        if bad:
            with pytest.raises(ShapeError, match="replicas"):
                apply(ReductionAttrs(data.draw(st.sampled_from(bad))), x)


def test_reduction_of_replicas_scales():
    x = ParallelTensorShape.of((4, 4), (1, 1))
    copies = apply(ReplicateAttrs(2), x)
    assert apply(ReductionAttrs(2), copies) == x  # same layout as x; the value is 2x


# ---------------------------------------------------------------------------
# (c) Fusion.


@FAST
@given(parallel_shapes(), st.data())
def test_two_repartitions_fuse_into_the_product(x, data):
    d = data.draw(st.integers(0, x.rank - 1), label="dim")
    room = x.sizes[d] // x.degrees[d]
    a = data.draw(st.sampled_from(divisors(room)), label="a")
    b = data.draw(st.sampled_from(divisors(room // a)), label="b")
    fused = fuse(RepartitionAttrs(d, a), RepartitionAttrs(d, b))
    assert fused == RepartitionAttrs(d, a * b)
    assert apply(fused, x) == apply(RepartitionAttrs(d, b), apply(RepartitionAttrs(d, a), x))


@st.composite
def parallel_ops(draw, rank: int):
    kind = draw(st.sampled_from(["Repartition", "Combine", "Replicate", "CombineReplicas", "Reduction"]))
    k = draw(st.sampled_from([1, 2, 3, 4, 6]))
    d = draw(st.integers(0, rank - 1))
    return {"Repartition": lambda: RepartitionAttrs(d, k), "Combine": lambda: CombineAttrs(d, k),
            "Replicate": lambda: ReplicateAttrs(k), "CombineReplicas": lambda: CombineAttrs(REPLICA_DIM, k),
            "Reduction": lambda: ReductionAttrs(k)}[kind]()


@settings(max_examples=200, deadline=None)
@given(parallel_shapes(), st.data())
def test_fuse_agrees_with_applying_both(x, data):
    first = data.draw(parallel_ops(x.rank), label="first")
    second = data.draw(parallel_ops(x.rank), label="second")
    try:
        want = apply(second, apply(first, x))
    except ShapeError:
        assume(False)
    fused = fuse(first, second)
    if fused is None:
        return
    got = x if fused is IDENTITY else apply(fused, x)
    assert got == want, (first, second, fused)


def test_fuse_known_cases():
    assert fuse(RepartitionAttrs(0, 2), CombineAttrs(0, 2)) is IDENTITY
    assert fuse(CombineAttrs(1, 3), RepartitionAttrs(1, 3)) is IDENTITY
    assert fuse(ReplicateAttrs(4), CombineAttrs(REPLICA_DIM, 4)) is IDENTITY
    assert fuse(RepartitionAttrs(0, 6), CombineAttrs(0, 2)) == RepartitionAttrs(0, 3)
    assert fuse(RepartitionAttrs(0, 2), CombineAttrs(0, 6)) == CombineAttrs(0, 3)
    # Whether a Reduction adds partial sums or replicas depends on the shape: never fused.
    assert fuse(ReductionAttrs(2), ReductionAttrs(3)) is None
    assert fuse(CombineAttrs(0, 2), CombineAttrs(0, 3)) == CombineAttrs(0, 6)
    assert fuse(RepartitionAttrs(0, 2), RepartitionAttrs(1, 2)) is None
    assert fuse(ReplicateAttrs(2), ReductionAttrs(2)) is None
    assert fuse(CombineAttrs(0, 2), RepartitionAttrs(0, 4)) is None


def _legal_op(data, x: ParallelTensorShape):
    """One parallel op that is legal on ``x`` (drawn interactively)."""
    choices = ["Repartition", "Replicate"]
    if any(g > 1 for g in x.degrees):
        choices.append("Combine")
    if x.copy_degree > 1:
        choices.append("CombineReplicas")
    if x.sum_degree > 1:
        choices.append("Reduction")
    kind = data.draw(st.sampled_from(choices))
    if kind == "Repartition":
        d = data.draw(st.integers(0, x.rank - 1))
        return RepartitionAttrs(d, data.draw(st.sampled_from(divisors(x.sizes[d] // x.degrees[d]))))
    if kind == "Combine":
        d = data.draw(st.sampled_from([d for d, g in enumerate(x.degrees) if g > 1]))
        return CombineAttrs(d, data.draw(st.sampled_from(divisors(x.degrees[d]))))
    if kind == "Replicate":
        return ReplicateAttrs(data.draw(st.sampled_from([1, 2, 3])))
    if kind == "CombineReplicas":
        return CombineAttrs(REPLICA_DIM, data.draw(st.sampled_from(divisors(x.copy_degree))))
    return ReductionAttrs(data.draw(st.sampled_from(divisors(x.sum_degree))))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1, 2, 3]), st.integers(1, 6), st.data())
def test_simplify_preserves_the_shapes_of_random_chains(contracted, length, data):
    """x @ w with K split ``contracted`` ways, then a random chain of legal parallel ops
    (with a second reader half-way, which must block fusion across it), then Relu."""
    b = GraphBuilder()
    x = b.add1(RepartitionAttrs(1, contracted), [b.add1(InputAttrs(TensorShape((12, 6))), (), "x")])
    w = b.add1(RepartitionAttrs(0, contracted), [b.add1(InputAttrs(TensorShape((6, 12))), (), "w")])
    ref = b.add1(MatMulAttrs(), [x, w], "mm")
    side = data.draw(st.integers(0, length), label="side reader at")
    outs = []
    for step in range(length):
        if step == side:
            outs.append(b.add1(UnaryAttrs("Identity"), [ref], "side"))
        ref = b.add1(_legal_op(data, b.shape(ref)), [ref])
    ref = b.add1(ReductionAttrs(b.shape(ref).sum_degree), [ref])
    g = b.build([b.add1(UnaryAttrs("Relu"), [ref], "out")] + outs)
    validate(g)
    s = simplify(g)
    validate(s)
    assert [s.shape(r) for r in s.outputs] == [g.shape(r) for r in g.outputs]
    assert sum(n.spec.is_parallel_op for _, n in s) <= sum(n.spec.is_parallel_op for _, n in g)
    assert simplify(s).canonical_hash == s.canonical_hash   # a fixed point


def test_simplify_keeps_an_earlier_fusion():
    """Rep(0,2); Rep(0,3); Combine(0,3) is Rep(0,2), not the identity."""
    b = GraphBuilder()
    ref = b.add1(InputAttrs(TensorShape((12, 4))), (), "x")
    for op in (RepartitionAttrs(0, 2), RepartitionAttrs(0, 3), CombineAttrs(0, 3)):
        ref = b.add1(op, [ref])
    g = b.build([b.add1(UnaryAttrs("Relu"), [ref])])
    s = simplify(g)
    assert s.shape(s.outputs[0]) == ParallelTensorShape.of((12, 4), (2, 1))
    assert [n.op for _, n in s if n.spec.is_parallel_op] == [RepartitionAttrs(0, 2)]


def test_simplify_after_a_degree_one_op():
    """A degree-1 op is dropped; the op after it must not fuse with what came before it."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((12, 4))), (), "x")
    a = b.add1(RepartitionAttrs(0, 2), [x])
    other = b.add1(UnaryAttrs("Relu"), [a], "other")
    one = b.add1(RepartitionAttrs(0, 1), [a])
    c = b.add1(RepartitionAttrs(0, 3), [one])
    g = b.build([b.add1(UnaryAttrs("Relu"), [c], "out"), other])
    s = simplify(g)
    validate(s)
    assert [s.shape(r) for r in s.outputs] == [g.shape(r) for r in g.outputs]


# ---------------------------------------------------------------------------
# (d) Ordinary ops: layouts from input_layout are accepted, pieces agree.


@st.composite
def broadcast_pair(draw):
    out = draw(st.lists(SIZES, min_size=1, max_size=3))
    a, b = [], []
    for s in out:
        which = draw(st.sampled_from(["both", "a1", "b1"]))
        a.append(1 if which == "a1" else s)
        b.append(1 if which == "b1" else s)
    drop_a = draw(st.integers(0, len(out)))
    drop_a = next((k for k in range(drop_a) if a[k] != 1), drop_a)  # only leading 1s may go
    return TensorShape(tuple(a[drop_a:])), TensorShape(tuple(b))


@FAST
@given(broadcast_pair(), st.sampled_from(["Add", "Mul", "Sub"]), DEGREES, st.booleans(), st.data())
def test_binary_input_layout_is_accepted(pair, fn, copy, swap, data):
    ins = list(pair[::-1] if swap else pair)
    attrs = BinaryAttrs(fn)
    spec = spec_of(attrs)
    (out,) = spec.infer(attrs, ins)
    out_deg = [data.draw(st.sampled_from(divisors(s))) for s in out.dims]
    pieces = math.prod(out_deg) * copy
    layout = input_layout(spec, attrs, ins, out_deg, 1, pieces)
    assert layout is not None
    (y,) = infer_parallel(spec, attrs, layout)
    assert y.degrees == tuple(out_deg) and y.sum_degree == 1 and y.copy_degree == copy
    assert all(p.pieces == y.pieces == pieces for p in layout)
    assert [p.logical for p in layout] == ins
    assert input_layout(spec, attrs, ins, out_deg, 2, pieces * 2) is None


@st.composite
def matmul_operands(draw):
    m, k, n = draw(SIZES), draw(st.sampled_from([2, 4, 6, 12])), draw(SIZES)
    batch = draw(st.lists(SIZES, max_size=2))
    a_batch = [draw(st.sampled_from([s, 1])) for s in batch]
    b_batch = [s if x != 1 else draw(st.sampled_from([s, 1])) for s, x in zip(batch, a_batch)]
    a_batch = a_batch[draw(st.integers(0, len(a_batch))):]
    b_batch = b_batch[draw(st.integers(0, len(b_batch))):]
    a = (k,) if draw(st.booleans()) and not a_batch else tuple(a_batch) + (m, k)
    b = (k,) if draw(st.booleans()) and not b_batch else tuple(b_batch) + (k, n)
    return TensorShape(a), TensorShape(b)


@FAST
@given(matmul_operands(), DEGREES, st.data())
def test_matmul_input_layout_is_accepted(ab, copy, data):
    a, b = ab
    attrs = MatMulAttrs()
    spec = spec_of(attrs)
    (out,) = spec.infer(attrs, [a, b])
    assert out.dims == np.matmul(np.zeros(a.dims), np.zeros(b.dims)).shape
    out_deg = [data.draw(st.sampled_from(divisors(s))) for s in out.dims]
    contracted = data.draw(st.sampled_from(divisors(a.dims[-1])), label="contracted")
    pieces = math.prod(out_deg) * contracted * copy
    layout = input_layout(spec, attrs, [a, b], out_deg, contracted, pieces)
    assert layout is not None
    assert layout[0].degrees[-1] == contracted
    assert layout[1].degrees[0 if b.rank == 1 else -2] == contracted
    (y,) = infer_parallel(spec, attrs, layout)
    assert y.degrees == tuple(out_deg)
    assert y.sum_degree == contracted
    assert y.copy_degree == copy
    assert all(p.pieces == y.pieces == pieces for p in layout)


@FAST
@given(st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 3, 4]), st.sampled_from(["Add", "Sub"]))
def test_add_needs_equal_partial_sums(s1, s2, fn):
    pieces = 12
    a = ParallelTensorShape.of((4, 6), (1, 1), DType.FLOAT32, s1, pieces // s1) if pieces % s1 == 0 else None
    b = ParallelTensorShape.of((4, 6), (1, 1), DType.FLOAT32, s2, pieces // s2) if pieces % s2 == 0 else None
    assume(a is not None and b is not None)
    attrs = BinaryAttrs(fn)
    if s1 != s2:
        with pytest.raises(ShapeError, match="different partial sums"):
            infer_parallel(spec_of(attrs), attrs, [a, b])
    else:
        (y,) = infer_parallel(spec_of(attrs), attrs, [a, b])
        assert y.sum_degree == s1 and y.pieces == pieces


@FAST
@given(parallel_shapes())
def test_nonlinear_ops_reject_partial_sums(x):
    assume(x.sum_degree > 1)
    for fn in ("Relu", "Exp", "Sigmoid"):
        with pytest.raises(ShapeError, match="not linear"):
            apply(UnaryAttrs(fn), x)
    y = x.with_replicas(sum_degree=1, copy_degree=x.copy_degree * x.sum_degree)
    with pytest.raises(ShapeError, match="both hold partial sums"):
        infer_parallel(spec_of(BinaryAttrs("Mul")), BinaryAttrs("Mul"), [x, x])
    (z,) = infer_parallel(spec_of(BinaryAttrs("Mul")), BinaryAttrs("Mul"), [x, y])
    assert z.sum_degree == x.sum_degree
    with pytest.raises(ShapeError):
        infer_parallel(spec_of(BinaryAttrs("Max")), BinaryAttrs("Max"), [x, y])


def test_matmul_contracted_gives_partial_sums():
    a = ParallelTensorShape.of((4, 6), (2, 3))
    w = ParallelTensorShape.of((6, 8), (3, 1), copy_degree=2)
    (y,) = infer_parallel(spec_of(MatMulAttrs()), MatMulAttrs(), [a, w])
    assert y == ParallelTensorShape.of((4, 8), (2, 1), sum_degree=3)
    with pytest.raises(ShapeError, match="contracted"):
        infer_parallel(spec_of(MatMulAttrs()), MatMulAttrs(), [a, ParallelTensorShape.of((6, 8), (2, 1),
                                                                                          copy_degree=3)])
    with pytest.raises(ShapeError, match="pieces"):
        infer_parallel(spec_of(MatMulAttrs()), MatMulAttrs(), [a, ParallelTensorShape.of((6, 8), (3, 1))])


# ---------------------------------------------------------------------------
# (e) reshape_roles: a shard along input dim i is the shard along its output dim j.


@st.composite
def factorizations(draw):
    factors = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=5))

    def grouping():
        cuts = sorted(draw(st.sets(st.integers(1, len(factors) - 1), max_size=len(factors) - 1))) \
            if len(factors) > 1 else []
        bounds = [0, *cuts, len(factors)]
        dims = [math.prod(factors[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
        for _ in range(draw(st.integers(0, 2))):      # sprinkle size-1 dims
            dims.insert(draw(st.integers(0, len(dims))), 1)
        return tuple(dims)

    return grouping(), grouping()


@settings(max_examples=150, deadline=None)
@given(factorizations())
def test_reshape_roles_commute_with_partitioning(src_dst):
    src, dst = src_dst
    roles = reshape_roles(src, dst)
    assert len(roles) == len(src)
    mapped = [r for r in roles if isinstance(r, int)]
    assert len(set(mapped)) == len(mapped), roles
    a = np.arange(math.prod(src)).reshape(src)
    b = a.reshape(dst)
    for i, j in enumerate(roles):
        if not isinstance(j, int):
            continue
        assert 0 <= j < len(dst)
        for k in divisors(math.gcd(src[i], dst[j])):
            for s in range(k):
                sa = np.split(a, k, axis=i)[s]
                sb = np.split(b, k, axis=j)[s]
                assert np.array_equal(sa.reshape(sb.shape), sb), (src, dst, i, j, k, s)
            x = ParallelTensorShape.of(src, tuple(k if d == i else 1 for d in range(len(src))))
            (y,) = infer_parallel(spec_of(ReshapeAttrs(dst)), ReshapeAttrs(dst), [x])
            assert y.degrees == tuple(k if d == j else 1 for d in range(len(dst)))


def test_reshape_roles_examples():
    assert reshape_roles((2, 3, 4), (6, 4)) == (0, "whole", 1)
    assert reshape_roles((6, 4), (2, 3, 4)) == (0, 2)
    assert reshape_roles((1, 6), (6,)) == ("whole", 0)
    assert reshape_roles((4, 6), (6, 4)) == (0, "whole")


# ---------------------------------------------------------------------------
# (f) The canonical hash.


def _mlp(degree: int = 2, names: str = "") -> object:
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((8, 6))), (), "x")
    w = b.add1(InputAttrs(TensorShape((6, 4))), (), "w")
    x = b.add1(RepartitionAttrs(0, degree), [x], names + "rep")
    w = b.add1(ReplicateAttrs(degree), [w], names + "repl")
    h = b.add1(MatMulAttrs(), [x, w], names + "mm")
    y = b.add1(UnaryAttrs("Relu"), [h], names + "relu")
    return b.build([b.add1(CombineAttrs(0, degree), [y], names + "comb")])


def test_equal_graphs_hash_equal():
    assert _mlp().canonical_hash == _mlp().canonical_hash
    assert _mlp().canonical_hash == _mlp(names="other_").canonical_hash
    assert _mlp(2).canonical_hash != _mlp(4).canonical_hash


@FAST
@given(parallel_shapes(replicas=False), st.data())
def test_changing_one_degree_changes_the_hash(x, data):
    d = data.draw(st.integers(0, x.rank - 1), label="dim")
    room = x.sizes[d] // x.degrees[d]
    assume(room > 1)
    k = data.draw(st.sampled_from(divisors(room)[1:]), label="k")

    def graph(extra: int):
        b, ref = _prefix_graph(x)
        ref = b.add1(RepartitionAttrs(d, extra), [ref])
        return b.build([b.add1(UnaryAttrs("Relu"), [ref])])

    assert graph(k).canonical_hash == graph(k).canonical_hash
    assert graph(k).canonical_hash != graph(1).canonical_hash


HASH_SCRIPT = """
import sys
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.ir.ops.parallel import RepartitionAttrs
from unity_cli.ir.pcg import GraphBuilder
pcg = import_model(sys.argv[1], ImportOptions(input_shapes={"input_ids": (4, 32)})).pcg
print(pcg.canonical_hash)
b = GraphBuilder()
b.nodes = list(pcg.nodes)
out = b.add1(RepartitionAttrs(0, 2), [pcg.outputs[0]])
print(b.build([out]).canonical_hash)
"""


def test_hash_is_stable_across_hash_seeds():
    from models.catalog import TINY_MODELS_DIR

    path = TINY_MODELS_DIR / "bert_tiny.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not there")
    root = Path(__file__).resolve().parents[2]
    results = []
    for seed in ("123", "456"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(root))
        proc = subprocess.run([sys.executable, "-c", HASH_SCRIPT, str(path)], env=env, cwd=root,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        results.append(proc.stdout.split())
    assert results[0] == results[1]
    assert len(results[0]) == 2 and results[0][0] != results[0][1]
    from unity_cli.onnx_import import ImportOptions, import_model

    here = import_model(path, ImportOptions(input_shapes={"input_ids": (4, 32)})).pcg
    assert here.canonical_hash == results[0][0]
