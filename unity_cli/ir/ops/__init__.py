"""Operator specifications, one module per family; importing this fills the registry."""
from __future__ import annotations

from . import (  # noqa: F401
    array_ops,
    conv,
    einsum,
    elementwise,
    gather_reduce,
    index_ops,
    linear,
    norm,
    parallel,
    shape_ops,
    sources,
)
