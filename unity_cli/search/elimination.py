"""Exact minimization of a sum of unary and pairwise cost tables, by variable elimination.

The inner solver's objective (``solver.Problem``) is a sum of one table per operator and
one per edge. Eliminating one variable at a time (min over its values of every table that
names it, the result a new table over its neighbours) is the dynamic program over the
graph's structure: on a chain it is Viterbi's, on a series-parallel graph the classic
series and parallel reductions, and on a DNN with residual connections it keeps tables over
two or three operators at a time. Its work is linear in the number of layers, so a model
of 24 identical layers costs 24 times one layer's elimination.

The order is chosen greedily, smallest new table first (ties by variable), so it is the
same on every run. An elimination whose table would exceed ``limit`` entries gives up
(``None``), and the caller takes the integer program instead.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

TABLE_LIMIT = 4_000_000
"""The largest table (entries) one elimination may build: a count, so the same inputs take
the same path on any machine."""


class TooWide(Exception):
    """Some elimination would build a table larger than the limit."""


def minimize(sizes: Mapping[int, int], unary: Mapping[int, Sequence[float]],
             pairs: Sequence[tuple[int, int, np.ndarray]], limit: int = TABLE_LIMIT) -> tuple[float, dict[int, int]]:
    """``(least total, an assignment reaching it)`` of ``sum unary[v][x_v] + sum table[x_u, x_v]``
    over ``x_v in range(sizes[v])``. The total is ``inf`` when every assignment meets an
    infinite entry. Of equal optima the one with the lowest indices in elimination order
    wins, so the answer is deterministic. Raises :class:`TooWide` past ``limit``."""
    factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    touching: dict[int, set[int]] = {v: set() for v in sizes}

    ids = itertools.count()

    def add(scope: tuple[int, ...], table: np.ndarray) -> None:
        f = next(ids)
        factors[f] = (scope, table)
        for v in scope:
            touching[v].add(f)

    for v in sizes:
        add((v,), np.asarray(unary[v], dtype=float))
    for u, v, table in pairs:
        if u == v:
            add((u,), np.diagonal(np.asarray(table, dtype=float)).copy())
        else:
            add((u, v), np.asarray(table, dtype=float))

    def neighbours(v: int) -> set[int]:
        return {u for f in touching[v] for u in factors[f][0]} - {v}

    def width(v: int) -> int:
        return math.prod(sizes[u] for u in neighbours(v))

    heap = [(width(v), v) for v in sorted(sizes)]
    heapq.heapify(heap)
    done: set[int] = set()
    trace: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    constant = 0.0
    while heap:
        w, v = heapq.heappop(heap)
        if v in done:
            continue
        now = width(v)
        if now != w:                      # stale entry: its neighbourhood changed since
            heapq.heappush(heap, (now, v))
            continue
        if now > limit:
            raise TooWide(f"eliminating a variable would build a table of {now} entries")
        rest = tuple(sorted(neighbours(v)))
        scope = rest + (v,)
        total = np.zeros(tuple(sizes[u] for u in scope))
        for f in sorted(touching[v]):
            fscope, table = factors.pop(f)
            for u in fscope:
                if u != v:
                    touching[u].discard(f)
            total = total + _aligned(table, fscope, scope)
        touching[v] = set()
        done.add(v)
        best = total.min(axis=-1)
        trace.append((v, rest, total.argmin(axis=-1)))
        if rest:
            add(rest, best)
            for u in rest:
                heapq.heappush(heap, (width(u), u))
        else:
            constant += float(best)
    for _, table in factors.values():   # only constants can remain
        constant += float(table)
    choice: dict[int, int] = {}
    for v, rest, arg in reversed(trace):
        choice[v] = int(arg[tuple(choice[u] for u in rest)])
    return constant, choice


def _aligned(table: np.ndarray, scope: tuple[int, ...], into: tuple[int, ...]) -> np.ndarray:
    """``table`` (axes in ``scope`` order) as an array broadcastable over ``into``'s axes."""
    t = np.transpose(table, sorted(range(len(scope)), key=lambda k: into.index(scope[k])))
    return t.reshape([table.shape[scope.index(u)] if u in scope else 1 for u in into])
