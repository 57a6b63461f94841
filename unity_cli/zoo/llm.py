"""Decoder-only language models: Llama 2 (Touvron et al., 2023) and GPT-3 (Brown et al.,
NeurIPS'20), each a causal language model whose output is the LM head's logits
[batch, seq, vocab] over ``input_ids`` [batch, seq].

* Llama 2: token embedding (Gather), pre-RMSNorm decoder layers of rotary self-attention
  and a SwiGLU feed-forward, a final RMSNorm and an untied LM head, no biases. The 70B
  model's attention is grouped-query: 8 key/value heads, each read by 8 query heads.
* GPT-3: token and learned position embeddings, pre-LayerNorm decoder layers of
  multi-head self-attention and a Gelu (tanh) feed-forward, a final LayerNorm and an LM
  head tied to the token embedding. Every layer is dense (the paper's alternating
  locally banded sparse layers are not modelled: they change no weight).

The nodes are the ones PyTorch's exporter writes for Hugging Face's modules: RMSNorm as
Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul; SiLU as ``x * Sigmoid(x)``; rotary embeddings
as Slice, Neg, Concat, Mul, Add against cos/sin tables. Those tables and the causal mask are
computed in the graph from integer positions (Cast, Unsqueeze, Mul, Exp, Cos, Sin, Greater,
Where): the importer folds them into constants, so they are never trainable weights, and a
paper-scale file holds no [2048, 2048] mask, only 2048 int64 positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from .layers import embedding, layer_norm, linear
from .net import Net, const

MASKED = -1e9      # added to a future position's score: exp underflows to 0, and it stays finite


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """A Llama 2 model; ``kv_heads < heads`` makes attention grouped-query."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    vocab: int
    rope_base: float = 10000.0
    eps: float = 1e-5


@dataclass(frozen=True, slots=True)
class GptConfig:
    """A GPT-3 model (GPT-2's architecture at a larger size)."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int
    positions: int
    eps: float = 1e-5


LLAMA2_7B = LlamaConfig(32, 4096, 32, 32, 11008, 2048, 32000)
LLAMA2_7B_SMALL = LlamaConfig(2, 32, 4, 4, 88, 16, 64)
LLAMA2_70B = LlamaConfig(80, 8192, 64, 8, 28672, 2048, 32000)
LLAMA2_70B_SMALL = LlamaConfig(2, 64, 8, 4, 128, 16, 64)       # 2 query heads per key/value head
GPT3_175B = GptConfig(96, 12288, 96, 49152, 2048, 50257, 2048)
GPT3_175B_SMALL = GptConfig(2, 32, 4, 128, 16, 128, 16)


@dataclass(frozen=True, slots=True)
class Shared:
    """Names of the constants every layer reads, made once per graph: the positions [S]
    (int64), the causal mask [S, S], the rotary tables [S, d] and RMSNorm's scalars ("" where
    the model has none)."""

    positions: str
    mask: str
    cos: str
    sin: str
    halves: tuple[str, str, str]     # rotary's Slice bounds: 0, d/2, d
    last_axis: str
    two: str
    eps: str


def shared(net: Net, seq: int, head_dim: int, rope_base: float | None, rms_eps: float | None) -> Shared:
    """The per-graph constants; the rotary tables only with ``rope_base``, RMSNorm's only with
    ``rms_eps``. The mask and tables are computed by nodes on integer positions, which the
    importer folds: written as float initializers they would read as trainable weights."""
    pos = net.ints("positions", np.arange(seq))
    axis0, axis1 = net.ints("axis_0", [0]), net.ints("axis_1", [1])
    rows = net.node("Unsqueeze", [pos, axis1], "causal_mask.rows")                 # [S, 1]
    cols = net.node("Unsqueeze", [pos, axis0], "causal_mask.cols")                 # [1, S]
    future = net.node("Greater", [cols, rows], "causal_mask.future")               # key after query
    mask = net.node("Where", [future, net.scalar("causal_mask.masked", MASKED),
                              net.scalar("causal_mask.visible", 0.0)], "causal_mask")
    cos = sin = ""
    halves = ("", "", "")
    if rope_base is not None:
        # angle[s, i] = s * base^(-2i/d), i < d/2, repeated for the two halves (Hugging Face's layout)
        expo = net.node("Cast", [net.ints("rotary.even", np.arange(0, head_dim, 2))], "rotary.even.float",
                        to=TensorProto.FLOAT)
        inv = net.node("Exp", [net.node("Mul", [expo, net.scalar("rotary.log_base", -math.log(rope_base) / head_dim)],
                                        "rotary.exponent")], "rotary.inv_freq")   # [d/2]
        spos = net.node("Cast", [rows], "rotary.positions", to=TensorProto.FLOAT)   # [S, 1]
        ang = net.node("Mul", [spos, net.node("Unsqueeze", [inv, axis0], "rotary.inv_freq.row")], "rotary.freqs")
        ang = net.node("Concat", [ang, ang], "rotary.angles", axis=-1)              # [S, d]
        cos, sin = net.node("Cos", [ang], "rotary.cos"), net.node("Sin", [ang], "rotary.sin")
        halves = (net.ints("rotary.start", [0]), net.ints("rotary.half", [head_dim // 2]),
                  net.ints("rotary.end", [head_dim]))
    last_axis = two = eps_c = ""
    if rms_eps is not None:
        two, eps_c = net.scalar("two", 2.0), net.scalar("norm_eps", rms_eps)
    if rms_eps is not None or rope_base is not None:
        last_axis = net.ints("last_axis", [-1])
    return Shared(pos, mask, cos, sin, halves, last_axis, two, eps_c)


def rms_norm(net: Net, x: str, d: int, name: str, c: Shared) -> str:
    """x / sqrt(mean(x^2, last axis) + eps) * weight (Zhang & Sennrich): LayerNorm without
    the mean and the bias, as Llama's exporter writes it."""
    ms = net.node("ReduceMean", [net.node("Pow", [x, c.two], f"{name}.square"), c.last_axis], f"{name}.mean",
                  keepdims=1)
    r = net.node("Reciprocal", [net.node("Sqrt", [net.node("Add", [ms, c.eps], f"{name}.add_eps")], f"{name}.sqrt")],
                 f"{name}.rsqrt")
    y = net.node("Mul", [x, r], f"{name}.normed")
    return net.node("Mul", [y, net.param(f"{name}.weight", [d], const(1.0))], f"{name}.scale")


def rotary(net: Net, x: str, name: str, c: Shared) -> str:
    """x cos + rotate_half(x) sin on x[..., S, d], rotate_half(x) = [-x2, x1] for the halves
    x1, x2 of the last axis (Su et al.'s RoPE in Hugging Face's half-split layout)."""
    start, half, end = c.halves
    x1 = net.node("Slice", [x, start, half, c.last_axis], f"{name}.x1")
    x2 = net.node("Slice", [x, half, end, c.last_axis], f"{name}.x2")
    rot = net.node("Concat", [net.node("Neg", [x2], f"{name}.neg"), x1], f"{name}.rotate_half", axis=-1)
    return net.node("Add", [net.node("Mul", [x, c.cos], f"{name}.cos"), net.node("Mul", [rot, c.sin], f"{name}.sin")],
                    name)


def causal_attention(net: Net, x: str, hidden: int, heads: int, kv_heads: int, name: str, c: Shared,
                     bias: bool, rope: bool) -> str:
    """Causal self-attention on x[N, S, hidden] -> [N, S, hidden]: softmax(Q K^T / sqrt(d) +
    mask) V. With ``kv_heads < heads`` (grouped-query) the query heads are split as
    [kv_heads, group] and K, V carry a size-1 group axis, so one MatMul broadcasts each
    key/value head over its group: no copy of K or V is made, as repeat_kv's would be."""
    d = hidden // heads
    group = heads // kv_heads
    assert d * heads == hidden and group * kv_heads == heads, (hidden, heads, kv_heads)
    q_heads, kv_split = ([heads], [heads]) if group == 1 else ([kv_heads, group], [kv_heads, 1])
    rank = 3 + len(q_heads)                     # [N, S, *heads, d]
    to_heads = [0, *range(2, rank - 1), 1, rank - 1]           # -> [N, *heads, S, d]
    back = [to_heads.index(i) for i in range(rank)]
    swap = [*range(rank - 2), rank - 1, rank - 2]

    def project(p: str, width: int, split: list[int]) -> str:
        y = linear(net, x, hidden, width, f"{name}.{p}", bias)
        y = net.node("Reshape", [y, net.ints(f"{name}.{p}.split_heads", [0, 0, *split, d])], f"{name}.{p}.heads")
        return net.node("Transpose", [y], f"{name}.{p}.t", perm=to_heads)

    q = project("q_proj", heads * d, q_heads)
    k = project("k_proj", kv_heads * d, kv_split)
    v = project("v_proj", kv_heads * d, kv_split)
    if rope:
        q, k = rotary(net, q, f"{name}.q_rotary", c), rotary(net, k, f"{name}.k_rotary", c)
    k = net.node("Transpose", [k], f"{name}.k_proj.tt", perm=swap)               # [N, *heads, d, S]
    scores = net.node("MatMul", [q, k], f"{name}.scores")                          # [N, *heads, S, S]
    scores = net.node("Mul", [scores, net.scalar(f"{name}.scale", 1 / math.sqrt(d))], f"{name}.scaled")
    scores = net.node("Add", [scores, c.mask], f"{name}.masked")
    probs = net.node("Softmax", [scores], f"{name}.softmax", axis=-1)
    ctx = net.node("MatMul", [probs, v], f"{name}.context")                       # [N, *heads, S, d]
    ctx = net.node("Transpose", [ctx], f"{name}.context.t", perm=back)
    ctx = net.node("Reshape", [ctx, net.ints(f"{name}.merge_heads", [0, 0, hidden])], f"{name}.merge")
    return linear(net, ctx, hidden, hidden, f"{name}.o_proj", bias)


def build_llama(net: Net, cfg: LlamaConfig, batch: int | str) -> str:
    ids = net.input("input_ids", [batch, cfg.seq], TensorProto.INT64)
    h = cfg.hidden
    c = shared(net, cfg.seq, h // cfg.heads, cfg.rope_base, cfg.eps)
    x = embedding(net, ids, cfg.vocab, h, "model.embed_tokens")
    for i in range(cfg.layers):
        p = f"model.layers.{i}"
        a = causal_attention(net, rms_norm(net, x, h, f"{p}.input_layernorm", c), h, cfg.heads, cfg.kv_heads,
                             f"{p}.self_attn", c, bias=False, rope=True)
        x = net.node("Add", [x, a], f"{p}.attn_residual")
        y = rms_norm(net, x, h, f"{p}.post_attention_layernorm", c)
        gate = linear(net, y, h, cfg.ffn, f"{p}.mlp.gate_proj", bias=False)
        silu = net.node("Mul", [gate, net.node("Sigmoid", [gate], f"{p}.mlp.sigmoid")], f"{p}.mlp.silu")
        up = linear(net, y, h, cfg.ffn, f"{p}.mlp.up_proj", bias=False)
        f = linear(net, net.node("Mul", [silu, up], f"{p}.mlp.gated"), cfg.ffn, h, f"{p}.mlp.down_proj", bias=False)
        x = net.node("Add", [x, f], f"{p}.mlp_residual")
    x = rms_norm(net, x, h, "model.norm", c)
    net.output(linear(net, x, h, cfg.vocab, "lm_head", bias=False), [batch, cfg.seq, cfg.vocab])
    kv = f" ({cfg.kv_heads} key/value heads)" if cfg.kv_heads != cfg.heads else ""
    return (f"Llama 2: {cfg.layers} layers, hidden {h}, {cfg.heads} heads{kv}, SwiGLU {cfg.ffn}, rotary, "
            f"RMSNorm, sequence {cfg.seq}, vocabulary {cfg.vocab}; causal LM logits")


def build_gpt(net: Net, cfg: GptConfig, batch: int | str) -> str:
    ids = net.input("input_ids", [batch, cfg.seq], TensorProto.INT64)
    h = cfg.hidden
    c = shared(net, cfg.seq, h // cfg.heads, None, None)
    wte = embedding(net, ids, cfg.vocab, h, "transformer.wte")
    wpe = embedding(net, c.positions, cfg.positions, h, "transformer.wpe")
    x = net.node("Add", [wte, wpe], "transformer.add_positions")
    for i in range(cfg.layers):
        p = f"transformer.h.{i}"
        a = causal_attention(net, layer_norm(net, x, h, f"{p}.ln_1", cfg.eps), h, cfg.heads, cfg.heads,
                             f"{p}.attn", c, bias=True, rope=False)
        x = net.node("Add", [x, a], f"{p}.attn_residual")
        f = linear(net, layer_norm(net, x, h, f"{p}.ln_2", cfg.eps), h, cfg.ffn, f"{p}.mlp.c_fc")
        f = net.node("Gelu", [f], f"{p}.mlp.gelu", approximate="tanh")
        x = net.node("Add", [x, linear(net, f, cfg.ffn, h, f"{p}.mlp.c_proj")], f"{p}.mlp_residual")
    x = layer_norm(net, x, h, "transformer.ln_f", cfg.eps)
    # The LM head is the token embedding, transposed (tied, as in GPT-2): no weight of its own.
    head = net.node("Transpose", ["transformer.wte.weight"], "lm_head.weight_t", perm=[1, 0])
    net.output(net.node("MatMul", [x, head], "lm_head"), [batch, cfg.seq, cfg.vocab])
    return (f"GPT-3: {cfg.layers} layers, hidden {h}, {cfg.heads} heads, feed-forward {cfg.ffn} (Gelu), "
            f"learned positions, pre-LayerNorm, sequence {cfg.seq}, vocabulary {cfg.vocab}; tied LM head logits")
