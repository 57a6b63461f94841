"""Normalizations, softmax and hardmax: the normalized dims must stay whole, the rest may be split.

BatchNormalization normalizes each channel over batch and space: with the batch split
each piece sees only its shard, so training needs the statistics all-reduced (the
runtime does this); channels split freely.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import ShapeError
from ..dtypes import DType
from ..kernel import Kernel, first_extremum, unbroadcast
from ..opspec import WHOLE, Imported, Opaque, OpKind, OpSpec, Saved, register
from ..shapes import TensorShape
from ..terms import Axiom, Law, Symbol, need
from .common import need_inputs, norm_axis, streaming_cost
from .shape_ops import MAX_PERMUTED, SWAP, all_perm_codes, code_perm


@dataclass(frozen=True, slots=True)
class BatchNormAttrs:
    epsilon: float = 1e-5
    momentum: float = 0.9


@dataclass(frozen=True, slots=True)
class LayerNormAttrs:
    axis: int                      # normalized dims are [axis, rank)
    epsilon: float = 1e-5


@dataclass(frozen=True, slots=True)
class SoftmaxAttrs:
    """Softmax (``log``: LogSoftmax) over dim ``axis``, or with ``flatten`` over dims
    ``[axis, rank)`` jointly: ONNX before opset 13 flattens the input to 2-D at ``axis``."""

    axis: int
    log: bool = False
    flatten: bool = False


@dataclass(frozen=True, slots=True)
class HardmaxAttrs:
    """One-hot of the first maximum over dim ``axis`` (``flatten``: dims ``[axis, rank)``,
    in row-major order), as for :class:`SoftmaxAttrs`."""

    axis: int
    flatten: bool = False


def normalized_dims(attrs: SoftmaxAttrs | HardmaxAttrs, rank: int) -> tuple[int, ...]:
    """The dims a Softmax or Hardmax normalizes over."""
    return tuple(range(attrs.axis, rank)) if attrs.flatten else (attrs.axis,)


def _softmax_axis(node) -> tuple[int, bool]:
    """``(axis, flatten)`` of an ONNX Softmax, LogSoftmax or Hardmax node. Before opset 13
    these normalize over ``[axis, rank)`` (default axis 1), since then over ``axis``
    (default -1); over the last dim the two agree and the attrs say ``flatten=False``."""
    rank = node.inputs[0].shape.rank
    old = node.opset < 13
    axis = norm_axis(node.op_type, int(node.attrs.get("axis", 1 if old else -1)), rank)
    return axis, old and axis < rank - 1


@dataclass(frozen=True, slots=True)
class LRNAttrs:
    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    bias: float = 1.0


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Normalization kernels: Softmax / LogSoftmax, Hardmax, LayerNormalization, BatchNormalization, LRN.
# BatchNormalization is the inference form ``(x - mean) / sqrt(var + eps) * scale + bias``
# with the running statistics given as inputs 3 and 4: training runs it with frozen
# statistics, as an eval-mode export does. Gradients reach x, scale and bias; the
# statistics get None. Hardmax has no backward: its gradient is zero wherever it exists.


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


@register
class BatchNorm(OpSpec):
    kind = OpKind.BatchNormalization
    kernel = Kernel(batchnorm_forward, batchnorm_backward)
    verifier = Opaque("a normalization with running statistics: no axioms yet")
    attrs_type = BatchNormAttrs
    onnx_ops = ("BatchNormalization",)
    state_inputs = (3, 4)
    weight_inputs = (1, 2)

    def saved(self, attrs, inputs, outputs):
        """The scale, the normalized input and the inverse deviation per channel."""
        return Saved((1,), (), (inputs[0], inputs[4]))

    def from_onnx(self, node) -> Imported:
        a = node.attrs
        return Imported(BatchNormAttrs(float(a.get("epsilon", 1e-5)), float(a.get("momentum", 0.9))), (0, 1, 2, 3, 4))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 5)
        x = inputs[0]
        if x.rank < 2:
            raise ShapeError(f"BatchNormalization needs an [N, C, ...] input, got {list(x.dims)}")
        for i, p in enumerate(inputs[1:], 1):
            if p.dims != (x.dims[1],):
                raise ShapeError(f"BatchNormalization input {i} is {list(p.dims)}, expected [{x.dims[1]}]")
        return (x,)

    def roles(self, attrs, inputs):
        return (tuple(range(inputs[0].rank)),) + ((1,),) * 4

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs[:1], outputs, 5, bwd_factor=2.5)


@register
class LayerNorm(OpSpec):
    kind = OpKind.LayerNormalization
    kernel = Kernel(layernorm_forward, layernorm_backward)
    verifier = Opaque("a normalization over the last dims: no axioms yet")
    attrs_type = LayerNormAttrs
    onnx_ops = ("LayerNormalization",)
    weight_inputs = (1, 2)

    def saved(self, attrs, inputs, outputs):
        """The scale and bias, the normalized input and each row's inverse deviation (in
        float32 for half precision)."""
        x = inputs[0]
        dt = DType.FLOAT32 if x.dtype.itemsize < 4 else x.dtype
        rows = x.dims[:attrs.axis] + (1,) * (x.rank - attrs.axis)
        return Saved(tuple(range(1, len(inputs))), (), (TensorShape(x.dims, dt), TensorShape(rows, dt)))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        axis = norm_axis(node.op_type, int(node.attrs.get("axis", -1)), rank)
        return Imported(LayerNormAttrs(axis, float(node.attrs.get("epsilon", 1e-5))), tuple(range(len(node.inputs))))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1, 3)
        x = inputs[0]
        norm = x.dims[attrs.axis:]
        for i, p in enumerate(inputs[1:], 1):
            if tuple(p.dims) != norm[len(norm) - p.rank:] or p.rank > len(norm):
                raise ShapeError(f"LayerNormalization input {i} is {list(p.dims)}, expected {list(norm)}")
        return (x,)

    def roles(self, attrs, inputs):
        x = inputs[0]
        rx = tuple(range(attrs.axis)) + (WHOLE,) * (x.rank - attrs.axis)
        return (rx,) + tuple((WHOLE,) * p.rank for p in inputs[1:])

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs[:1], outputs, 8, bwd_factor=2.5)


class _Normalizing(OpSpec):
    """An op over the normalized dims of one input (see :func:`normalized_dims`), which
    must stay whole; the other dims split freely."""

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        rank = inputs[0].rank
        if not 0 <= attrs.axis < max(rank, 1):
            raise ShapeError(f"{self.kind}: axis {attrs.axis} is out of range for rank {rank}")
        return (inputs[0],)

    def roles(self, attrs, inputs):
        norm = normalized_dims(attrs, inputs[0].rank)
        return (tuple(WHOLE if d in norm else d for d in range(inputs[0].rank)),)


def _softmax_meaning(run, ax, x):
    need(-x.ndim <= ax <= -1, f"softmax over axis {ax} of a rank-{x.ndim} tensor")
    return run(SoftmaxAttrs(x.ndim + ax), x)[0]


def _moved_axis(code: int, ax: int, rank: int = MAX_PERMUTED) -> int:
    """Where dim ``ax`` (from the end) of a tensor is after the permutation ``code``."""
    perm = code_perm(code, rank)
    return perm.index(rank + ax) - rank


def _softmax_permute_axioms() -> tuple[Axiom, ...]:
    """A softmax over the place a permutation puts dim ``ax`` of ``x`` is the permuted
    ``softmax(ax, x)``: one law per permutation code and axis (-1 to -4), since that place
    is a table, not arithmetic z3 could match on (the last-two swap is ``transpose``)."""
    out = []
    for code in all_perm_codes():
        for ax in range(-MAX_PERMUTED, 0):
            to = _moved_axis(code, ax)
            out.append(Axiom(f"softmax-permute-{code}-{-ax}", _softmax_law(code, to, ax)))
    return tuple(out)


def _softmax_law(code: int, to: int, ax: int):
    def law(s, v):
        def moved(t):
            return s.transpose(t) if code == SWAP else s.permute(code, t)
        return Law(s.softmax(to, moved(v.x)), moved(s.softmax(ax, v.x)))
    return law


@register
class Softmax(_Normalizing):
    """Encoded for the verifier only as a plain softmax over one axis (``softmax(ax, x)``,
    ``ax`` from the end): its laws say a permutation of the dims moves the axis with it.
    LogSoftmax and a flattened softmax stay opaque."""

    kind = OpKind.Softmax
    kernel = Kernel(softmax_forward, softmax_backward)
    attrs_type = SoftmaxAttrs
    onnx_ops = ("Softmax", "LogSoftmax")

    def saved(self, attrs, inputs, outputs):
        """The output."""
        return Saved((), (0,))

    def from_onnx(self, node) -> Imported:
        axis, flatten = _softmax_axis(node)
        return Imported(SoftmaxAttrs(axis, node.op_type == "LogSoftmax", flatten), (0,))

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 10)

    def encode(self, s, attrs, x, ins, outs):
        return None if attrs.log or attrs.flatten else [s.softmax(attrs.axis - ins[0].rank, x[0])]

    symbols = (Symbol("softmax", ("I", "T"), _softmax_meaning),)
    axioms = _softmax_permute_axioms()


@register
class Hardmax(_Normalizing):
    """Not differentiable: its gradient is zero wherever it exists."""

    kind = OpKind.Hardmax
    kernel = Kernel(hardmax_forward)

    def saved(self, attrs, inputs, outputs):
        """Nothing: no gradient."""
        return Saved()
    verifier = Opaque("a normalization along one dim, like Softmax: no axioms yet")
    attrs_type = HardmaxAttrs
    onnx_ops = ("Hardmax",)

    def from_onnx(self, node) -> Imported:
        return Imported(HardmaxAttrs(*_softmax_axis(node)), (0,))

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 3, bwd_factor=0.0)


@register
class LRN(OpSpec):
    kind = OpKind.LRN
    kernel = Kernel(lrn_forward, lrn_backward)
    verifier = Opaque("a windowed normalization over channels: no axioms yet")
    attrs_type = LRNAttrs
    onnx_ops = ("LRN",)

    def saved(self, attrs, inputs, outputs):
        """The input, the output and the window sums' denominator."""
        return Saved((0,), (0,), (inputs[0],))

    def from_onnx(self, node) -> Imported:
        a = node.attrs
        return Imported(LRNAttrs(int(a["size"]), float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)),
                                 float(a.get("bias", 1.0))), (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        return (inputs[0],)

    def roles(self, attrs, inputs):
        return ((0, WHOLE) + tuple(range(2, inputs[0].rank)),)

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, 3 * attrs.size + 10)
