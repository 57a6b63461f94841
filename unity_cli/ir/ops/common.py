"""Helpers shared by the operator specifications (broadcasting, axis handling, costs)."""
from __future__ import annotations

from collections.abc import Sequence

from ...errors import ShapeError
from ..opspec import WHOLE, OpCost, Role
from ..shapes import TensorShape


def broadcast_dims(kind: str, shapes: Sequence[TensorShape]) -> tuple[int, ...]:
    """The ONNX (numpy) multidirectional broadcast of the input dims."""
    rank = max((s.rank for s in shapes), default=0)
    out = []
    for k in range(rank):
        sizes = {s.dims[k - rank + s.rank] for s in shapes if k - rank + s.rank >= 0}
        big = sizes - {1}
        if len(big) > 1:
            raise ShapeError(f"{kind}: shapes {[list(s.dims) for s in shapes]} do not broadcast")
        out.append(big.pop() if big else 1)
    return tuple(out)


def broadcast_roles(shape: TensorShape, out_dims: Sequence[int]) -> tuple[Role, ...]:
    """Each input dim is the output dim it aligns with, unless it is broadcast (size 1)."""
    offset = len(out_dims) - shape.rank
    return tuple(WHOLE if (d == 1 and out_dims[offset + k] != 1) else offset + k
                 for k, d in enumerate(shape.dims))


def norm_axis(kind: str, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{kind}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def norm_axes(kind: str, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    out = tuple(sorted(norm_axis(kind, a, rank) for a in axes))
    if len(set(out)) != len(out):
        raise ShapeError(f"{kind}: repeated axes {list(axes)}")
    return out


def streaming_cost(inputs: Sequence[TensorShape], outputs: Sequence[TensorShape],
                   flops_per_element: float = 1.0, bwd_factor: float = 2.0) -> OpCost:
    """Cost of an op that streams its inputs once and does a few flops per output element."""
    moved = float(sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs))
    flops = flops_per_element * sum(s.numel for s in outputs)
    return OpCost(flops, moved, bwd_factor * flops, bwd_factor * moved)


def need_inputs(kind: str, inputs: Sequence[TensorShape], lo: int, hi: int | None = None) -> None:
    hi = lo if hi is None else hi
    if not lo <= len(inputs) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise ShapeError(f"{kind} takes {want} inputs, got {len(inputs)}")
