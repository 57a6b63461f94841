"""Optimizers: the same elementwise update on a whole weight or on any slice of it.

Because every update is elementwise, a device that keeps a shard of a weight and one
that keeps all of it compute the same numbers for the same elements, and replicas that
start equal and get equal (all-reduced) gradients stay equal.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import UsageError
from ..ir.training import CPU_CHUNK, GPU_CHUNK, OPTIMIZER_STATES


class OptimizerKind(Enum):
    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"


DEFAULT_LR = {OptimizerKind.SGD: 0.01, OptimizerKind.MOMENTUM: 0.01, OptimizerKind.ADAM: 1e-3}


@dataclass(frozen=True, slots=True)
class OptimizerConfig:
    """``momentum`` for MOMENTUM; ``betas`` and ``eps`` for ADAM (PyTorch's defaults)."""

    kind: OptimizerKind
    lr: float
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    @staticmethod
    def of(name: str, lr: float | None) -> OptimizerConfig:
        try:
            kind = OptimizerKind(name)
        except ValueError:
            raise UsageError(f"--optimizer {name!r}: expected sgd, momentum or adam") from None
        if lr is not None and not lr >= 0:
            raise UsageError(f"--lr must be >= 0, got {lr}")
        return OptimizerConfig(kind, DEFAULT_LR[kind] if lr is None else lr)


CHUNK = CPU_CHUNK
"""Elements a numpy update works through at a time (``ir/training.CPU_CHUNK``)."""


class Optimizer:
    """Updates weights in place, keeping per-weight state under the caller's key. Every
    step works in place through one scratch buffer shared by all weights, so a step
    allocates nothing. A large weight is updated a chunk at a time (:data:`CHUNK` on CPUs,
    :data:`GPU_CHUNK`), so the scratch is at most a chunk; the update is elementwise, so the
    numbers are the same."""

    def __init__(self, config: OptimizerConfig, xp: Any):
        self.config = config
        self.xp = xp
        self.state: dict[str, list[Any]] = {}
        self.t = 0
        self._scratch: dict[Any, Any] = {}    # by dtype: a flat buffer

    def begin_step(self) -> None:
        self.t += 1

    @property
    def chunk(self) -> int:
        """Elements one pass of an update works on (:data:`CHUNK` on CPUs, :data:`GPU_CHUNK`)."""
        return CHUNK if self.xp.__name__ == "numpy" else GPU_CHUNK

    def _buffer(self, w: Any) -> Any:
        """The scratch for an update of ``w``: a chunk of it where the update goes a chunk at
        a time, else all of it (one flat buffer per dtype, grown to the largest)."""
        n = min(w.size, self.chunk) if w.flags.c_contiguous else w.size
        flat = self._scratch.get(w.dtype)
        if flat is None or flat.size < n:
            flat = self._scratch[w.dtype] = self.xp.empty(n, dtype=w.dtype)
        return flat[:w.size].reshape(w.shape) if n == w.size else flat[:n]

    def prepare(self, key: str, w: Any) -> list[Any]:
        """The state of weight ``w`` under ``key`` (made, zero, the first time), the scratch
        buffer grown for it: a trainer makes both before its first step, so every step
        holds the same memory (``runtime/ledger.py``)."""
        if key not in self.state:
            self._buffer(w)
            self.state[key] = [self.xp.zeros_like(w) for _ in range(OPTIMIZER_STATES[self.config.kind.value])]
        return self.state[key]

    def arrays(self) -> list[Any]:
        """What it holds: every weight's state and the scratch buffer."""
        return [a for st in self.state.values() for a in st] + list(self._scratch.values())

    def update(self, key: str, w: Any, g: Any) -> None:
        state = self.prepare(key, w)
        tmp = self._buffer(w)
        chunk = self.chunk
        if w.size <= chunk or not all(a.flags.c_contiguous for a in (w, g, *state)):
            if tmp.size < w.size:    # (a gradient out of order: the scratch of all of it)
                tmp = self.xp.empty_like(w)
            self._update(w, g, tmp, state)
            return
        flat = [a.reshape(-1) for a in (w, g, *state)]
        for at in range(0, w.size, chunk):
            w_, g_, *state_ = (a[at:at + chunk] for a in flat)
            self._update(w_, g_, tmp[:w_.size], state_)

    def _update(self, w: Any, g: Any, tmp: Any, state: list[Any]) -> None:
        c, xp = self.config, self.xp
        match c.kind:
            case OptimizerKind.SGD:
                xp.multiply(g, c.lr, out=tmp)
                w -= tmp
            case OptimizerKind.MOMENTUM:
                (buf,) = state
                buf *= c.momentum
                buf += g
                xp.multiply(buf, c.lr, out=tmp)
                w -= tmp
            case OptimizerKind.ADAM:
                m, v = state
                b1, b2 = c.betas
                m *= b1
                xp.multiply(g, 1 - b1, out=tmp)
                m += tmp
                v *= b2
                xp.multiply(g, g, out=tmp)
                tmp *= 1 - b2
                v += tmp
                # lr * m_hat / (sqrt(v_hat) + eps), with m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t)
                xp.divide(v, 1 - b2 ** self.t, out=tmp)
                xp.sqrt(tmp, out=tmp)
                tmp += c.eps
                xp.divide(m, tmp, out=tmp)
                tmp *= c.lr / (1 - b1 ** self.t)
                w -= tmp
