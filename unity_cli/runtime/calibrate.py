"""How long the executor spends on a task besides its kernel, on an optimizer
update besides its arithmetic, and on a step's loss.

A profile times each operator piece's kernels alone; a training step also pays, per
task, the executor's dispatch: looking up the pieces it reads, saving what backward
needs, accumulating gradients, freeing values. On small models that is most of a CPU
step, so ``unity profile`` measures it and the cost model adds it to every task.

It is measured by difference: the same one-device program with a short and a long chain
of identical cheap tasks (``Neg`` on a tiny tensor); the extra step time per extra task,
less the kernel time of that task, is the dispatch. Everything else in a step (loss,
optimizer, the first MatMul) is common to both programs and cancels.

The update overhead is timed directly: the ``optimizer`` phase of a step (``phases.py``)
of a program with many tiny weights, per weight; their bytes are too few for the
bandwidth term the cost model adds to matter. The same steps' ``loss`` phase is the fixed
cost of a step's loss.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import kernels
from ..ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from ..ir.ops.linear import MatMulAttrs
from ..ir.ops.sources import InputAttrs, WeightAttrs
from ..ir.pcg import PCG, GraphBuilder
from ..ir.shapes import TensorShape
from .comm import mpi
from .executor import build_executor
from .loss import LossKind
from .optim import OptimizerConfig
from .phases import StepClock
from .program import single_device_views

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


def _timed_steps(pcg: PCG, initial: dict[str, np.ndarray], optimizer: str, backend: str, xp: Any,
                 steps: int) -> list[tuple[float, dict[str, float]]]:
    """Train ``pcg`` (input ``x`` and output [2, 4], on one device) for ``steps`` steps after a
    warm-up one: each step's seconds and its phases (``phases.py``)."""

    rng = np.random.default_rng(0)
    _, comm, _, executor = build_executor(pcg, single_device_views(pcg), None, backend, mpi().COMM_SELF, xp,
                                          initial, OptimizerConfig.of(optimizer, 1e-3), LossKind.MSE, {})
    inputs = {"x": xp.asarray(rng.standard_normal((2, 4)).astype(np.float32))}
    target = xp.asarray(rng.standard_normal((2, 4)).astype(np.float32))
    clock = executor.clock = StepClock(comm)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        executor.step(inputs, target)
        comm.sync()
        times.append(time.perf_counter() - t0)
        clock.stop(times[-1])
    return list(zip(times, clock.steps, strict=True))[1:]


def _step_seconds(tasks: int, backend: str, xp: Any, steps: int) -> float:
    w = {"w": np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)}
    # the least disturbed step: a shared machine only ever adds time
    return min(t for t, _ in _timed_steps(chain(tasks), w, "sgd", backend, xp, steps))


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


def update_and_loss_seconds(backend: str = "numpy", xp: Any = np, steps: int = 20
                            ) -> tuple[dict[str, float], float]:
    """Train :func:`weights_sum` with each optimizer. Per optimizer, the fixed seconds a step
    spends on one (tiny) weight piece after backward: assembling its gradient, the
    optimizer's arithmetic, re-cutting the piece (the step's ``optimizer`` phase,
    ``phases.py``, divided by the weights); and the fixed seconds of the step's loss (its
    ``loss`` phase: gathering the output, the loss and its gradient). Each from the least
    disturbed step."""
    rng = np.random.default_rng(0)
    initial = {f"w{k}": rng.standard_normal((2, 4)).astype(np.float32) for k in range(WEIGHTS)}
    out, loss = {}, []
    for name in ("sgd", "momentum", "adam"):
        phases = [ph for _, ph in _timed_steps(weights_sum(WEIGHTS), initial, name, backend, xp, steps)]
        out[name] = min(ph["optimizer"] for ph in phases) / WEIGHTS
        loss.append(min(ph["loss"] for ph in phases))
    return out, min(loss)


WEIGHTS = 64


def weights_sum(weights: int) -> PCG:
    """x[2, 4] + w0 + w1 + ... (``weights`` trainable [2, 4] weights), all on one device."""
    b = GraphBuilder()
    h = b.add1(InputAttrs(TensorShape((2, 4))), (), "x")
    for k in range(weights):
        w = b.add1(WeightAttrs(TensorShape((2, 4))), (), f"w{k}")
        h = b.add1(BinaryAttrs("Add"), (h, w), f"add{k}")
    return b.build([h])
