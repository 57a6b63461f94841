"""How an operator's kernels are declared: forward and backward written once against an
array module ``xp`` (``numpy`` or ``cupy``), in the operator's own module (``ir/ops/``), and
the helpers they share.

A spec's ``kernel`` is a :class:`Kernel`: ``forward(op, inputs, xp) -> (outputs, ctx)`` and
``backward(op, ctx, grads, xp) -> input grads``. Kernels see only what
:mod:`unity_cli.kernels` (which runs them) has checked: ``grads`` has no None for an
output that is floating point, and a gradient returned for a non-float input is dropped.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UnityError

Array = Any
"""A ``numpy.ndarray`` or a ``cupy.ndarray``."""

Forward = Callable[[Any, Sequence[Array], Any], tuple[list[Array], Any]]
Backward = Callable[[Any, Any, Sequence[Array], Any], list[Array | None]]


class KernelError(UnityError):
    """A kernel cannot run an operator: no kernel for its kind, or inputs it cannot take."""


@dataclass(frozen=True, slots=True)
class Kernel:
    """Forward and backward of one op kind; ``backward`` None: nothing is differentiable. A
    ``selective`` backward is called as ``backward(op, ctx, grads, xp, wanted)`` and may
    leave out (None) the gradients of inputs ``wanted`` does not mark."""

    forward: Forward
    backward: Backward | None = None
    selective: bool = False


# ---------------------------------------------------------------------------
# Helpers shared by the kernels.


def is_float(dtype: Any) -> bool:
    return getattr(dtype, "kind", "") == "f"


def unbroadcast(g: Array, shape: Sequence[int], xp: Any) -> Array:
    """Sum ``g`` (of a broadcast result's shape) back down to an input of ``shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(k for k, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def scatter_add(target: Array, index: Any, values: Array, xp: Any) -> None:
    """``target[index] += values`` where repeated indices all add up (numpy's ``add.at``)."""
    if xp.__name__ == "numpy":
        xp.add.at(target, index, values)
    else:
        import cupyx  # noqa: PLC0415  (only on GPUs)

        cupyx.scatter_add(target, index, values)


def first_extremum(x: Array, y: Array, axes: tuple[int, ...], xp: Any) -> Array:
    """A boolean mask of ``x`` that is true, in each slice reduced over ``axes``, at the
    first position equal to ``y`` (the slice's max or min, keepdims form): where the
    gradient of a max/min reduction goes."""
    kept = tuple(d for d in range(x.ndim) if d not in axes)
    xt = xp.transpose(x, kept + axes)
    head = xt.shape[:len(kept)]
    flat = (xt == xp.transpose(y, kept + axes)).reshape(head + (-1,))
    first = flat.argmax(axis=-1)
    mask = xp.arange(flat.shape[-1]) == first[..., None]
    inv = [0] * x.ndim
    for j, d in enumerate(kept + axes):
        inv[d] = j
    return xp.transpose(mask.reshape(xt.shape), inv)
