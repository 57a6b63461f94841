"""Training data: batches from an ``.npz`` file, or synthetic ones from a seed.

Every rank makes (or loads) the same whole batch and cuts the pieces it reads, as a
data loader of a data-parallel job would; no rank scatters data to another.

Synthetic batch ``s`` comes from ``numpy.random.default_rng([seed, s])``: float inputs
are standard normal; an integer input that a ``Gather`` uses as indices is uniform in
``[0, table rows)``; other integer (and boolean) inputs are ones. Labels are class ids
for cross entropy, standard normal targets of the output's shape for mse.

An ``.npz`` holds one array per graph input (by name) and ``labels``; the leading dim of
each is the batch, or a multiple of it: step ``s`` then takes batch ``s mod k``.
"""
from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..ir.opspec import OpKind
from ..ir.pcg import PCG
from ..ir.shapes import TensorShape
from .loss import LossKind, label_dtype, label_shape


@dataclass(frozen=True)
class Batch:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray


def gather_tables(pcg: PCG) -> dict[str, int]:
    """Graph inputs used as Gather (or GroupedGather) indices -> the rows of the smallest
    table they index."""
    out: dict[str, int] = {}
    for i, n in pcg:
        if n.kind != OpKind.Input:
            continue
        todo = [i]
        while todo:
            j = todo.pop()
            for u, pos in pcg.consumers[j]:
                user = pcg.nodes[u]
                if user.spec.is_parallel_op or user.kind == OpKind.Cast:
                    todo.append(u)
                elif user.kind == OpKind.Gather and pos == 1 or user.kind == OpKind.GroupedGather and pos:
                    rows = user.op.rows[pos - 1] if user.kind == OpKind.GroupedGather else \
                        pcg.shape(user.inputs[0]).sizes[user.op.axis]
                    out[n.name] = min(out.get(n.name, rows), rows)
    return out


def read_npz(path: str) -> dict[str, np.ndarray]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--data {path}: no such file")
    try:
        with np.load(p, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise UsageError(f"--data {path}: not a readable .npz file ({e})") from None


class Data:
    """The batch of each step (see the module docstring)."""

    def __init__(self, inputs: Mapping[str, TensorShape], out_dims: tuple[int, ...], loss: LossKind,
                 seed: int, tables: Mapping[str, int], arrays: Mapping[str, np.ndarray] | None = None,
                 source: str = ""):
        self.inputs = dict(inputs)
        self.loss = loss
        self.labels_shape = label_shape(loss, out_dims)
        self.classes = out_dims[-1] if loss is LossKind.CROSS_ENTROPY else 0
        self.seed = seed
        self.tables = dict(tables)
        self.arrays: dict[str, np.ndarray] | None = None
        self.batches = 1
        if arrays is not None:
            self.arrays = self._check(arrays, source)

    def _check(self, arrays: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
        want = {name: (s.dims, s.dtype.numpy) for name, s in self.inputs.items()}
        want["labels"] = (self.labels_shape, label_dtype(self.loss))
        missing = sorted(set(want) - set(arrays))
        if missing:
            raise UsageError(f"--data {source}: no array named {missing[0]!r} "
                             f"(it needs {', '.join(sorted(want))})")
        extra = sorted(set(arrays) - set(want))
        if extra:   # a misspelt input would otherwise train on synthetic data without a word
            raise UsageError(f"--data {source}: array {extra[0]!r} is not a graph input nor 'labels' "
                             f"(it needs {', '.join(sorted(want))})")
        out, counts = {}, set()
        for name, (dims, dtype) in want.items():
            a = np.asarray(arrays[name])
            if a.shape[1:] != tuple(dims[1:]) or not dims or a.shape[0] % dims[0] or a.shape[0] == 0:
                raise UsageError(f"--data {source}: {name!r} has shape {list(a.shape)}; the plan wants "
                                 f"{list(dims)} (or a multiple of its batch {dims[0] if dims else 1})")
            if np.dtype(dtype).kind in "iub" and a.dtype.kind not in "iub":
                raise UsageError(f"--data {source}: {name!r} holds {a.dtype}, the model wants integers")
            if a.dtype.kind in "fc" and a.size and not np.isfinite(a).all():
                bad = np.argwhere(~np.isfinite(a))[0]
                raise UsageError(f"--data {source}: {name!r} holds NaN or infinity (at index {list(map(int, bad))})")
            rows = self.tables.get(name)
            if rows is not None and a.size and (a.min() < -rows or a.max() >= rows):
                worst = int(a.min()) if a.min() < -rows else int(a.max())
                raise UsageError(f"--data {source}: {name!r} indexes a table of {rows} rows, but holds {worst} "
                                 f"(ids must lie in [-{rows}, {rows}))")
            out[name] = a.astype(dtype, copy=False)
            counts.add(a.shape[0] // dims[0])
        if self.loss is LossKind.CROSS_ENTROPY:
            lab = out["labels"]
            if lab.size and (lab.min() < 0 or lab.max() >= self.classes):
                raise UsageError(f"--data {source}: labels must be class ids in [0, {self.classes})")
        if len(counts) != 1:
            raise UsageError(f"--data {source}: the arrays hold different numbers of batches")
        self.batches = counts.pop()
        return out

    def batch(self, step: int) -> Batch:
        if self.arrays is not None:
            k = step % self.batches
            inputs = {}
            for name, s in self.inputs.items():
                b = s.dims[0]
                inputs[name] = self.arrays[name][k * b:(k + 1) * b]
            b = self.labels_shape[0]
            return Batch(inputs, self.arrays["labels"][k * b:(k + 1) * b])
        rng = np.random.default_rng([self.seed, step])
        inputs = {}
        for name in sorted(self.inputs):
            s = self.inputs[name]
            dt = s.dtype.numpy
            if s.dtype.is_float:
                inputs[name] = rng.standard_normal(s.dims).astype(dt)
            elif name in self.tables:
                inputs[name] = rng.integers(0, self.tables[name], size=s.dims).astype(dt)
            else:
                inputs[name] = np.ones(s.dims, dtype=dt)
        if self.loss is LossKind.CROSS_ENTROPY:
            labels = rng.integers(0, self.classes, size=self.labels_shape).astype(label_dtype(self.loss))
        else:
            labels = rng.standard_normal(self.labels_shape).astype(label_dtype(self.loss))
        return Batch(inputs, labels)
