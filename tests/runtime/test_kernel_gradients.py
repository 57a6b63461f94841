"""Backward kernels against central finite differences, in float64.

For each case (see ``kernel_cases``) and each floating-point input ``x_i``: with random
upstream gradients ``g`` and a random direction ``e``, the directional derivative
``(<g, f(x_i + h e)> - <g, f(x_i - h e)>) / 2h`` must equal ``<grad_i, e>``. Inputs are
kept away from kinks (Relu, Abs, Max, pooling) by the cases' data. A None gradient
counts as zero, so step functions check out too; only the gradients that are None by
design (BatchNormalization's frozen statistics, Mod) are exempt.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from runtime.kernel_cases import CASES, Case

from unity_cli.ir.opspec import spec_of
from unity_cli.kernels import backward, forward

H = 1e-6
NONE_BY_DESIGN = {("BatchNormalization", 3), ("BatchNormalization", 4)}


def _f64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def _loss(op, args, gs) -> float:
    outs, _ = forward(op, args, np)
    return sum(float(np.sum(g * o)) for g, o in zip(gs, outs) if g is not None)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=lambda c: c.id)
def test_backward_matches_finite_differences(case: Case):
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    op, args = case.node()
    args = [_f64(a) for a in args]
    outs, ctx = forward(op, args, np)
    gs = [rng.standard_normal(o.shape) if o.dtype.kind == "f" else None for o in outs]
    grads = backward(op, ctx, gs, np)
    assert len(grads) == len(args)
    kind = spec_of(op).kind
    for i, (a, grad) in enumerate(zip(args, grads)):
        if a.dtype.kind != "f" or (kind, i) in NONE_BY_DESIGN:
            assert grad is None, f"input {i} ({a.dtype}) should get no gradient"
            continue
        if grad is not None:
            assert grad.shape == a.shape and grad.dtype == a.dtype
        e = rng.standard_normal(a.shape)
        plus = [x + H * e if k == i else x for k, x in enumerate(args)]
        minus = [x - H * e if k == i else x for k, x in enumerate(args)]
        numeric = (_loss(op, plus, gs) - _loss(op, minus, gs)) / (2 * H)
        analytic = float(np.sum(grad * e)) if grad is not None else 0.0
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(numeric)), \
            f"input {i}: finite difference {numeric}, backward {analytic}"


def test_all_none_upstream_gives_none():
    case = next(c for c in CASES if c.id == "matmul_batched_2d")
    op, args = case.node()
    _, ctx = forward(op, args, np)
    assert backward(op, ctx, [None], np) == [None, None]


def test_float32_gradients_stay_float32():
    for cid in ("conv2d_groups_strides_dilations", "layernorm_last", "pow_int_exponent", "gather_axis0_neg"):
        op, args = next(c for c in CASES if c.id == cid).node()
        outs, ctx = forward(op, args, np)
        grads = backward(op, ctx, [np.ones_like(o) for o in outs], np)
        for a, g in zip(args, grads):
            assert g is None or g.dtype == a.dtype == np.float32, cid
