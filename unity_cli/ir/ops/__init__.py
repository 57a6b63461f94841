"""Operator specifications, one module per family; importing this fills the registry."""
from __future__ import annotations

from . import conv, elementwise, gather_reduce, linear, norm, parallel, shape_ops, sources  # noqa: F401
