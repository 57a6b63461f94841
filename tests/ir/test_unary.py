"""The unary elementwise functions' one table (``ir/ops/unary.py``) is complete: every
entry has a cost, a meaning (the one the kernels, the reference semantics and the verifier's
numeric model all call), a gradient that its meaning agrees with (or none, for a step
function or a test), and a verifier treatment or a stated reason for being opaque; the
operator, the kernels, the reference semantics and the verifier all read it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from unity_cli.ir.ops.elementwise import ATTRIBUTE_VARIANTS, Unary, UnaryAttrs, unary_backward, unary_forward
from unity_cli.ir.ops.unary import EW_FUNCS, UNARY, VERIFIER
from unity_cli.ir.opspec import Opaque

SAMPLES = {"any": (-2.0, 2.0), "positive": (0.5, 3.0), "away": (0.3, 2.0)}


def _x(fn: str, rng: np.random.Generator) -> np.ndarray:
    lo, hi = SAMPLES[UNARY[fn].domain]
    x = rng.uniform(lo, hi, size=(3, 5))
    return x * rng.choice([-1, 1], size=x.shape) if UNARY[fn].domain == "away" else x


@pytest.mark.parametrize("fn", sorted(UNARY))
def test_each_function_is_whole(fn):
    f = UNARY[fn]
    assert f.flops >= 0
    assert f.verifier in VERIFIER or (isinstance(f.verifier, Opaque) and len(f.verifier.reason) > 20)  # or why not
    if f.boolean:
        assert f.backward is None
    assert fn in Unary.onnx_ops or fn in ATTRIBUTE_VARIANTS      # the importer reads every one
    x = _x(fn, np.random.default_rng(0)).astype(bool if fn == "Not" else np.float64)
    (y,), ctx = unary_forward(UnaryAttrs(fn), [x], np)
    assert y.shape == x.shape


@pytest.mark.parametrize("fn", sorted(n for n, f in UNARY.items() if f.backward is not None))
def test_each_gradient_agrees_with_its_function(fn):
    """Central differences in float64 against the declared backward."""
    x = _x(fn, np.random.default_rng(1))
    g = np.random.default_rng(2).normal(size=x.shape)
    _, ctx = unary_forward(UnaryAttrs(fn), [x], np)
    (dx,) = unary_backward(UnaryAttrs(fn), ctx, [g], np)
    _assert_central_differences(dx, UNARY[fn].forward, x, g)


def _assert_central_differences(dx, forward, x, g):
    h = 1e-6
    up, down = forward(x + h, np), forward(x - h, np)
    np.testing.assert_allclose(dx, g * (up - down) / (2 * h), rtol=1e-5, atol=1e-7)


def test_the_verifier_codes_are_the_pointwise_functions():
    # Functions z3 sees as opaque symbols that still evaluate pointwise, and not the ones it
    # encodes exactly (Relu, Neg, Identity) nor the predicates it cannot model.
    assert {"Erf", "Exp", "Gelu", "Sigmoid", "Softsign", "Tanh"} <= set(EW_FUNCS)
    assert not {"Relu", "Neg", "Identity", "IsNaN"} & set(EW_FUNCS)
    assert {n for n, f in UNARY.items() if f.opaque} >= {"IsNaN", "IsInf"}


def test_a_wrong_gradient_would_be_caught():
    """The check above can fail: a Tanh entry whose gradient is y instead of 1 - y^2, run
    through the same check, does."""
    wrong = dataclasses.replace(UNARY["Tanh"], backward=lambda x, y, g, xp: g * y)
    x = _x("Tanh", np.random.default_rng(1))
    g = np.random.default_rng(2).normal(size=x.shape)
    with pytest.raises(AssertionError):
        _assert_central_differences(wrong.backward(x, np.tanh(x), g, np), wrong.forward, x, g)


@pytest.mark.parametrize("fn", ["Softsign", "Mish"])
def test_an_added_function_runs_as_onnxruntime_computes(fn, tmp_path):
    """The functions added as the proof that a new one is one entry (Softsign, and Mish once
    the kernels moved into the operators' modules): an ONNX node of it imports and runs as
    onnxruntime runs it (its gradient is checked with every entry's, above)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from unity_cli.onnx_import import ImportOptions, import_model

    graph = helper.make_graph([helper.make_node(fn, ["x"], ["y"], name="s")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    path = tmp_path / f"{fn}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    pcg = import_model(path, ImportOptions()).pcg
    (node,) = [n for _, n in pcg if not n.spec.is_source]
    assert node.op == UnaryAttrs(fn)
    x = _x(fn, np.random.default_rng(3)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (got,), _ = unary_forward(node.op, [x], np)
    np.testing.assert_allclose(got, want, rtol=1e-6)
