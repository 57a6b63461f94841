"""The collectives the runtime calls, and how many bytes each member sends in one.

:func:`sent_bytes` is the one convention for the bytes of tensor data a rank sends in one
call: the plan's prediction (``cost/moves.py``) and ``unity run``'s count (at its
communicator, ``runtime/phases.py``) both use it, so the two can be compared exactly.
It lives here, below both, because both must read the same one.
"""
from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from fractions import Fraction


class Collective(Enum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all-to-all"
    P2P = "point-to-point"


def sent_bytes(kind: Collective, nbytes: int, group: Sequence[int], rank: int, root: int = -1) -> Fraction:
    """Bytes of tensor data ``rank`` sends in one call of ``kind`` over ``group`` (the
    members in increasing order; for point-to-point ``(sender, receiver)``), where
    ``nbytes`` is the buffer the call passes:

    * point-to-point: the sender sends the message, ``nbytes``;
    * all-reduce (ring: a reduce-scatter, then an all-gather, of ``g`` chunks):
      ``2 (g - 1) / g * nbytes`` per member;
    * all-gather (``nbytes``: one member's piece) and reduce-scatter (``nbytes``: one
      member's result; a ring passes each of the other chunks on once): ``(g - 1) * nbytes``;
    * broadcast (a binomial tree from the root, MPI's classic algorithm): ``nbytes`` to each
      of the member's children, so the root sends ``ceil(log2 g)`` copies and a leaf none;
    * reduce (the same tree towards the root): ``nbytes`` from every member but the root;
    * all-to-all: ``(g - 1) / g * nbytes`` per member.

    Exact (a fraction), so sums over calls do not depend on their order or grouping.
    """
    num, den = sent_ratio(kind, nbytes, group, rank, root)
    return Fraction(num, den)


def sent_ratio(kind: Collective, nbytes: int, group: Sequence[int], rank: int, root: int = -1) -> tuple[int, int]:
    """:func:`sent_bytes` as ``(numerator, denominator)`` integers (to add up fast)."""
    g = len(group)
    if g <= 1 or nbytes <= 0 or rank not in group:
        return 0, 1
    match kind:
        case Collective.P2P:
            return (nbytes if rank == group[0] else 0), 1
        case Collective.ALL_REDUCE:
            return 2 * (g - 1) * nbytes, g
        case Collective.ALL_GATHER | Collective.REDUCE_SCATTER:
            return (g - 1) * nbytes, 1
        case Collective.ALL_TO_ALL:
            return (g - 1) * nbytes, g
        case Collective.BROADCAST | Collective.REDUCE:
            rel = (group.index(rank) - group.index(root)) % g
            if kind is Collective.REDUCE:
                return (nbytes if rel else 0), 1
            return nbytes * _tree_children(rel, g), 1
    raise AssertionError(kind)


def _tree_children(rel: int, g: int) -> int:
    """How many members relative rank ``rel`` sends to in a binomial-tree broadcast of ``g``
    (MPICH's: ``rel`` sends to ``rel + mask`` for each power of two ``mask`` below its lowest
    set bit; the root, below the first power of two >= ``g``)."""
    top = rel & -rel if rel else 1 << (g - 1).bit_length()
    mask, n = top >> 1, 0
    while mask:
        n += rel + mask < g
        mask >>= 1
    return n
