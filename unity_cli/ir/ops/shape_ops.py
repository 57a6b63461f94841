"""Data-movement operators: reshape, transpose, concat/split, slicing, (un)squeeze, expand.

All are linear, so partial sums pass through them. Their constant operands (target
shapes, axes, slice bounds) become attributes at import.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ModelError, ShapeError
from ..kernel import Kernel, unbroadcast
from ..opspec import WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Role, Saved, register
from ..shapes import TensorShape
from ..terms import Axiom, Law, Symbol, need
from .common import broadcast_dims, broadcast_roles, need_inputs, norm_axes, norm_axis


@dataclass(frozen=True, slots=True)
class ReshapeAttrs:
    dims: tuple[int, ...]          # fully resolved target shape (no 0 / -1)


@dataclass(frozen=True, slots=True)
class TransposeAttrs:
    perm: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConcatAttrs:
    axis: int


@dataclass(frozen=True, slots=True)
class SplitAttrs:
    axis: int
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SliceAttrs:
    """Per input dim (start, stop, step), normalized to non-negative bounds."""

    ranges: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class ExpandAttrs:
    dims: tuple[int, ...]


def _copy_cost(inputs: Sequence[TensorShape], outputs: Sequence[TensorShape]) -> OpCost:
    moved = float(sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs))
    return OpCost(0.0, moved, 0.0, moved, 1)


def reshape_roles(src: Sequence[int], dst: Sequence[int]) -> tuple[Role, ...]:
    """Roles of a reshape's input dims: a dim maps to an output dim only where a shard of
    it stays one contiguous shard of that output dim (the outermost dims of each group of
    dims whose products match)."""
    roles: list[Role] = [WHOLE] * len(src)
    i = j = 0
    while i < len(src) or j < len(dst):
        gi, gj = [i], [j]
        if i >= len(src) or j >= len(dst):
            break
        pi, pj = src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                if i >= len(src):
                    break
                pi *= src[i]
                gi.append(i)
                i += 1
            else:
                if j >= len(dst):
                    break
                pj *= dst[j]
                gj.append(j)
                j += 1
        lead_i = next((k for k in gi if src[k] != 1), None)
        lead_j = next((k for k in gj if dst[k] != 1), None)
        if lead_i is not None and lead_j is not None:
            roles[lead_i] = lead_j
        elif len(gi) == 1 and len(gj) == 1:
            roles[gi[0]] = gj[0]
    return tuple(roles)


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Data-movement kernels: Transpose, Reshape, Concat, Split, Slice, Expand.
# On a piece, Reshape and Expand get attrs whose ``dims`` are the piece's shape (the
# executor rewrites them), and the ranges of a Slice over a split dim are whole (its role
# requires it), so every kernel here reads only the shapes of its arrays.


def transpose_forward(op, xs, xp):
    return [xp.transpose(xs[0], op.perm)], None


def transpose_backward(op, ctx, gs, xp):
    inv = [0] * len(op.perm)
    for j, p in enumerate(op.perm):
        inv[p] = j
    return [xp.transpose(gs[0], inv)]


def reshape_forward(op, xs, xp):
    x = xs[0]
    return [x.reshape(op.dims)], x.shape


def reshape_backward(op, ctx, gs, xp):
    return [gs[0].reshape(ctx)]


def concat_forward(op, xs, xp):
    return [xp.concatenate(list(xs), axis=op.axis)], [x.shape[op.axis] for x in xs]


def concat_backward(op, ctx, gs, xp):
    return _split(gs[0], ctx, op.axis, xp)


def _split(x, sizes, axis, xp):
    bounds = list(itertools.accumulate(sizes))
    return xp.split(x, bounds[:-1], axis=axis)


def split_forward(op, xs, xp):
    return _split(xs[0], op.sizes, op.axis, xp), None


def split_backward(op, ctx, gs, xp):
    return [xp.concatenate(list(gs), axis=op.axis)]


def _slices(ranges):
    """Python slices for ``slice.indices()`` triples, whose stop of -1 with a negative
    step means "through index 0" (and whose start of -1 then means "empty")."""
    return tuple(slice(a, b if b >= 0 else None, s) if len(range(a, b, s)) else slice(0, 0)
                 for a, b, s in ranges)


def slice_forward(op, xs, xp):
    x = xs[0]
    return [x[_slices(op.ranges)]], x.shape


def slice_backward(op, ctx, gs, xp):
    g = gs[0]
    gx = xp.zeros(ctx, dtype=g.dtype)
    gx[_slices(op.ranges)] = g
    return [gx]


def expand_forward(op, xs, xp):
    x = xs[0]
    # A real array rather than broadcast_to's read-only view with zero strides.
    return [xp.ascontiguousarray(xp.broadcast_to(x, op.dims))], x.shape


def expand_backward(op, ctx, gs, xp):
    return [unbroadcast(gs[0], ctx, xp)]


def _at_piece_shape(self, attrs, output):
    """``OpSpec.piece_attrs`` of an op whose attributes name its whole output's shape
    (Reshape, Expand): the piece's shape instead."""
    return replace(attrs, dims=output.piece.dims)


@register
class Reshape(OpSpec):
    kind = OpKind.Reshape
    kernel = Kernel(reshape_forward, reshape_backward)
    verifier = Opaque("a reshape's axioms (how it commutes with splits and concatenations) are not written yet")
    attrs_type = ReshapeAttrs
    onnx_ops = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    piece_attrs = _at_piece_shape

    def from_onnx(self, node) -> Imported:
        x = node.inputs[0].shape
        match node.op_type:
            case "Reshape":
                target = [int(v) for v in node.const_input(1, "shape").reshape(-1)]
                allow_zero = bool(node.attrs.get("allowzero", 0))
                dims = [x.dims[k] if (v == 0 and not allow_zero) else v for k, v in enumerate(target)]
                if dims.count(-1) > 1:
                    raise ModelError(f"Reshape target {target} has more than one -1")
                if -1 in dims:
                    known = math.prod(d for d in dims if d != -1)
                    if known == 0 or x.numel % known:
                        raise ModelError(f"Reshape of {list(x.dims)} to {target} does not fit")
                    dims[dims.index(-1)] = x.numel // known
            case "Flatten":
                # Flatten's axis lies in [-r, r]; a negative one counts from r, not r + 1.
                axis = int(node.attrs.get("axis", 1))
                axis = norm_axis("Flatten", axis, x.rank + 1 if axis >= 0 else x.rank)
                dims = [math.prod(x.dims[:axis]), math.prod(x.dims[axis:])]
            case "Squeeze":
                axes = node.axes(x.rank, default=[k for k, d in enumerate(x.dims) if d == 1])
                dims = [d for k, d in enumerate(x.dims) if k not in axes]
            case "Unsqueeze":
                axes = node.axes(x.rank + len(node.axes_raw()), default=None)
                it = iter(x.dims)
                dims = [1 if k in axes else next(it) for k in range(x.rank + len(axes))]
            case _:
                raise AssertionError(node.op_type)
        return Imported(ReshapeAttrs(tuple(dims)), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if math.prod(attrs.dims) != x.numel or any(d < 0 for d in attrs.dims):
            raise ShapeError(f"Reshape of {list(x.dims)} to {list(attrs.dims)}: element counts differ")
        return (TensorShape(attrs.dims, x.dtype),)

    def roles(self, attrs, inputs):
        return (reshape_roles(inputs[0].dims, attrs.dims),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return OpCost(0.0, 0.0, 0.0, 0.0, 0)  # a view: no data moves


def _transpose_meaning(run, x):
    need(x.ndim >= 2, f"transpose of a rank-{x.ndim} tensor")
    return run(TransposeAttrs(tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)), x)[0]


# A permutation of a tensor's trailing dims, as the verifier writes it: ``permute(code, x)``.
# The code lists, in decimal digits, the source dim of each of the last L dims counted from
# the first moved one (a tail starts where the permutation first moves a dim, so its first
# digit is never 0): ``[0, 2, 1, 3]`` moves the last three dims as (1, 0, 2), code 102, and
# applies to any tensor of rank 3 or more. The last-two swap (code 10) keeps its own
# symbol, ``transpose``, which the older laws are written in.
MAX_PERMUTED = 4
"""Most trailing dims a verifier's permutation moves (codes of up to 4 digits)."""
SWAP = 10
BATCH_SWAP = 1023
"""The one code of up to 4 dims that keeps the last two where they are (it swaps two batch dims)."""


def perm_code(perm: Sequence[int]) -> int:
    """The code of a permutation of all dims of a tensor: 0 for the identity, else its tail's
    digits; ValueError past :data:`MAX_PERMUTED` dims."""
    r, i = len(perm), 0
    while i < r and perm[i] == i:
        i += 1
    tail = [p - i for p in perm[i:]]
    if len(tail) > MAX_PERMUTED:
        raise ValueError(f"a permutation moving {len(tail)} dims")
    return int("".join(map(str, tail))) if tail else 0


def code_perm(code: int, rank: int) -> tuple[int, ...]:
    """The permutation of all ``rank`` dims that ``code`` stands for (see :func:`perm_code`)."""
    tail = [int(c) for c in str(code)] if code else []
    need(len(tail) <= rank and sorted(tail) == list(range(len(tail))) and (not tail or tail[0] != 0),
         f"permutation code {code} of a rank-{rank} tensor")
    lead = rank - len(tail)
    return tuple(range(lead)) + tuple(lead + t for t in tail)


def all_perm_codes(dims: int = MAX_PERMUTED) -> tuple[int, ...]:
    """Every non-identity permutation code moving at most ``dims`` trailing dims, shortest first."""
    return tuple(perm_code(p) for n in range(2, dims + 1) for p in itertools.permutations(range(n)) if p[0] != 0)


def inverse_code(code: int) -> int:
    """The code of the permutation that undoes ``code``'s."""
    perm = code_perm(code, len(str(code)))
    inv = [0] * len(perm)
    for j, p in enumerate(perm):
        inv[p] = j
    return perm_code(inv)


def _undoes(j, k):
    """The guard ``permute(j, permute(k, x)) = x``: the pair is one of the finitely many
    (code, inverse) pairs (the last-two swap is ``transpose``'s own law)."""
    pairs = [(inverse_code(c), c) for c in all_perm_codes() if c != SWAP]
    return functools.reduce(lambda acc, e: acc | e, [(j == a) & (k == b) for a, b in pairs])


def _permute_meaning(run, code, x):
    return run(TransposeAttrs(code_perm(code, x.ndim)), x)[0]


def permuted(s, x, rank: int) -> tuple[tuple[int, ...], Any]:
    """``(perm, base)`` with the term ``x`` = ``base`` permuted by ``perm`` (of all ``rank``
    dims), peeling the permutations on top of it."""
    perm: tuple[int, ...] = tuple(range(rank))
    while x.num_args() and x.decl() in (s.transpose, s.permute):
        inner = code_perm(SWAP if x.decl() == s.transpose else x.arg(0).as_long(), rank)
        perm = tuple(inner[p] for p in perm)     # transpose(transpose(y, inner), perm)
        x = x.arg(x.num_args() - 1)
    return perm, x


def permute_term(s, perm: Sequence[int], x):
    """The term of ``x`` permuted by ``perm`` (all its dims): ``x`` itself for the identity,
    ``transpose`` for the last-two swap, ``permute`` otherwise."""
    code = perm_code(perm)
    return x if code == 0 else s.transpose(x) if code == SWAP else s.permute(code, x)


def _axis_from_end(ax: int, x) -> int:
    need(-x.ndim <= ax <= -1, f"axis {ax} of a rank-{x.ndim} tensor")
    return x.ndim + ax


def _concat_meaning(run, ax, n1, n2, a, b):
    axis = _axis_from_end(ax, a)
    need(a.ndim == b.ndim and a.shape[ax] == n1 and b.shape[ax] == n2,
         f"concat({ax}, {n1}, {n2}) of {a.shape}, {b.shape}")
    need(all(p == q for k, (p, q) in enumerate(zip(a.shape, b.shape)) if k != axis), "concat: other dims differ")
    return run(ConcatAttrs(axis), a, b)[0]


def _split_meaning(run, ax, n1, n2, i, x):
    axis = _axis_from_end(ax, x)
    need(x.shape[ax] == n1 + n2 and i in (0, 1), f"split({ax}, {n1}, {n2}, {i}) of {x.shape}")
    return run(SplitAttrs(axis, (n1, n2)), x)[i]


@register
class Transpose(OpSpec):
    kind = OpKind.Transpose
    kernel = Kernel(transpose_forward, transpose_backward)
    attrs_type = TransposeAttrs
    onnx_ops = ("Transpose",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        perm = tuple(node.attrs.get("perm", list(range(rank))[::-1]))
        return Imported(TransposeAttrs(perm), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if sorted(attrs.perm) != list(range(x.rank)):
            raise ShapeError(f"Transpose perm {list(attrs.perm)} is not a permutation of rank {x.rank}")
        return (TensorShape(tuple(x.dims[p] for p in attrs.perm), x.dtype),)

    def roles(self, attrs, inputs):
        inv = [0] * len(attrs.perm)
        for j, p in enumerate(attrs.perm):
            inv[p] = j
        return (tuple(inv),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return _copy_cost(inputs, outputs)

    def encode(self, s, attrs, x, ins, outs):
        """A transpose of a permuted term is one permutation of its base: composing them
        here is what the kernels do (``transpose(transpose(y, p), q) = transpose(y, p[q])``),
        so a pair that cancels is the base itself."""
        inner, base = permuted(s, x[0], len(attrs.perm))
        try:
            return [permute_term(s, tuple(inner[q] for q in attrs.perm), base)]
        except ValueError:
            return None    # moves more dims than a code has digits for

    symbols = (Symbol("transpose", ("T",), _transpose_meaning),    # of the last two dims
               Symbol("permute", ("I", "T"), _permute_meaning))    # of the last dims a code names
    axioms = (
        Axiom("transpose-transpose", lambda s, v: Law(s.transpose(s.transpose(v.x)), v.x)),
        Axiom("transpose-matmul", lambda s, v: Law(s.transpose(s.matmul(v.a, v.b)),
                                                   s.matmul(s.transpose(v.b), s.transpose(v.a)))),
        Axiom("transpose-add", lambda s, v: Law(s.transpose(s.add(v.a, v.b)),
                                                s.add(s.transpose(v.a), s.transpose(v.b)))),
        Axiom("transpose-mul", lambda s, v: Law(s.transpose(s.mul(v.a, v.b)),
                                                s.mul(s.transpose(v.a), s.transpose(v.b)))),
        Axiom("transpose-relu", lambda s, v: Law(s.transpose(s.relu(v.x)), s.relu(s.transpose(v.x)))),
        Axiom("transpose-ew", lambda s, v: Law(s.transpose(s.ew(v.k, v.x)), s.ew(v.k, s.transpose(v.x)))),
        Axiom("transpose-scale", lambda s, v: Law(s.transpose(s.scale(v.k, v.x)), s.scale(v.k, s.transpose(v.x)))),
        Axiom("transpose-concat-last", lambda s, v: Law(
            s.transpose(s.concat(-1, v.n1, v.n2, v.a, v.b)),
            s.concat(-2, v.n1, v.n2, s.transpose(v.a), s.transpose(v.b)))),
        Axiom("transpose-concat-rows", lambda s, v: Law(
            s.transpose(s.concat(-2, v.n1, v.n2, v.a, v.b)),
            s.concat(-1, v.n1, v.n2, s.transpose(v.a), s.transpose(v.b)))),
        Axiom("transpose-concat-batch", lambda s, v: Law(
            s.transpose(s.concat(v.ax, v.n1, v.n2, v.a, v.b)),
            s.concat(v.ax, v.n1, v.n2, s.transpose(v.a), s.transpose(v.b)), v.ax <= -3)),
        Axiom("permute-inverse", lambda s, v: Law(s.permute(v.j, s.permute(v.k, v.x)), v.x, _undoes(v.j, v.k),
                                                  two_way=False)),
        # Elementwise functions commute with any permutation.
        Axiom("permute-relu", lambda s, v: Law(s.permute(v.k, s.relu(v.x)), s.relu(s.permute(v.k, v.x)))),
        Axiom("permute-ew", lambda s, v: Law(s.permute(v.k, s.ew(v.j, v.x)), s.ew(v.j, s.permute(v.k, v.x)))),
        Axiom("permute-scale", lambda s, v: Law(s.permute(v.k, s.scale(v.j, v.x)),
                                                s.scale(v.j, s.permute(v.k, v.x)))),
        Axiom("permute-add", lambda s, v: Law(s.permute(v.k, s.add(v.a, v.b)),
                                              s.add(s.permute(v.k, v.a), s.permute(v.k, v.b)))),
        Axiom("permute-mul", lambda s, v: Law(s.permute(v.k, s.mul(v.a, v.b)),
                                              s.mul(s.permute(v.k, v.a), s.permute(v.k, v.b)))),
    )


@register
class Concat(OpSpec):
    kind = OpKind.Concat
    kernel = Kernel(concat_forward, concat_backward)
    attrs_type = ConcatAttrs
    onnx_ops = ("Concat",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        return Imported(ConcatAttrs(norm_axis("Concat", int(node.attrs["axis"]), rank)), tuple(range(len(node.inputs))))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1, 1 << 16)
        x = inputs[0]
        if not 0 <= attrs.axis < x.rank:
            raise ShapeError(f"Concat: axis {attrs.axis} is out of range for rank {x.rank}")
        for k, s in enumerate(inputs):
            if s.rank != x.rank or any(a != b for d, (a, b) in enumerate(zip(s.dims, x.dims)) if d != attrs.axis):
                raise ShapeError(f"Concat on axis {attrs.axis}: input {k} {list(s.dims)} does not fit {list(x.dims)}")
            if s.dtype != x.dtype:
                raise ShapeError(f"Concat: input {k} has type {s.dtype.value}, input 0 {x.dtype.value}")
        total = sum(s.dims[attrs.axis] for s in inputs)
        return (TensorShape(x.dims[:attrs.axis] + (total,) + x.dims[attrs.axis + 1:], x.dtype),)

    def roles(self, attrs, inputs):
        return tuple(tuple(WHOLE if d == attrs.axis else d for d in range(s.rank)) for s in inputs)

    def terms(self, attrs, n):
        return tuple((i,) for i in range(n))

    def cost(self, attrs, inputs, outputs):
        """Forward copies the parts into one tensor; backward hands each part a view of
        the gradient (its kernel, below), which moves nothing."""
        copy = _copy_cost(inputs, outputs)
        return OpCost(0.0, copy.fwd_bytes, 0.0, 0.0, 1)

    def encode(self, s, attrs, x, ins, outs):   # nested from the left: concat(concat(a, b), c)
        ax = attrs.axis - ins[0].rank
        acc, size = x[0], ins[0].sizes[attrs.axis]
        for t, shape in zip(x[1:], ins[1:], strict=True):
            acc = s.concat(ax, size, shape.sizes[attrs.axis], acc, t)
            size += shape.sizes[attrs.axis]
        return [acc]

    # concat(ax, n1, n2, a, b): the parts carry their sizes along ax, an axis counted from the end
    symbols = (Symbol("concat", ("I", "I", "I", "T", "T"), _concat_meaning),)
    axioms = (
        Axiom("concat-assoc-left", lambda s, v: Law(
            s.concat(v.ax, v.n1, v.m, v.a, s.concat(v.ax, v.n2, v.n3, v.b, v.c)),
            s.concat(v.ax, v.n1 + v.n2, v.n3, s.concat(v.ax, v.n1, v.n2, v.a, v.b), v.c), v.m == v.n2 + v.n3, False)),
        Axiom("concat-assoc-right", lambda s, v: Law(
            s.concat(v.ax, v.m, v.n3, s.concat(v.ax, v.n1, v.n2, v.a, v.b), v.c),
            s.concat(v.ax, v.n1, v.n2 + v.n3, v.a, s.concat(v.ax, v.n2, v.n3, v.b, v.c)), v.m == v.n1 + v.n2, False)),
        Axiom("concat-interchange", lambda s, v: Law(
            s.concat(v.ax, v.m, v.n3, s.concat(v.i, v.n1, v.n2, v.a, v.b), s.concat(v.i, v.n1, v.n2, v.c, v.d)),
            s.concat(v.i, v.n1, v.n2, s.concat(v.ax, v.m, v.n3, v.a, v.c), s.concat(v.ax, v.m, v.n3, v.b, v.d)),
            v.ax != v.i)),
        Axiom("concat-split", lambda s, v: Law(
            s.concat(v.ax, v.n1, v.n2, s.split(v.ax, v.n1, v.n2, 0, v.x), s.split(v.ax, v.n1, v.n2, 1, v.x)), v.x)),
    )


@register
class Split(OpSpec):
    kind = OpKind.Split
    kernel = Kernel(split_forward, split_backward)
    attrs_type = SplitAttrs
    onnx_ops = ("Split",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        x = node.inputs[0].shape
        axis = norm_axis("Split", int(node.attrs.get("axis", 0)), x.rank)
        n = len(node.outputs)
        if "split" in node.attrs:
            sizes = tuple(node.attrs["split"])
        elif len(node.inputs) > 1 and node.inputs[1].name:
            sizes = tuple(int(v) for v in node.const_input(1, "split"))
        else:
            n = int(node.attrs.get("num_outputs", n))
            chunk = -(-x.dims[axis] // n)
            sizes = tuple(min(chunk, x.dims[axis] - k * chunk) for k in range(n))
        return Imported(SplitAttrs(axis, sizes), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if not 0 <= attrs.axis < x.rank:
            raise ShapeError(f"Split: axis {attrs.axis} is out of range for rank {x.rank}")
        if sum(attrs.sizes) != x.dims[attrs.axis]:
            raise ShapeError(f"Split sizes {list(attrs.sizes)} do not add up to dim {attrs.axis} of {list(x.dims)}")
        return tuple(TensorShape(x.dims[:attrs.axis] + (s,) + x.dims[attrs.axis + 1:], x.dtype) for s in attrs.sizes)

    def roles(self, attrs, inputs):
        return (tuple(WHOLE if d == attrs.axis else d for d in range(inputs[0].rank)),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        """Forward hands out views of the input (its kernel, below), which move nothing;
        backward concatenates the parts' gradients, a copy."""
        copy = _copy_cost(inputs, outputs)
        return OpCost(0.0, 0.0, 0.0, copy.bwd_bytes, 1)

    def encode(self, s, attrs, x, ins, outs):   # nested as Concat nests, so that one undoes the other term by term
        ax = attrs.axis - ins[0].rank
        parts, rest, total = [], x[0], sum(attrs.sizes)
        for size in reversed(attrs.sizes[1:]):
            parts.append(s.split(ax, total - size, size, 1, rest))
            rest, total = s.split(ax, total - size, size, 0, rest), total - size
        return [rest] + parts[::-1]

    # split(ax, n1, n2, i, x): part i of x cut in two along ax (from the end) at n1
    symbols = (Symbol("split", ("I", "I", "I", "I", "T"), _split_meaning),)
    axioms = (
        Axiom("split-concat-first", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, 0, s.concat(v.ax, v.n1, v.n2, v.a, v.b)), v.a)),
        Axiom("split-concat-second", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, 1, s.concat(v.ax, v.n1, v.n2, v.a, v.b)), v.b)),
        Axiom("split-concat-across", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, v.i, s.concat(v.j, v.m, v.n3, v.a, v.b)),
            s.concat(v.j, v.m, v.n3, s.split(v.ax, v.n1, v.n2, v.i, v.a), s.split(v.ax, v.n1, v.n2, v.i, v.b)),
            v.ax != v.j)),
        Axiom("split-relu", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.relu(v.x)),
                                             s.relu(s.split(v.ax, v.n1, v.n2, v.i, v.x)))),
        Axiom("split-ew", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.ew(v.k, v.x)),
                                           s.ew(v.k, s.split(v.ax, v.n1, v.n2, v.i, v.x)))),
        Axiom("split-scale", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.scale(v.k, v.x)),
                                              s.scale(v.k, s.split(v.ax, v.n1, v.n2, v.i, v.x)))),
        Axiom("split-add", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, v.i, s.add(v.x, v.y)),
            s.add(s.split(v.ax, v.n1, v.n2, v.i, v.x), s.split(v.ax, v.n1, v.n2, v.i, v.y)))),
        # (y spans the split dim: a y broadcast along it would stay whole, another law)
        Axiom("split-badd", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, v.i, s.badd(v.x, v.y)),
            s.badd(s.split(v.ax, v.n1, v.n2, v.i, v.x), s.split(v.ax, v.n1, v.n2, v.i, v.y)))),
        Axiom("split-mul", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, v.i, s.mul(v.x, v.y)),
            s.mul(s.split(v.ax, v.n1, v.n2, v.i, v.x), s.split(v.ax, v.n1, v.n2, v.i, v.y)))),
        Axiom("split-transpose-last", lambda s, v: Law(s.split(-1, v.n1, v.n2, v.i, s.transpose(v.x)),
                                                       s.transpose(s.split(-2, v.n1, v.n2, v.i, v.x)))),
        Axiom("split-transpose-rows", lambda s, v: Law(s.split(-2, v.n1, v.n2, v.i, s.transpose(v.x)),
                                                       s.transpose(s.split(-1, v.n1, v.n2, v.i, v.x)))),
        Axiom("split-transpose-batch", lambda s, v: Law(s.split(v.ax, v.n1, v.n2, v.i, s.transpose(v.x)),
                                                        s.transpose(s.split(v.ax, v.n1, v.n2, v.i, v.x)),
                                                        v.ax <= -3)),
        Axiom("split-matmul-rows", lambda s, v: Law(s.split(-2, v.n1, v.n2, v.i, s.matmul(v.a, v.b)),
                                                    s.matmul(s.split(-2, v.n1, v.n2, v.i, v.a), v.b))),
        Axiom("split-matmul-cols", lambda s, v: Law(s.split(-1, v.n1, v.n2, v.i, s.matmul(v.a, v.b)),
                                                    s.matmul(v.a, s.split(-1, v.n1, v.n2, v.i, v.b)))),
        Axiom("split-matmul-batch", lambda s, v: Law(
            s.split(v.ax, v.n1, v.n2, v.i, s.matmul(v.a, v.b)),
            s.matmul(s.split(v.ax, v.n1, v.n2, v.i, v.a), s.split(v.ax, v.n1, v.n2, v.i, v.b)), v.ax <= -3)),
    )


@register
class Slice(OpSpec):
    kind = OpKind.Slice
    kernel = Kernel(slice_forward, slice_backward)
    verifier = Opaque("a strided window: no axioms yet (Split is the slicing the rules use)")
    attrs_type = SliceAttrs
    onnx_ops = ("Slice",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    def from_onnx(self, node) -> Imported:
        x = node.inputs[0].shape
        if node.opset < 10:
            starts, ends = node.attrs["starts"], node.attrs["ends"]
            axes = node.attrs.get("axes", list(range(len(starts))))
            steps = [1] * len(starts)
        else:
            starts = [int(v) for v in node.const_input(1, "starts")]
            ends = [int(v) for v in node.const_input(2, "ends")]
            axes = [int(v) for v in node.const_input(3, "axes")] if node.has_input(3) else list(range(len(starts)))
            steps = [int(v) for v in node.const_input(4, "steps")] if node.has_input(4) else [1] * len(starts)
        ranges = [(0, d, 1) for d in x.dims]
        for a, s, e, st in zip(norm_axes("Slice", axes, x.rank), starts, ends, steps):
            ranges[a] = slice(s, e, st).indices(x.dims[a])
        return Imported(SliceAttrs(tuple(ranges)), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if len(attrs.ranges) != x.rank:
            raise ShapeError(f"Slice has {len(attrs.ranges)} ranges for a rank-{x.rank} input")
        return (TensorShape(tuple(len(range(*r)) for r in attrs.ranges), x.dtype),)

    def roles(self, attrs, inputs):
        x = inputs[0]
        return (tuple(d if attrs.ranges[d] == (0, x.dims[d], 1) else WHOLE for d in range(x.rank)),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return _copy_cost(outputs, outputs)


@register
class Expand(OpSpec):
    kind = OpKind.Expand
    kernel = Kernel(expand_forward, expand_backward)
    verifier = Opaque("a broadcast to a given shape: no axioms yet")
    attrs_type = ExpandAttrs
    onnx_ops = ("Expand",)

    def saved(self, attrs, inputs, outputs):
        """Nothing but shapes."""
        return Saved()

    piece_attrs = _at_piece_shape

    def from_onnx(self, node) -> Imported:
        target = TensorShape(tuple(int(v) for v in node.const_input(1, "shape")))
        dims = broadcast_dims("Expand", [node.inputs[0].shape, target])
        return Imported(ExpandAttrs(dims), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if broadcast_dims("Expand", [x, TensorShape(attrs.dims)]) != attrs.dims:
            raise ShapeError(f"Expand of {list(x.dims)} to {list(attrs.dims)}")
        return (TensorShape(attrs.dims, x.dtype),)

    def roles(self, attrs, inputs):
        return (broadcast_roles(inputs[0], attrs.dims),)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        return _copy_cost(inputs, outputs)
