"""Layers shared by the zoo's models, written as the ONNX nodes PyTorch's exporter emits
for them: Linear = MatMul (+ Add), Conv + BatchNormalization, LayerNormalization,
multi-head self-attention with Reshape/Transpose/MatMul/Softmax."""
from __future__ import annotations

import math
from collections.abc import Sequence

from .net import Net, const, he_normal, normal, uniform


def linear(net: Net, x: str, d_in: int, d_out: int, name: str, bias: bool = True, act: str | None = None) -> str:
    """y = act(x W + b): W is [d_in, d_out] (already transposed, as exporters write it)."""
    y = net.node("MatMul", [x, net.param(f"{name}.weight", [d_in, d_out], he_normal(d_in))], f"{name}.matmul")
    if bias:
        y = net.node("Add", [y, net.param(f"{name}.bias", [d_out], uniform(-0.05, 0.05))], f"{name}.add")
    return net.node(act, [y], f"{name}.{act.lower()}") if act else y


def mlp(net: Net, x: str, dims: Sequence[int], name: str, bias: bool = True, last_act: str | None = "Relu") -> str:
    """A stack of Linears dims[0] -> dims[1] -> ... with ReLU between, ``last_act`` after the last."""
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        x = linear(net, x, a, b, f"{name}.{i}", bias, "Relu" if i < len(dims) - 2 else last_act)
    return x


def conv(net: Net, x: str, cin: int, cout: int, kernel: int | tuple[int, int], name: str, stride: int = 1,
         pad: int | tuple[int, int] | None = None, group: int = 1, bias: bool = False) -> str:
    """A 2-D convolution; ``pad`` defaults to 'same' for odd kernels at stride 1."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    ph, pw = (kh // 2, kw // 2) if pad is None else ((pad, pad) if isinstance(pad, int) else pad)
    fan_in = cin // group * kh * kw
    ins = [x, net.param(f"{name}.weight", [cout, cin // group, kh, kw], he_normal(fan_in))]
    if bias:
        ins.append(net.param(f"{name}.bias", [cout], uniform(-0.05, 0.05)))
    return net.node("Conv", ins, name, kernel_shape=[kh, kw], strides=[stride, stride],
                    pads=[ph, pw, ph, pw], group=group)


def batch_norm(net: Net, x: str, c: int, name: str, eps: float = 1e-5) -> str:
    """Inference-form BatchNormalization (scale, bias trained; mean, var are state)."""
    ins = [x, net.param(f"{name}.weight", [c], uniform(0.8, 1.2)), net.param(f"{name}.bias", [c], uniform(-0.1, 0.1)),
           net.buffer(f"{name}.running_mean", [c], uniform(-0.05, 0.05)),
           net.buffer(f"{name}.running_var", [c], uniform(0.9, 1.1))]
    return net.node("BatchNormalization", ins, name, epsilon=eps)


def conv_bn(net: Net, x: str, cin: int, cout: int, kernel: int | tuple[int, int], name: str, stride: int = 1,
            pad: int | tuple[int, int] | None = None, group: int = 1, relu: bool = True, eps: float = 1e-5) -> str:
    """Conv (no bias) -> BatchNormalization [-> Relu]: torchvision's building block."""
    y = batch_norm(net, conv(net, x, cin, cout, kernel, f"{name}.conv", stride, pad, group), cout, f"{name}.bn", eps)
    return net.node("Relu", [y], f"{name}.relu") if relu else y


def layer_norm(net: Net, x: str, d: int, name: str, eps: float = 1e-12) -> str:
    return net.node("LayerNormalization", [x, net.param(f"{name}.weight", [d], const(1.0)),
                                           net.param(f"{name}.bias", [d], const(0.0))], name, axis=-1, epsilon=eps)


def self_attention(net: Net, x: str, hidden: int, heads: int, name: str) -> str:
    """Multi-head self-attention on x[N, S, hidden] -> [N, S, hidden] (BERT's, no mask):
    softmax(Q K^T / sqrt(d)) V per head, heads split with Reshape + Transpose."""
    d = hidden // heads
    split = net.ints(f"{name}.split_heads", [0, 0, heads, d])
    q, k, v = (net.node("Reshape", [linear(net, x, hidden, hidden, f"{name}.{p}"), split], f"{name}.{p}.heads")
               for p in ("query", "key", "value"))
    q = net.node("Transpose", [q], f"{name}.query.t", perm=[0, 2, 1, 3])       # [N, h, S, d]
    k = net.node("Transpose", [k], f"{name}.key.t", perm=[0, 2, 3, 1])         # [N, h, d, S]
    v = net.node("Transpose", [v], f"{name}.value.t", perm=[0, 2, 1, 3])       # [N, h, S, d]
    scores = net.node("MatMul", [q, k], f"{name}.scores")                       # [N, h, S, S]
    scores = net.node("Mul", [scores, net.scalar(f"{name}.scale", 1 / math.sqrt(d))], f"{name}.scaled")
    probs = net.node("Softmax", [scores], f"{name}.softmax", axis=-1)
    ctx = net.node("MatMul", [probs, v], f"{name}.context")                     # [N, h, S, d]
    ctx = net.node("Transpose", [ctx], f"{name}.context.t", perm=[0, 2, 1, 3])
    ctx = net.node("Reshape", [ctx, net.ints(f"{name}.merge_heads", [0, 0, hidden])], f"{name}.merge")
    return linear(net, ctx, hidden, hidden, f"{name}.output")


def embedding(net: Net, ids: str, rows: int, dim: int, name: str) -> str:
    """Gather rows of a [rows, dim] table: the ONNX form of nn.Embedding."""
    table = net.param(f"{name}.weight", [rows, dim], normal(1 / math.sqrt(dim)))
    return net.node("Gather", [table, ids], name, axis=0)
