"""Logical and parallel tensor shapes.

A parallel tensor is stored as ``prod(degrees) * sum_degree * copy_degree`` pieces, one
per device: each dim is cut into ``degree`` equal shards, ``sum_degree`` pieces hold
partial values that add up to the tensor, and ``copy_degree`` pieces are identical
replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .dtypes import DType


@dataclass(frozen=True, slots=True)
class TensorShape:
    """The logical (unpartitioned) shape of a tensor."""

    dims: tuple[int, ...]
    dtype: DType = DType.FLOAT32

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.dims))}]"


@dataclass(frozen=True, slots=True)
class ParallelDim:
    """One logical dim: its size and how many shards it is cut into."""

    size: int
    degree: int = 1


@dataclass(frozen=True, slots=True)
class ParallelTensorShape:
    """A logical shape plus how it is spread over devices (see the module docstring)."""

    dims: tuple[ParallelDim, ...]
    dtype: DType = DType.FLOAT32
    sum_degree: int = 1
    copy_degree: int = 1
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        # Cached: shapes key the cost model's caches, and hashing one walks its dims' and
        # dtype's Python-level hashes (a third of the calls to hash() in a search).
        h = self._hash
        if h is None:
            h = hash((self.dims, self.dtype, self.sum_degree, self.copy_degree))
            object.__setattr__(self, "_hash", h)
        return h

    @staticmethod
    def unpartitioned(shape: TensorShape) -> ParallelTensorShape:
        return ParallelTensorShape(tuple(ParallelDim(d) for d in shape.dims), shape.dtype)

    @staticmethod
    def of(sizes: tuple[int, ...], degrees: tuple[int, ...], dtype: DType = DType.FLOAT32,
           sum_degree: int = 1, copy_degree: int = 1) -> ParallelTensorShape:
        return ParallelTensorShape(tuple(ParallelDim(s, d) for s, d in zip(sizes, degrees, strict=True)),
                                   dtype, sum_degree, copy_degree)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.dims)

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(d.degree for d in self.dims)

    @property
    def logical(self) -> TensorShape:
        return TensorShape(self.sizes, self.dtype)

    @property
    def shard_degree(self) -> int:
        return math.prod(self.degrees)

    @property
    def pieces(self) -> int:
        return self.shard_degree * self.sum_degree * self.copy_degree

    @property
    def piece(self) -> TensorShape:
        """The logical shape of one piece (each dim divided by its degree)."""
        return TensorShape(tuple(d.size // d.degree for d in self.dims), self.dtype)

    @property
    def is_partitioned(self) -> bool:
        return self.pieces > 1

    def problems(self) -> list[str]:
        """Reasons this shape is not well formed (empty when it is)."""
        out = []
        for i, d in enumerate(self.dims):
            if d.degree < 1:
                out.append(f"dim {i} has degree {d.degree} < 1")
            elif d.size % d.degree:
                out.append(f"dim {i} of size {d.size} is not divisible by its degree {d.degree}")
        if self.sum_degree < 1 or self.copy_degree < 1:
            out.append(f"replica degrees must be >= 1 (sum={self.sum_degree}, copy={self.copy_degree})")
        return out

    def with_dim(self, i: int, degree: int) -> ParallelTensorShape:
        dims = list(self.dims)
        dims[i] = ParallelDim(dims[i].size, degree)
        return ParallelTensorShape(tuple(dims), self.dtype, self.sum_degree, self.copy_degree)

    def with_replicas(self, sum_degree: int | None = None, copy_degree: int | None = None) -> ParallelTensorShape:
        return ParallelTensorShape(self.dims, self.dtype,
                                   self.sum_degree if sum_degree is None else sum_degree,
                                   self.copy_degree if copy_degree is None else copy_degree)

    def __str__(self) -> str:
        dims = ",".join(f"{d.size}" if d.degree == 1 else f"{d.size}/{d.degree}" for d in self.dims)
        extra = "".join(f" {k}={v}" for k, v in (("sum", self.sum_degree), ("copy", self.copy_degree)) if v > 1)
        return f"{self.dtype.value}[{dims}]{extra}"
