"""MatMul (numpy semantics: batched, broadcasting, 1-D operands) and Gemm."""
from __future__ import annotations

from ..ir.ops.unary import UNARY
from ..ir.opspec import OpKind
from .registry import register, unbroadcast


def _folds(a, b) -> bool:
    """Whether ``a @ b`` is one 2-D GEMM with ``a``'s leading dims folded into its rows (a
    batched activation times a weight matrix): numpy would otherwise run one small GEMM per
    leading index (1.5x slower on BERT's [16, 32, 128] @ [128, 512]), and backward would
    sum the weight's gradient over them instead of taking it in one GEMM."""
    return b.ndim == 2 and a.ndim > 2


def matmul_forward(op, xs, xp):
    a, b = xs
    if _folds(a, b):
        return [xp.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[1:])], (a, b)
    return [xp.matmul(a, b)], (a, b)


def matmul_backward(op, ctx, gs, xp, wanted):
    a, b = ctx
    g = gs[0]
    want_a, want_b = wanted
    if _folds(a, b):
        g2 = g.reshape(-1, g.shape[-1])
        return [xp.matmul(g2, b.T).reshape(a.shape) if want_a else None,
                xp.matmul(a.reshape(-1, a.shape[-1]).T, g2) if want_b else None]
    # Promote 1-D operands to matrices as matmul does, and g to the promoted output.
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if b.ndim == 1:
        g = g[..., None]
    if a.ndim == 1:
        g = g[..., None, :]
    ga = unbroadcast(xp.matmul(g, xp.swapaxes(b2, -1, -2)), a2.shape, xp).reshape(a.shape) if want_a else None
    gb = unbroadcast(xp.matmul(xp.swapaxes(a2, -1, -2), g), b2.shape, xp).reshape(b.shape) if want_b else None
    return [ga, gb]


def gemm_forward(op, xs, xp):
    """``Y = f(alpha * A' @ B' + beta * C)`` with ``A'``, ``B'`` transposed as the flags
    say and ``f`` the fused activation (none by default)."""
    a, b = xs[0], xs[1]
    a2 = a.T if op.trans_a else a
    b2 = b.T if op.trans_b else b
    y = xp.matmul(a2, b2)
    if op.alpha != 1.0:
        y = y * op.alpha
    if len(xs) == 3:
        c = xs[2]
        y = y + (c if op.beta == 1.0 else c * op.beta)
    z = None
    if op.activation:   # the product is kept only where the activation's backward needs it
        z, y = y, UNARY[op.activation].forward(y, xp)
        z = None if UNARY[op.activation].from_output else z
    return [y], (a2, b2, xs[2].shape if len(xs) == 3 else None, z, y)


def gemm_backward(op, ctx, gs, xp, wanted):
    a2, b2, c_shape, z, y = ctx
    if op.activation:   # through the activation first, as its own kernel would
        gs = [UNARY[op.activation].backward(y if z is None else z, y, gs[0], xp)]
    g = gs[0] * op.alpha if op.alpha != 1.0 else gs[0]
    # A transposed operand's gradient is computed in its own layout (C-contiguous), never
    # returned as a transposed view: adding a strided view into the weight's gradient cost
    # 25x a contiguous add (9 ms per 1024 x 1024).
    ga = (xp.matmul(b2, g.T) if op.trans_a else xp.matmul(g, b2.T)) if wanted[0] else None
    gb = (xp.matmul(g.T, a2) if op.trans_b else xp.matmul(a2.T, g)) if wanted[1] else None
    out = [ga, gb]
    if c_shape is not None and wanted[2]:
        gc = gs[0] * op.beta if op.beta != 1.0 else gs[0]
        out.append(unbroadcast(gc, c_shape, xp))
    return out


register(OpKind.MatMul, matmul_forward, matmul_backward, selective=True)
register(OpKind.Gemm, gemm_forward, gemm_backward, selective=True)
