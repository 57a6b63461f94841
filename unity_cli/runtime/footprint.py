"""The bytes a rank will hold during a training step, predicted from the plan: what
:class:`~.ledger.Ledger` measures (its docstring says what is counted), without running.

It walks the step as the executor runs it, from the same values: the program, each rank's
share of each step (:func:`~.executor.plan_step`), the order of the actions
(:class:`~.program.StepOrder`), the weights' buckets and shards (``ir/buckets.py``) and what
each kernel keeps (:meth:`~unity_cli.ir.opspec.OpSpec.saved`). Like
:func:`~.planned.planned_calls` for the bytes sent, it is held equal to the measurement.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import assert_never

from ..ir.buckets import sync_buckets
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import TensorRef
from ..ir.schedule import region_shape
from ..ir.shapes import TensorShape
from ..ir.training import OPTIMIZER_STATES, Training
from .executor import plan_step
from .ledger import Peak
from .loss import LossKind, label_dtype, label_shape
from .optim import CHUNK
from .program import LOCAL, Action, Program, StepKind, StepOrder
from .weights import seed_piece, weight_syncs

Entry = tuple[int, str]          # bytes, part


def contiguous(dims: Sequence[int], region: Sequence[slice]) -> bool:
    """Whether ``region`` of a C-ordered array of shape ``dims`` is one run of memory, as
    numpy's flags say (dims of length 1 do not count)."""
    lengths = region_shape(tuple(region), dims)
    if 0 in lengths:
        return True
    want = 1
    for d in range(len(dims) - 1, -1, -1):
        if lengths[d] != 1:
            if math.prod(dims[d + 1:]) != want:
                return False
            want *= lengths[d]
    return True


def planned_memory(p: Program, me: int, training: Training = Training(), optimizer: str = "adam",
                   bucket_bytes: int = 0, loss: LossKind = LossKind.CROSS_ENTROPY,
                   chunk: int = CHUNK) -> tuple[int, dict[str, int]]:
    """Rank ``me``'s peak bytes in a training step, and their parts at the peak (``chunk``:
    the elements an update works on at a time, ``Optimizer.chunk``)."""
    return _Walk(p, me, training, optimizer, bucket_bytes, loss, chunk).run()


class _Walk:
    def __init__(self, p: Program, me: int, training: Training, optimizer: str, bucket_bytes: int,
                 loss: LossKind, chunk: int):
        self.chunk = chunk
        self.p, self.me, self.training = p, me, training
        pcg = p.pcg
        self.order = StepOrder.of(p, training.recompute, training.recompute_segments)
        self.mine = [plan_step(p, me, k, s) for k, s in enumerate(p.steps)]
        self.free = [[r for r in m.free if r not in self.order.kept] for m in self.mine]
        self.static: dict[tuple, Entry] = {}
        self.alias: set[TensorRef] = set()          # weight pieces that are (a slice of) their master
        self.units: dict[int, list[TensorRef]] = {}  # ZeRO-3: weight node -> this rank's pieces of it
        self.gathered: dict[int, int] = {}           # and the bytes of its gather's buffer
        self.unsynced: list[tuple[str, int]] = []    # weights without a bucket: (name, bytes)
        self.seeded: set[TensorRef] = set()          # gradients made in the sync's buffer
        # ZeRO-2/3: per bucket, when backward has made its gradients, the gradients it takes and
        # the bytes of its flat buffer (held beside them while it is filled and reduce-scattered)
        self.scatters: list[tuple[int, list[TensorRef], int]] = []
        self._store(optimizer, bucket_bytes)
        for i, n in pcg:
            if n.kind == "Input" or n.kind == "Weight" and not n.op.trainable:
                self.static[("source", i)] = (math.prod(n.outputs[0].sizes) * n.outputs[0].dtype.itemsize,
                                              "inputs and constants")
        out = pcg.shape(p.output)
        labels = math.prod(label_shape(loss, out.sizes)) * label_dtype(loss).itemsize
        self.static[("target",)] = (labels, "inputs and constants")
        self.cut: dict[tuple, Entry] = {}             # constants' pieces, cut once and kept
        self.peak = Peak()

    def _bytes(self, ref: TensorRef) -> int:
        s = self.p.pcg.shape(ref)
        return s.piece.numel * s.dtype.itemsize

    def _store(self, optimizer: str, bucket_bytes: int) -> None:
        """What :class:`~.weights.ParamStore` keeps: masters, buckets, shards, optimizer state."""
        p, me = self.p, self.me
        pcg = p.pcg
        plans = [q for q in p.params if me in q.master]
        by_node = {q.node: q for q in plans}
        size = {q.name: math.prod(region_shape(q.master[me], q.shape)) for q in plans}
        dtype = {q.name: pcg.nodes[q.node].outputs[0].dtype for q in plans}
        master = {q.name: ("master", q.name) for q in plans}      # the array each master lives in
        updated: list[tuple[str, int, object]] = []                # (state key, elements, dtype)
        bucketed: set[str] = set()
        sharded: set[str] = set()        # updated on their bucket's shard (ZeRO)
        scattered: set[str] = set()      # reduce-scattered in every micro-batch (ZeRO-2/3)
        stages = self.training.stages(pcg)
        for k, b in enumerate(x for x in sync_buckets(pcg, weight_syncs(p), bucket_bytes, stages) if me in x.group):
            ms = [by_node[w] for w in b.weights]
            dt, zero = dtype[ms[0].name], b.zero
            if zero:
                sharded.update(q.name for q in ms)
            if zero >= 2:
                scattered.update(q.name for q in ms)
            length = b.shard() * len(b.group) if zero else sum(size[q.name] for q in ms)
            bucketed.update(q.name for q in ms)
            if zero >= 3:
                self.static[("shard", k)] = (b.shard() * dt.itemsize, "weights")
                self.units[b.weights[0]] = [TensorRef(node) for node, _, _ in ms[0].pieces[me]]
                self.gathered[b.weights[0]] = length * dt.itemsize     # its flat buffer, while in flight
                del master[ms[0].name]
            elif zero:
                self.static[("flat", k)] = (length * dt.itemsize, "weights")
                for q in ms:
                    master[q.name] = ("flat", k)
            if zero >= 2:
                self.scatters.append((b.ready, [TensorRef(node) for q in ms for node, _, _ in q.pieces[me]],
                                      b.shard() * len(b.group) * dt.itemsize))
            if zero:
                self.static[("gshard", k)] = (b.shard() * dt.itemsize, "gradients")
                updated.append((f"zero:{k}", b.shard(), dt))
            if zero < 2:
                self.static[("gflat", k)] = (length * dt.itemsize, "gradients")
        for q in plans:
            if q.name not in master:
                continue
            if master[q.name][0] == "master":
                self.static[master[q.name]] = (size[q.name] * dtype[q.name].itemsize, "weights")
            if q.name not in bucketed:
                self.unsynced.append((q.name, size[q.name] * dtype[q.name].itemsize))
            if q.name not in sharded:
                updated.append((q.name, size[q.name], dtype[q.name]))
            dims = region_shape(q.master[me], q.shape)
            # (ParamStore.seeds)
            if q.name in bucketed and q.name not in scattered and (seed := seed_piece(q, me)) is not None:
                self.seeded.add(seed)
            for node, region, scale in q.pieces[me]:
                if scale == 1 and contiguous(dims, region):
                    self.alias.add(TensorRef(node))
                else:                                          # a copy, kept between steps
                    self.static[("ref", TensorRef(node))] = (self._bytes(TensorRef(node)), "weights")
        states = OPTIMIZER_STATES[optimizer]
        scratch: dict[object, int] = {}
        for key, n, dt in updated:
            self.static[("opt", key)] = (states * n * dt.itemsize, "optimizer")
            scratch[dt] = max(scratch.get(dt, 0), min(n, self.chunk))
        for dt, n in scratch.items():
            self.static[("scratch", dt)] = (n * dt.itemsize, "optimizer")

    # -- the walk ---------------------------------------------------------------------------

    def run(self) -> tuple[int, dict[str, int]]:
        micro = self.training.micro_batches
        self.full: dict[tuple, Entry] = {}
        for j in range(micro):
            self._micro_batch()
            if j < micro - 1:      # ParamStore.accumulate: each unsynced weight's gradient, its own copy
                self.full = {("full", name): (nbytes, "gradients") for name, nbytes in self.unsynced}
                self.grads = {}
                self._sample()
        self.full, self.grads, self.values = {}, {}, {}      # after the update
        self._sample()
        return self.peak.peak, self.peak.parts

    def _micro_batch(self) -> None:
        order = self.order
        self.values: dict[tuple, Entry] = {}
        self.ctx: dict[int, dict[tuple, Entry]] = {}
        self.stashed: dict[tuple[int, int], dict[tuple, Entry]] = {}   # ZeRO-3: (step, weight) -> what its
        # context gave up until backward
        self.grads: dict[TensorRef, int] = {}
        self.fed: dict[tuple, Entry] = {}
        issued = 0
        for j, (act, k) in enumerate(order.actions):
            for w in order.first_use.get(j, ()):
                self.values.pop(("prefetch", w), None)
                for ref in self.units.get(w, ()):
                    self.values[("ref", ref)] = (self._bytes(ref), "weights")
                if w in self.units and w in order.regain.get(j, ()):      # Executor._restore
                    for r in order.stashed[w]:
                        self.ctx.get(r, {}).update(self.stashed.pop((r, w), {}))
            for w in order.prefetch.get(j, ()):          # ParamStore.start_gather
                if w in self.gathered:
                    self.values[("prefetch", w)] = (self.gathered[w], "weights")
            match act:
                case Action.FORWARD:
                    self._forward(k, k not in order.no_context)
                    for ref in self.free[k]:
                        self.values.pop(("ref", ref), None)
                case Action.LOSS:
                    self._loss()
                case Action.RECOMPUTE:
                    self._forward(k, True)
                case Action.BACKWARD:
                    if self.mine[k].active:
                        self._backward(k)
                    after = self.mine[k - 1].step.node if k else -1
                    while issued < len(self.scatters) and self.scatters[issued][0] > after:
                        _, refs, flat = self.scatters[issued]
                        self._sample({("scatter",): (flat, "gradients")})
                        for ref in refs:
                            self.grads.pop(ref, None)
                        issued += 1
                case Action.DROP:
                    for i in order.segments[k]:
                        node = self.mine[i].step.node
                        for o in range(len(self.p.pcg.nodes[node].outputs)):
                            self.values.pop(("ref", TensorRef(node, o)), None)
                case _:
                    assert_never(act)
            for w in order.drop.get(j, ()) if self.units else ():      # Executor._stash
                for r in order.stashed[w] if w in self.units else ():
                    self.stashed[(r, w)] = {key: self.ctx[r].pop(key) for key in [("ref", ref) for ref in self.units[w]]
                                            if r in self.ctx and key in self.ctx[r]}
            for w in order.last_use.get(j, ()):
                for ref in self.units.get(w, ()):
                    self.values.pop(("ref", ref), None)
            self._sample()
        self.values = {}

    def _value(self, ref: TensorRef) -> tuple[tuple, Entry] | None:
        """A value the executor reads: None where it is its master (counted with the store)."""
        if ref in self.alias:
            return None
        src = self.p.layout[ref.node]
        weight = src is not None and isinstance(op := self.p.pcg.nodes[src].op, WeightAttrs) and op.trainable
        return ("ref", ref), (self._bytes(ref), "weights" if weight else "activations")

    def _source(self, k: int, ri: int) -> tuple[tuple, Entry] | None:
        """A read of an input's or constant's piece: a copy only where it is scaled (cached)."""
        rd = self.mine[k].task.reads[ri]
        i = rd.ref.node
        if self.p.scale[i] == 1:
            return None
        key = ("cut", i, rd.coord, None if rd.region is None else tuple((s.start, s.stop) for s in rd.region))
        entry = (self._bytes(TensorRef(i)), "inputs and constants")
        (self.fed if self.p.pcg.nodes[self.p.layout[i]].kind == "Input" else self.cut)[key] = entry
        return key, entry

    def _forward(self, k: int, keep: bool) -> None:
        m, pcg = self.mine[k], self.p.pcg
        step, t = m.step, m.task
        node = step.node
        if step.kind is StepKind.FUSED:
            if m.colls:
                self.values[("ref", TensorRef(node))] = (self._bytes(TensorRef(node)), "activations")
            return
        if t is None:
            return
        sources = {ri: self._source(k, ri) for ri, rd in enumerate(t.reads)
                   if rd.src == LOCAL and ri not in m.remote and ri not in m.covered}
        outs = [TensorRef(node, j) for j in range(len(pcg.nodes[node].outputs))]
        for ref in outs if step.kind is StepKind.COMPUTE else outs[:1]:
            self.values[("ref", ref)] = (self._bytes(ref), "activations")
        if step.kind is not StepKind.COMPUTE or not (m.active and keep):
            return
        ins = [TensorShape(tuple(self._read_dims(rd)), pcg.shape(rd.ref).dtype) for rd in t.reads]
        saved = pcg.nodes[node].spec.saved(m.attrs, ins, [pcg.shape(r).piece for r in outs])
        kept: dict[tuple, Entry] = {}
        for ri in saved.inputs:
            rd = t.reads[ri]
            if ri in m.remote:
                kept[("recv", k, ri)] = (ins[ri].numel * ins[ri].dtype.itemsize, "activations")
            elif ri in m.covered:   # a broadcast's buffer (one per collective)
                c = next(c for c, coll in enumerate(m.colls) if (m.ti, ri) in coll.covered)
                kept[("bcast", k, c)] = (ins[ri].numel * ins[ri].dtype.itemsize, "activations")
            elif ri in sources:
                if sources[ri] is not None:
                    kept.update([sources[ri]])
            elif (v := self._value(rd.ref)) is not None:
                kept.update([v])
        for j in saved.outputs:
            kept[("ref", outs[j])] = (self._bytes(outs[j]), "activations")
        for x, shape in enumerate(saved.extra):
            kept[("extra", k, x)] = (shape.numel * shape.dtype.itemsize, "activations")
        self.ctx[k] = kept

    def _read_dims(self, rd) -> tuple[int, ...]:
        dims = self.p.pcg.shape(rd.ref).piece.dims
        return dims if rd.region is None else region_shape(rd.region, dims)

    def _loss(self) -> None:
        p, me = self.p, self.me
        out = p.output
        if out not in p.has_grad:
            return
        lead = next((g for g in p.loss_groups if g.leader == me), None)
        member = next((g for g in p.loss_groups for r, _, _ in g.members if r == me), None)
        if lead is not None and any(r == me for r, _, _ in lead.members) or \
                member is not None and member.leader != me:
            self.grads[out] = self._bytes(out)

    def _backward(self, k: int) -> None:
        m, p = self.mine[k], self.p
        step, t = m.step, m.task
        node = step.node
        if step.kind is StepKind.FUSED:
            if m.colls_back:
                self.grads.pop(TensorRef(node), None)
                self.grads[step.source] = self._bytes(step.source)
            return
        flows = False
        if t is not None:
            outs = [TensorRef(node, j) for j in range(len(p.pcg.nodes[node].outputs))]
            flows = any([self.grads.pop(r, None) is not None for r in outs])   # (every one popped)
            self.ctx.pop(k, None)
        for _, rd in m.grad_recv:
            self.grads[rd.ref] = self._bytes(rd.ref)
        if t is not None and flows:
            for ri, rd in enumerate(t.reads):
                if ri in m.remote or ri in m.covered or rd.src == LOCAL or rd.ref not in p.has_grad:
                    continue
                self.grads[rd.ref] = self._bytes(rd.ref)
        for c in m.colls_back:
            task = step.tasks[c.covered[0][0]]
            if c.kind.name == "BCAST":
                if self.me == c.root:
                    rd = task.reads[c.covered[0][1]]
                    self.grads[rd.ref] = self._bytes(rd.ref)
            else:
                rd = next(r for r in task.reads if r.src == self.me)
                self.grads[rd.ref] = self._bytes(rd.ref)

    def _sample(self, extra: dict[tuple, Entry] | None = None) -> None:
        held = {**self.static, **self.cut, **self.fed, **self.full, **self.values, **(extra or {})}
        for kept in self.ctx.values():
            held.update(kept)
        held.update((("grad", r), (b, "gradients")) for r, b in self.grads.items() if r not in self.seeded)
        self.peak.see(held)
