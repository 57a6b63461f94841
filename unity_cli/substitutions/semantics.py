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

from ..ir.ops.parallel import ReductionAttrs, reduces_copies
from ..ir.opspec import spec_of
from ..ir.pcg import PCG
from ..ir.shapes import ParallelTensorShape
from ..kernels import KernelError, forward


def reference(op: Any, args: Sequence[np.ndarray], shapes: Sequence[ParallelTensorShape]) -> list[np.ndarray]:
    """The logical outputs of operator attrs ``op`` on whole arrays whose parallel shapes
    are ``shapes``: a parallel op leaves the value as it is, but a ``Reduction`` that adds
    up replicas scales it by its degree; any other op runs the runtime's own kernel on
    numpy (``unity_cli.kernels``), the one implementation of every operator."""
    if isinstance(op, ReductionAttrs):
        return [args[0] * op.degree if reduces_copies(shapes[0]) else args[0]]
    if spec_of(op).is_parallel_op:
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
        outs = reference(n.op, args, [pcg.shape(r) for r in n.inputs])
        for k, v in enumerate(outs):
            values[(i, k)] = v
    return [values[(r.node, r.index)] for r in pcg.outputs]
