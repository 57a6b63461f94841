"""The logical device mesh the inner solver parallelizes over.

The solver lays the devices out as a 2-D mesh ``M0 x M1`` (as Alpa does): an operator's
option splits its dims over either axis or both, so tensor parallelism over one axis and
data parallelism over the other, of any factorization of the device count (6 = 2 x 3,
48 = 6 x 8), are all points of its space. A ``Mesh`` is a named pair, so it unpacks and
compares as the ``(M0, M1)`` tuple it replaces.
"""
from __future__ import annotations

import math
from typing import NamedTuple


class Mesh(NamedTuple):
    """``outer x inner`` devices: ``inner`` consecutive devices per row."""

    outer: int
    inner: int

    @property
    def devices(self) -> int:
        return self.outer * self.inner

    def sub(self, count: int) -> Mesh:
        """The mesh of a group of ``count`` devices in a run on this mesh: its first axis as
        much of this one's first axis as divides ``count``, so tensor parallelism stays inside it."""
        g = math.gcd(self.outer, count)
        return Mesh(g, count // g)


def factorizations(n: int) -> list[Mesh]:
    """Mesh shapes ``M0 x M1 = n`` with ``M0 <= M1``."""
    return [Mesh(a, n // a) for a in range(1, math.isqrt(n) + 1) if n % a == 0]
