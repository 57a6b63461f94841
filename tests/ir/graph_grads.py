"""A PCG run node by node with the runtime's kernels, forward and backward, on one process:
what a test compares two graphs with (a rewrite must keep values and gradients)."""
from __future__ import annotations

import numpy as np

from unity_cli.kernels import backward, forward


def run_graph(pcg, feed: dict[str, np.ndarray], seed: int = 1) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The outputs of a PCG run node by node with the runtime's kernels, and the gradient of
    ``sum(output * r)`` (``r`` random, seeded) with respect to each float source, by name."""
    values, ctxs = {}, {}
    for i, n in pcg:
        if n.spec.is_source:
            values[(i, 0)] = feed[n.name]
            continue
        outs, ctxs[i] = forward(n.op, [values[(r.node, r.index)] for r in n.inputs], np)
        values.update({(i, k): o for k, o in enumerate(outs)})
    outs = [values[(r.node, r.index)] for r in pcg.outputs]
    rng = np.random.default_rng(seed)
    grads = {(r.node, r.index): rng.standard_normal(o.shape).astype(o.dtype) for r, o in zip(pcg.outputs, outs)}
    for i in sorted(ctxs, reverse=True):
        n = pcg.nodes[i]
        gs = backward(n.op, ctxs[i], [grads.get((i, k)) for k in range(len(n.outputs))], np)
        for r, g in zip(n.inputs, gs, strict=True):
            if g is not None:
                key = (r.node, r.index)
                grads[key] = g if key not in grads else grads[key] + g
    return outs, {n.name: grads[(i, 0)] for i, n in pcg if n.spec.is_source and (i, 0) in grads}
