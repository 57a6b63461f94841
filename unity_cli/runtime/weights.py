"""Trainable weights on one rank: the part it keeps, its gradient sync and its update.

A rank keeps the ``master`` region of each weight that :class:`~.program.ParamPlan`
gives it, with the optimizer state for that region. After backward it adds up its
resident pieces' gradients into the master's, all-reduces them with the ranks that keep
the same region (data parallelism's gradient sync, in the buckets of ``ir/buckets.py``: one
flat buffer per group after backward, or buckets started during backward as soon as their
gradients are whole), updates the master and re-cuts its resident pieces from it.

With micro-batches, each micro-batch's gradients are added into the same buffers
(:meth:`ParamStore.accumulate`) and the sync runs once, after the last. Under ZeRO-1
(``ir/training.py``) a group's masters live in one flat buffer padded to equal shards: the
gradients are reduce-scattered (``ir/buckets.sync_calls``), each member updates its shard,
with optimizer state for that shard only, and the shards are all-gathered back. Under
ZeRO-2 each micro-batch's gradients are reduce-scattered at the end of its backward, from a
flat buffer made for that call, and added into the member's shard. Under ZeRO-3 each weight
is its own unit and a member keeps only its shard: the executor gathers it before each pass
that reads it (:meth:`ParamStore.gather_unit`) and frees it after, starting each gather
where the one before it is needed (:meth:`ParamStore.start_gather`, ``ir/recompute.gathers``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..ir.buckets import AFTER_BACKWARD, SyncBucket, SyncCallKind, WeightSync, sync_buckets, sync_calls
from ..ir.pcg import TensorRef
from ..ir.schedule import region_shape
from .comm import Comm
from .optim import Optimizer
from .program import ParamPlan, Program


def weight_syncs(program: Program) -> list[WeightSync]:
    """What :func:`~unity_cli.ir.buckets.sync_buckets` needs of each trainable weight, in plan
    order (the cost model reads the same from its moves: ``cost/model.py``)."""
    out = []
    for p in program.params:
        groups: dict[tuple[int, ...], int] = {}
        dtype = program.pcg.nodes[p.node].outputs[0].dtype
        for rank, g in sorted(p.group.items()):
            groups.setdefault(g, math.prod(region_shape(p.master[rank], p.shape)) * dtype.itemsize)
        residents = sorted({node for ps in p.pieces.values() for node, _, _ in ps})
        out.append(WeightSync(p.node, dtype.value, tuple(residents), tuple(groups.items())))
    return out


def seed_piece(p: ParamPlan, me: int) -> TensorRef | None:
    """The resident piece of weight ``p`` on rank ``me`` whose gradient backward can make in
    the sync's buffer itself (``ParamStore.seeds``): the only one, unscaled, the whole master
    region."""
    if len(p.pieces[me]) != 1:
        return None
    node, region, scale = p.pieces[me][0]
    dims = region_shape(p.master[me], p.shape)
    return TensorRef(node) if scale == 1 and region_shape(region, dims) == dims else None


def to_host(a: Any) -> np.ndarray:
    """A numpy copy of a numpy or cupy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


class ParamStore:
    def __init__(self, program: Program, comm: Comm, xp: Any, initial: Mapping[str, np.ndarray],
                 optimizer: Optimizer, bucket_bytes: int = 0, zero: int | Mapping[int, int] = 0):
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
        self._region = {name: (m.shape, m.dtype) for name, m in self.master.items()}   # each master region's
        # The gradient sync's all-reduces (ir/buckets.py), each over a flat buffer made once:
        # a weight's gradient is written into its slice there and all-reduced in place.
        self.bucket_bytes = bucket_bytes
        self._by_node = {p.node: p for p in self.plans}
        self.buckets: list[tuple[SyncBucket, Any]] = []
        self.slots: dict[str, Any] = {}   # a synced weight's slice of its bucket's buffer
        self.shards: dict[int, tuple[Any, Any]] = {}   # ZeRO: bucket index -> (flat masters, summed gradient shard)
        self.units: dict[int, int] = {}    # ZeRO-3: weight node -> its bucket index (only its shard is kept)
        # (``zero``: every weight's ZeRO stage, or each one's by its node: ``ir/training.py``)
        buckets = sync_buckets(program.pcg, weight_syncs(program), bucket_bytes, zero)
        if bucket_bytes and any(b.zero for b in buckets):
            raise ValueError("ZeRO's sync runs flat after backward: no buckets")
        if bucket_bytes or any(b.zero >= 3 for b in buckets):   # the bucketed sync's, or ZeRO-3's prefetched gathers
            comm.setup_sync_groups(sorted({b.group for b in buckets}))
        self.inflight: dict[int, tuple[Any, Any]] = {}   # ZeRO-3: weight node -> its gather in flight
        for b in buckets:
            if me not in b.group:
                continue
            ms = [self._by_node[w] for w in b.weights]
            dtype, zero = self.master[ms[0].name].dtype, b.zero
            length = b.shard() * len(b.group) if zero else sum(self.master[p.name].size for p in ms)
            masters = xp.zeros(length, dtype=dtype) if zero else None
            at = 0
            for p in ms:
                m = self.master[p.name]
                if masters is not None:   # the master becomes its slice of the group's flat buffer
                    masters[at:at + m.size] = m.reshape(-1)
                    self.master[p.name] = masters[at:at + m.size].reshape(m.shape)
                at += m.size
            if zero >= 3:    # the weight's own unit: this member keeps its shard alone
                at = b.group.index(me) * b.shard()
                masters = masters[at:at + b.shard()].copy()
                self.units[b.weights[0]] = len(self.buckets)
                del self.master[ms[0].name]     # gathered for each pass that reads it (gather_unit)
            if masters is not None:
                self.shards[len(self.buckets)] = (masters, xp.empty(b.shard(), dtype=dtype))
            # ZeRO-2 keeps no whole gradient between micro-batches: its flat buffer is made
            # for each micro-batch's reduce-scatter (_flat_buffer), and dropped after it
            self.buckets.append((b, None if zero >= 2 else self._flat_buffer(b, length, dtype)))
        self._bucketed = {self._by_node[w].name for b, _ in self.buckets for w in b.weights}
        self._sharded = {self._by_node[w].name for b, _ in self.buckets if b.zero for w in b.weights}  # updated by
        # their bucket's shard; ZeRO-2/3's buckets, reduce-scattered in every micro-batch, come first
        self._early = sum(b.zero >= 2 for b, _ in self.buckets)
        self._scatters = {self._by_node[w].name for b, _ in self.buckets[:self._early] for w in b.weights}
        self._scattered: set[int] = set()  # ZeRO-2/3: buckets reduce-scattered into their shard this step
        self._filled: set[str] = set()    # weights whose gradient this step's buffers already hold
        self._gathered = False            # --check under ZeRO: the summed gradients all-gathered
        self._issued = 0                  # buckets whose all-reduce has started this step
        self._pending: list[Any] = []     # their requests (bucketed: nonblocking)
        self.keep_synced = False      # --check: keep each step's synced gradients (memory: one more copy)
        self.fault_scale = 1.0        # UNITY_FAULT_GRAD_RANK: this rank's gradient pieces scaled (for tests)
        self.synced: dict[str, Any] = {}
        self._full: dict[str, Any] = {}   # this step's gradient of each master region
        self.sample: Callable[[], None] | None = None   # the memory ledger's, at a reduce-scatter's fullest
        # Below ZeRO-2, a weight whose one resident piece is its whole master region has its
        # gradient made in its slice of the bucket's buffer: backward adds into it (the
        # executor starts each micro-batch's gradients from these), so no second copy is kept
        # (as torch DDP's gradient_as_bucket_view)
        self.seeds: dict[TensorRef, Any] = {}
        self._seeded: set[str] = set()
        for p in self.plans:
            if p.name in self.slots and (seed := seed_piece(p, me)) is not None:
                self.seeds[seed] = self.slots[p.name]
                self._seeded.add(p.name)
        self._scaled: set[str] = set()    # seeded gradients the fault scale (a test's) was applied to
        for p in self.plans:              # the optimizer's state, made now: every step holds the same
            if p.name in self.master and p.name not in self._sharded:
                optimizer.prepare(p.name, self.master[p.name])
        for k, (masters, shard) in self.shards.items():
            b = self.buckets[k][0]
            at = 0 if b.zero >= 3 else b.group.index(me) * shard.size
            optimizer.prepare(f"zero:{k}", masters[at:at + shard.size])

    @property
    def scatters_in_backward(self) -> bool:
        """Whether some bucket is reduce-scattered in every micro-batch's backward (ZeRO-2/3)."""
        return self._early > 0

    def held(self) -> list[tuple[Any, str]]:
        """Every array this store keeps between a step's actions, with the part of the memory
        ledger it counts under (``runtime/ledger.py``): masters and shards, gradient buffers,
        the optimizer's state (``synced``, --check's copy, is not the training's)."""
        out = [(m, "weights") for m in self.master.values()]
        for masters, shard in self.shards.values():
            out += [(masters, "weights"), (shard, "gradients")]
        out += [(flat, "gradients") for _, flat in self.buckets if flat is not None]
        out += [(a, "gradients") for a in (*self.slots.values(), *self._full.values())]
        out += [(flat, "weights") for flat, _ in self.inflight.values()]
        return out + [(a, "optimizer") for a in self.optimizer.arrays()]

    def _flat_buffer(self, b: SyncBucket, length: int, dtype: Any) -> Any:
        """A flat gradient buffer of bucket ``b`` (zeros: ZeRO's padding stays zero), each of
        its weights' gradients a slice of it (``slots``)."""
        flat = self.xp.zeros(length, dtype=dtype)
        at = 0
        for w in b.weights:
            name = self._by_node[w].name
            shape = self._region[name][0]
            size = math.prod(shape)
            self.slots[name] = flat[at:at + size].reshape(shape)
            at += size
        return flat

    def gather_unit(self, weight: int) -> dict[TensorRef, Any]:
        """ZeRO-3: weight node ``weight`` all-gathered from its group's shards, and this rank's
        resident pieces of it cut from the whole (the caller frees them after their pass);
        if :meth:`start_gather` started it, it is waited for."""
        if weight in self.inflight:
            flat, request = self.inflight.pop(weight)
            self.comm.wait([request])
        else:
            group, mine, flat = self._gather_buffers(weight)
            self.comm.allgather(group, mine, flat)
        p = self._by_node[weight]
        shape = self._region[p.name][0]
        return self._cut(p, flat[:math.prod(shape)].reshape(shape))

    def start_gather(self, weight: int) -> None:
        """ZeRO-3's prefetch: start all-gathering weight node ``weight`` without waiting (on
        the group's own communicator); :meth:`gather_unit` waits for it."""
        group, mine, flat = self._gather_buffers(weight)
        self.inflight[weight] = (flat, self.comm.iallgather(group, mine, flat))

    def _gather_buffers(self, weight: int) -> tuple[tuple[int, ...], Any, Any]:
        """ZeRO-3: weight ``weight``'s group, this member's shard, and a buffer for the gather."""
        k = self.units[weight]
        group, (mine, _) = self.buckets[k][0].group, self.shards[k]
        return group, mine, self.xp.empty(mine.size * len(group), dtype=mine.dtype)

    def _cut(self, p: ParamPlan, m: Any) -> dict[TensorRef, Any]:
        """This rank's resident pieces of weight ``p``, cut from its master region ``m``."""
        out = {}
        for node, region, scale in p.pieces[self.comm.rank]:
            piece = m[region]
            if scale != 1:
                piece = piece * piece.dtype.type(scale)
            out[TensorRef(node)] = self.xp.ascontiguousarray(piece)
        return out

    def clear_seeds(self) -> None:
        """A step begins: the seeded gradients' slots start from zero."""
        for slot in self.seeds.values():
            slot[...] = 0

    def _reduce_scatter(self, k: int, grads: dict[TensorRef, Any]) -> None:
        """ZeRO-2/3: bucket ``k``'s gradients in a flat buffer made for it, reduce-scattered,
        and added into the member's summed shard; the resident pieces' gradients are dropped
        from ``grads`` (the executor's), so nothing whole outlives the call."""
        b, _ = self.buckets[k]
        _, shard = self.shards[k]
        flat = self._flat_buffer(b, shard.size * len(b.group), shard.dtype)
        for w in b.weights:
            self._fill(self._by_node[w], grads)
        if self.sample:      # the flat buffer beside the gradients it was filled from
            self.sample()
        self.comm.in_sync = True    # (its time is the gradient sync's, wherever it falls)
        try:
            if k not in self._scattered:
                self.comm.reduce_scatter(b.group, flat, shard)
                self._scattered.add(k)
            else:
                part = self.xp.empty_like(shard)
                self.comm.reduce_scatter(b.group, flat, part)
                shard += part
        finally:
            self.comm.in_sync = False
        me = self.comm.rank
        for w in b.weights:
            p = self._by_node[w]
            del self.slots[p.name], self._full[p.name]
            self._filled.discard(p.name)
            for node, _, _ in p.pieces[me]:
                grads.pop(TensorRef(node), None)

    def _reduce_scatter_micro_batch(self, grads: dict[TensorRef, Any]) -> None:
        """ZeRO-2/3, at the end of a micro-batch's backward: the buckets backward has not
        reduce-scattered yet (:meth:`backward_passed`)."""
        for k in range(self._issued, self._early):
            self._reduce_scatter(k, grads)
        self._issued = 0

    def residents(self) -> dict[TensorRef, Any]:
        """This rank's resident pieces, cut from its masters."""
        out = {}
        for p in self.plans:
            if p.name in self.master:    # (ZeRO-3's are gathered for each pass instead)
                out.update(self._cut(p, self.master[p.name]))
        return out

    def accumulate(self, grads: dict[TensorRef, Any]) -> None:
        """A micro-batch before the last is done: its resident pieces' gradients are added
        into each weight's gradient buffer (the sync runs once, after the last; under ZeRO-2
        the buckets' gradients are reduce-scattered now)."""
        for p in self.plans:
            if p.name not in self._scatters:
                self._fill(p, grads, own=True)
        self._reduce_scatter_micro_batch(grads)

    def update(self, grads: dict[TensorRef, Any]) -> None:
        """Gradient sync and one optimizer step; ``grads`` holds the resident pieces' gradients.
        The synced gradient of each master region stays in ``synced`` until the next step
        (``--check`` compares it)."""
        synced = self.sync(grads)
        self.synced = synced if self.keep_synced else {}
        self._gathered = False
        self._scattered = set()
        self._scaled = set()
        self.optimizer.begin_step()
        for p in self.plans:
            if p.name not in self._sharded:
                self.optimizer.update(p.name, self.master[p.name], synced[p.name])
        me = self.comm.rank
        for k, (masters, shard) in self.shards.items():
            group = self.buckets[k][0].group
            if self.buckets[k][0].zero >= 3:      # the shard is all it keeps: nothing to gather after
                self.optimizer.update(f"zero:{k}", masters, shard)
                continue
            at = group.index(me) * shard.size
            mine = masters[at:at + shard.size]
            self.optimizer.update(f"zero:{k}", mine, shard)
            self.comm.allgather(group, mine.copy(), masters)   # (a copy: MPI sends from outside the result)
        self._full = {}    # (the gradients are used: nothing is held until the next backward)

    def backward_passed(self, next_node: int, grads: dict[TensorRef, Any]) -> None:
        """Backward has run every step of a node above ``next_node``: start the all-reduce
        of every bucket whose gradients are now whole, in order, without waiting for it
        (bucketed sync), and let those already started progress; under ZeRO-2/3 reduce-
        scatter each such bucket into its shard (every micro-batch)."""
        if self._early:
            while self._issued < self._early and self.buckets[self._issued][0].ready > next_node:
                self._reduce_scatter(self._issued, grads)
                self._issued += 1
            return
        if not self.bucket_bytes:
            return
        while self._issued < len(self.buckets) and self.buckets[self._issued][0].ready > next_node:
            b, flat = self.buckets[self._issued]
            for w in b.weights:
                self._fill(self._by_node[w], grads)
            self._pending.append(self.comm.iallreduce(b.group, flat))
            self._issued += 1
        if self._pending:
            self.comm.test_all(self._pending)

    def sync(self, grads: dict[TensorRef, Any]) -> dict[str, Any]:
        """Each master region's gradient: this rank's resident pieces' gradients added up,
        then all-reduced with the ranks that keep the same region (``self.buckets``; those
        a bucketed sync has not started yet start now, and all are waited for)."""
        for p in self.plans:
            if p.name not in self._bucketed:
                self._fill(p, grads)
        if self.bucket_bytes:
            self.backward_passed(AFTER_BACKWARD - 1, grads)
            self.comm.wait_all(self._pending)
        else:
            self._reduce_scatter_micro_batch(grads)
            for k in range(self._early, len(self.buckets)):
                b, flat = self.buckets[k]
                for w in b.weights:
                    self._fill(self._by_node[w], grads)
                if sync_calls(b)[0].kind is SyncCallKind.ALL_REDUCE:
                    self.comm.allreduce(b.group, flat)
                else:
                    self.comm.reduce_scatter(b.group, flat, self.shards[k][1])
        self._issued, self._pending = 0, []
        self._filled = set()
        return self._full

    def _fill(self, p: ParamPlan, grads: Mapping[TensorRef, Any], own: bool = False) -> None:
        """Weight ``p``'s gradient on this rank before the sync: its resident pieces'
        gradients added up, in its slice of its bucket's buffer (or alone: not synced);
        added to what earlier micro-batches of the step left there (``own``: later ones
        will add to it, so a piece is never taken as it is)."""
        me = self.comm.rank
        if p.name in self._seeded:    # backward made it in its slot already
            slot = self.slots[p.name]
            if not own and self.fault_scale != 1 and p.name not in self._scaled:
                slot *= slot.dtype.type(self.fault_scale)
                self._scaled.add(p.name)
            self._full[p.name] = slot
            self._filled.add(p.name)
            return
        parts = [(region, grads[TensorRef(node)], scale * self.fault_scale)
                 for node, region, scale in p.pieces[me] if TensorRef(node) in grads]
        if p.name in self._filled:
            out = self._full[p.name]
            for region, piece, scale in parts:
                out[region] += piece if scale == 1 else piece * piece.dtype.type(scale)
            return
        self._filled.add(p.name)
        shape, dtype = self._region[p.name]
        out = self.slots.get(p.name)
        if len(parts) == 1 and parts[0][1].shape == shape and parts[0][1].dtype == dtype:
            # One piece covering the master (data parallelism): taken as it is, or copied
            # into the bucket's buffer; never added into zeros.
            _, piece, scale = parts[0]
            if out is None and own:
                out = self.xp.array(piece if scale == 1 else piece * piece.dtype.type(scale), copy=True, order="C")
            elif out is None:
                out = self.xp.ascontiguousarray(piece if scale == 1 else piece * piece.dtype.type(scale))
            elif scale == 1:
                out[...] = piece
            else:
                self.xp.multiply(piece, piece.dtype.type(scale), out=out)
        else:
            if out is None:
                out = self.xp.zeros(shape, dtype=dtype)
            else:
                out[...] = 0
            for region, piece, scale in parts:
                out[region] += piece if scale == 1 else piece * piece.dtype.type(scale)
        self._full[p.name] = out

    def load(self, whole: Mapping[str, np.ndarray]) -> None:
        """Set this rank's masters from whole weights (by name; the others keep theirs)."""
        me = self.comm.rank
        for p in self.plans:
            if p.name in whole and p.name in self.master:
                self.master[p.name][...] = self.xp.asarray(np.asarray(whole[p.name])[p.master[me]])
        for w, k in self.units.items():     # ZeRO-3: this member's shard of the padded region
            p, b = self._by_node[w], self.buckets[k][0]
            if p.name in whole:
                mine = self.shards[k][0]
                flat = np.zeros(mine.size * len(b.group), dtype=mine.dtype)
                region = np.asarray(whole[p.name])[p.master[me]].reshape(-1)
                flat[:region.size] = region
                at = b.group.index(me) * mine.size
                mine[...] = self.xp.asarray(flat[at:at + mine.size])

    def gather(self, root: int = 0, what: str = "weights") -> dict[str, np.ndarray]:
        """Every trainable weight (``what="grads"``: its last synced gradient), whole, on
        ``root`` (empty elsewhere); all ranks call it (``keep_synced`` for the gradients).
        Under ZeRO a member holds only its shard of the summed gradient: the shards are
        all-gathered first (``--check`` only, after the step)."""
        me = self.comm.rank
        if what == "grads" and self.shards and not self._gathered:
            for k, (_, shard) in self.shards.items():
                b, flat = self.buckets[k]
                if flat is None:         # ZeRO-2: a buffer for the check only
                    flat = self._flat_buffer(b, shard.size * len(b.group), shard.dtype)
                    self.synced.update((self._by_node[w].name, self.slots.pop(self._by_node[w].name))
                                       for w in b.weights)
                self.comm.allgather(b.group, shard, flat)
            self._gathered = True
        source = self.master if what == "weights" else self.synced
        if what == "weights" and self.units:    # ZeRO-3: the shards all-gathered (after the step)
            source = dict(self.master)
            for w, k in self.units.items():
                b, shard = self.buckets[k][0], self.shards[k][0]
                flat = self.xp.empty(shard.size * len(b.group), dtype=shard.dtype)
                self.comm.allgather(b.group, shard, flat)
                name = self._by_node[w].name
                shape = self._region[name][0]
                source[name] = flat[:math.prod(shape)].reshape(shape)
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
