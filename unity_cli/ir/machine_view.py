"""Machine views: which device runs each piece of an operator.

A view is a strided range in the flattened (node-major) device grid: piece ``idx`` of an
operator, with ``idx`` a coordinate over its output's parallel axes
``(dim 0, ..., dim r-1, sum, copy)``, runs on device ``start + sum(idx[a] * strides[a])``.
A stride that keeps an axis inside one node makes its collectives use the fast
intra-node link; a larger stride spreads it over nodes.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ShapeError
from .shapes import ParallelTensorShape


def parallel_axes(shape: ParallelTensorShape) -> tuple[int, ...]:
    """The degrees of a tensor's parallel axes: its dims, then sum, then copy."""
    return shape.degrees + (shape.sum_degree, shape.copy_degree)


@dataclass(frozen=True, slots=True)
class MachineView:
    start: int
    strides: tuple[int, ...]

    def devices(self, shape: ParallelTensorShape) -> tuple[int, ...]:
        """The device of each piece, pieces in row-major order over the parallel axes."""
        return _devices(self, parallel_axes(shape))

    def groups(self, shape: ParallelTensorShape, axis: int, size: int) -> list[tuple[int, ...]]:
        """The device groups that talk when ``size`` consecutive pieces along ``axis`` merge."""
        axes = list(parallel_axes(shape))
        if axes[axis] % size:
            raise ShapeError(f"cannot group {size} pieces along an axis of degree {axes[axis]}")
        outer = axes[:axis] + [axes[axis] // size] + axes[axis + 1:]
        out = []
        for idx in itertools.product(*(range(a) for a in outer)):
            base = self.start + sum(i * s for i, s in zip(idx, self.strides)) + \
                idx[axis] * (size - 1) * self.strides[axis]
            out.append(tuple(base + k * self.strides[axis] for k in range(size)))
        return out

    def to_json(self) -> dict:
        return {"start": self.start, "strides": list(self.strides)}

    @staticmethod
    def from_json(data: dict) -> MachineView:
        return MachineView(int(data["start"]), tuple(int(s) for s in data["strides"]))


@functools.lru_cache(maxsize=1 << 16)
def _devices(view: MachineView, axes: tuple[int, ...]) -> tuple[int, ...]:
    if len(axes) != len(view.strides):
        raise ShapeError(f"view has {len(view.strides)} strides for {len(axes)} parallel axes")
    return tuple(view.start + sum(i * s for i, s in zip(idx, view.strides))
                 for idx in itertools.product(*(range(a) for a in axes)))


def packed_view(shape: ParallelTensorShape, inner_to_outer: Sequence[int], start: int = 0) -> MachineView:
    """A view that packs pieces densely from ``start``, axes listed innermost first."""
    axes = parallel_axes(shape)
    strides = [0] * len(axes)
    step = 1
    for a in inner_to_outer:
        strides[a] = step if axes[a] > 1 else 0
        step *= axes[a]
    for a in range(len(axes)):
        if a not in inner_to_outer:
            if axes[a] > 1:
                raise ShapeError(f"axis {a} of degree {axes[a]} has no place in the view")
    return MachineView(start, tuple(strides))


def devices_used(pcg, views) -> int:
    """How many devices a mapped PCG puts pieces on (at least 1; a plan whose branches run on
    device groups of their own may leave devices between them idle)."""
    return len({d for i, n in pcg for d in views[i].devices(n.outputs[0])}) or 1


def check_view(view: MachineView, shape: ParallelTensorShape, num_devices: int) -> str | None:
    """Why a view cannot hold a tensor's pieces on a cluster, or None if it can."""
    devs = view.devices(shape)
    if len(set(devs)) != len(devs):
        return "two pieces map to the same device"
    bad = [d for d in devs if not 0 <= d < num_devices]
    if bad:
        return f"device {bad[0]} is outside the cluster's {num_devices} devices"
    return None
