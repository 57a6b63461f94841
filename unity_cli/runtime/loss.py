"""Training losses on the graph's first output, averaged over the batch.

* ``mse``: ``mean((y - t)^2)`` over every element of the output (PyTorch's default).
* ``cross_entropy``: the output's last dim holds class logits; ``mean(-log softmax(y)[label])``
  over every other position (over the batch, for ``[batch, classes]`` logits).

``auto`` picks cross entropy when the labels are integers, mse when they are floats;
with synthetic data (no labels given), cross entropy when the output looks like
classifier logits: a float tensor of rank >= 2 with a last dim >= 2, made by a MatMul
or Gemm (maybe plus a bias Add), else mse.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UsageError
from ..ir.pcg import PCG
from ..ir.schedule import planned_loss
from ..ir.training import LossKind, label_dtype, label_shape  # noqa: F401  (re-exported)


def choose_loss(requested: str, labels: np.ndarray | None, pcg: PCG) -> LossKind:
    """The loss for ``--loss`` (``auto``, ``mse`` or ``cross_entropy``); see the module docstring."""
    out = pcg.shape(pcg.outputs[0])
    if requested == "mse":
        kind = LossKind.MSE
    elif requested == "cross_entropy":
        kind = LossKind.CROSS_ENTROPY
    elif requested != "auto":
        raise UsageError(f"--loss {requested!r}: expected auto, mse or cross_entropy")
    elif labels is not None:
        kind = LossKind.CROSS_ENTROPY if labels.dtype.kind in "iu" else LossKind.MSE
    else:
        kind = planned_loss(pcg, "auto")
    if not out.dtype.is_float:
        raise UsageError(f"the model's output is {out.dtype.value}; a loss needs a float output")
    if kind is LossKind.CROSS_ENTROPY and (out.rank < 2 or out.sizes[-1] < 2):
        raise UsageError(f"--loss cross_entropy needs class logits [..., classes]; the output is {list(out.sizes)}")
    return kind


def loss_count(kind: LossKind, out_dims: tuple[int, ...]) -> int:
    """How many terms the mean is over."""
    return int(np.prod(label_shape(kind, out_dims), dtype=np.int64))


def loss_and_grad(kind: LossKind, y: Any, target: Any, count: int, xp: Any) -> tuple[float, Any]:
    """This region's share of the loss (its sum over ``count``) and the gradient wrt ``y``."""
    match kind:
        case LossKind.MSE:
            d = y - target.astype(y.dtype)
            return float((d * d).sum(dtype=xp.float64)) / count, d * y.dtype.type(2.0 / count)
        case LossKind.CROSS_ENTROPY:
            shifted = y - y.max(axis=-1, keepdims=True)
            e = xp.exp(shifted)
            s = e.sum(axis=-1, keepdims=True)
            logp = shifted - xp.log(s)
            labels = target.astype(xp.int64)
            picked = xp.take_along_axis(logp, labels[..., None], axis=-1)
            loss = -float(picked.sum(dtype=xp.float64)) / count
            onehot = (xp.arange(y.shape[-1]) == labels[..., None]).astype(y.dtype)
            return loss, (e / s - onehot) * y.dtype.type(1.0 / count)
    raise AssertionError(kind)
