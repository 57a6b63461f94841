"""Attention: ``softmax(scale * q k^T + mask) v`` in one operator, whose kernels never hold the
[Sq, Sk] scores of a whole sequence.

Inputs ``q`` [..., Sq, d], ``k`` [..., Sk, d] (not transposed), ``v`` [..., Sk, dv], then, as
the attributes say, an additive ``mask`` that broadcasts to the scores [..., Sq, Sk] and a
one-element ``factor`` tensor that multiplies them. The leading (batch and head) dims broadcast
as numpy's do: grouped-query attention's k and v carry a size-1 group axis, and each query
head reads its key/value head there, with no copy.

The chain a decoder's export writes, ``MatMul(Softmax(Add(Mul(MatMul(q, Transpose(k)), s),
mask)), v)``, keeps several [Sq, Sk] tensors for backward; this operator keeps only its output
and a log-sum-exp per query row. Its kernels walk the keys in blocks of :data:`KEY_BLOCK`:
forward with an online softmax (a running max and sum per row), backward recomputing each
block's probabilities from q, k and the log-sum-exp (FlashAttention-2's scheme). A rewrite
makes it from the chain (``substitutions/attention_rules.py``): the chain's scale is a
constant tensor, which no rule can read as a number, so the rewrite passes it as ``factor``.

The mask is taken as a constant (a causal or padding mask): backward gives it no gradient,
which for a [Sq, Sk] mask would be a score-sized tensor, so no rewrite makes an Attention
whose mask needs one (``no_grad_inputs``: a learned additive bias, as Swin's relative
position bias, keeps its chain). Making that gradient when asked for it is not built.

Parallelization: the batch and head dims split through, as does the query axis (each piece
takes the mask's rows of its queries); the key axis and the head dim stay whole. The output
is linear in ``v``: partial sums of ``v`` pass through.

The verifier sees an Attention as the chain of operators it stands for, each encoded by its
own spec (:meth:`Attention.encode`); a fractional ``scale`` has no such term, and that
Attention is an uninterpreted function.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ShapeError
from ..dtypes import DType
from ..kernel import Kernel, unbroadcast
from ..opspec import WHOLE, OpCost, OpKind, OpSpec, Role, Saved, encode_terms, register, spec_of
from ..shapes import ParallelTensorShape, TensorShape
from .common import broadcast_dims, broadcast_roles, need_inputs
from .elementwise import BinaryAttrs, ScaleAttrs
from .linear import MatMulAttrs
from .norm import SoftmaxAttrs
from .shape_ops import TransposeAttrs

KEY_BLOCK = 128
"""Keys per block of the kernels: the scores they hold at once are [..., Sq, KEY_BLOCK]."""
SOFTMAX_FLOPS = 5
"""Flops per score element beside the two products: scale, mask, running max, exp, sum."""


@dataclass(frozen=True, slots=True)
class AttentionAttrs:
    """``softmax(scale * factor * q k^T + mask) v`` over the last axis; ``mask``: input 3 is
    the additive mask; ``factor``: the last input is a one-element tensor multiplying the
    scores (a constant of the graph, as the chain's own scale is)."""

    scale: float = 1.0
    mask: bool = False
    factor: bool = False


@dataclass(frozen=True, slots=True)
class _Parts:
    """The inputs by role (shapes, arrays or terms); None for an absent optional one."""

    q: Any
    k: Any
    v: Any
    mask: Any
    factor: Any


def _parts(attrs: AttentionAttrs, xs: Sequence[Any]) -> _Parts:
    return _Parts(xs[0], xs[1], xs[2], xs[3] if attrs.mask else None, xs[-1] if attrs.factor else None)


def _batch(p: _Parts) -> tuple[int, ...]:
    """The broadcast batch dims of the scores and the output: of q, k, v and the mask."""
    lead = [TensorShape(t.dims[:-2]) for t in (p.q, p.k, p.v)]
    if p.mask is not None:
        lead.append(TensorShape(p.mask.dims[:-2]))
    return broadcast_dims(OpKind.Attention, lead)


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``), over blocks of keys.
# Half-precision inputs are computed in float32. A row whose scores are all -inf so far has
# its running max taken as 0 (so exp gives 0 and no NaN); a row masked everywhere is NaN, as
# the chain's softmax makes it.


def _compute_dtype(dtype: Any) -> Any:
    return "float32" if dtype.itemsize < 4 else dtype


def _scale_of(op: AttentionAttrs, factor: Any, dtype: Any, xp: Any) -> Any:
    """The scores' multiplier as a 0-d array: ``scale``, times the factor tensor if any."""
    c = xp.asarray(op.scale, dtype=dtype)
    return c if factor is None else c * factor.reshape(()).astype(dtype)


def _block(t: Any, j0: int, j1: int) -> Any:
    """Keys ``j0:j1`` of k or v (axis -2)."""
    return t[..., j0:j1, :]


def _mask_block(mask: Any, j0: int, j1: int) -> Any:
    """The mask's columns of keys ``j0:j1``; a mask broadcast along the keys as it is."""
    if mask is None or mask.ndim == 0 or mask.shape[-1] == 1:
        return mask
    return mask[..., j0:j1]


def _scores(q: Any, kb: Any, c: Any, mb: Any, xp: Any) -> tuple[Any, Any]:
    """One key block's scores ``c q kb^T + mb``, and ``q kb^T``."""
    raw = xp.matmul(q, xp.swapaxes(kb, -1, -2))
    s = raw * c
    return (s if mb is None else s + mb), raw


def attention_forward(op, xs, xp):
    """Online softmax over the key blocks: per query row a running max, the running sum of
    exp(score - max) and of its products with v, each rescaled when the max grows; keeps
    the output and the log-sum-exp ``max + log(sum)`` for backward."""
    p = _parts(op, xs)
    dtype = p.q.dtype
    cdt = _compute_dtype(dtype)
    q, k, v = (t.astype(cdt, copy=False) for t in (p.q, p.k, p.v))
    mask = None if p.mask is None else p.mask.astype(cdt, copy=False)
    c = _scale_of(op, p.factor, cdt, xp)
    rows = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                               () if mask is None else mask.shape[:-2]) + (q.shape[-2],)
    top = xp.full(rows + (1,), -xp.inf, dtype=cdt)        # running max of each row's scores
    total = xp.zeros(rows + (1,), dtype=cdt)              # running sum of exp(score - top)
    acc = xp.zeros(rows + (v.shape[-1],), dtype=cdt)      # running sum of exp(score - top) v
    for j0 in range(0, k.shape[-2], KEY_BLOCK):
        j1 = min(j0 + KEY_BLOCK, k.shape[-2])
        s, _ = _scores(q, _block(k, j0, j1), c, _mask_block(mask, j0, j1), xp)
        new = xp.maximum(top, s.max(axis=-1, keepdims=True))
        ref = xp.where(new == -xp.inf, 0, new)
        e = xp.exp(s - ref)
        keep = xp.exp(top - ref)
        total = total * keep + e.sum(axis=-1, keepdims=True)
        acc = acc * keep + xp.matmul(e, _block(v, j0, j1))
        top = new
    out = (acc / total).astype(dtype, copy=False)
    lse = top + xp.log(total)
    # the inputs and output as they are (half precision converted again in backward), the
    # log-sum-exp and the multiplier: what saved() declares
    return [out], (p.q, p.k, p.v, p.mask, p.factor, c, out, lse)


def attention_backward(op, ctx, gs, xp):
    """FlashAttention-2's backward: per key block, ``P = exp(S - lse)``, ``dV = P^T dO``,
    ``dS = P (dO V^T - D)`` with ``D = rowsum(dO O)``, ``dQ += c dS K``, ``dK = c dS^T Q``;
    gradients of broadcast dims (a group axis) summed back. The mask gets none (a constant);
    the factor gets ``scale * sum(dS q k^T)``."""
    q, k, v, mask, factor, c, out, lse = ctx
    q, k, v, out = (t.astype(lse.dtype, copy=False) for t in (q, k, v, out))
    mask = None if mask is None else mask.astype(lse.dtype, copy=False)
    g = gs[0].astype(out.dtype, copy=False)
    d = (g * out).sum(axis=-1, keepdims=True)
    dq = None
    dk = xp.zeros(k.shape, dtype=out.dtype)
    dv = xp.zeros(v.shape, dtype=out.dtype)
    dfactor = xp.zeros((), dtype=out.dtype)
    for j0 in range(0, k.shape[-2], KEY_BLOCK):
        j1 = min(j0 + KEY_BLOCK, k.shape[-2])
        kb, vb = _block(k, j0, j1), _block(v, j0, j1)
        s, raw = _scores(q, kb, c, _mask_block(mask, j0, j1), xp)
        prob = xp.exp(s - lse)
        dv[..., j0:j1, :] = unbroadcast(xp.matmul(xp.swapaxes(prob, -1, -2), g), vb.shape, xp)
        ds = prob * (xp.matmul(g, xp.swapaxes(vb, -1, -2)) - d)
        dk[..., j0:j1, :] = unbroadcast(xp.matmul(xp.swapaxes(ds, -1, -2), q) * c, kb.shape, xp)
        part = xp.matmul(ds, kb)
        dq = part if dq is None else dq + part
        if factor is not None:
            dfactor = dfactor + (ds * raw).sum()
    grads = [unbroadcast(dq * c, q.shape, xp), dk, dv]
    if op.mask:
        grads.append(None)
    if factor is not None:
        grads.append((dfactor * op.scale).reshape(factor.shape))
    return grads


@register
class Attention(OpSpec):
    """Encoded for the verifier as the chain it stands for: ``matmul(softmax(-1, s + mask), v)``
    with ``s = factor * scale * matmul(q, transpose(k))``, each operator's term as its own spec
    writes it (a product whose batch dims broadcast is its uninterpreted function, as a MatMul
    node's is). Its meaning is that composition: a rule that makes an Attention is proved equal
    to it, and what the composition computes is the kernels' business, which the tests hold
    to the chain's kernels."""

    kind = OpKind.Attention
    kernel = Kernel(attention_forward, attention_backward)
    attrs_type = AttentionAttrs

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 3 + attrs.mask + attrs.factor)
        p = _parts(attrs, inputs)
        for name, t in (("q", p.q), ("k", p.k), ("v", p.v)):
            if t.rank < 2:
                raise ShapeError(f"Attention: {name} must be [..., S, d], got {list(t.dims)}")
        if not p.q.dtype.is_float or any(t.dtype != p.q.dtype for t in inputs):
            raise ShapeError(f"Attention: inputs must share one float type, got {[t.dtype.value for t in inputs]}")
        if p.q.dims[-1] != p.k.dims[-1]:
            raise ShapeError(f"Attention: q {list(p.q.dims)} and k {list(p.k.dims)} differ in their last dim")
        if p.k.dims[-2] != p.v.dims[-2]:
            raise ShapeError(f"Attention: k {list(p.k.dims)} and v {list(p.v.dims)} differ in their keys (dim -2)")
        batch = _batch(p)
        scores = batch + (p.q.dims[-2], p.k.dims[-2])
        if p.mask is not None and broadcast_dims(self.kind, [p.mask, TensorShape(scores)]) != scores:
            raise ShapeError(f"Attention: mask {list(p.mask.dims)} does not broadcast to the scores {list(scores)}")
        if p.factor is not None and (p.factor.numel != 1 or p.factor.rank > len(scores)):
            raise ShapeError(f"Attention: factor must have one element, got {list(p.factor.dims)}")
        return (TensorShape(batch + (p.q.dims[-2], p.v.dims[-1]), p.q.dtype),)

    def roles(self, attrs, inputs):
        p = _parts(attrs, inputs)
        batch = _batch(p)
        n = len(batch)

        def lead(t: TensorShape) -> tuple[Role, ...]:
            """Batch dims: the output dim each aligns with, whole where it is broadcast."""
            off = n - (t.rank - 2)
            return tuple(WHOLE if d == 1 and batch[off + i] != 1 else off + i for i, d in enumerate(t.dims[:-2]))

        out: list[tuple[Role, ...]] = [lead(p.q) + (n, WHOLE), lead(p.k) + (WHOLE, WHOLE),
                                       lead(p.v) + (WHOLE, WHOLE)]
        if p.mask is not None:   # aligned with the scores [*batch, Sq, Sk]; the keys stay whole
            r = broadcast_roles(p.mask, batch + (p.q.dims[-2], p.k.dims[-2]))
            out.append(r[:-1] + (WHOLE,) if r else ())
        if p.factor is not None:
            out.append((WHOLE,) * p.factor.rank)
        return tuple(out)

    def terms(self, attrs, n):
        return ((2,),)     # linear in v alone

    def cost(self, attrs, inputs, outputs):
        """Forward ``2 E d`` for the scores and ``2 E dv`` for the product with v (``E`` score
        elements: ``4 N H Sq Sk d`` when ``dv = d``), plus the softmax's work; backward
        recomputes the scores (``2 E d``) and their exp, and makes ``dV`` and ``dP`` (``2 E dv``
        each), ``dQ`` and ``dK`` (``2 E d`` each) and ``dS``. Bytes: each tensor once (the
        kernels keep no scores), the log-sum-exp written, then read by backward with the
        output and its gradient."""
        p = _parts(attrs, inputs)
        out = outputs[0]
        rows = out.numel // out.dims[-1]
        e = float(rows * p.k.dims[-2])
        d, dv = p.q.dims[-1], out.dims[-1]
        lse = rows * out.dtype.itemsize
        moved = float(sum(t.nbytes for t in inputs))
        return OpCost(2 * e * d + 2 * e * dv + SOFTMAX_FLOPS * e, moved + out.nbytes + lse,
                      6 * e * d + 4 * e * dv + SOFTMAX_FLOPS * e,
                      moved + 2 * out.nbytes + lse + sum(t.nbytes for t in (p.q, p.k, p.v)))

    def no_grad_inputs(self, attrs):
        """The mask (a constant: backward makes no score-sized gradient for it)."""
        return (3,) if attrs.mask else ()

    def saved(self, attrs, inputs, outputs):
        """The inputs, the output, the log-sum-exp of each query row and the scores'
        multiplier (in the compute dtype): never a score."""
        out = outputs[0]
        cdt = DType.FLOAT32 if out.dtype.itemsize < 4 else out.dtype
        return Saved(tuple(range(len(inputs))), (0,), (TensorShape(out.dims[:-1] + (1,), cdt), TensorShape((), cdt)))

    def encode(self, s, attrs, x, ins, outs):
        if not float(attrs.scale).is_integer():
            return None
        p = _parts(attrs, list(zip(x, ins, strict=True)))
        try:
            y = _step(s, MatMulAttrs(), p.q, _step(s, TransposeAttrs(_swap(p.k[1].rank)), p.k))
            if attrs.scale != 1:
                y = _step(s, ScaleAttrs(int(attrs.scale)), y)
            if p.factor is not None:
                y = _step(s, BinaryAttrs("Mul"), y, p.factor)
            if p.mask is not None:
                y = _step(s, BinaryAttrs("Add"), y, p.mask)
            y = _step(s, MatMulAttrs(), _step(s, SoftmaxAttrs(y[1].rank - 1), y), p.v)
        except ShapeError:
            return None
        return [y[0]]


Term = tuple[Any, ParallelTensorShape]
"""A verifier term and the parallel shape of the tensor it stands for."""


def _step(s: Any, attrs: Any, *args: Term) -> Term:
    """One operator of the chain an Attention stands for, applied to terms: its output's
    term, as that operator's spec encodes it, and its shape."""
    ins = [shape for _, shape in args]
    outs = spec_of(attrs).infer_parallel(attrs, ins)
    return encode_terms(s, attrs, [t for t, _ in args], ins, outs)[0], outs[0]


def _swap(rank: int) -> tuple[int, ...]:
    """The permutation that swaps the last two of ``rank`` dims."""
    return (*range(rank - 2), rank - 1, rank - 2)
