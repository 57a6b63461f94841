"""Reference semantics of small graphs: evaluate a PCG on concrete arrays.

``evaluate`` computes logical values: parallel ops leave values unchanged, except a
``Reduction`` that adds up replicas, which scales by its degree. Kernels are plain numpy
and exact on integer inputs, so fingerprints of equal graphs agree bit for bit.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.ops.binary import BINARY
from ..ir.ops.parallel import reduces_copies
from ..ir.ops.unary import UNARY
from ..ir.pcg import PCG

Kernel = Callable[[Any, Sequence[np.ndarray]], list[np.ndarray]]

def _unary(a, x):
    return [UNARY[a.fn].forward(x[0], np)]


def _binary(a, x):
    f = BINARY[a.fn].forward
    return [functools.reduce(lambda y, b: f(y, b, np), x[1:], x[0])]


KERNELS: dict[str, Kernel] = {
    "MatMul": lambda a, x: [np.matmul(x[0], x[1])],
    "Gemm": lambda a, x: [a.alpha * ((x[0].T if a.trans_a else x[0]) @ (x[1].T if a.trans_b else x[1]))
                          + (a.beta * x[2] if len(x) > 2 else 0)],
    "Unary": _unary,
    "Binary": _binary,
    "Scale": lambda a, x: [a.factor * x[0]],
    "Transpose": lambda a, x: [np.transpose(x[0], a.perm)],
    "Concat": lambda a, x: [np.concatenate(x, axis=a.axis)],
    "Split": lambda a, x: np.split(x[0], np.cumsum(a.sizes)[:-1], axis=a.axis),
    "Reshape": lambda a, x: [x[0].reshape(a.dims)],
    "Repartition": lambda a, x: [x[0]],
    "Combine": lambda a, x: [x[0]],
    "Replicate": lambda a, x: [x[0]],
}


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
            try:
                kernel = KERNELS[n.kind]
            except KeyError:
                raise NotImplementedError(f"no reference kernel for {n.kind}") from None
            outs = kernel(n.op, args)
        for k, v in enumerate(outs):
            values[(i, k)] = v
    return [values[(r.node, r.index)] for r in pcg.outputs]
