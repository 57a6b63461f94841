"""The binary elementwise functions' one table (``ir/ops/binary.py``) is complete: every
entry is imported, means the same to the kernels and the reference semantics, and has
gradients its meaning agrees with (or none), and a verifier treatment or a stated reason."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.ir.ops.binary import BINARY, VERIFIER
from unity_cli.ir.ops.elementwise import FROM_ATTRIBUTE, Binary, BinaryAttrs, binary_backward, binary_forward
from unity_cli.ir.opspec import Opaque


def _inputs(fn: str, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    if BINARY[fn].boolean and fn in ("And", "Or"):
        return [rng.random((3, 4)) > 0.5 for _ in range(n)]
    # Positive and apart (Pow's base, Div's divisor, Max/Min without ties), the second broadcast.
    return [rng.uniform(0.5, 2.0, (3, 4)) + k for k in range(n - 1)] + [rng.uniform(0.5, 2.0, (4,)) + n]


@pytest.mark.parametrize("fn", sorted(BINARY))
def test_each_function_is_whole(fn):
    f = BINARY[fn]
    assert f.terms in ("sum", "product", "numerator", "none")
    assert f.verifier in VERIFIER or (isinstance(f.verifier, Opaque) and len(f.verifier.reason) > 10)
    assert not (f.boolean and f.backward is not None)
    assert fn in Binary.onnx_ops or fn in FROM_ATTRIBUTE
    xs = _inputs(fn, 3 if f.variadic else 2, np.random.default_rng(0))
    (y,), _ = binary_forward(BinaryAttrs(fn), xs, np)
    assert y.shape == (3, 4) and (y.dtype == bool) == f.boolean


@pytest.mark.parametrize("fn", sorted(n for n, f in BINARY.items() if f.backward is not None))
def test_each_gradient_agrees_with_its_function(fn):
    """Central differences in float64, per input, against the declared backward (summed
    back to the broadcast input's shape)."""
    xs = _inputs(fn, 3 if BINARY[fn].variadic else 2, np.random.default_rng(1))
    g = np.random.default_rng(2).normal(size=(3, 4))
    _, ctx = binary_forward(BinaryAttrs(fn), xs, np)
    grads = binary_backward(BinaryAttrs(fn), ctx, [g], np)
    h = 1e-6
    for k, x in enumerate(xs):
        want = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            up = [v.copy() for v in xs]
            down = [v.copy() for v in xs]
            up[k][idx] += h
            down[k][idx] -= h
            f_up = binary_forward(BinaryAttrs(fn), up, np)[0][0]
            f_down = binary_forward(BinaryAttrs(fn), down, np)[0][0]
            want[idx] = np.sum(g * (f_up - f_down)) / (2 * h)
        np.testing.assert_allclose(grads[k], want, rtol=1e-5, atol=1e-6, err_msg=f"input {k}")
