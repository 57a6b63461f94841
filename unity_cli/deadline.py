"""A time ceiling the long loops honour (``optimize --budget``).

``optimize`` sets the ceiling with :func:`ceiling` around the work it may cut (the mapping
DP, the baselines beyond the first, the inner solver, the searches) and the loops that
grow with the graph (pricing a step, building a baseline, building the solver's tables)
call :func:`check`, which raises :class:`OutOfTime` once it has passed. Without a ceiling
(the default, and whenever ``--max-candidates`` is given) ``check`` does nothing, so the
plan never depends on the machine's speed.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_AT: ContextVar[float | None] = ContextVar("unity_deadline", default=None)


class OutOfTime(Exception):
    """The ceiling passed: whoever set it keeps what it had. Never reaches the user."""


@contextmanager
def ceiling(at: float | None) -> Iterator[None]:
    """Inside, :func:`check` raises once ``time.monotonic()`` reaches ``at`` (None: never,
    which also lifts an outer ceiling: for work that must finish)."""
    token = _AT.set(at)
    try:
        yield
    finally:
        _AT.reset(token)


def check() -> None:
    """Raise :class:`OutOfTime` when the ceiling has passed."""
    at = _AT.get()
    if at is not None and time.monotonic() >= at:
        raise OutOfTime


def left() -> float | None:
    """Seconds until the ceiling (None: none set)."""
    at = _AT.get()
    return None if at is None else at - time.monotonic()
