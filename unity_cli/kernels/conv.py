"""Convolution and pooling over N-d spatial dims.

Both run as im2col without strided tricks (so they work on numpy and cupy alike): each
kernel offset contributes one strided slice of the padded input; a convolution stacks
the slices and does a single batched matmul, a pool reduces over them. Backward adds
each slice's gradient back into the padded input. Pads are ONNX's: all begin pads, then
all end pads.
"""
from __future__ import annotations

import itertools
import math

from ..ir.ops.conv import window_out
from ..ir.opspec import OpKind
from .registry import first_extremum, register


def _out_sizes(spatial, op, ceil_mode=False):
    n = len(spatial)
    return tuple(window_out(spatial[i], op.kernel[i], op.strides[i], op.pads[i], op.pads[n + i],
                            op.dilations[i], ceil_mode) for i in range(n))


def _offsets(op, out):
    """Per kernel offset (row-major, as the weight's layout), the slice of the padded input it reads."""
    return [(slice(None), slice(None)) + tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                                               for o, d, s, n in zip(ks, op.dilations, op.strides, out))
            for ks in itertools.product(*(range(k) for k in op.kernel))]


def _end_pads(spatial, op, out):
    """End pads, grown where ceil mode's last window reaches past the padded input."""
    n = len(spatial)
    return tuple(max(op.pads[n + i], (out[i] - 1) * op.strides[i] + op.dilations[i] * (op.kernel[i] - 1) + 1
                     - spatial[i] - op.pads[i])
                 for i in range(n))


def _pad(x, begin, end, value, xp):
    if not any(begin) and not any(end):
        return x
    return xp.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=value)


def _unpad(gp, begin, spatial):
    return gp[(slice(None), slice(None)) + tuple(slice(b, b + n) for b, n in zip(begin, spatial))]


def _add_slices(grads, shape, begin, end, offsets, xp):
    """The input gradient from each kernel offset's slice gradient ``grads(j)``."""
    padded = tuple(s + b + e for s, b, e in zip(shape[2:], begin, end))
    gp = None
    for j, sl in enumerate(offsets):
        gj = grads(j)
        if gp is None:
            gp = xp.zeros(shape[:2] + padded, dtype=gj.dtype)
        gp[sl] += gj
    return _unpad(gp, begin, shape[2:])


# ---------------------------------------------------------------------------
# Conv: y[n, m] = sum over c in m's group and kernel offsets of w[m, c, k] * x[n, c, at + k].


def _cols(x, op, out, xp):
    n = x.ndim - 2
    xpad = _pad(x, op.pads[:n], op.pads[n:], 0, xp)
    return xp.stack([xpad[sl] for sl in _offsets(op, out)], axis=2)  # (N, C, K, *out)


def conv_forward(op, xs, xp):
    x, w = xs[0], xs[1]
    batch, c, m, g = x.shape[0], x.shape[1], w.shape[0], op.groups
    out = _out_sizes(x.shape[2:], op)
    ck = c // g * math.prod(op.kernel)
    cols = _cols(x, op, out, xp).reshape(batch, g, ck, math.prod(out))
    y = xp.matmul(w.reshape(g, m // g, ck), cols).reshape((batch, m) + out)
    if len(xs) == 3:
        y = y + xs[2].reshape((1, m) + (1,) * len(out))
    return [y], (x, w, out, len(xs) == 3)


def conv_backward(op, ctx, gs, xp, wanted):
    x, w, out, has_bias = ctx
    batch, c, m, g = x.shape[0], x.shape[1], w.shape[0], op.groups
    n = x.ndim - 2
    ck = c // g * math.prod(op.kernel)
    gy = gs[0].reshape(batch, g, m // g, math.prod(out))
    gw = gx = None
    if wanted[1]:
        cols = _cols(x, op, out, xp).reshape(batch, g, ck, math.prod(out))
        gw = xp.matmul(gy, xp.swapaxes(cols, -1, -2)).sum(axis=0).reshape(w.shape)
        del cols
    if wanted[0]:    # an image's gradient: a whole product and its scatter, skipped when nobody reads it
        gcols = xp.matmul(xp.swapaxes(w.reshape(g, m // g, ck), -1, -2), gy)
        gcols = gcols.reshape((batch, c, -1) + out)
        gx = _add_slices(lambda j: gcols[:, :, j], x.shape, op.pads[:n], op.pads[n:], _offsets(op, out), xp)
    result = [gx, gw]
    if has_bias and wanted[2]:
        result.append(gs[0].sum(axis=(0,) + tuple(range(2, gs[0].ndim))))
    return result


# ---------------------------------------------------------------------------
# Pool: max or average over each window; ceil mode can add windows that run past the
# end pads, whose overhang counts as padding nowhere.


def pool_forward(op, xs, xp):
    x = xs[0]
    n = x.ndim - 2
    spatial = x.shape[2:]
    out = _out_sizes(spatial, op, op.ceil_mode)
    begin, end = op.pads[:n], _end_pads(spatial, op, out)
    offsets = _offsets(op, out)
    if op.mode == "max":
        low = -math.inf if x.dtype.kind == "f" else xp.iinfo(x.dtype).min
        xpad = _pad(x, begin, end, low, xp)
        stacked = xp.stack([xpad[sl] for sl in offsets], axis=2)
        arg = stacked.argmax(axis=2)
        y = xp.take_along_axis(stacked, arg[:, :, None], axis=2)[:, :, 0]
        return [y], (x.shape, out, end, arg)
    xpad = _pad(x, begin, end, 0, xp)
    total = xpad[offsets[0]]
    for sl in offsets[1:]:
        total = total + xpad[sl]
    count = _window_counts(spatial, op, out, end, xp, x.dtype)
    return [total / count], (x.shape, out, end, count)


def _window_counts(spatial, op, out, end, xp, dtype):
    """How many elements each window averages: those of the input, plus those of the
    explicit pads if ``count_include_pad`` (never ceil mode's overhang)."""
    n = len(spatial)
    ones = xp.ones((1, 1) + tuple(spatial), dtype=dtype)
    if op.count_include_pad:
        ones = _pad(ones, op.pads[:n], op.pads[n:], 1, xp)
        mask = _pad(ones, (0,) * n, tuple(e - p for e, p in zip(end, op.pads[n:])), 0, xp)
    else:
        mask = _pad(ones, op.pads[:n], end, 0, xp)
    count = mask[_offsets(op, out)[0]]
    for sl in _offsets(op, out)[1:]:
        count = count + mask[sl]
    return xp.maximum(count, 1)


def pool_backward(op, ctx, gs, xp):
    shape, out, end, saved = ctx
    n = len(shape) - 2
    g = gs[0]
    offsets = _offsets(op, out)
    if op.mode == "max":
        return [_add_slices(lambda j: g * (saved == j), shape, op.pads[:n], end, offsets, xp)]
    gq = g / saved
    return [_add_slices(lambda j: gq, shape, op.pads[:n], end, offsets, xp)]


def global_pool_forward(op, xs, xp):
    x = xs[0]
    axes = tuple(range(2, x.ndim))
    y = x.mean(axis=axes, keepdims=True) if op.mode == "avg" else x.max(axis=axes, keepdims=True)
    return [y.astype(x.dtype)], (x, y)


def global_pool_backward(op, ctx, gs, xp):
    x, y = ctx
    g = gs[0]
    axes = tuple(range(2, x.ndim))
    if op.mode == "avg":
        return [xp.broadcast_to(g / math.prod(x.shape[2:]), x.shape).copy()]
    return [g * first_extremum(x, y, axes, xp)]


register(OpKind.Conv, conv_forward, conv_backward, selective=True)
register(OpKind.Pool, pool_forward, pool_backward)
register(OpKind.GlobalPool, global_pool_forward, global_pool_backward)
