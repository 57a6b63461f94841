"""Compute time of one operator piece on one device: a roofline plus launch overhead."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..cluster.spec import DeviceType
from ..ir.dtypes import DType
from ..ir.opspec import OpCost, spec_of
from ..ir.shapes import ParallelTensorShape, TensorShape

# Ops whose attrs name their whole output shape: a piece runs with its own (as
# ``unity_cli.ir.pieces.piece_attrs`` does for the runtime).
_NAME_OUTPUT_SHAPE = ("Reshape", "Expand")


@dataclass(frozen=True, slots=True)
class PieceTime:
    fwd: float
    bwd: float


def as_compute_dtype(shape: TensorShape, dtype: DType) -> TensorShape:
    """Float tensors are computed in the chosen dtype; integer ones keep theirs."""
    return TensorShape(shape.dims, dtype) if shape.dtype.is_float else shape


def roofline(cost: OpCost, device: DeviceType, dtype: DType) -> PieceTime:
    peak = device.flops(dtype.value)
    bw = device.memory_bandwidth
    launch = device.launch_overhead * cost.kernels
    fwd = max(cost.fwd_flops / peak, cost.fwd_bytes / bw) + launch if cost.kernels else 0.0
    bwd = max(cost.bwd_flops / peak, cost.bwd_bytes / bw) + 2 * launch if cost.kernels else 0.0
    return PieceTime(fwd, bwd)


def piece_shapes(shapes: Sequence, dtype: DType) -> list[TensorShape]:
    return [as_compute_dtype(s.piece, dtype) for s in shapes]


def piece_op(op: Any, output: ParallelTensorShape) -> Any:
    """The attrs one piece of an op runs with, given the op's (first) output shape."""
    if spec_of(op).kind in _NAME_OUTPUT_SHAPE:
        return dataclasses.replace(op, dims=output.piece.dims)
    return op
