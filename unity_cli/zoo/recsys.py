"""Recommendation models: large sparse embedding tables (Gather) beside small dense MLPs.

* DLRM (Naumov et al., 2019): a bottom MLP over dense features, one embedding table per
  sparse feature, the pairwise dot-product interaction of all those vectors (a batched
  MatMul of the stacked vectors with their transpose, then the strict upper triangle
  picked by a constant-index Gather), concatenated with the bottom MLP's output, then a
  top MLP and a sigmoid. Paper scale follows FlexFlow's Summit runs of DLRM (the code
  the Unity paper measured): 8 tables of 1M rows x 64, bottom MLP 64-512-512-64, top MLP
  1024-1024-1024-1 (FlexFlow concatenates instead of the dot interaction; we keep DLRM's).
* XDL (Alibaba's ads model, as FlexFlow's XDL example the paper measured): sum-pooled
  embedding bags over wide tables (4 x 1M rows x 64), concatenated, and a bias-free MLP
  256-256-256-2 ending in a sigmoid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from .layers import embedding, mlp
from .net import Net


@dataclass(frozen=True, slots=True)
class DLRMConfig:
    dense: int
    bottom: tuple[int, ...]     # bottom MLP widths after the dense input; the last is the embedding dim
    tables: tuple[int, ...]     # rows per embedding table
    top: tuple[int, ...]        # top MLP widths after the interaction; the last is 1


DLRM_PAPER = DLRMConfig(64, (512, 512, 64), (1_000_000,) * 8, (1024, 1024, 1024, 1))
DLRM_SMALL = DLRMConfig(4, (16, 8), (50, 40, 30), (16, 1))


def build_dlrm(net: Net, cfg: DLRMConfig, batch: int | str) -> str:
    dim = cfg.bottom[-1]
    dense = net.input("dense", [batch, cfg.dense])
    vectors = [mlp(net, dense, (cfg.dense,) + cfg.bottom, "bottom_mlp")]                  # [N, dim]
    for t, rows in enumerate(cfg.tables):
        ids = net.input(f"sparse_{t}", [batch], TensorProto.INT64)
        vectors.append(embedding(net, ids, rows, dim, f"emb_{t}"))                        # [N, dim]
    f = len(vectors)
    row = net.ints("interaction.row_shape", [-1, 1, dim])
    stacked = net.node("Concat", [net.node("Reshape", [v, row], f"interaction.row_{i}") for i, v in enumerate(vectors)],
                       "interaction.stack", axis=1)                                       # [N, f, dim]
    pairs = net.node("MatMul", [stacked, net.node("Transpose", [stacked], "interaction.t", perm=[0, 2, 1])],
                     "interaction.dot")                                                   # [N, f, f]
    flat = net.node("Reshape", [pairs, net.ints("interaction.flat_shape", [-1, f * f])], "interaction.flat")
    i, j = np.triu_indices(f, k=1)
    upper = net.node("Gather", [flat, net.ints("interaction.upper", i * f + j)], "interaction.upper_triangle",
                     axis=1)                                                              # [N, f(f-1)/2]
    x = net.node("Concat", [vectors[0], upper], "interaction.concat", axis=1)
    width = dim + f * (f - 1) // 2
    y = mlp(net, x, (width,) + cfg.top, "top_mlp", last_act="Sigmoid")
    net.output(y, [batch, cfg.top[-1]])
    return (f"DLRM: {len(cfg.tables)} tables of {cfg.tables[0]} x {dim}, bottom MLP "
            f"{'-'.join(map(str, (cfg.dense,) + cfg.bottom))}, dot interaction, top MLP "
            f"{'-'.join(map(str, (width,) + cfg.top))}")


@dataclass(frozen=True, slots=True)
class XDLConfig:
    tables: tuple[int, ...]
    dim: int
    bag: int                    # ids per sample and table, summed (an embedding bag)
    mlp: tuple[int, ...]        # widths after the concatenated embeddings; the last is the output


XDL_PAPER = XDLConfig((1_000_000,) * 4, 64, 1, (256, 256, 2))
XDL_SMALL = XDLConfig((60, 50, 40), 8, 2, (16, 8, 2))


def build_xdl(net: Net, cfg: XDLConfig, batch: int | str) -> str:
    axis = net.ints("bag_axis", [1])
    bags = []
    for t, rows in enumerate(cfg.tables):
        ids = net.input(f"sparse_{t}", [batch, cfg.bag], TensorProto.INT64)
        e = embedding(net, ids, rows, cfg.dim, f"emb_{t}")                                # [N, bag, dim]
        bags.append(net.node("ReduceSum", [e, axis], f"emb_{t}.bag_sum", keepdims=0))    # [N, dim]
    x = net.node("Concat", bags, "concat", axis=1)
    width = cfg.dim * len(cfg.tables)
    net.output(mlp(net, x, (width,) + cfg.mlp, "mlp", bias=False, last_act="Sigmoid"), [batch, cfg.mlp[-1]])
    return (f"XDL: {len(cfg.tables)} embedding bags of {cfg.tables[0]} x {cfg.dim} (bag {cfg.bag}, sum), "
            f"MLP {'-'.join(map(str, (width,) + cfg.mlp))}")
