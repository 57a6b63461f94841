"""ONNX → PCG import."""
from __future__ import annotations

from .convert import DEFAULT_BATCH, ImportedModel, ImportOptions, import_model, import_model_proto

__all__ = ["DEFAULT_BATCH", "ImportedModel", "ImportOptions", "import_model", "import_model_proto"]
