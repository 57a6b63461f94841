"""The intermediate representation: shapes, operator specifications and the PCG."""
from __future__ import annotations

from . import ops  # noqa: F401  (fills the operator registry)
from .dtypes import DType
from .opspec import SUM, WHOLE, OpCost, OpSpec, all_specs, infer_parallel, input_layout, spec_by_kind, spec_of
from .pcg import PCG, GraphBuilder, Node, TensorRef
from .shapes import ParallelDim, ParallelTensorShape, TensorShape

__all__ = ["DType", "SUM", "WHOLE", "OpCost", "OpSpec", "all_specs", "infer_parallel", "input_layout",
           "spec_by_kind", "spec_of", "PCG", "GraphBuilder", "Node", "TensorRef", "ParallelDim",
           "ParallelTensorShape", "TensorShape"]
