"""Compute time of one operator piece on one device: a roofline plus launch overhead."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..cluster.spec import DeviceType
from ..ir.dtypes import DType
from ..ir.opspec import OpCost
from ..ir.shapes import TensorShape


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
    bwd = max(cost.bwd_flops / peak, cost.bwd_bytes / bw) + device.launch_overhead * cost.bwd_launches \
        if cost.kernels else 0.0
    return PieceTime(fwd, bwd)


def piece_shapes(shapes: Sequence, dtype: DType) -> list[TensorShape]:
    return [as_compute_dtype(s.piece, dtype) for s in shapes]

