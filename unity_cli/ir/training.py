"""What a training step does besides the graph: how many micro-batches it runs, where each
weight's optimizer state lives, and how many bytes a parameter costs.

These are facts the cost model, the solver and the runtime all read, so each is stated
once, here:

* :class:`Training` is the step's shape: ``micro_batches`` forward and backward passes
  whose gradients add up before one sync and one update (gradient accumulation; the plan's
  graph is built at the micro-batch size), the ZeRO stage of each weight that
  data-parallel replicas keep (``zero``, and ``zero_by_weight`` where some weights are
  kept otherwise), and what backward recomputes (``ir/recompute.py``).
* :class:`WeightBytes` is the bytes of one parameter by what holds them (the weight the
  kernels read, its gradient, its fp32 master copy, its optimizer states), and which of
  them a ZeRO stage shards over the replicas.
* :func:`shard_elements` is how a flat buffer of a sync group is cut among its members.

ZeRO stages (Rajbhandari et al., SC'20), as built:

* 0: every replica keeps every byte of the weights it reads, and all-reduces gradients;
* 1: the optimizer states (and the fp32 master, where the kernels read a narrower copy) are
  sharded over the replicas: the gradient is reduce-scattered (each member gets the summed
  shard it updates), the update runs on the shard, and the new weights are all-gathered.
  Its bytes sent equal the all-reduce's, up to the padding of the flat buffer to a
  multiple of the group. Megatron-LM's distributed optimizer is this stage.
* 2: the gradients are sharded too: each weight is its own bucket, reduce-scattered as
  soon as backward has made its gradient and added into the member's shard, so no replica
  keeps a whole gradient longer than that. With ``k`` micro-batches it sends ``k``
  reduce-scatters of each weight where stage 1 sends one flat buffer (DeepSpeed's stage 2
  reduce-scatters in buckets during backward the same way).
* 3: the weights are sharded too (FSDP's ``FULL_SHARD``): each weight is its own unit,
  padded to equal shards; each member keeps its shard and its optimizer state, all-gathers
  the weight before each pass that reads it (forward, and each recompute of a segment that
  reads it, ``ir/recompute.py``) and frees it after the pass's last reader; its gradient is
  reduce-scattered every micro-batch as soon as backward has made it, and the update runs
  on the shard (nothing is gathered after it). A reader whose context keeps its inputs for backward (one that is not
  recomputed) keeps the gathered weight until then, so only weights whose readers are all
  recomputed are held as shards alone through the step.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

import numpy as np

from .dtypes import DType
from .ops.sources import WeightAttrs
from .recompute import Recompute

if TYPE_CHECKING:
    from .pcg import PCG

ZERO_STAGES = (0, 1, 2, 3)
"""The ZeRO stages unity plans and runs (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Training:
    """The step's shape beyond the graph (see the module docstring)."""

    zero: int = 0
    micro_batches: int = 1
    recompute: Recompute = Recompute.NONE
    recompute_segments: int = 0     # recompute only the first this many segments (0: every one)
    zero_by_weight: tuple[tuple[str, int], ...] = ()
    """(pattern, stage): the weights whose names match the pattern (``fnmatch``: ``*``,
    ``?``, ``[...]``; :func:`literal` makes one name a pattern) are kept at that stage; the
    last pattern that matches a weight's name gives its stage, and ``zero`` the rest's."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        object.__setattr__(self, "zero_by_weight", tuple((str(p), int(z)) for p, z in self.zero_by_weight))
        for pattern, z in ((None, self.zero), *self.zero_by_weight):
            if z not in ZERO_STAGES:
                at = f"[{pattern}]" if pattern is not None else ""
                raise ValueError(f"zero{at}={z}: stages {', '.join(map(str, ZERO_STAGES))} are built")
            if pattern is not None and not pattern:
                raise ValueError("zero[]: a weight name pattern is empty")
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches={self.micro_batches}: must be at least 1")
        if self.recompute_segments < 0 or self.recompute_segments and self.recompute is Recompute.NONE:
            raise ValueError(f"recompute_segments={self.recompute_segments}: a count of recomputed segments "
                             "(with recompute full or selective)")

    @property
    def recompute_name(self) -> str:
        """``none``, ``selective``, ``full``, or with a count of segments ``full:K``."""
        return f"{self.recompute.value}:{self.recompute_segments}" if self.recompute_segments else self.recompute.value

    @property
    def default(self) -> bool:
        return self == Training()

    @property
    def sharded(self) -> bool:
        """Whether some weight may be kept under ZeRO (its sync is then flat, after backward)."""
        return self.zero > 0 or any(z for _, z in self.zero_by_weight)

    @property
    def mixed(self) -> bool:
        """Whether weights may be kept at different stages."""
        return any(z != self.zero for _, z in self.zero_by_weight)

    @property
    def zero_text(self) -> str:
        """``ZeRO-1``, or where weights are kept otherwise ``ZeRO-1, ZeRO-3 for *embed*``: the
        patterns in order (the last that names a weight wins), or past four, how many of
        each stage."""
        by = self.zero_by_weight
        if len(by) <= 4:
            return ", ".join([f"ZeRO-{self.zero}", *(f"ZeRO-{z} for {p}" for p, z in by)])
        count = {z: sum(s == z for _, s in by) for z in sorted({z for _, z in by})}
        return ", ".join([f"ZeRO-{self.zero}", *(f"ZeRO-{z} for {n} name pattern{'s' * (n != 1)}"
                                                 for z, n in count.items())])

    def stages(self, pcg: PCG) -> Stages:
        """Each trainable weight's ZeRO stage, by its node in ``pcg``."""
        if not self.mixed:
            return Stages(self.zero, {})
        return Stages(self.zero, weight_stages(weight_names(pcg).items(), self.zero, self.zero_by_weight))

    def to_json(self) -> dict[str, int | list[list[str | int]]]:
        """The fields that differ from the default (a plan made without them stays the same)."""
        out: dict[str, int | list[list[str | int]]] = {}
        if self.zero:
            out["zero"] = self.zero
        if self.zero_by_weight:
            out["zero_by_weight"] = [[p, z] for p, z in self.zero_by_weight]
        if self.micro_batches != 1:
            out["micro_batches"] = self.micro_batches
        if self.recompute is not Recompute.NONE:
            out["recompute"] = self.recompute.value
        if self.recompute_segments:
            out["recompute_segments"] = self.recompute_segments
        return out

    @staticmethod
    def from_json(fields: Mapping) -> Training:
        """:meth:`to_json`'s fields (among others: a plan's config, a row of its table) read back."""
        return Training(int(fields.get("zero", 0)), int(fields.get("micro_batches", 1)),
                        Recompute(fields.get("recompute", Recompute.NONE)), int(fields.get("recompute_segments", 0)),
                        tuple((p, z) for p, z in fields.get("zero_by_weight", ())))

    def describe(self) -> str:
        parts = []
        if self.sharded:
            parts.append(self.zero_text)
        if self.micro_batches > 1:
            parts.append(f"{self.micro_batches} micro-batches")
        if self.recompute is not Recompute.NONE:
            first = f" of the first {self.recompute_segments} segments" if self.recompute_segments else ""
            parts.append(f"{self.recompute.value} recomputation{first}")
        return ", ".join(parts)


class Stages(Mapping[int, int]):
    """Each trainable weight's ZeRO stage by its node (``zero`` for any node it does not list)."""

    __slots__ = ("zero", "_by_node")

    def __init__(self, zero: int, by_node: dict[int, int]):
        self.zero = zero
        self._by_node = by_node

    def __getitem__(self, node: int) -> int:
        return self._by_node.get(node, self.zero)

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)

    @property
    def most(self) -> int:
        """The highest stage of any weight."""
        return max(self._by_node.values(), default=self.zero)


_META = re.compile(r"([*?[])")
_ESCAPED = re.compile(r"\[([*?[])\]")


def literal(name: str) -> str:
    """A pattern that matches the weight name ``name`` alone (``*``, ``?`` and ``[`` bracketed)."""
    return _META.sub(r"[\1]", name)


def weight_names(pcg: PCG) -> dict[int, str]:
    """The name of each trainable weight of ``pcg``, by its node."""
    return {i: n.name for i, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable}


def unmatched(by_weight: Iterable[tuple[str, int]], pcg: PCG) -> int | None:
    """The index of the first (pattern, stage) whose pattern names no trainable weight of
    ``pcg`` (None: each names one)."""
    names = weight_names(pcg).values()
    return next((k for k, (pattern, _) in enumerate(by_weight)
                 if not any(fnmatchcase(name, pattern) for name in names)), None)


def weight_stages(names: Iterable[tuple[int, str]], zero: int, by_weight: tuple[tuple[str, int], ...]
                  ) -> dict[int, int]:
    """Each weight's stage, by its key in ``names`` (key, name) (see :attr:`Training.zero_by_weight`).
    A pattern that is one name is looked up, the others matched."""
    exact: dict[str, tuple[int, int]] = {}
    globs: list[tuple[int, str, int]] = []
    for k, (pattern, z) in enumerate(by_weight):
        name = _ESCAPED.sub(r"\1", pattern)
        if literal(name) == pattern:
            exact[name] = (k, z)
        else:
            globs.append((k, pattern, z))
    out = {}
    for key, name in names:
        k, z = exact.get(name, (-1, zero))
        for at, pattern, stage in globs:
            if at > k and fnmatchcase(name, pattern):
                k, z = at, stage
        out[key] = z
    return out


def shard_elements(numel: int, group: int) -> int:
    """The elements each of ``group`` members owns of a flat buffer of ``numel``: the buffer
    is padded with zeros to ``group`` equal shards, as MPI's and NCCL's reduce-scatter and
    all-gather of equal blocks need."""
    return -(-numel // max(1, group))


OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}
"""Arrays of state an optimizer keeps per weight element (the momentum; Adam's two moments),
by name: what the memory account prices and what the runtime's optimizer makes."""


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Bytes per parameter, by what holds them.

    In float32 training the kernels read the master weight itself: 4 (weight) + 4
    (gradient) + 4 per optimizer state (Adam: 16). In mixed precision (``bfloat16``,
    ``float16``) the kernels read a 2-byte copy, the gradient is accumulated in fp32 (as
    Megatron-LM's main grads), and an fp32 master and the states are kept for the update:
    2 + 4 + 4 + 8 = 18 with Adam. ZeRO-1 shards the master and the states: with Adam,
    ``4 + 4 + 8/d`` (float32) or ``2 + 4 + 12/d`` (mixed) over ``d`` replicas, and ``4/d``
    for the gradient shard it reduce-scatters into (a communication buffer); ZeRO-2 the
    gradient too: ``4 + 12/d`` or ``2 + 16/d``; ZeRO-3 the weight too: ``16/d`` or ``18/d``
    (and the gathered weights a pass reads, one at a time: ``cost/memory.memory_table``).
    """

    weight: int       # the copy the kernels read
    grad: int
    master: int       # an fp32 master beside a narrower weight (0 in float32)
    states: int       # the optimizer's

    @staticmethod
    def of(dtype: DType, optimizer_states: int) -> WeightBytes:
        narrow = dtype in (DType.BFLOAT16, DType.FLOAT16)
        return WeightBytes(dtype.itemsize if narrow else 4, 4, 4 if narrow else 0, 4 * optimizer_states)

    def breakdown(self, numel: int, replicas: int, zero: int) -> dict[str, int]:
        """The bytes a device holds for ``numel`` parameters that ``replicas`` devices keep
        alike, by part: weights (from ZeRO-3 on, this replica's shard), gradients (from
        ZeRO-2 on, its shard), optimizer (master and states: from ZeRO-1 on, its shard), and
        the gradient sync's communication buffers: under ZeRO-1 the summed shard the gradient
        is reduce-scattered into. Under ZeRO a shard is padded (:func:`shard_elements`), and
        the flat buffers of the whole weights and gradients with it, as the runtime pads
        them. (Below ZeRO-2 backward makes the gradient in the sync's flat buffer itself,
        ``runtime/weights.ParamStore.seeds``, where one piece is the weight's whole region on
        the device: data and tensor parallelism.)"""
        weight, grad, opt = self.weight * numel, self.grad * numel, (self.master + self.states) * numel
        buffers = 0
        shard = shard_elements(numel, replicas)     # padded, as a flat buffer is (at most as much)
        if zero >= 1 and replicas > 1:
            opt = (self.master + self.states) * shard
            weight = self.weight * shard * replicas
        if zero == 1 and replicas > 1:
            buffers, grad = self.grad * shard, self.grad * shard * replicas
        if zero >= 2 and replicas > 1:
            grad = self.grad * shard
        if zero >= 3 and replicas > 1:
            weight = self.weight * shard
        return {"weights": weight, "gradients": grad, "optimizer": opt, "communication buffers": buffers}

    def per_device(self, numel: int, replicas: int, zero: int) -> int:
        """:meth:`breakdown`'s parts added up."""
        return sum(self.breakdown(numel, replicas, zero).values())


class LossKind(Enum):
    """The loss ``unity run`` trains with (``runtime/loss.py``)."""

    MSE = "mse"
    CROSS_ENTROPY = "cross_entropy"


def label_shape(kind: LossKind, out_dims: tuple[int, ...]) -> tuple[int, ...]:
    """A micro-batch's targets: a class id per position for cross entropy, else the output's shape."""
    return out_dims[:-1] if kind is LossKind.CROSS_ENTROPY else out_dims


def label_dtype(kind: LossKind) -> np.dtype:
    """Class ids for cross entropy, float32 targets for MSE."""
    return np.dtype(np.int64) if kind is LossKind.CROSS_ENTROPY else np.dtype(np.float32)


CPU_CHUNK = 32768
"""Elements a numpy update works through at a time: its passes (Adam makes twelve) then
run over arrays that stay in the core's cache (five of them, 640 KiB), and only the
update's own reads and writes go to memory. On one core of this machine, Adam over 8 M
elements took 35.2 ms whole and 22.7 ms in chunks of 32 K (21.8 at 64 K, 24.7 at 256 K).
The optimizer's scratch buffer is at most one chunk (``runtime/optim.py``)."""

GPU_CHUNK = 1 << 22
"""A GPU's chunk: large enough that an update of a big weight is a few dozen launches of
each of its passes, and its scratch buffer at most 16 MiB in float32."""
