"""Runs the forward and backward kernels of every compute operator, written once against
an array module ``xp`` (``numpy`` or ``cupy``) in the operator's own module (each spec's
``kernel``, ``ir/ops/``), and checks what goes in and out.

``forward(op, inputs, xp)`` runs the operator whose attrs are ``op`` (a PCG node's
``n.op``) and returns its outputs and a context for ``backward(op, ctx, grads, xp)``,
which returns the gradient of each input. Both are exact to ONNX's semantics on whole
tensors and run unchanged on pieces (see :mod:`unity_cli.substitutions.pieces`).

Conventions:

* a None gradient means zero: None in ``grads`` for an output nobody used, None out
  for an input that is not differentiable (integer indices, masks, running statistics)
  or whose gradient is zero everywhere (``Floor``, comparisons);
* only floating-point tensors carry gradients, each in its tensor's dtype and shape;
* outputs, contexts and gradients may share memory with the inputs: do not write into
  them in place.

Parallel ops (Repartition, Combine, Replicate, Reduction) and sources (Input, Weight)
have no kernels: the executor moves and feeds those tensors.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..ir import ops  # noqa: F401  (fill the registry)
from ..ir.kernel import Array, Kernel, KernelError, is_float
from ..ir.opspec import all_specs, spec_of

__all__ = ["KERNELS", "Array", "Kernel", "KernelError", "backward", "forward", "has_kernel"]

KERNELS = MappingProxyType({kind: spec.kernel for kind, spec in all_specs().items() if spec.kernel is not None})
"""Every compute operator's kernel, by kind."""


@dataclass(frozen=True, slots=True)
class _Context:
    """What ``forward`` hands to ``backward``: the kernel's own context plus the inputs'
    and outputs' shapes and dtypes (to fill in zero gradients and drop integer ones)."""

    kind: str
    saved: Any
    inputs: tuple[tuple[tuple[int, ...], Any], ...]
    outputs: tuple[tuple[tuple[int, ...], Any], ...]


def has_kernel(kind: str) -> bool:
    return kind in KERNELS


def _kernel(op: Any) -> tuple[str, Kernel]:
    kind = spec_of(op).kind
    try:
        return kind, KERNELS[kind]
    except KeyError:
        raise KernelError(f"no kernel for operator {kind}") from None


def forward(op: Any, inputs: Sequence[Array], xp: Any) -> tuple[list[Array], Any]:
    """Run operator attrs ``op`` on arrays; return ``(outputs, ctx)`` for :func:`backward`."""
    kind, k = _kernel(op)
    outs, saved = k.forward(op, inputs, xp)
    outs = [xp.asarray(o) for o in outs]  # numpy turns 0-d results into scalars
    ctx = _Context(kind, saved, tuple((x.shape, x.dtype) for x in inputs),
                   tuple((o.shape, o.dtype) for o in outs))
    return outs, ctx


def backward(op: Any, ctx: Any, grad_outputs: Sequence[Array | None], xp: Any,
             wanted: Sequence[bool] | None = None) -> list[Array | None]:
    """Gradients w.r.t. each input of the forward call that made ``ctx``; None is zero.
    ``wanted`` (default: all) marks the inputs whose gradient the caller uses: the others
    come back None, and a selective kernel does not compute them (a product's ``dX`` of a
    graph input is a whole GEMM)."""
    kind, k = _kernel(op)
    if not isinstance(ctx, _Context) or ctx.kind != kind:
        raise KernelError(f"{kind}: backward got a context that its forward did not make")
    if len(grad_outputs) != len(ctx.outputs):
        raise KernelError(f"{kind}: {len(grad_outputs)} output gradients for {len(ctx.outputs)} outputs")
    live = [g is not None and is_float(dt) for g, (_, dt) in zip(grad_outputs, ctx.outputs)]
    n_in = len(ctx.inputs)
    if k.backward is None or not any(live) or not any(is_float(dt) for _, dt in ctx.inputs):
        return [None] * n_in
    grads = [g if ok else xp.zeros(s, dtype=dt)
             for g, ok, (s, dt) in zip(grad_outputs, live, ctx.outputs)]
    for g, (s, _) in zip(grads, ctx.outputs):
        if tuple(g.shape) != tuple(s):
            raise KernelError(f"{kind}: an output gradient of shape {tuple(g.shape)} for an output of {tuple(s)}")
    if wanted is not None and len(wanted) != n_in:
        raise KernelError(f"{kind}: {len(wanted)} wanted flags for {n_in} inputs")
    want = [True] * n_in if wanted is None else [bool(w) for w in wanted]
    if not any(w and is_float(dt) for w, (_, dt) in zip(want, ctx.inputs)):
        return [None] * n_in
    result = k.backward(op, ctx.saved, grads, xp, want) if k.selective else k.backward(op, ctx.saved, grads, xp)
    out: list[Array | None] = []
    for g, w, (s, dt) in zip(result, want, ctx.inputs):
        if g is None or not w or not is_float(dt):
            out.append(None)
            continue
        if tuple(g.shape) != tuple(s):
            raise KernelError(f"{kind}: backward made a gradient of shape {tuple(g.shape)} "
                              f"for an input of {tuple(s)}")
        out.append(g if g.dtype == dt else g.astype(dt))
    return out + [None] * (n_in - len(out))
