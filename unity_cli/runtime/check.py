"""``--check``: the original graph trained on one process, step for step, as the oracle.

Rank 0 runs the imported (unrewritten, unpartitioned) PCG through the same executor on
one device with the same data, weights, loss and optimizer, and compares each step's
loss and every updated weight (matched by Weight node name: rewrites keep source names).
The error of a tensor is ``max|a - b| / max(max|b|, tiny)``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.pcg import PCG
from .comm import mpi
from .executor import build_executor
from .loss import LossKind
from .optim import OptimizerConfig
from .program import single_device_views

RTOL = 1e-4
TINY = 1e-30


class Reference:
    """The original graph on this process alone."""

    def __init__(self, pcg: PCG, backend: str, xp: Any, weights: Mapping[str, np.ndarray],
                 constants: Mapping[str, np.ndarray], loss: LossKind, optimizer: OptimizerConfig):
        class_axis = pcg.shape(pcg.outputs[0]).rank - 1 if loss is LossKind.CROSS_ENTROPY else None
        _, _, self.params, self.executor = build_executor(pcg, single_device_views(pcg), class_axis, backend,
                                                          mpi().COMM_SELF, xp, weights, optimizer, loss, constants)

    def step(self, inputs: Mapping[str, Any], target: Any) -> float:
        return self.executor.step(inputs, target)

    def weights(self) -> dict[str, np.ndarray]:
        return self.params.gather(0)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), TINY))


@dataclass
class CheckResult:
    """The largest error seen, and the first tensor beyond tolerance (None: all within)."""

    max_rel_err: float = 0.0
    failure: str | None = None
    compared: int = 0
    missing: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.failure is None and self.compared > 0

    def add(self, step: int, what: str, err: float) -> None:
        self.compared += 1
        if not err <= self.max_rel_err:
            self.max_rel_err = err
        if self.failure is None and not err <= RTOL:
            self.failure = f"step {step}: {what} differs from the one-process run (relative error {err:.2e} > {RTOL:g})"

    def compare(self, step: int, loss: float, ref_loss: float, weights: Mapping[str, np.ndarray],
                ref_weights: Mapping[str, np.ndarray]) -> None:
        self.add(step, "the loss", rel_err(np.array(loss), np.array(ref_loss)))
        for name in sorted(ref_weights):
            if name not in weights:
                if name not in self.missing:
                    self.missing.append(name)
                continue
            self.add(step, f"weight {name!r}", rel_err(weights[name], ref_weights[name]))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"passed": self.passed, "max_rel_err": self.max_rel_err, "rtol": RTOL}
        if self.failure:
            out["failure"] = self.failure
        if self.missing:
            out["unmatched_weights"] = list(self.missing)
        return out
