"""Reference semantics of small graphs: evaluate a PCG on concrete arrays.

``evaluate`` computes logical values: parallel ops leave values unchanged, except a
``Reduction`` that adds up replicas, which scales by its degree. Every operator runs the
runtime's own kernel on numpy (``unity_cli.kernels``), exact on integer inputs, so
fingerprints of equal graphs agree bit for bit, and what the verifier checks numerically
is what ``unity run`` computes.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.ops.parallel import reduces_copies
from ..ir.opspec import spec_of
from ..ir.pcg import PCG
from ..kernels import KernelError, forward

PASS_THROUGH = frozenset({"Repartition", "Combine", "Replicate"})
"""Parallel ops that leave a tensor's logical value as it is."""


def reference(op: Any, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The logical outputs of operator attrs ``op`` on whole arrays: the runtime's own
    kernel on numpy (``unity_cli.kernels``), the one implementation of every operator."""
    kind = spec_of(op).kind
    if kind in PASS_THROUGH:
        return [args[0]]
    try:
        return forward(op, args, np)[0]
    except KernelError as e:
        raise NotImplementedError(str(e)) from None


def evaluate(pcg: PCG, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The logical values of the graph's outputs, its sources fed from ``inputs`` by name."""
    values: dict[tuple[int, int], np.ndarray] = {}
    for i, n in pcg:
        if n.spec.is_source:
            values[(i, 0)] = np.asarray(inputs[n.name])
            continue
        args = [values[(r.node, r.index)] for r in n.inputs]
        if n.kind == "Reduction":
            x = pcg.shape(n.inputs[0])
            outs = [args[0] * n.op.degree if reduces_copies(x) else args[0]]
        else:
            outs = reference(n.op, args)
        for k, v in enumerate(outs):
            values[(i, k)] = v
    return [values[(r.node, r.index)] for r in pcg.outputs]
