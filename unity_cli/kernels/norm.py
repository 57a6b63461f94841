"""Normalization kernels: Softmax / LogSoftmax, Hardmax, LayerNormalization, BatchNormalization, LRN.

BatchNormalization is the inference form ``(x - mean) / sqrt(var + eps) * scale + bias``
with the running statistics given as inputs 3 and 4: training runs it with frozen
statistics, as an eval-mode export does. Gradients reach x, scale and bias; the
statistics get None. Hardmax has no backward: its gradient is zero wherever it exists.
"""
from __future__ import annotations

from ..ir.ops.norm import normalized_dims
from ..ir.opspec import OpKind
from .registry import first_extremum, register, unbroadcast


def softmax_forward(op, xs, xp):
    """Softmax / LogSoftmax over the normalized dims (one axis, or ``[axis, rank)``)."""
    x = xs[0]
    axes = normalized_dims(op, x.ndim)
    shifted = x - x.max(axis=axes, keepdims=True)
    e = xp.exp(shifted)
    total = e.sum(axis=axes, keepdims=True)
    y = shifted - xp.log(total) if op.log else e / total
    return [y], y


def softmax_backward(op, ctx, gs, xp):
    y, g = ctx, gs[0]
    axes = normalized_dims(op, y.ndim)
    if op.log:
        return [g - xp.exp(y) * g.sum(axis=axes, keepdims=True)]
    return [y * (g - (g * y).sum(axis=axes, keepdims=True))]


def hardmax_forward(op, xs, xp):
    """1 at the first maximum of each slice over the normalized dims (row-major), else 0."""
    x = xs[0]
    axes = normalized_dims(op, x.ndim)
    return [first_extremum(x, x.max(axis=axes, keepdims=True), axes, xp).astype(x.dtype)], None


def layernorm_forward(op, xs, xp):
    """``(x - mean) / sqrt(var + eps) * scale + bias`` over dims ``[axis, rank)``; float16
    is computed in float32 (ONNX's default ``stash_type``)."""
    x = xs[0]
    axes = tuple(range(op.axis, x.ndim))
    xc = x.astype("float32") if x.dtype.itemsize < 4 else x
    mu = xc.mean(axis=axes, keepdims=True)
    d = xc - mu
    inv = 1 / xp.sqrt((d * d).mean(axis=axes, keepdims=True) + op.epsilon)
    xhat = d * inv
    y = xhat
    if len(xs) > 1:
        y = y * xs[1]
    if len(xs) > 2:
        y = y + xs[2]
    return [y.astype(x.dtype)], (xhat, inv, tuple(xs[1:]))


def layernorm_backward(op, ctx, gs, xp):
    xhat, inv, params = ctx
    g = gs[0]
    axes = tuple(range(op.axis, g.ndim))
    gxhat = g * params[0] if params else g
    gx = inv * (gxhat - gxhat.mean(axis=axes, keepdims=True)
                - xhat * (gxhat * xhat).mean(axis=axes, keepdims=True))
    out = [gx.astype(g.dtype)]
    if len(params) > 0:
        out.append(unbroadcast(g * xhat, params[0].shape, xp))
    if len(params) > 1:
        out.append(unbroadcast(g, params[1].shape, xp))
    return out


def _per_channel(v, rank):
    return v.reshape((1, -1) + (1,) * (rank - 2))


def batchnorm_forward(op, xs, xp):
    x, scale, bias, mean, var = xs
    r = x.ndim
    inv = 1 / xp.sqrt(var + op.epsilon)
    xhat = (x - _per_channel(mean, r)) * _per_channel(inv, r)
    y = xhat * _per_channel(scale, r) + _per_channel(bias, r)
    return [y], (xhat, inv, scale)


def batchnorm_backward(op, ctx, gs, xp):
    xhat, inv, scale = ctx
    g = gs[0]
    r = g.ndim
    axes = (0,) + tuple(range(2, r))
    gx = g * _per_channel(scale * inv, r)
    return [gx, (g * xhat).sum(axis=axes), g.sum(axis=axes), None, None]


def _channel_window_sum(v, lo, hi, xp):
    """``out[:, c] = sum(v[:, c - lo : c + hi + 1])`` (clipped to the channels there are)."""
    c = v.shape[1]
    pad = [(0, 0)] * v.ndim
    pad[1] = (lo, hi)
    p = xp.pad(v, pad)
    out = p[:, 0:c]
    for k in range(1, lo + hi + 1):
        out = out + p[:, k:k + c]
    return out


def lrn_forward(op, xs, xp):
    """``y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta``; the
    window of channel c is ``[c - floor((size-1)/2), c + ceil((size-1)/2)]``."""
    x = xs[0]
    lo, hi = (op.size - 1) // 2, op.size - 1 - (op.size - 1) // 2
    d = op.bias + (op.alpha / op.size) * _channel_window_sum(x * x, lo, hi, xp)
    y = x * d ** -op.beta
    return [y], (x, d, y)


def lrn_backward(op, ctx, gs, xp):
    x, d, y = ctx
    g = gs[0]
    lo, hi = (op.size - 1) // 2, op.size - 1 - (op.size - 1) // 2
    # x_j feeds d_c for every c whose window holds j: c in [j - hi, j + lo], the mirrored window.
    t = g * y / d
    back = _channel_window_sum(t, hi, lo, xp)
    return [g * d ** -op.beta - (2 * op.alpha * op.beta / op.size) * x * back]


register(OpKind.Softmax, softmax_forward, softmax_backward)
register(OpKind.Hardmax, hardmax_forward)
register(OpKind.LayerNormalization, layernorm_forward, layernorm_backward)
register(OpKind.BatchNormalization, batchnorm_forward, batchnorm_backward)
register(OpKind.LRN, lrn_forward, lrn_backward)
