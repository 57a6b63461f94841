"""Einsum, Softmax / LogSoftmax / Hardmax and IsNaN / IsInf: import (equation
normalization, the pre-opset-13 axis semantics, attribute variants), parallel roles, and
parallel correctness: with every dim the roles allow split 2 ways, the kernel run on each
piece gives the pieces of the whole-tensor result."""
from __future__ import annotations

import math

import numpy as np
import pytest
from runtime.kernel_cases import Case

from unity_cli.errors import ModelError, ShapeError
from unity_cli.ir import DType, GraphBuilder, ParallelTensorShape, TensorShape
from unity_cli.ir.ops.einsum import EinsumAttrs, normalize
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.norm import HardmaxAttrs, SoftmaxAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.opspec import SUM, WHOLE, attrs_from_json, attrs_to_json, spec_of
from unity_cli.ir.pieces import coords, piece_op, task_inputs
from unity_cli.kernels import forward
from unity_cli.substitutions.pieces import assemble, split_value

RNG = np.random.default_rng(11)


def _f(*shape: int) -> np.ndarray:
    return RNG.uniform(-2, 2, shape)


def _special(*shape: int) -> np.ndarray:
    x = _f(*shape).reshape(-1)
    x[[0, 3, 5]] = [np.nan, np.inf, -np.inf]
    return x.reshape(shape)


# ---------------------------------------------------------------------------
# Parallel correctness.


def _run_in_pieces(op, values: list[np.ndarray], partial: int = 1) -> None:
    """Split each input 2 ways on every dim its roles let split (input 0 also holding
    ``partial`` partial sums), run the kernel per output piece and compare the
    assembled pieces with the kernel on whole tensors."""
    spec = spec_of(op)
    logical = [TensorShape(v.shape, DType.from_numpy(v.dtype)) for v in values]
    roles = spec.roles(op, logical)
    split_dims = [[role != WHOLE and size % 2 == 0 for size, role in zip(s.dims, rs, strict=True)]
                  for s, rs in zip(logical, roles, strict=True)]
    axes = {role for rs, ss in zip(roles, split_dims, strict=True) for role, s in zip(rs, ss, strict=True) if s}
    pieces = 2 ** len(axes) * partial
    b = GraphBuilder()
    refs, shapes = [], []
    for i, (s, ss) in enumerate(zip(logical, split_dims, strict=True)):
        degrees = tuple(2 if x else 1 for x in ss)
        sums = partial if i == 0 else 1
        shape = ParallelTensorShape.of(s.dims, degrees, s.dtype, sums, pieces // (math.prod(degrees) * sums))
        shapes.append(shape)
        refs.append(b.add(InputAttrs(s), (), f"x{i}", outputs=[shape])[0])
    out = b.add1(op, refs)
    node = b.nodes[out.node]
    out_shape = node.outputs[0]
    assert out_shape.pieces == pieces
    if any(any(ss) for ss in split_dims):
        assert out_shape.is_partitioned
    reads = task_inputs(node, shapes)
    split = [split_value(v, s, RNG if s.sum_degree > 1 else None) for v, s in zip(values, shapes, strict=True)]
    piece_attrs = piece_op(op, out_shape)
    got = {}
    for t in coords(out_shape):
        (y,), _ = forward(piece_attrs, [split[i][reads.coord(i, t)] for i in range(len(values))], np)
        got[t] = y
    (want,), _ = forward(op, values, np)
    np.testing.assert_allclose(assemble(got, out_shape), want, rtol=1e-12, atol=1e-12)


EINSUMS = [
    ("ij,jk->ik", (4, 6), (6, 2)),
    ("bij,bjk->bik", (2, 4, 6), (2, 6, 2)),
    ("bhqd,bhkd->bhqk", (2, 2, 4, 6), (2, 2, 2, 6)),
    ("ij->ji", (4, 2)),
    ("ii", (4, 4)),
    ("ii->i", (4, 4)),
    ("bii->bi", (2, 4, 4)),
    ("ii,i->i", (4, 4), (4,)),
    ("iij->ij", (2, 2, 4)),
    ("ij->i", (4, 6)),
    ("ij->", (4, 6)),
    ("i,j->ij", (4,), (2,)),
    ("ikl->i", (2, 4, 6)),
    ("ik,il->i", (2, 4), (2, 6)),
    ("ik,j->ij", (2, 4), (6,)),
    ("...ij,...jk->...ik", (2, 4, 6), (2, 6, 2)),
    ("...ij,jk", (2, 2, 4, 6), (6, 2)),
    ("ij,jk,kl->il", (2, 4), (4, 6), (6, 2)),
    ("bi,bj,bk->bijk", (2, 4), (2, 2), (2, 2)),
    ("ij,ij->ij", (4, 6), (1, 6)),
    ("bij,bjk->ik", (2, 4, 6), (1, 6, 2)),
]


@pytest.mark.parametrize("case", EINSUMS, ids=[e[0] for e in EINSUMS])
@pytest.mark.parametrize("partial", [1, 2], ids=["whole", "partial_input0"])
def test_einsum_pieces_assemble_to_the_whole(case, partial):
    equation, *shapes = case
    values = [_f(*s) for s in shapes]
    _run_in_pieces(EinsumAttrs(normalize(equation, [len(s) for s in shapes])), values, partial)


@pytest.mark.parametrize("op, shape", [
    (SoftmaxAttrs(1, False, True), (4, 6, 2, 2)),          # opset < 13: dims [1, 4) jointly
    (SoftmaxAttrs(1, True, True), (2, 4, 6)),
    (SoftmaxAttrs(2, False, True), (4, 2, 6, 2)),
    (SoftmaxAttrs(1, False, False), (4, 6, 2)),            # opset >= 13: dim 1 alone
    (SoftmaxAttrs(0, True, False), (4, 6, 2)),
    (HardmaxAttrs(1, True), (4, 6, 2, 2)),
    (HardmaxAttrs(1, False), (4, 6, 2)),
    (HardmaxAttrs(2, False), (2, 4, 6)),
], ids=str)
def test_softmax_and_hardmax_pieces_assemble_to_the_whole(op, shape):
    _run_in_pieces(op, [_f(*shape)])


@pytest.mark.parametrize("fn", ["IsNaN", "IsInf", "IsPosInf", "IsNegInf", "IsInfNeither"])
def test_isnan_isinf_pieces_assemble_to_the_whole(fn):
    _run_in_pieces(UnaryAttrs(fn), [_special(4, 2, 6)])


# ---------------------------------------------------------------------------
# Roles.


def _roles(op, *shapes):
    return spec_of(op).roles(op, [TensorShape(s) for s in shapes])


def test_einsum_roles_per_letter():
    mm = EinsumAttrs("ij,jk->ik")
    assert _roles(mm, (4, 6), (6, 2)) == ((0, SUM), (SUM, 1))
    assert _roles(EinsumAttrs("bii->bi"), (2, 3, 3)) == ((0, WHOLE, WHOLE),)
    # A diagonal letter stays whole in every input, not just where it repeats.
    assert _roles(EinsumAttrs("ii,i->i"), (3, 3), (3,)) == ((WHOLE, WHOLE), (WHOLE,))
    # A broadcast size-1 dim stays whole.
    assert _roles(EinsumAttrs("ij,ij->ij"), (4, 6), (1, 6)) == ((0, 1), (WHOLE, 1))


def test_einsum_splits_only_one_summed_letter():
    """Pieces read one shard index for all SUM dims, so two summed letters split together
    would pair shard c with shard c only: just the largest summed letter is SUM."""
    assert _roles(EinsumAttrs("ikl->i"), (2, 4, 6)) == ((0, WHOLE, SUM),)
    assert _roles(EinsumAttrs("ik,il->i"), (2, 4), (2, 4)) == ((0, SUM), (0, WHOLE))
    assert _roles(EinsumAttrs("ijk,jk->i"), (2, 6, 6), (6, 6)) == ((0, SUM, WHOLE), (SUM, WHOLE))


def test_einsum_refuses_splitting_a_diagonal():
    x = ParallelTensorShape.of((4, 4), (2, 1))
    with pytest.raises(ShapeError, match="whole"):
        spec_of(EinsumAttrs("ii->i")).infer_parallel(EinsumAttrs("ii->i"), [x])


def test_contracted_split_gives_partial_sums():
    op = EinsumAttrs("ij,jk->ik")
    a, b = ParallelTensorShape.of((4, 6), (1, 2)), ParallelTensorShape.of((6, 2), (2, 1))
    (y,) = spec_of(op).infer_parallel(op, [a, b])
    assert y.sum_degree == 2 and y.degrees == (1, 1)


def test_softmax_roles_keep_the_normalized_dims_whole():
    assert _roles(SoftmaxAttrs(1, False, True), (2, 1000, 1, 1)) == ((0, WHOLE, WHOLE, WHOLE),)
    assert _roles(SoftmaxAttrs(1), (2, 3, 4)) == ((0, WHOLE, 2),)
    assert _roles(HardmaxAttrs(0, True), (2, 3)) == ((WHOLE, WHOLE),)
    assert _roles(UnaryAttrs("IsNaN"), (2, 3)) == ((0, 1),)


def test_einsum_cost_is_twice_the_letter_product():
    op = EinsumAttrs("bij,bjk->bik")
    ins = [TensorShape((2, 3, 4)), TensorShape((2, 4, 5))]
    out = spec_of(op).infer(op, ins)
    cost = spec_of(op).cost(op, ins, out)
    assert cost.fwd_flops == 2 * 2 * 3 * 4 * 5 and cost.bwd_flops == 2 * cost.fwd_flops


# ---------------------------------------------------------------------------
# Import.


@pytest.mark.parametrize("equation, ranks, want", [
    ("ij,jk->ik", (2, 2), "ij,jk->ik"),
    (" ij , jk ", (2, 2), "ij,jk->ik"),
    ("ba", (2,), "ba->ab"),
    ("aB", (2,), "aB->Ba"),                  # numpy's alphabetical order: upper case first
    ("ii", (2,), "ii->"),
    ("i,i", (1, 1), "i,i->"),
    ("...ij,...jk->...ik", (4, 3), "ABij,Bjk->ABik"),
    ("...ij,jk", (3, 2), "Aij,jk->Aik"),
    ("i...->...i", (3,), "iAB->ABi"),
    ("...ii->...i", (2,), "ii->i"),
    ("...,...", (0, 0), ",->"),
])
def test_einsum_equation_is_normalized(equation, ranks, want):
    assert normalize(equation, ranks) == want


@pytest.mark.parametrize("equation, ranks, why", [
    ("...ij->ij", (3,), "output has no '...'"),
    ("ij,jk->ik", (2,), "2 operands"),
    ("ij->i", (3,), "does not fit"),
    ("i1->i", (2,), "not letters"),
    ("ij->ii", (2,), "repeats"),
    ("ij->k", (2,), "label no input dim"),
])
def test_bad_einsum_equations_are_refused(equation, ranks, why):
    with pytest.raises((ModelError, ShapeError), match=why):
        normalize(equation, ranks)


def test_einsum_rejects_mismatched_sizes():
    op = EinsumAttrs("ij,jk->ik")
    with pytest.raises(ShapeError, match="'j' has sizes 3 and 4"):
        spec_of(op).infer(op, [TensorShape((2, 3)), TensorShape((4, 5))])
    with pytest.raises(ShapeError, match="sizes 2 and 3"):
        spec_of(op).infer(EinsumAttrs("ii->i"), [TensorShape((2, 3))])


def _imported(op_type: str, x: np.ndarray, opset: int, **attrs):
    return Case("c", op_type, [x], attrs=attrs, opset=opset).node()[0]


def test_softmax_before_opset13_normalizes_axis_to_the_end():
    x = np.zeros((2, 1000, 1, 1), np.float32)       # SqueezeNet's head
    assert _imported("Softmax", x, 9, axis=1) == SoftmaxAttrs(1, False, True)
    assert _imported("LogSoftmax", x, 11) == SoftmaxAttrs(1, True, True)     # default axis 1
    assert _imported("Softmax", x, 11, axis=-1) == SoftmaxAttrs(3, False, False)
    assert _imported("Softmax", x, 13, axis=1) == SoftmaxAttrs(1, False, False)
    assert _imported("Softmax", x, 13) == SoftmaxAttrs(3, False, False)      # default axis -1
    assert _imported("Hardmax", x, 11, axis=1) == HardmaxAttrs(1, True)
    assert _imported("Hardmax", x, 13, axis=1) == HardmaxAttrs(1, False)


def test_isinf_flags_select_the_fn():
    x = np.zeros((2, 3), np.float32)
    assert _imported("IsNaN", x, 18) == UnaryAttrs("IsNaN")
    assert _imported("IsInf", x, 18) == UnaryAttrs("IsInf")
    assert _imported("IsInf", x, 18, detect_negative=0) == UnaryAttrs("IsPosInf")
    assert _imported("IsInf", x, 18, detect_positive=0) == UnaryAttrs("IsNegInf")
    assert _imported("IsInf", x, 18, detect_positive=0, detect_negative=0) == UnaryAttrs("IsInfNeither")
    op = UnaryAttrs("IsNaN")
    assert spec_of(op).infer(op, [TensorShape((2, 3))])[0].dtype == DType.BOOL
    with pytest.raises(ShapeError, match="floating-point"):
        spec_of(op).infer(op, [TensorShape((2, 3), DType.INT64)])


@pytest.mark.parametrize("op", [SoftmaxAttrs(1, True, True), HardmaxAttrs(2, False), EinsumAttrs("ij,jk->ik"),
                                UnaryAttrs("IsPosInf")], ids=str)
def test_attrs_round_trip_through_json(op):
    assert attrs_from_json(attrs_to_json(op)) == op


def test_softmax_attrs_of_an_older_plan_load_with_the_new_fields_default():
    from unity_cli.ir.ops.norm import SoftmaxAttrs
    from unity_cli.ir.opspec import attrs_from_json

    assert attrs_from_json({"kind": "Softmax", "axis": 2, "log": False}) == SoftmaxAttrs(2, False)
    with pytest.raises(KeyError):
        attrs_from_json({"kind": "Softmax", "log": False})      # a field without a default is still required
