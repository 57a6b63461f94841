"""Compute time of one operator piece on one device: a roofline plus launch overhead.

Each pass over memory streams at the device's memory bandwidth, or at its cache's where
the pass's bytes fit in the cache (``DeviceType.bandwidth``; a CPU core's L2), unless it
reads them out of order (``OpCost.strided``: a transposing copy runs at memory's speed, or
slower: 69 us for a 256 x 256 float32 transpose copied on a core, 5 us in order)."""
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

    def bw(c: OpCost, nbytes: float) -> float:
        return device.memory_bandwidth if c.strided else device.bandwidth(nbytes)

    if not cost.kernels:
        return PieceTime(0.0, 0.0)
    passes = (cost,) + cost.then     # one after another in the call: each its own roofline
    fwd = sum(max(c.fwd_flops / peak, c.fwd_bytes / bw(c, c.fwd_bytes)) for c in passes) \
        + device.launch_overhead * cost.kernels
    bwd = sum(max(c.bwd_flops / peak, c.bwd_bytes / bw(c, c.bwd_bytes)) for c in passes) \
        + device.launch_overhead * cost.bwd_launches
    return PieceTime(fwd, bwd)


def piece_shapes(shapes: Sequence, dtype: DType) -> list[TensorShape]:
    return [as_compute_dtype(s.piece, dtype) for s in shapes]

