"""The operators, one module per family: each operator's spec, its kernels, and what the z3
verifier knows of it (its terms, symbols and axioms); importing this fills the registry."""
from __future__ import annotations

from . import (  # noqa: F401
    array_ops,
    attention,
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
