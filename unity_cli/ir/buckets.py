"""Which weight gradients one all-reduce sums, and when it may start: the sync's buckets.

After backward, each group of devices that keeps the same region of some weights sums
those gradients (data parallelism's gradient sync, :class:`~.schedule.ParamPlan`). The
runtime (``runtime/weights.py``) runs it, and the cost model (``cost/model.py``) prices it,
from the same buckets, made here:

* **flat** (``bucket_bytes == 0``): one all-reduce per group and dtype, over one flat
  buffer of every region the group keeps, once the whole backward pass is done;
* **bucketed** (``bucket_bytes > 0``): a group's weights in the order their gradients
  are finished (the last layers first), cut into buckets of at least ``bucket_bytes``;
  each bucket's all-reduce starts, without blocking, as soon as backward has run every
  step that reads one of its weights, and overlaps the rest of backward.

A weight's gradient is whole once backward has run every step that reads one of its
stored layouts (its *residents*): those are the steps whose backward adds to it, on any
rank. Steps run in node order, so that is once backward has passed the smallest node
index among the residents' consumers (:func:`ready_index`). That index is the same on
every rank, and so is each group's bucket order: the members of a group issue its
all-reduces in one order, as MPI and NCCL require of collectives on one communicator.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from .dtypes import DType
from .pcg import PCG
from .training import shard_elements

Group = tuple[int, ...]

_ITEMSIZES = {d.value: d.itemsize for d in DType}

AFTER_BACKWARD = -1
"""A flat bucket's :attr:`SyncBucket.ready`: it starts once the whole backward pass is done."""


@dataclass(frozen=True, slots=True)
class SyncBucket:
    """One all-reduce of the gradient sync: ``weights`` (weight node indices, in the order
    of the flat buffer) summed over ``group``, ``nbytes`` in all. It may start once backward
    has run every step of a node at index ``ready`` or above (``AFTER_BACKWARD``: at its end)."""

    group: Group
    dtype: str
    weights: tuple[int, ...]
    sizes: tuple[int, ...]         # bytes of each weight's region, in the order of ``weights``
    ready: int
    zero: int = 0                  # the ZeRO stage its weights are kept under (its calls: sync_calls)

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZES[self.dtype]

    def shard(self) -> int:
        """The elements each member owns of the flat buffer under ZeRO (padded: :func:`~.training.shard_elements`)."""
        return shard_elements(self.nbytes // self.itemsize, len(self.group))


class SyncCallKind(Enum):
    ALL_REDUCE = "allreduce"            # the summed gradient on every member
    REDUCE_SCATTER = "reduce_scatter"   # ZeRO: each member's summed shard
    ALL_GATHER = "allgather"            # ZeRO: the updated shards to every member, after the update


class SyncWhen(Enum):
    """When in a step a sync call runs."""

    BEFORE_USE = "before_use"      # before each pass that reads the weight, every micro-batch (ZeRO-3)
    MICRO_BATCH = "micro_batch"    # at the end of every micro-batch's backward (ZeRO-2, -3)
    SYNC = "sync"                  # once, after the last micro-batch's backward
    AFTER_UPDATE = "after_update"  # once, after the optimizer's update


@dataclass(frozen=True, slots=True)
class SyncCall:
    """One call a bucket makes: ``nbytes`` as the communicator's byte count reads it (an
    all-reduce's buffer; a reduce-scatter's result and an all-gather's piece: one member's
    shard), and when it runs."""

    kind: SyncCallKind
    group: Group
    nbytes: int
    when: SyncWhen = SyncWhen.SYNC


def sync_calls(bucket: SyncBucket) -> tuple[SyncCall, ...]:
    """The calls of one bucket under its ZeRO stage (``ir/training.py``): an all-reduce in
    the sync; or a reduce-scatter of the padded flat buffer (in the sync, or from ZeRO-2 on
    in every micro-batch, once backward has made its gradients) and an all-gather of the
    weights (after the update on the shard, or under ZeRO-3 before each pass that reads the
    weight)."""
    zero = bucket.zero
    if zero == 0:
        return (SyncCall(SyncCallKind.ALL_REDUCE, bucket.group, bucket.nbytes),)
    shard = bucket.shard() * bucket.itemsize
    when = SyncWhen.MICRO_BATCH if zero >= 2 else SyncWhen.SYNC
    gather = SyncWhen.BEFORE_USE if zero >= 3 else SyncWhen.AFTER_UPDATE
    return (SyncCall(SyncCallKind.REDUCE_SCATTER, bucket.group, shard, when),
            SyncCall(SyncCallKind.ALL_GATHER, bucket.group, shard, gather))


@dataclass(frozen=True, slots=True)
class WeightSync:
    """What the buckets need of one trainable weight: its node, the dtype of its master copy,
    its residents and the all-reduces its regions need (each group with the bytes of the
    region it keeps)."""

    weight: int
    dtype: str
    residents: tuple[int, ...]
    groups: tuple[tuple[Group, int], ...]


def ready_index(pcg: PCG, residents: Iterable[int]) -> int:
    """The smallest node index that reads one of ``residents``: once backward has run every
    step of that index and above, the weight's gradient is whole (nothing reads them: the
    graph's length, whole from the start)."""
    return min((u for r in residents for u, _ in pcg.consumers[r]), default=len(pcg))


def sync_buckets(pcg: PCG, weights: Sequence[WeightSync], bucket_bytes: int, zero: int | Mapping[int, int] = 0
                 ) -> tuple[SyncBucket, ...]:
    """The gradient sync's all-reduces, in the order a rank issues them (see the module
    docstring); ``weights`` in plan order. Every rank computes the same tuple. ``zero`` is
    the ZeRO stage of every weight, or of each by its node (0 where it names none): weights
    of different stages never share a bucket. Under ZeRO-2 and 3 each weight is its own
    bucket, reduce-scattered as soon as its gradient is whole (so no rank holds a whole
    gradient longer), and under ZeRO-3 the unit gathered before it is read."""
    if bucket_bytes < 0:
        raise ValueError(f"bucket_bytes must be >= 0, got {bucket_bytes}")
    stages = zero if isinstance(zero, Mapping) else None
    members: dict[tuple[Group, str, int], list[tuple[int, int, int, int]]] = {}
    for position, w in enumerate(weights):
        ready = ready_index(pcg, w.residents)
        z = zero if stages is None else stages.get(w.weight, 0)
        for group, nbytes in w.groups:
            if len(group) > 1:
                members.setdefault((group, w.dtype, z), []).append((-ready, position, w.weight, nbytes))
    out: list[tuple[tuple, SyncBucket]] = []
    for (group, dtype, z), ms in members.items():
        if z >= 2:      # each weight's reduce-scatter as soon as backward has made its gradient
            ms.sort()
            chunks = [[m] for m in ms]
        elif bucket_bytes == 0:
            ms.sort(key=lambda m: m[1])
            chunks = [ms]
        else:
            ms.sort()
            chunks, acc = [[]], 0
            for m in ms:
                if acc >= bucket_bytes:
                    chunks.append([])
                    acc = 0
                chunks[-1].append(m)
                acc += m[3]
        for k, chunk in enumerate(chunks):
            ready = AFTER_BACKWARD if bucket_bytes == 0 and z < 2 else -max(m[0] for m in chunk)
            bucket = SyncBucket(group, dtype, tuple(m[2] for m in chunk), tuple(m[3] for m in chunk), ready, z)
            out.append(((-ready, group, dtype, z, k), bucket))
    out.sort(key=lambda kb: kb[0])
    return tuple(b for _, b in out)
