"""The search's independent pricings, run on the machine's cores.

A few parts of the search are many pricings that share nothing but what was computed before
them: the solver's meshes and its groupings of branches onto device groups (``solver.solve``,
``solver.regroup``), the uniform configurations priced on a shortened graph
(``uniform.best_uniform``), and the rows of a search on one lengthened and priced whole
(``folded.folded_search``). :func:`fork_map` runs such a list in forked
worker processes, which see everything the parent had computed, and returns the results in
the list's order; the parent then takes what it needs back (``solver.Tables.merge``). The
answer is the serial one whatever the number of workers, and the order they finish in:
each item is computed by the same code from the same state, and the results are combined
in the list's order. Only time depends on the cores.

Where the work is small (fork and pickling cost milliseconds), on one core, inside a worker
(workers do not fork again), or where the platform cannot fork, the list runs in this
process."""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

PARALLEL_DEVICES = 256
"""From this many devices the search's lists run side by side: each item prices moves of as
many pieces as devices (a decoder's mesh at 512 devices is some thousand reshardings, about
5 s). Below it they run in one process: at 192 devices ``benchmarks/paper.py``'s small graphs
searched slower side by side (their meshes cost less than the forks and the tables sent back)."""

WORKERS_ENV = "UNITY_WORKERS"
"""Set to a count to cap the worker processes (1: run everything in the calling process)."""

_task: Callable[[int], Any] | None = None     # the running fork_map's item function, inherited by fork
_in_worker = False


def workers() -> int:
    """How many processes a :func:`fork_map` may use: this process's cores (its CPU
    affinity), capped by ``UNITY_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        cores = os.cpu_count() or 1
    cap = os.environ.get(WORKERS_ENV, "").strip()
    if cap:
        try:
            cores = min(cores, max(1, int(cap)))
        except ValueError:
            pass
    return max(1, cores)


def large(devices: int) -> bool:
    """Whether a list of pricings on ``devices`` devices is worth spreading (:data:`PARALLEL_DEVICES`)."""
    return devices >= PARALLEL_DEVICES


def in_worker() -> bool:
    """Whether this process is one of :func:`fork_map`'s workers."""
    return _in_worker


def _mark_worker() -> None:
    global _in_worker
    _in_worker = True


def _run(i: int) -> Any:
    assert _task is not None
    return _task(i)


def fork_map(fn: Callable[[T], R], items: Sequence[T], worth: bool = True) -> list[R]:
    """``[fn(x) for x in items]``, the items spread over forked workers where ``worth`` (the
    caller's judgement that the items are large) and there is more than one core and item."""
    global _task
    n = min(len(items), workers())
    if not worth or n <= 1 or _in_worker or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(x) for x in items]
    _task = lambda i: fn(items[i])      # noqa: E731 (a closure the forked workers inherit)
    try:
        with multiprocessing.get_context("fork").Pool(n, initializer=_mark_worker) as pool:
            return pool.map(_run, range(len(items)), chunksize=1)
    finally:
        _task = None
