"""Convolution and pooling over N-d spatial dims (2-D is the common case).

Batch and channels can be split; spatial dims stay whole (a spatial split needs halo
exchange, which the runtime does not do). A convolution's input channels are its
contracted dim: splitting them (with the weight's) leaves partial sums.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import ModelError, ShapeError
from ..opspec import SUM, WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Role, register
from ..shapes import TensorShape
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


@register
class Conv(OpSpec):
    kind = OpKind.Conv
    attrs_type = ConvAttrs
    onnx_ops = ("Conv",)
    weight_inputs = (1, 2)

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
        x, w = inputs[0], inputs[1]
        n_sp = x.rank - 2
        depthwise = attrs.groups > 1 and attrs.groups == x.dims[1] == w.dims[0]
        c_role: Role = SUM if attrs.groups == 1 else (1 if depthwise else WHOLE)
        rx = (0, c_role) + (WHOLE,) * n_sp
        rw = (1, SUM if attrs.groups == 1 else WHOLE) + (WHOLE,) * n_sp
        return (rx, rw, (1,))[:len(inputs)]

    def terms(self, attrs, n):
        return ((0, 1), (2,)) if n == 3 else ((0, 1),)

    selective_backward = True

    def cost(self, attrs, inputs, outputs):
        return self.cost_of_grads(attrs, inputs, outputs, (True,) * len(inputs))

    def cost_of_grads(self, attrs, inputs, outputs, wanted):
        """A product of the unfolded input and the kernel (backward: ``dX`` and ``dW``
        those ``wanted``, each a product as large), plus the bias: one pass over ``Y``
        forward, its reduction backward."""
        x, w = inputs[0], inputs[1]
        y = outputs[0]
        macs = 2.0 * y.numel * (w.dims[1] * math.prod(attrs.kernel))
        bwd_flops, bwd_bytes, kernels, bwd_kernels = product_grads(macs, x, w, y, (bool(wanted[0]), bool(wanted[1])))
        bias = len(inputs) == 3
        if bias and wanted[2]:
            bwd_flops, bwd_bytes = bwd_flops + 2.0 * y.numel, bwd_bytes + 2.0 * inputs[2].nbytes
        moved = float(sum(s.nbytes for s in inputs) + y.nbytes)
        return OpCost(macs + (y.numel if bias else 0), moved, bwd_flops, bwd_bytes, kernels,
                      bwd_kernels or int(bias and bool(wanted[2])))


@register
class Pool(OpSpec):
    kind = OpKind.Pool
    verifier = Opaque("a windowed reduction: no axioms yet (only Conv's are written)")
    attrs_type = PoolAttrs
    onnx_ops = ("MaxPool", "AveragePool")

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
    verifier = Opaque("a reduction over the spatial dims: no axioms yet")
    attrs_type = GlobalPoolAttrs
    onnx_ops = ("GlobalAveragePool", "GlobalMaxPool")

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
