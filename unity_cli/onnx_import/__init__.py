"""ONNX → PCG import."""
from __future__ import annotations

from .convert import DEFAULT_BATCH, ImportedModel, ImportOptions, import_model

__all__ = ["DEFAULT_BATCH", "ImportedModel", "ImportOptions", "import_model"]
