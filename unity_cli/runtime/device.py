"""Which array module a rank computes with: numpy, or cupy on one of this node's GPUs."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import UsageError

BACKENDS = ("auto", "numpy", "cupy")


def array_module(name: str = "auto", rank: int = 0) -> tuple[str, Any]:
    """``(name, xp)`` for ``--backend name``: ``auto`` is cupy when it imports and sees a GPU
    (then rank ``r`` uses GPU ``r`` modulo the GPUs), else numpy."""
    if name not in BACKENDS:
        raise UsageError(f"--backend {name!r}: expected {', '.join(BACKENDS)}")
    if name == "numpy":
        return "numpy", np
    try:
        import cupy  # noqa: PLC0415  (optional: the [gpu] extra)

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001  (no cupy, no driver, no device: no GPU)
        count = 0
    if not count:
        if name == "cupy":
            raise UsageError("--backend cupy: cupy is not installed or sees no GPU (pip install -e '.[gpu]')")
        return "numpy", np
    cupy.cuda.Device(rank % count).use()
    return "cupy", cupy
