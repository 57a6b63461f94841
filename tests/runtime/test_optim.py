"""The optimizers' updates: a large weight updated a chunk at a time gives the numbers the
whole-array update gives, to the bit, step after step, for every optimizer."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.runtime import optim
from unity_cli.runtime.optim import Optimizer, OptimizerConfig


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("shape", [(3 * optim.CHUNK + 17,), (300, 1000), (5,)])
def test_chunked_update_equals_whole(kind, shape, monkeypatch):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) * 10.0 ** -k for k in range(4)]
    config = OptimizerConfig.of(kind, None)
    chunked, whole = Optimizer(config, np), Optimizer(config, np)
    a, b = w0.copy(), w0.copy()
    for g in grads:
        chunked.begin_step()
        chunked.update("w", a, g)
        with monkeypatch.context() as m:
            m.setattr(optim, "CHUNK", 1 << 40)          # one chunk: the whole array at once
            whole.begin_step()
            whole.update("w", b, g)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, w0)
    for s, t in zip(chunked.state.get("w", []), whole.state.get("w", []), strict=True):
        np.testing.assert_array_equal(s, t)


def test_a_strided_weight_is_updated_whole():
    """A view that is not contiguous is not cut into flat chunks (that would copy it)."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2 * optim.CHUNK, 4)).astype(np.float32)
    w = base[:, ::2]
    before = w.copy()
    g = np.ones_like(w)
    opt = Optimizer(OptimizerConfig.of("sgd", 0.5), np)
    opt.begin_step()
    opt.update("w", w, g)
    np.testing.assert_array_equal(base[:, ::2], before - 0.5)
