"""Models made of dense layers only, at the sizes of FlexFlow's examples that the Unity
paper measured (bias-free Linears, as there).

* CANDLE Uno (the cancer drug-response model of the CANDLE project): one feature tower of
  8 Linears x 4192 (ReLU) for each non-scalar input — the cell line's RNA-seq (942) and
  two drugs' descriptors (5270) and fingerprints (2048) — concatenated with the two doses,
  then 4 Linears x 4192 and one output (the response). FlexFlow gives each input its own
  tower (CANDLE's Keras model shares a tower between the two drugs); so do we.
* MLP: FlexFlow's ``MLP_Unify``, the Unity paper's dense benchmark: two towers of
  8 Linears x 8192 over two 1024-wide inputs, added, then a softmax. It is chosen over a
  single stack because it is the network the paper measured, and because two
  independent towers are exactly what a joint search can place side by side.
"""
from __future__ import annotations

from dataclasses import dataclass

from .layers import mlp
from .net import Net


@dataclass(frozen=True, slots=True)
class CandleConfig:
    features: tuple[tuple[str, int], ...]   # (input name, width); width 1 inputs skip the towers
    tower: tuple[int, ...]
    dense: tuple[int, ...]


_UNO_INPUTS = (("cell_rnaseq", 942), ("dose1", 1), ("dose2", 1), ("drug1_descriptors", 5270),
               ("drug1_fingerprints", 2048), ("drug2_descriptors", 5270), ("drug2_fingerprints", 2048))
CANDLE_PAPER = CandleConfig(_UNO_INPUTS, (4192,) * 8, (4192,) * 4)
CANDLE_SMALL = CandleConfig((("cell_rnaseq", 12), ("dose1", 1), ("dose2", 1), ("drug1_descriptors", 20),
                             ("drug1_fingerprints", 16), ("drug2_descriptors", 20), ("drug2_fingerprints", 16)),
                            (16, 16), (16, 16))


def build_candle(net: Net, cfg: CandleConfig, batch: int | str) -> str:
    encoded, width = [], 0
    for name, d in cfg.features:
        x = net.input(name, [batch, d])
        if d > 1:
            x = mlp(net, x, (d,) + cfg.tower, f"{name}.tower", bias=False)
            d = cfg.tower[-1]
        encoded.append(x)
        width += d
    x = net.node("Concat", encoded, "concat", axis=1)
    x = mlp(net, x, (width,) + cfg.dense + (1,), "dense", bias=False, last_act=None)
    net.output(x, [batch, 1])
    towers = sum(d > 1 for _, d in cfg.features)
    return (f"CANDLE Uno: {towers} feature towers of {len(cfg.tower)} x {cfg.tower[0]}, "
            f"concatenated ({width}), {len(cfg.dense)} x {cfg.dense[0]} dense layers, 1 output")


@dataclass(frozen=True, slots=True)
class MLPConfig:
    inputs: int
    width: int
    layers: int
    towers: int


MLP_PAPER = MLPConfig(1024, 8192, 8, 2)
MLP_SMALL = MLPConfig(16, 32, 3, 2)


def build_mlp(net: Net, cfg: MLPConfig, batch: int | str) -> str:
    outs = []
    for t in range(cfg.towers):
        x = net.input(f"x{t}", [batch, cfg.inputs])
        outs.append(mlp(net, x, (cfg.inputs,) + (cfg.width,) * cfg.layers, f"tower{t}", bias=False, last_act=None))
    y = outs[0]
    for t, o in enumerate(outs[1:], 1):
        y = net.node("Add", [y, o], f"add{t}")
    net.output(net.node("Softmax", [y], "softmax", axis=-1), [batch, cfg.width])
    return (f"MLP: {cfg.towers} towers of {cfg.layers} x {cfg.width} Linears over {cfg.inputs}-wide inputs, "
            "added, softmax")
