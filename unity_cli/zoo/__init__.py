"""The seven DNNs of the Unity paper's evaluation (OSDI'22, section 8) and three decoder
LLMs people train today (Llama-2 7B and 70B, GPT-3 175B: ``llm.py``), built as ONNX graphs
with ``onnx.helper``: ``unity zoo NAME --out MODEL.onnx``.

Each model comes at two scales: ``paper`` (the real sizes; weights are external-data
references, written only when asked, so the file plans without hundreds of MB of data)
and ``small`` (the same architecture shrunk to train on two CPU ranks in seconds, with
seeded random weights inline). The batch dim is symbolic (``N``) unless fixed.
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from ..errors import UsageError
from . import bert, dense, inception, llm, recsys, resnext
from .net import BATCH, Net, WeightMode, Weights

SCALES = ("paper", "small")


@dataclass(frozen=True, slots=True)
class ZooModel:
    """One model of the zoo: how to build it and its configuration at each scale."""

    name: str
    description: str
    build: Callable[[Net, Any, int | str], str]
    paper: Any
    small: Any
    seed: int

    def config(self, scale: str) -> Any:
        return {"paper": self.paper, "small": self.small}[check_scale(scale)]


def _registry(*models: ZooModel) -> dict[str, ZooModel]:
    out: dict[str, ZooModel] = {}
    for m in models:
        if m.name in out:
            raise ValueError(f"zoo model {m.name!r} is registered twice")
        out[m.name] = m
    return out


MODELS: dict[str, ZooModel] = _registry(
    ZooModel("resnext-50", "ResNeXt-50 32x4d image classifier (grouped convs, BN, residuals), 224x224",
             resnext.build, resnext.PAPER, resnext.SMALL, 1),
    ZooModel("bert-large", "BERT-large encoder (24 layers, hidden 1024, 16 heads), sequence 512, classifier",
             bert.build, bert.PAPER, bert.SMALL, 2),
    ZooModel("dlrm", "DLRM recommender: 8 embedding tables of 1M x 64, MLPs, dot-product interaction",
             recsys.build_dlrm, recsys.DLRM_PAPER, recsys.DLRM_SMALL, 3),
    ZooModel("candle-uno", "CANDLE Uno drug-response model: 5 dense feature towers, concat, dense stack",
             dense.build_candle, dense.CANDLE_PAPER, dense.CANDLE_SMALL, 4),
    ZooModel("inception-v3", "Inception-v3 image classifier (A/B/C/D/E modules, factorized convs), 299x299",
             inception.build, inception.PAPER, inception.SMALL, 5),
    ZooModel("mlp", "MLP: two towers of 8 x 8192 Linears, added, softmax (FlexFlow's MLP_Unify)",
             dense.build_mlp, dense.MLP_PAPER, dense.MLP_SMALL, 6),
    ZooModel("xdl", "XDL ads model: 4 wide embedding bags of 1M x 64, concat, MLP 256-256-256-2",
             recsys.build_xdl, recsys.XDL_PAPER, recsys.XDL_SMALL, 7),
    ZooModel("llama2-7b", "Llama 2 7B decoder (32 layers, hidden 4096, 32 heads, SwiGLU, rotary), sequence 2048",
             llm.build_llama, llm.LLAMA2_7B, llm.LLAMA2_7B_SMALL, 8),
    ZooModel("llama2-70b", "Llama 2 70B decoder (80 layers, hidden 8192, 64 heads, 8 KV heads), sequence 2048",
             llm.build_llama, llm.LLAMA2_70B, llm.LLAMA2_70B_SMALL, 9),
    ZooModel("gpt3-175b", "GPT-3 175B decoder (96 layers, hidden 12288, 96 heads, Gelu), sequence 2048",
             llm.build_gpt, llm.GPT3_175B, llm.GPT3_175B_SMALL, 10),
)


PAPER_MODELS = ("resnext-50", "bert-large", "dlrm", "candle-uno", "inception-v3", "mlp", "xdl")
"""The seven DNNs of the Unity paper's evaluation, as its benchmarks name them."""
LLMS = ("llama2-7b", "llama2-70b", "gpt3-175b")
"""The decoder LLMs (``llm.py``), planned by ``benchmarks/llm.py``."""


@dataclass(frozen=True, slots=True)
class Built:
    """A built model and what was made of its weights."""

    model: onnx.ModelProto
    params: int
    doc: str


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise UsageError(f"--scale: unknown scale {scale!r} (choose from {', '.join(SCALES)})")
    return scale


def lookup(name: str) -> ZooModel:
    """The model called ``name`` (case and ``_``/``-`` don't matter); a did-you-mean error if none is."""
    key = name.strip().lower().replace("_", "-")
    if key in MODELS:
        return MODELS[key]
    close = difflib.get_close_matches(key, list(MODELS), n=1, cutoff=0.4) or \
        [m for m in MODELS if m.split("-")[0] == key.split("-")[0]][:1]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UsageError(f"unknown zoo model {name!r}{hint} (models: {', '.join(MODELS)}; see 'unity zoo --list')")


def build(name: str, scale: str = "paper", batch_size: int | None = None,
          weights: Weights = Weights(WeightMode.ABSENT, "weights.data")) -> Built:
    """Build a zoo model in memory. ``weights`` says where initializer values go; a
    model with ABSENT weights carries shapes only (planning needs nothing more)."""
    m = lookup(name)
    cfg = m.config(scale)
    if batch_size is not None and batch_size < 1:
        raise UsageError(f"--batch-size must be a positive integer, got {batch_size}")
    net = Net(m.name.replace("-", "_"), weights, seed=m.seed)
    doc = m.build(net, cfg, BATCH if batch_size is None else batch_size)
    model = net.model(f"{doc} ({scale} scale, unity zoo)")
    return Built(model, net.params, doc)


def write(name: str, out: str | Path, scale: str = "paper", batch_size: int | None = None,
          weights: bool | None = None) -> tuple[Built, Path | None]:
    """Build a zoo model and save it to ``out``. Weights: inline at small scale; at paper
    scale external references to ``<out>.data``, which is written only if ``weights``.
    Returns the model and the data file written, if any. A stale ``<out>.data`` left by
    an earlier file of that name is removed when no data is written: it belongs to the
    file being replaced, and the importer would read it."""
    lookup(name)
    check_scale(scale)
    out = Path(out)
    if not out.resolve().parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.resolve().parent} does not exist")
    data = out.with_name(out.name + ".data")
    if scale == "small" and weights is not False:
        built = build(name, scale, batch_size, Weights(WeightMode.INLINE))
        written = None
    elif weights:
        with open(data, "wb") as sink:
            built = build(name, scale, batch_size, Weights(WeightMode.EXTERNAL, data.name, sink))
        written = data
    else:
        built = build(name, scale, batch_size, Weights(WeightMode.ABSENT, data.name))
        written = None
    if written is None and data.exists():
        data.unlink()
    onnx.save(built.model, str(out))
    return built, written


def paper_parameters(name: str) -> int:
    """Trainable parameters of the paper-scale model (built shape-only, so it is quick)."""
    return build(name, "paper").params


__all__ = ["LLMS", "MODELS", "PAPER_MODELS", "SCALES", "Built", "ZooModel", "build", "lookup", "paper_parameters",
           "write"]
