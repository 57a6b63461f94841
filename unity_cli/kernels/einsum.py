"""Einsum, forward and backward, on the explicit equation its attrs hold.

Inputs are first broadcast to the full size of each letter (a size-1 dim against a
larger one), so the einsums below never rely on the array module broadcasting labelled
dims. The gradient of input ``i`` is the einsum of the output gradient with the other
inputs onto ``i``'s distinct letters; two things an einsum output cannot express are
built explicitly: a letter only ``i`` has and nothing else sums it (a vector of ones
brings it in), and a letter repeated in ``i`` (the gradient of a diagonal lies on the
diagonal: identity matrices spread it there). Broadcast dims are summed back to size 1.
"""
from __future__ import annotations

from typing import Any

from ..ir.ops.einsum import LETTERS, letter_sizes, parse
from ..ir.opspec import OpKind
from .registry import Array, KernelError, register, unbroadcast


def _einsum(equation: str, operands: list[Array], xp: Any) -> Array:
    # numpy's default contracts all operands in one C loop; its optimizer uses BLAS pairwise.
    if xp.__name__ == "numpy":
        return xp.einsum(equation, *operands, optimize=True)
    return xp.einsum(equation, *operands)


def einsum_forward(op, xs, xp):
    terms, _ = parse(op.equation)
    sizes = letter_sizes(op.equation, [x.shape for x in xs])
    full = []
    for t, x in zip(terms, xs, strict=True):
        want = tuple(sizes[c] for c in t)
        full.append(x if tuple(x.shape) == want else xp.broadcast_to(x, want))
    dtype = xs[0].dtype
    if dtype.kind not in "biufc":
        # A float numpy's einsum does not know (ml_dtypes' bfloat16): computed in float32.
        y = _einsum(op.equation, [x.astype("float32") for x in full], xp).astype(dtype)
    else:
        y = _einsum(op.equation, full, xp)
    return [y], (tuple(full), tuple(x.shape for x in xs), sizes)


def _input_grad(equation: str, i: int, full: tuple[Array, ...], g: Array, sizes: dict[str, int], xp: Any) -> Array:
    """The gradient of full-size input ``i`` (see the module docstring)."""
    terms, out = parse(equation)
    term = terms[i]
    distinct = "".join(dict.fromkeys(term))
    subs = [out] + [t for j, t in enumerate(terms) if j != i]
    operands = [g] + [x for j, x in enumerate(full) if j != i]
    present = set("".join(subs))
    for c in distinct:
        if c not in present:
            subs.append(c)
            operands.append(xp.ones(sizes[c], dtype=g.dtype))
    grad = _einsum(",".join(subs) + "->" + distinct, operands, xp)
    if len(distinct) == len(term):
        return grad
    free = iter(sorted(LETTERS - set(equation)))
    target, eye_subs, eyes, seen = [], [], [], set()
    for c in term:
        if c not in seen:
            seen.add(c)
            target.append(c)
            continue
        new = next(free, None)
        if new is None:
            raise KernelError(f"Einsum {equation!r}: no free letter left for the gradient of a diagonal")
        eye_subs.append(c + new)
        eyes.append(xp.eye(sizes[c], dtype=g.dtype))
        target.append(new)
    return _einsum(",".join([distinct] + eye_subs) + "->" + "".join(target), [grad] + eyes, xp)


def einsum_backward(op, ctx, gs, xp):
    full, shapes, sizes = ctx
    g = gs[0]
    return [unbroadcast(_input_grad(op.equation, i, full, g, sizes, xp), shape, xp)
            for i, shape in enumerate(shapes)]


register(OpKind.Einsum, einsum_forward, einsum_backward)
