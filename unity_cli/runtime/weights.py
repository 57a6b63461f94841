"""Trainable weights on one rank: the part it keeps, its gradient sync and its update.

A rank keeps the ``master`` region of each weight that :class:`~.program.ParamPlan`
gives it, with the optimizer state for that region. After backward it adds up its
resident pieces' gradients into the master's, all-reduces them with the ranks that keep
the same region (one flat buffer per group: data parallelism's gradient sync), updates
the master and re-cuts its resident pieces from it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..ir.pcg import TensorRef
from .comm import Comm
from .optim import Optimizer
from .program import ParamPlan, Program


def to_host(a: Any) -> np.ndarray:
    """A numpy copy of a numpy or cupy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


class ParamStore:
    def __init__(self, program: Program, comm: Comm, xp: Any, initial: Mapping[str, np.ndarray],
                 optimizer: Optimizer):
        self.program = program
        self.comm = comm
        self.xp = xp
        self.optimizer = optimizer
        me = comm.rank
        self.plans: list[ParamPlan] = [p for p in program.params if me in p.master]
        self.master: dict[str, Any] = {}
        for p in self.plans:
            value = np.asarray(initial[p.name])
            if value.shape != p.shape:
                raise ValueError(f"weight {p.name!r} has shape {value.shape}, the plan wants {p.shape}")
            self.master[p.name] = xp.array(value[p.master[me]], copy=True, order="C")
        # One all-reduce per group: the weights it syncs, in plan order (the same on every member).
        self.buckets: list[tuple[tuple[int, ...], list[ParamPlan]]] = []
        for g in program.groups:
            members = [p for p in self.plans if p.group[me] == g]
            if members and len(g) > 1:
                self.buckets.append((g, members))
        # Each bucket's flat gradient buffer, made once: a weight's gradient is written into
        # its slice and all-reduced there (no per-step concatenate). Mixed dtypes: concatenated.
        self.flat: dict[int, Any] = {}
        self.slots: dict[str, Any] = {}   # a bucketed weight's slice of its bucket's flat buffer
        for k, (_, members) in enumerate(self.buckets):
            dtypes = {self.master[p.name].dtype for p in members}
            if len(dtypes) != 1:
                continue
            flat = self.flat[k] = xp.empty(sum(self.master[p.name].size for p in members), dtype=dtypes.pop())
            at = 0
            for p in members:
                m = self.master[p.name]
                self.slots[p.name] = flat[at:at + m.size].reshape(m.shape)
                at += m.size
        self.keep_synced = False      # --check: keep each step's synced gradients (memory: one more copy)
        self.fault_scale = 1.0        # UNITY_FAULT_GRAD_RANK: this rank's gradient pieces scaled (for tests)
        self.synced: dict[str, Any] = {}

    def residents(self) -> dict[TensorRef, Any]:
        """This rank's resident pieces, cut from its masters."""
        out = {}
        me = self.comm.rank
        for p in self.plans:
            m = self.master[p.name]
            for node, region, scale in p.pieces[me]:
                piece = m[region]
                if scale != 1:
                    piece = piece * piece.dtype.type(scale)
                out[TensorRef(node)] = self.xp.ascontiguousarray(piece)
        return out

    def update(self, grads: Mapping[TensorRef, Any]) -> None:
        """Gradient sync and one optimizer step; ``grads`` holds the resident pieces' gradients.
        The synced gradient of each master region stays in ``synced`` until the next step
        (``--check`` compares it)."""
        synced = self.sync(grads)
        self.synced = synced if self.keep_synced else {}
        self.optimizer.begin_step()
        for p in self.plans:
            self.optimizer.update(p.name, self.master[p.name], synced[p.name])

    def sync(self, grads: Mapping[TensorRef, Any]) -> dict[str, Any]:
        """Each master region's gradient: this rank's resident pieces' gradients added up,
        then all-reduced with the ranks that keep the same region (one flat buffer per group)."""
        me = self.comm.rank
        full: dict[str, Any] = {}
        for p in self.plans:
            m = self.master[p.name]
            out = self.slots.get(p.name)
            parts = [(region, grads[TensorRef(node)], scale * self.fault_scale)
                     for node, region, scale in p.pieces[me] if TensorRef(node) in grads]
            if len(parts) == 1 and parts[0][1].shape == m.shape and parts[0][1].dtype == m.dtype:
                # One piece covering the master (data parallelism): taken as it is, or copied
                # into the bucket's buffer; never added into zeros.
                _, piece, scale = parts[0]
                if out is None:
                    out = self.xp.ascontiguousarray(piece if scale == 1 else piece * piece.dtype.type(scale))
                elif scale == 1:
                    out[...] = piece
                else:
                    self.xp.multiply(piece, piece.dtype.type(scale), out=out)
            else:
                if out is None:
                    out = self.xp.zeros_like(m)
                else:
                    out[...] = 0
                for region, piece, scale in parts:
                    out[region] += piece if scale == 1 else piece * piece.dtype.type(scale)
            full[p.name] = out
        for k, (group, members) in enumerate(self.buckets):
            flat = self.flat.get(k)
            if flat is not None:
                self.comm.allreduce(group, flat)
                continue
            flat = self.xp.concatenate([full[p.name].ravel() for p in members])
            self.comm.allreduce(group, flat)
            at = 0
            for p in members:
                g = full[p.name]
                full[p.name] = flat[at:at + g.size].reshape(g.shape)
                at += g.size
        return full

    def load(self, whole: Mapping[str, np.ndarray]) -> None:
        """Set this rank's masters from whole weights (by name; the others keep theirs)."""
        me = self.comm.rank
        for p in self.plans:
            if p.name in whole:
                self.master[p.name][...] = self.xp.asarray(np.asarray(whole[p.name])[p.master[me]])

    def gather(self, root: int = 0, what: str = "weights") -> dict[str, np.ndarray]:
        """Every trainable weight (``what="grads"``: its last synced gradient), whole, on
        ``root`` (empty elsewhere); all ranks call it (``keep_synced`` for the gradients)."""
        me = self.comm.rank
        source = self.master if what == "weights" else self.synced
        out: dict[str, np.ndarray] = {}
        for p in self.program.params:
            holders: dict[tuple, int] = {}
            for rank in sorted(p.master):
                holders.setdefault(tuple((s.start, s.stop) for s in p.master[rank]), rank)
            if not holders:
                continue                  # a weight nothing reads: never trained
            if me == root:
                out[p.name] = np.zeros(p.shape, dtype=self.program.pcg.nodes[p.node].outputs[0].dtype.numpy)
            for key, rank in holders.items():
                region = tuple(slice(a, b) for a, b in key)
                shape = tuple(b - a for a, b in key)
                if rank == me == root:
                    out[p.name][region] = to_host(source[p.name])
                elif rank == me:
                    self.comm.send_array(np.ascontiguousarray(to_host(source[p.name])), root, 11)
                elif me == root:
                    buf = np.empty(shape, dtype=out[p.name].dtype)
                    self.comm.recv_array(buf, rank, 11)
                    out[p.name][region] = buf
        return out
