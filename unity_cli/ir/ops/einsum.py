"""Einsum: a sum of products over labelled dims, ``y[out] = sum over the rest of prod_i x_i[term_i]``.

The equation is stored in explicit form (``"bij,bjk->bik"``): ellipses are expanded to
concrete letters for the inputs' ranks and an implicit output (no ``->``) is made
explicit, so the attrs never depend on dim sizes and a piece runs the same equation.

Parallelization, per letter: a letter of the output maps every input dim it labels to
that output dim; one summed letter (not in the output) is ``SUM``, since the op is
linear in each input and a split of it leaves partial sums. The pieces of a split op
read one shard index for every ``SUM`` dim, which is right only when those dims carry
one letter: with two summed letters split, the pieces would pair shard ``c`` of one
with shard ``c`` of the other only. So exactly one summed letter (the largest) is
``SUM`` and the others stay whole, as do letters repeated within one input (a diagonal
``"ii->i"`` needs both dims whole) and a size-1 dim broadcast against a larger one.
"""
from __future__ import annotations

import math
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import ModelError, ShapeError
from ..kernel import Array, Kernel, KernelError, unbroadcast
from ..opspec import SUM, WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Role, Saved, register
from ..shapes import TensorShape

LETTERS = frozenset(string.ascii_letters)
ELLIPSIS = "..."


@dataclass(frozen=True, slots=True)
class EinsumAttrs:
    """An einsum equation in explicit form, ellipses expanded: ``"bij,bjk->bik"``."""

    equation: str


def parse(equation: str) -> tuple[tuple[str, ...], str]:
    """The input terms and the output term of an explicit equation."""
    lhs, arrow, out = equation.partition("->")
    if not arrow:
        raise ShapeError(f"Einsum equation {equation!r} is not in explicit form")
    return tuple(lhs.split(",")), out


def normalize(equation: str, ranks: Sequence[int]) -> str:
    """``equation`` in explicit form for inputs of ``ranks``: spaces dropped, each
    ``...`` replaced by letters the equation does not use (right-aligned, as numpy
    broadcasts them), and an implicit output made explicit (numpy's: the ellipsis dims,
    then the letters that occur once, in alphabetical order)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ModelError(f"Einsum equation {equation!r} has {len(terms)} operands, the node {len(ranks)} inputs")
    for t in terms + ([out] if arrow else []):
        bad = set(t.replace(ELLIPSIS, "")) - LETTERS
        if bad or t.count(ELLIPSIS) > 1:
            raise ModelError(f"Einsum equation {equation!r}: term {t!r} is not letters with at most one '...'")
    used = set(eq) & LETTERS
    ell_len = []
    for t, r in zip(terms, ranks, strict=True):
        named = len(t.replace(ELLIPSIS, ""))
        n = r - named
        if n < 0 or (n and ELLIPSIS not in t):
            raise ModelError(f"Einsum equation {equation!r}: term {t!r} does not fit an input of rank {r}")
        ell_len.append(n if ELLIPSIS in t else 0)
    width = max(ell_len, default=0)
    fresh = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in used]
    if len(fresh) < width:
        raise ModelError(f"Einsum equation {equation!r}: too few free letters for its '...' dims")
    ell = "".join(fresh[:width])
    terms = [t.replace(ELLIPSIS, ell[width - n:]) for t, n in zip(terms, ell_len, strict=True)]
    if arrow:
        if ELLIPSIS not in out and width:
            raise ModelError(f"Einsum equation {equation!r}: the inputs have '...' dims but the output has no '...'")
        out = out.replace(ELLIPSIS, ell)
    else:
        counts = {c: "".join(terms).count(c) for c in set("".join(terms))}
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    result = ",".join(terms) + "->" + out
    _check_output(result)
    return result


def _check_output(equation: str) -> None:
    terms, out = parse(equation)
    if len(set(out)) != len(out):
        raise ShapeError(f"Einsum equation {equation!r} repeats a letter in its output")
    missing = set(out) - set("".join(terms))
    if missing:
        raise ShapeError(f"Einsum equation {equation!r}: output letters {sorted(missing)} label no input dim")


def letter_sizes(equation: str, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    """The size of each letter: equal wherever it labels a dim, or 1 where it broadcasts."""
    terms, _ = parse(equation)
    if len(terms) != len(shapes):
        raise ShapeError(f"Einsum {equation!r} takes {len(terms)} inputs, got {len(shapes)}")
    sizes: dict[str, int] = {}
    for i, (t, dims) in enumerate(zip(terms, shapes, strict=True)):
        if len(t) != len(dims):
            raise ShapeError(f"Einsum {equation!r}: input {i} has rank {len(dims)}, its term {t!r} {len(t)}")
        own: dict[str, int] = {}
        for c, d in zip(t, dims, strict=True):
            if own.setdefault(c, d) != d:
                raise ShapeError(f"Einsum {equation!r}: input {i} labels dims of sizes {own[c]} and {d} {c!r}")
        for c, d in own.items():
            known = sizes.get(c, d)
            if known != d and 1 not in (known, d):
                raise ShapeError(f"Einsum {equation!r}: letter {c!r} has sizes {known} and {d}")
            sizes[c] = max(known, d)
    return sizes


def _letter_roles(equation: str, sizes: dict[str, int]) -> dict[str, Role]:
    """Each letter's role (see the module docstring)."""
    terms, out = parse(equation)
    diagonal = {c for t in terms for c in t if t.count(c) > 1}
    roles: dict[str, Role] = {}
    summed = []
    for c in dict.fromkeys("".join(terms)):
        if c in diagonal:
            roles[c] = WHOLE
        elif c in out:
            roles[c] = out.index(c)
        else:
            roles[c] = WHOLE
            summed.append(c)
    if summed:
        # The largest contraction, the first of equals: the one worth splitting.
        roles[max(summed, key=lambda c: sizes[c])] = SUM
    return roles


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Einsum, forward and backward, on the explicit equation its attrs hold.
# Inputs are first broadcast to the full size of each letter (a size-1 dim against a
# larger one), so the einsums below never rely on the array module broadcasting labelled
# dims. The gradient of input ``i`` is the einsum of the output gradient with the other
# inputs onto ``i``'s distinct letters; two things an einsum output cannot express are
# built explicitly: a letter only ``i`` has and nothing else sums it (a vector of ones
# brings it in), and a letter repeated in ``i`` (the gradient of a diagonal lies on the
# diagonal: identity matrices spread it there). Broadcast dims are summed back to size 1.


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


@register
class Einsum(OpSpec):
    kind = OpKind.Einsum
    kernel = Kernel(einsum_forward, einsum_backward)
    verifier = Opaque("a general contraction; imported Einsums that are matmuls are not rewritten to MatMul yet")
    attrs_type = EinsumAttrs
    onnx_ops = ("Einsum",)

    def saved(self, attrs, inputs, outputs):
        """Every operand (broadcast views of them)."""
        return Saved(tuple(range(len(inputs))))

    def from_onnx(self, node) -> Imported:
        if "equation" not in node.attrs:
            raise ModelError("Einsum has no equation")
        ranks = [i.shape.rank for i in node.inputs]
        return Imported(EinsumAttrs(normalize(str(node.attrs["equation"]), ranks)), tuple(range(len(node.inputs))))

    def infer(self, attrs, inputs):
        if not inputs:
            raise ShapeError("Einsum takes at least one input")
        if len({s.dtype for s in inputs}) > 1:
            raise ShapeError(f"Einsum: inputs have different types {[s.dtype.value for s in inputs]}")
        _check_output(attrs.equation)
        sizes = letter_sizes(attrs.equation, [s.dims for s in inputs])
        _, out = parse(attrs.equation)
        return (TensorShape(tuple(sizes[c] for c in out), inputs[0].dtype),)

    def roles(self, attrs, inputs):
        sizes = letter_sizes(attrs.equation, [s.dims for s in inputs])
        letter = _letter_roles(attrs.equation, sizes)
        terms, _ = parse(attrs.equation)
        return tuple(tuple(WHOLE if d == 1 and sizes[c] != 1 else letter[c] for c, d in zip(t, s.dims, strict=True))
                     for t, s in zip(terms, inputs, strict=True))

    def terms(self, attrs, n):
        return (tuple(range(n)),)

    def cost(self, attrs, inputs, outputs):
        flops = 2.0 * math.prod(letter_sizes(attrs.equation, [s.dims for s in inputs]).values())
        moved = float(sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs))
        # Backward: one einsum per input, each about as large as the forward.
        return OpCost(flops, moved, 2 * flops, 2 * moved + sum(s.nbytes for s in inputs), 1)
