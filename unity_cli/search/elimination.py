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
(:class:`TooWide`), and the caller takes the integer program instead. The order and every
step's axes depend only on which tables there are, not on their values, so an
:class:`Elimination` is planned once and run for many cost tables of one shape (the
solver's Lagrangian search changes only the per-variable costs).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    return Elimination(sizes, [(u, v) for u, v, _ in pairs], limit).run(unary, [t for _, _, t in pairs])


@dataclass(frozen=True, slots=True)
class _Step:
    var: int
    rest: tuple[int, ...]                               # the new table's variables
    reads: tuple[tuple[int, tuple[int, ...] | None, tuple[int, ...]], ...]   # (table, axes order, shape)
    writes: int | None                                  # the new table's id (None: a constant)


class Elimination:
    """The elimination order of one set of variables and pairwise tables, planned once."""

    def __init__(self, sizes: Mapping[int, int], pairs: Sequence[tuple[int, int]], limit: int = TABLE_LIMIT):
        self.sizes = dict(sizes)
        self.pairs = tuple(pairs)
        self.variables = tuple(sorted(sizes))
        scopes: dict[int, tuple[int, ...]] = {}
        touching: dict[int, set[int]] = {v: set() for v in sizes}
        ids = itertools.count()

        def add(scope: tuple[int, ...]) -> int:
            f = next(ids)
            scopes[f] = scope
            for v in scope:
                touching[v].add(f)
            return f

        for v in self.variables:
            add((v,))
        for u, v in self.pairs:
            add((u,) if u == v else (u, v))

        def neighbours(v: int) -> set[int]:
            return {u for f in touching[v] for u in scopes[f]} - {v}

        def width(v: int) -> int:
            return math.prod(sizes[u] for u in neighbours(v))

        heap = [(width(v), v) for v in self.variables]
        heapq.heapify(heap)
        done: set[int] = set()
        steps: list[_Step] = []
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
            reads = []
            for f in sorted(touching[v]):
                fscope = scopes.pop(f)
                for u in fscope:
                    if u != v:
                        touching[u].discard(f)
                order = tuple(sorted(range(len(fscope)), key=lambda k: scope.index(fscope[k])))
                order = None if order == tuple(range(len(fscope))) else order
                shape = tuple(sizes[u] if u in fscope else 1 for u in scope)
                reads.append((f, order, shape))
            touching[v] = set()
            done.add(v)
            steps.append(_Step(v, rest, tuple(reads), add(rest) if rest else None))
            for u in rest:
                heapq.heappush(heap, (width(u), u))
        self.steps = tuple(steps)

    def run(self, unary: Mapping[int, Sequence[float]], tables: Sequence[np.ndarray]) -> tuple[float, dict[int, int]]:
        """:func:`minimize` of these per-variable costs and pairwise tables (in ``pairs`` order)."""
        data: dict[int, np.ndarray] = {}
        for f, v in enumerate(self.variables):
            data[f] = np.asarray(unary[v], dtype=float)
        for f, ((u, v), t) in enumerate(zip(self.pairs, tables, strict=True), start=len(self.variables)):
            t = np.asarray(t, dtype=float)
            data[f] = np.diagonal(t).copy() if u == v else t
        constant = 0.0
        args: list[np.ndarray] = []
        for step in self.steps:
            total = None
            for f, order, shape in step.reads:
                part = data.pop(f)
                part = (part if order is None else part.transpose(order)).reshape(shape)
                total = part if total is None else total + part
            best = total.min(axis=-1)
            args.append(total.argmin(axis=-1))
            if step.writes is None:
                constant += float(best)
            else:
                data[step.writes] = best
        choice: dict[int, int] = {}
        for step, arg in zip(reversed(self.steps), reversed(args), strict=True):
            choice[step.var] = int(arg[tuple(choice[u] for u in step.rest)])
        return constant, choice
