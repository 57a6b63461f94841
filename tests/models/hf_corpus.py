"""The Hugging Face corpus of ``tests/models/hf/`` (made by ``tests/models/export_hf.py``):
which files there are, what they are fed with, and which are refused on purpose.

Import as ``from models.hf_corpus import ...`` with ``tests/`` on ``sys.path``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HF_DIR = Path(__file__).resolve().parent / "hf"
VOCAB = 320        # export_hf.VOCAB: token ids are below it

# Files unity refuses, with a word their one-line error must contain: HF's default
# ("eager") MoE experts loop over the experts each token picked, found by NonZero.
REFUSED = {"mixtral_eager_torchscript.onnx": "NonZero"}


@dataclass(frozen=True)
class HFModel:
    file: str
    family: str
    exporter: str
    inputs: dict[str, list[int]]
    dtypes: dict[str, str]
    ops: list[str]
    note: str

    @property
    def path(self) -> Path:
        return HF_DIR / self.file

    @property
    def batch(self) -> int:
        return next(iter(self.inputs.values()))[0]

    def feed(self, batch: int | None = None, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs of the exported shapes (batch changed if given): token ids below the
        vocabulary, a padding mask with a few zeros on the last row, normal floats."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, dims in self.inputs.items():
            dims = [batch or dims[0], *dims[1:]]
            if self.dtypes[name] == "int64" and "mask" in name:
                mask = np.ones(dims, np.int64)
                mask[-1, -2:] = 0
                out[name] = mask
            elif self.dtypes[name] == "int64":
                out[name] = rng.integers(0, VOCAB, dims).astype(np.int64)
            else:
                out[name] = rng.standard_normal(dims).astype(np.float32)
        return out


def hf_models() -> list[HFModel]:
    """Every file of the corpus, in name order (none if the folder is missing)."""
    catalog = HF_DIR / "catalog.json"
    if not catalog.is_file():
        return []
    doc = json.loads(catalog.read_text())
    return [HFModel(e["file"], e["family"], e["exporter"], e["inputs"], e["dtypes"], e["ops"], e["note"])
            for e in doc["files"]]
