"""Forward kernels against onnxruntime, one ONNX node per case (see ``kernel_cases``),
and the registry's coverage of every compute op."""
from __future__ import annotations

import math

import numpy as np
import pytest
from runtime.kernel_cases import CASES, Case

from unity_cli.ir.ops.gather_reduce import GatherAttrs
from unity_cli.ir.ops.unary import erf
from unity_cli.ir.opspec import all_specs, spec_of
from unity_cli.kernels import KERNELS, backward, forward, has_kernel


def test_every_compute_op_has_a_kernel():
    compute = {k for k, s in all_specs().items() if not s.is_source and not s.is_parallel_op}
    assert compute - set(KERNELS) == set()
    assert set(KERNELS) - compute == set()
    assert all(has_kernel(k) for k in compute) and not has_kernel("Repartition")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_matches_onnxruntime(case: Case):
    op, args = case.node()
    outs, _ = forward(op, args, np)
    expected = case.expected()
    assert len(outs) == len(expected)
    for got, want in zip(outs, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(got, want)


def test_erf_is_float64_accurate():
    xs = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 1e-300, np.inf, -np.inf]])
    want = np.array([math.erf(v) for v in xs])
    np.testing.assert_allclose(erf(xs, np), want, rtol=0, atol=2e-15)
    assert erf(np.float32([0.5]), np).dtype == np.float32
    x32 = np.linspace(-6, 6, 20001, dtype=np.float32)
    want32 = np.array([math.erf(float(v)) for v in x32])
    err = np.abs(erf(x32, np).astype(np.float64) - want32)
    assert err.max() <= 4e-7
    small = np.abs(x32) < 0.5   # and relatively accurate near zero, where erf(x) ~ 1.13 x
    assert (err[small] <= 1e-6 * np.abs(want32[small]) + 1e-30).all()


def test_gather_outside_the_table_yields_zeros_and_no_gradient():
    """A row-split table's piece sees ids of other pieces as out of its range."""
    table = np.arange(12, dtype=np.float64).reshape(4, 3)
    idx = np.array([1, 4, -5, 9, -1])
    (y,), ctx = forward(GatherAttrs(0), [table, idx], np)
    np.testing.assert_array_equal(y, [table[1], [0] * 3, [0] * 3, [0] * 3, table[3]])
    g_table, g_idx = backward(GatherAttrs(0), ctx, [np.ones_like(y)], np)
    np.testing.assert_array_equal(g_table.sum(axis=1), [0, 3, 0, 3])
    assert g_idx is None


def test_none_output_gradient_is_zero():
    from unity_cli.ir.ops.shape_ops import SplitAttrs

    op = SplitAttrs(axis=0, sizes=(1, 2))
    x = np.arange(6.0).reshape(3, 2)
    outs, ctx = forward(op, [x], np)
    (gx,) = backward(op, ctx, [None, np.ones((2, 2))], np)
    np.testing.assert_array_equal(gx, [[0, 0], [1, 1], [1, 1]])
    assert backward(op, ctx, [None, None], np) == [None]


def test_a_kernel_is_selective_exactly_when_its_spec_prices_it_so():
    """The cost model prices only the gradients a selective kernel makes; both must agree."""
    specs = all_specs()
    assert {k for k, kern in KERNELS.items() if kern.selective} == \
        {k for k, s in specs.items() if s.selective_backward} == {"MatMul", "Gemm", "Conv"}


@pytest.mark.parametrize("case", [c for c in CASES if c.op in ("MatMul", "Gemm", "Conv")], ids=lambda c: c.id)
def test_a_selective_backward_makes_what_is_wanted_and_only_that(case: Case):
    """For every subset of the float inputs, the wanted gradients are bit for bit those of
    the full backward, the rest None; nothing wanted, backward makes nothing."""
    import itertools

    op, args = case.node()
    assert KERNELS[spec_of(op).kind].selective
    outs, ctx = forward(op, args, np)
    rng = np.random.default_rng(0)
    gs = [rng.standard_normal(o.shape).astype(o.dtype) for o in outs]
    full = backward(op, ctx, gs, np)
    assert all(g is not None for g in full)
    for wanted in itertools.product((False, True), repeat=len(args)):
        got = backward(op, ctx, gs, np, wanted)
        for g, f, w in zip(got, full, wanted, strict=True):
            if w:
                np.testing.assert_array_equal(g, f)
            else:
                assert g is None
