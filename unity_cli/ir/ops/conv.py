"""Convolution and pooling over N-d spatial dims (2-D is the common case).

Batch and channels can be split; spatial dims stay whole (a spatial split needs halo
exchange, which the runtime does not do). A convolution's input channels are its
contracted dim: splitting them (with the weight's) leaves partial sums.
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ...errors import ModelError, ShapeError
from ..dtypes import DType
from ..kernel import Kernel, first_extremum
from ..opspec import (
    SUM,
    WHOLE,
    Imported,
    Opaque,
    OpCost,
    OpKind,
    OpSpec,
    Role,
    Saved,
    attrs_from_json,
    attrs_key,
    infer_parallel,
    register,
)
from ..shapes import TensorShape
from ..terms import Axiom, IllTyped, Law, Symbol
from .common import need_inputs, streaming_cost
from .linear import product_grads


@dataclass(frozen=True, slots=True)
class ConvAttrs:
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]          # begin pads then end pads, as ONNX
    dilations: tuple[int, ...]
    groups: int = 1


@dataclass(frozen=True, slots=True)
class PoolAttrs:
    """MaxPool / AveragePool; ``count_include_pad`` only matters for the average."""

    mode: str                      # "max" | "avg"
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    pads: tuple[int, ...]
    dilations: tuple[int, ...]
    ceil_mode: bool = False
    count_include_pad: bool = False


@dataclass(frozen=True, slots=True)
class GlobalPoolAttrs:
    mode: str                      # "max" | "avg"


def window_out(size: int, k: int, stride: int, pb: int, pe: int, dil: int, ceil_mode: bool = False) -> int:
    """Output length of a sliding window (ONNX's formula, with its ceil-mode rule)."""
    span = size + pb + pe - dil * (k - 1) - 1
    if span < 0:
        raise ShapeError(f"window of {k} (dilation {dil}) is larger than the padded input {size + pb + pe}")
    n = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (n - 1) * stride >= size + pb:
        n -= 1  # the last window would start in the end padding
    return n


def resolve_window(node, spatial: Sequence[int], kernel: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """(strides, pads, dilations) of an ONNX conv/pool node, resolving auto_pad."""
    a = node.attrs
    n = len(spatial)
    strides = tuple(a.get("strides", [1] * n))
    dilations = tuple(a.get("dilations", [1] * n))
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("NOTSET", ""):
        pads = tuple(a.get("pads", [0] * (2 * n)))
    elif auto_pad == "VALID":
        pads = (0,) * (2 * n)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        pads = tuple(begin + end)
    else:
        raise ModelError(f"unknown auto_pad {auto_pad!r}")
    if len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ModelError(f"strides/pads/dilations do not match {n} spatial dims")
    return strides, pads, dilations


def _spatial_out(kind: str, spatial, kernel, strides, pads, dilations, ceil_mode=False) -> tuple[int, ...]:
    n = len(spatial)
    if len(kernel) != n:
        raise ShapeError(f"{kind}: kernel {list(kernel)} does not match {n} spatial dims")
    return tuple(window_out(spatial[i], kernel[i], strides[i], pads[i], pads[n + i], dilations[i], ceil_mode)
                 for i in range(n))


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Convolution and pooling over N-d spatial dims.
# Both run as im2col without strided tricks (so they work on numpy and cupy alike): each
# kernel offset contributes one strided slice of the padded input; a convolution stacks
# the slices and does a single batched matmul, a pool reduces over them. Backward adds
# each slice's gradient back into the padded input. Pads are ONNX's: all begin pads, then
# all end pads.


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


@register
class Conv(OpSpec):
    kind = OpKind.Conv
    kernel = Kernel(conv_forward, conv_backward, selective=True)
    attrs_type = ConvAttrs
    onnx_ops = ("Conv",)
    weight_inputs = (1, 2)

    def saved(self, attrs, inputs, outputs):
        """The image and the filter (backward cuts the columns again)."""
        return Saved((0, 1))

    def from_onnx(self, node) -> Imported:
        x, w = node.inputs[0].shape, node.inputs[1].shape
        kernel = tuple(node.attrs.get("kernel_shape", w.dims[2:]))
        strides, pads, dilations = resolve_window(node, x.dims[2:], kernel)
        return Imported(ConvAttrs(kernel, strides, pads, dilations, int(node.attrs.get("group", 1))),
                        tuple(range(len(node.inputs))))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2, 3)
        x, w = inputs[0], inputs[1]
        if x.rank < 3 or w.rank != x.rank:
            raise ShapeError(f"Conv: input {list(x.dims)} and weight {list(w.dims)} ranks do not fit")
        c_in, c_out, g = x.dims[1], w.dims[0], attrs.groups
        if c_in % g or c_out % g or w.dims[1] * g != c_in:
            raise ShapeError(f"Conv: {c_in} input channels, weight {list(w.dims)} and group={g} do not fit")
        if tuple(w.dims[2:]) != attrs.kernel:
            raise ShapeError(f"Conv: weight {list(w.dims)} does not match kernel {list(attrs.kernel)}")
        if len(inputs) == 3 and inputs[2].dims != (c_out,):
            raise ShapeError(f"Conv: bias {list(inputs[2].dims)} should be [{c_out}]")
        sp = _spatial_out(self.kind, x.dims[2:], attrs.kernel, attrs.strides, attrs.pads, attrs.dilations)
        return (TensorShape((x.dims[0], c_out) + sp, x.dtype),)

    def roles(self, attrs, inputs):
        """Ungrouped, every output channel reads every input channel (a contraction); grouped,
        a piece of whole groups reads their input channels alone, so both channel dims
        split together (:meth:`infer_parallel`: into whole groups)."""
        x = inputs[0]
        n_sp = x.rank - 2
        c_role: Role = SUM if attrs.groups == 1 else 1
        rx = (0, c_role) + (WHOLE,) * n_sp
        rw = (1, SUM if attrs.groups == 1 else WHOLE) + (WHOLE,) * n_sp
        return (rx, rw, (1,))[:len(inputs)]

    def infer_parallel(self, attrs, inputs):
        out = infer_parallel(self, attrs, inputs)
        d = out[0].dims[1].degree
        if attrs.groups > 1 and attrs.groups % d:
            raise ShapeError(f"Conv: {attrs.groups} groups cannot be split {d} ways (a piece holds whole groups)")
        return out

    def piece_attrs(self, attrs, output):
        """A piece of whole groups runs as a conv of its share of them."""
        d = output.dims[1].degree
        return attrs if d == 1 or attrs.groups == 1 else replace(attrs, groups=attrs.groups // d)

    def terms(self, attrs, n):
        return ((0, 1), (2,)) if n == 3 else ((0, 1),)

    selective_backward = True

    def cost(self, attrs, inputs, outputs):
        return self.cost_of_grads(attrs, inputs, outputs, (True,) * len(inputs))

    def cost_of_grads(self, attrs, inputs, outputs, wanted):
        """As the kernels run it: forward pads the image (where there are pads), unfolds it
        (each kernel offset's slice copied into ``cols``, ``K`` times the image), multiplies
        ``W`` by ``cols`` and adds the bias, each a pass of its own. Backward's ``dW``
        unfolds again, multiplies per image and sums the images' products; its ``dX``
        multiplies into unfolded gradients and adds each offset's slice into a zeroed,
        padded gradient. The bias' gradient is a reduction of ``dY``."""
        x, w = inputs[0], inputs[1]
        y = outputs[0]
        taps = math.prod(attrs.kernel)
        macs = 2.0 * y.numel * (w.dims[1] * taps)
        item = x.dtype.itemsize
        cols = TensorShape((x.dims[0], x.dims[1] * taps, math.prod(y.dims[2:])), x.dtype)
        padded = x.dims[0] * x.dims[1] * math.prod(d + a + b for d, a, b in zip(
            x.dims[2:], attrs.pads[:len(attrs.kernel)], attrs.pads[len(attrs.kernel):], strict=True)) * item
        pad = x.nbytes + padded if any(attrs.pads) else 0.0
        unfold = pad + 2.0 * cols.nbytes
        want_x, want_w = bool(wanted[0]), bool(wanted[1])
        bwd_flops, bwd_bytes, kernels, bwd_kernels = product_grads(macs, cols, w, y, (want_x, want_w))
        want_b = len(inputs) == 3 and bool(wanted[2])
        cost = OpCost(macs, float(cols.nbytes + w.nbytes + y.nbytes), bwd_flops, bwd_bytes, kernels,
                      bwd_kernels or int(want_b))
        cost = cost.followed_by(OpCost(0.0, unfold, 0.0, want_w * (unfold + 2.0 * x.dims[0] * w.nbytes)
                                       + want_x * (padded + 3.0 * cols.nbytes)))
        if len(inputs) == 3:
            b = inputs[2]
            cost = cost.followed_by(OpCost(y.numel, 2.0 * y.nbytes + b.nbytes, want_b * float(y.numel),
                                           want_b * float(y.nbytes + b.nbytes)))
        return cost

    def encode(self, s, attrs, x, ins, outs):   # the bias, when there is one, is another term: not modelled
        return [s.conv(conv_config(attrs), x[0], x[1])] if len(x) == 2 else None

    symbols = (Symbol("conv", ("I", "T", "T"), lambda run, cfg, x, w: _conv_meaning(run, conv_attrs(cfg), x, w)),)
    axioms = (   # bilinear
        Axiom("conv-add-input", lambda s, v: Law(s.conv(v.cfg, s.add(v.a, v.b), v.c),
                                                 s.add(s.conv(v.cfg, v.a, v.c), s.conv(v.cfg, v.b, v.c)),
                                                 two_way=False)),
        Axiom("conv-add-weight", lambda s, v: Law(s.conv(v.cfg, v.a, s.add(v.b, v.c)),
                                                  s.add(s.conv(v.cfg, v.a, v.b), s.conv(v.cfg, v.a, v.c)))),
        Axiom("conv-scale-input", lambda s, v: Law(s.conv(v.cfg, s.scale(v.k, v.a), v.b),
                                                   s.scale(v.k, s.conv(v.cfg, v.a, v.b)))),
        Axiom("conv-scale-weight", lambda s, v: Law(s.conv(v.cfg, v.a, s.scale(v.k, v.b)),
                                                    s.scale(v.k, s.conv(v.cfg, v.a, v.b)))),
        # ungrouped 2-D (cfg < 0): output channel m reads weight row m alone, so weights
        # stacked by rows give outputs stacked by channels (sibling convs fused)
        Axiom("conv-concat-out-channels", lambda s, v: Law(
            s.conv(v.cfg, v.a, s.concat(-4, v.n1, v.n2, v.b, v.c)),
            s.concat(-3, v.n1, v.n2, s.conv(v.cfg, v.a, v.b), s.conv(v.cfg, v.a, v.c)), v.cfg < 0)),
    )


def conv_config(attrs: ConvAttrs) -> int:
    """The ``cfg`` integer that names a Conv's attributes in the verifier's terms
    (reversible, see :func:`conv_attrs`): negative for an ungrouped 2-D conv, the one
    whose output channels are its weight's rows (the guard of ``conv-concat-out-channels``)."""
    key = int.from_bytes(attrs_key(attrs).encode(), "big")
    return -key if attrs.groups == 1 and len(attrs.kernel) == 2 else key


def conv_attrs(cfg: int) -> ConvAttrs:
    key = abs(cfg)
    return attrs_from_json(json.loads(key.to_bytes((key.bit_length() + 7) // 8, "big").decode()))


def _conv_meaning(run, attrs: ConvAttrs, x, w):
    """ONNX Conv without bias, by the kernel (exact on integers); arrays of shapes the Conv
    does not take are ill-typed."""
    try:
        Conv().infer(attrs, [TensorShape(x.shape), TensorShape(w.shape)])
    except ShapeError as e:
        raise IllTyped(str(e)) from None
    return run(attrs, x, w)[0]


@register
class Pool(OpSpec):
    kind = OpKind.Pool
    kernel = Kernel(pool_forward, pool_backward)
    verifier = Opaque("a windowed reduction: no axioms yet (only Conv's are written)")
    attrs_type = PoolAttrs
    onnx_ops = ("MaxPool", "AveragePool")

    def saved(self, attrs, inputs, outputs):
        """Max: each output's position in its window; average: each window's count."""
        out = outputs[0].dims
        if attrs.mode == "max":
            return Saved(extra=(TensorShape(out, DType.INT64),))
        return Saved(extra=(TensorShape((1, 1) + out[2:], inputs[0].dtype),))

    def from_onnx(self, node) -> Imported:
        x = node.inputs[0].shape
        kernel = tuple(node.attrs["kernel_shape"])
        strides, pads, dilations = resolve_window(node, x.dims[2:], kernel)
        mode = "max" if node.op_type == "MaxPool" else "avg"
        return Imported(PoolAttrs(mode, kernel, strides, pads, dilations, bool(node.attrs.get("ceil_mode", 0)),
                                  bool(node.attrs.get("count_include_pad", 0))), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if x.rank < 3:
            raise ShapeError(f"{attrs.mode} pool needs an [N, C, ...] input, got {list(x.dims)}")
        sp = _spatial_out(self.kind, x.dims[2:], attrs.kernel, attrs.strides, attrs.pads, attrs.dilations,
                          attrs.ceil_mode)
        return (TensorShape(x.dims[:2] + sp, x.dtype),)

    def roles(self, attrs, inputs):
        return ((0, 1) + (WHOLE,) * (inputs[0].rank - 2),)

    def terms(self, attrs, n):
        return ((0,),) if attrs.mode == "avg" else ()

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, math.prod(attrs.kernel))


@register
class GlobalPool(OpSpec):
    kind = OpKind.GlobalPool
    kernel = Kernel(global_pool_forward, global_pool_backward)
    verifier = Opaque("a reduction over the spatial dims: no axioms yet")
    attrs_type = GlobalPoolAttrs
    onnx_ops = ("GlobalAveragePool", "GlobalMaxPool")

    def saved(self, attrs, inputs, outputs):
        """The input and the reduction before its cast to the output."""
        return Saved((0,), (), (outputs[0],))

    def from_onnx(self, node) -> Imported:
        return Imported(GlobalPoolAttrs("avg" if node.op_type == "GlobalAveragePool" else "max"), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        if x.rank < 3:
            raise ShapeError(f"global pool needs an [N, C, ...] input, got {list(x.dims)}")
        return (TensorShape(x.dims[:2] + (1,) * (x.rank - 2), x.dtype),)

    def roles(self, attrs, inputs):
        return ((0, 1) + (WHOLE,) * (inputs[0].rank - 2),)

    def terms(self, attrs, n):
        return ((0,),) if attrs.mode == "avg" else ()

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, inputs[0].numel / max(outputs[0].numel, 1))
