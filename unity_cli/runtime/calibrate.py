"""How long the executor spends on a compute task besides its kernel, and an optimizer
update besides its arithmetic.

A profile times each operator piece's kernels alone; a training step also pays, per
task, the executor's dispatch: looking up the pieces it reads, saving what backward
needs, accumulating gradients, freeing values. On small models that is most of a CPU
step, so ``unity profile`` measures it and the cost model adds it to every task.

It is measured by difference: the same one-device program with a short and a long chain
of identical cheap tasks (``Neg`` on a tiny tensor); the extra step time per extra task,
less the kernel time of that task, is the dispatch. Everything else in a step (loss,
optimizer, the first MatMul) is common to both programs and cancels.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..ir.ops.elementwise import UnaryAttrs
from ..ir.ops.linear import MatMulAttrs
from ..ir.ops.sources import InputAttrs, WeightAttrs
from ..ir.pcg import PCG, GraphBuilder
from ..ir.shapes import TensorShape
from . import kernels

SHORT, LONG = 8, 72


def chain(tasks: int) -> PCG:
    """x[2, 4] @ w[4, 4] followed by ``tasks`` Negs, all on one device."""
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((2, 4))), (), "x")
    w = b.add1(WeightAttrs(TensorShape((4, 4))), (), "w")
    h = b.add1(MatMulAttrs(), (x, w), "mm")
    for k in range(tasks):
        h = b.add1(UnaryAttrs("Neg"), (h,), f"neg{k}")
    return b.build([h])


def _step_seconds(tasks: int, backend: str, xp: Any, steps: int) -> float:
    from .comm import mpi
    from .executor import build_executor
    from .loss import LossKind
    from .optim import OptimizerConfig
    from .program import single_device_views

    pcg = chain(tasks)
    rng = np.random.default_rng(0)
    _, comm, _, executor = build_executor(pcg, single_device_views(pcg), None, backend, mpi().COMM_SELF, xp,
                                          {"w": rng.standard_normal((4, 4)).astype(np.float32)},
                                          OptimizerConfig.of("sgd", 1e-3), LossKind.MSE, {})
    inputs = {"x": xp.asarray(rng.standard_normal((2, 4)).astype(np.float32))}
    target = xp.asarray(rng.standard_normal((2, 4)).astype(np.float32))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        executor.step(inputs, target)
        comm.sync()
        times.append(time.perf_counter() - t0)
    return min(times[1:])  # the least disturbed step: a shared machine only ever adds time


def _kernel_seconds(xp: Any, repeats: int = 200, rounds: int = 5) -> float:
    """Forward + backward of one Neg on a [2, 4] piece, called directly (the least disturbed
    of ``rounds`` loops)."""
    x = xp.ones((2, 4), dtype=np.float32)
    op = UnaryAttrs("Neg")
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeats):
            (y,), ctx = kernels.forward(op, [x], xp)
            kernels.backward(op, ctx, [y], xp)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


def dispatch_seconds(backend: str = "numpy", xp: Any = np, steps: int = 30) -> float:
    """Seconds per compute task (forward + backward) the executor adds to its kernels."""
    short = _step_seconds(SHORT, backend, xp, steps)
    long = _step_seconds(LONG, backend, xp, steps)
    per_task = (long - short) / (LONG - SHORT)
    return max(0.0, per_task - _kernel_seconds(xp))


def update_seconds(xp: Any = np, repeats: int = 200) -> dict[str, float]:
    """Per optimizer, the fixed seconds of updating one (tiny) weight piece."""
    from .optim import Optimizer, OptimizerConfig

    out = {}
    for name in ("sgd", "momentum", "adam"):
        opt = Optimizer(OptimizerConfig.of(name, 1e-3), xp)
        w, g = xp.ones(4, dtype=np.float32), xp.ones(4, dtype=np.float32)
        opt.begin_step()
        opt.update("w", w, g)  # allocates the state
        t0 = time.perf_counter()
        for _ in range(repeats):
            opt.update("w", w, g)
        out[name] = (time.perf_counter() - t0) / repeats
    return out
