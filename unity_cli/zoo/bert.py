"""BERT (Devlin et al., NAACL'19) as a sentence classifier: word, position and
token-type embeddings (Gather) + LayerNormalization, post-LN transformer encoder layers
(multi-head self-attention, Gelu feed-forward, residual Adds), the pooler (first token ->
Linear -> Tanh) and a 2-way classifier. BERT-large: 24 layers, hidden 1024, 16 heads,
feed-forward 4096, sequences of 512 tokens, vocabulary 30522.

Every sequence is full length (no padding mask) and of token type 0, so position and
token-type ids are constants of the graph, not inputs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from .layers import embedding, layer_norm, linear, self_attention
from .net import Net


@dataclass(frozen=True, slots=True)
class BertConfig:
    layers: int
    hidden: int
    heads: int
    ffn: int
    seq: int
    vocab: int
    max_positions: int = 512
    type_vocab: int = 2
    classes: int = 2


PAPER = BertConfig(24, 1024, 16, 4096, 512, 30522)
SMALL = BertConfig(2, 32, 4, 64, 16, 100, max_positions=16)


def build(net: Net, cfg: BertConfig, batch: int | str) -> str:
    ids = net.input("input_ids", [batch, cfg.seq], TensorProto.INT64)
    h = cfg.hidden
    x = embedding(net, ids, cfg.vocab, h, "embeddings.word_embeddings")
    pos = embedding(net, net.ints("position_ids", np.arange(cfg.seq)), cfg.max_positions, h,
                    "embeddings.position_embeddings")
    typ = embedding(net, net.ints("token_type_ids", np.zeros(cfg.seq)), cfg.type_vocab, h,
                    "embeddings.token_type_embeddings")
    x = net.node("Add", [net.node("Add", [x, pos], "embeddings.add_position"), typ], "embeddings.add_type")
    x = layer_norm(net, x, h, "embeddings.LayerNorm")
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}"
        a = self_attention(net, x, h, cfg.heads, f"{p}.attention")
        x = layer_norm(net, net.node("Add", [a, x], f"{p}.attention.residual"), h, f"{p}.attention.LayerNorm")
        f = linear(net, x, h, cfg.ffn, f"{p}.intermediate", act="Gelu")
        f = linear(net, f, cfg.ffn, h, f"{p}.output")
        x = layer_norm(net, net.node("Add", [f, x], f"{p}.output.residual"), h, f"{p}.output.LayerNorm")
    first = net.node("Gather", [x, net.ints("first_token", 0)], "pooler.first_token", axis=1)   # [N, hidden]
    pooled = linear(net, first, h, h, "pooler.dense", act="Tanh")
    net.output(linear(net, pooled, h, cfg.classes, "classifier"), [batch, cfg.classes])
    return (f"BERT: {cfg.layers} layers, hidden {h}, {cfg.heads} heads, feed-forward {cfg.ffn}, "
            f"sequence {cfg.seq}, vocabulary {cfg.vocab}; pooler + {cfg.classes}-way classifier")
