"""``--check``: the original graph on one process, step for step, as the oracle.

What parallelization can get wrong is compared, each step from identical weights, so an
error never compounds and the optimizer's own sensitivity (Adam's first steps move a
weight by about ``lr * sign(g)`` however small ``g`` is) never cries wolf:

* the loss, and every weight's synced gradient before the optimizer: rank 0 loads the
  job's weights into the unpartitioned graph, runs forward and backward on the same batch,
  and compares. The error of a gradient is ``max|a - b|`` over the larger of its own
  largest element and ``FLOOR`` times the model's largest gradient: float32 sums in
  another order (another split of the batch or of a contraction) stay far inside
  ``GRAD_RTOL`` (the yardstick: one process with the batch rows permuted), and a 1 %
  error in one rank's share does not;
* the update on its own: the weights after the step against the optimizer applied, on one
  process, to the weights before it and the job's own gradients (its state fed those
  gradients every step, so it mirrors the job's), within ``UPDATE_TOL`` in units of ``lr``
  beyond float32 rounding of the weight.

A difference names the step, the tensor, the element and the rank that holds it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.pcg import PCG
from .comm import mpi
from .executor import build_executor
from .loss import LossKind
from .optim import Optimizer, OptimizerConfig
from .program import single_device_views
from .weights import to_host

LOSS_RTOL = 1e-4
GRAD_RTOL = 1e-4
FLOOR = 1e-3
UPDATE_TOL = 1e-3
EPS32 = float(np.finfo(np.float32).eps)
TINY = 1e-30


class Reference:
    """The original graph on this process alone, loaded with the job's weights each step."""

    def __init__(self, pcg: PCG, backend: str, xp: Any, weights: Mapping[str, np.ndarray],
                 constants: Mapping[str, np.ndarray], loss: LossKind, optimizer: OptimizerConfig):
        class_axis = pcg.shape(pcg.outputs[0]).rank - 1 if loss is LossKind.CROSS_ENTROPY else None
        _, _, self.params, self.executor = build_executor(pcg, single_device_views(pcg), class_axis, backend,
                                                          mpi().COMM_SELF, xp, weights, optimizer, loss, constants)
        self.xp = xp
        self.optimizer = Optimizer(optimizer, xp)   # fed the job's gradients: its state mirrors the job's

    def gradients(self, weights: Mapping[str, np.ndarray], inputs: Mapping[str, Any], target: Any
                  ) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and every weight's gradient of the batch, from ``weights``."""
        self.params.load(weights)
        self.executor.reload()
        loss = self.executor.step(inputs, target, apply=False)
        return loss, {k: to_host(v) for k, v in self.params.sync(self.executor.pending).items()}

    def updated(self, weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The optimizer's step from ``weights`` with ``grads`` (the job's)."""
        self.optimizer.begin_step()
        out = {}
        for name in sorted(grads):
            if name in weights:
                w = self.xp.array(weights[name], copy=True)
                self.optimizer.update(name, w, self.xp.asarray(grads[name]))
                out[name] = to_host(w)
        return out


def rel_err(a: np.ndarray, b: np.ndarray, scale: float | None = None) -> tuple[float, tuple[int, ...]]:
    """``max|a - b|`` over ``scale`` (default: ``max|b|``), and where it is largest."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf"), ()
    if a.size == 0:
        return 0.0, ()
    diff = np.abs(a - b)
    where = np.unravel_index(int(np.argmax(diff)), diff.shape)
    s = float(np.abs(b).max()) if scale is None else scale
    return float(diff[where] / max(s, TINY)), tuple(int(i) for i in where)


@dataclass
class CheckResult:
    """The largest errors seen, and the first difference beyond tolerance (None: none)."""

    max_rel_err: float = 0.0            # of the loss and the gradients
    max_update_err: float = 0.0         # of the update, in units of its tolerance (<= 1 passes)
    failure: str | None = None
    compared: int = 0
    missing: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.failure is None and self.compared > 0

    def _fail(self, text: str) -> None:
        if self.failure is None:
            self.failure = text

    def compare(self, step: int, loss: float, ref_loss: float, grads: Mapping[str, np.ndarray],
                ref_grads: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                expected: Mapping[str, np.ndarray], lr: float,
                holder: Callable[[str, tuple[int, ...]], int | None] = lambda name, at: None) -> None:
        """One step: the loss and each gradient against the one-process run's from the same
        weights, and the weights after the step against the optimizer's step."""
        err, _ = rel_err(np.array(loss), np.array(ref_loss))
        self._note(err)
        if not err <= LOSS_RTOL:
            self._fail(f"step {step}: the loss differs from the one-process run "
                       f"(relative error {err:.2e} > {LOSS_RTOL:g})")
        largest = max((float(np.abs(g).max()) for g in ref_grads.values() if g.size), default=0.0)
        for name in sorted(ref_grads):
            if name not in grads:
                if name not in self.missing:
                    self.missing.append(name)
                continue
            ref = ref_grads[name]
            scale = max(float(np.abs(ref).max()) if ref.size else 0.0, FLOOR * largest)
            err, at = rel_err(grads[name], ref, scale)
            self._note(err)
            if not err <= GRAD_RTOL:
                self._fail(f"step {step}: the gradient of weight {name!r} differs from the one-process run at "
                           f"{list(at)}{_held(holder(name, at))} (relative error {err:.2e} > {GRAD_RTOL:g})")
        for name in sorted(expected):
            if name not in after:
                continue
            a = np.asarray(after[name], dtype=np.float64)
            e = np.asarray(expected[name], dtype=np.float64)
            if a.shape != e.shape:
                self._fail(f"step {step}: weight {name!r} has shape {a.shape}, the one-process run {e.shape}")
                continue
            if not a.size:
                continue
            bound = UPDATE_TOL * lr + 4 * EPS32 * np.abs(e) + TINY
            ratio = np.abs(a - e) / bound
            at = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            worst = float(ratio[at])
            self.compared += 1
            self.max_update_err = max(self.max_update_err, worst)
            if not worst <= 1.0:
                where = tuple(int(i) for i in at)
                self._fail(f"step {step}: weight {name!r} after the update differs from the optimizer's step at "
                           f"{list(where)}{_held(holder(name, where))} (by {abs(a[at] - e[at]):.2e}, more than "
                           f"{UPDATE_TOL:g} lr)")

    def _note(self, err: float) -> None:
        self.compared += 1
        if not err <= self.max_rel_err:
            self.max_rel_err = err

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"passed": self.passed, "max_rel_err": self.max_rel_err, "rtol": GRAD_RTOL,
                               "max_update_err": self.max_update_err, "update_tol_lr": UPDATE_TOL}
        if self.failure:
            out["failure"] = self.failure
        if self.missing:
            out["unmatched_weights"] = list(self.missing)
        return out


def _held(rank: int | None) -> str:
    return "" if rank is None else f", held by rank {rank}"
