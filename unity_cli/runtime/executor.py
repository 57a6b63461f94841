"""One rank's share of a training step: run the program's steps, forward then backward.

Like torch.fx's Interpreter, every node goes through one dispatch point (a compute task
through ``kernels.forward``/``backward``, a parallel op through its assembly rule), values
are freed after their last read, and a failure is re-raised as "node X: ...". What a
step sends and receives is worked out once, when the executor is built, from the global
:class:`~.program.Program`, so a training step only posts buffers.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

import numpy as np

from .. import kernels
from ..errors import RunError
from ..ir.machine_view import MachineView
from ..ir.opspec import OpKind
from ..ir.pcg import PCG, TensorRef
from ..ir.pieces import piece_attrs, piece_region
from ..ir.schedule import read_shape
from ..ir.training import Training
from .comm import Comm, make_comm
from .ledger import Ledger, root
from .loss import LossKind, loss_and_grad, loss_count
from .optim import Optimizer, OptimizerConfig
from .phases import StepClock, TimedComm
from .program import (
    LOCAL,
    Action,
    Assemble,
    Collective,
    CollectiveKind,
    Program,
    Read,
    Step,
    StepKind,
    StepOrder,
    Task,
    build_program,
)
from .weights import ParamStore


def build_executor(pcg: PCG, views: Sequence[MachineView], class_axis: int | None, backend: str, world: Any,
                   xp: Any, trainable: Mapping[str, np.ndarray], optimizer: OptimizerConfig, loss: LossKind,
                   constants: Mapping[str, np.ndarray], bucket_bytes: int = 0, training: Training = Training()
                   ) -> tuple[Program, Comm, ParamStore, Executor]:
    """This rank's program, communicator, weights and executor for a mapped graph;
    ``bucket_bytes`` is the gradient sync's (``ir/buckets.py``: 0, flat after backward),
    ``training`` the step's ZeRO stage and recomputation (``ir/training.py``)."""
    program = build_program(pcg, views, class_axis)
    comm = TimedComm(make_comm(backend, world))
    comm.setup_groups(program.groups)
    params = ParamStore(program, comm, xp, trainable, Optimizer(optimizer, xp), bucket_bytes,
                        training.stages(program.pcg))
    return program, comm, params, Executor(program, comm, xp, params, loss, constants, training)


def _address(a: Any) -> int:
    return a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data    # cupy | numpy


@dataclass(frozen=True, slots=True)
class _Stashed:
    """An array of a kernel's context given up until backward (``Executor._stash``): a view
    of weight piece ``ref``'s memory, at ``offset`` bytes into it."""

    ref: TensorRef
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def of(a: Any, refs: Mapping[int, TensorRef]) -> Any:
        """``a`` stashed if its memory is that of one of ``refs`` (by owner id), else ``a``."""
        r = root(a)
        if id(r) not in refs:
            return a
        return _Stashed(refs[id(r)], _address(a) - _address(r), tuple(a.shape), tuple(a.strides))

    def view(self, piece: Any) -> Any:
        """The same view of ``piece``'s memory (the piece gathered again: the same layout)."""
        r = root(piece)
        if hasattr(r.data, "ptr"):                                      # cupy
            import cupy  # noqa: PLC0415
            return cupy.ndarray(self.shape, r.dtype, cupy.cuda.MemoryPointer(r.data.mem, r.data.ptr - r.data.mem.ptr
                                                                             + self.offset), self.strides)
        return np.ndarray(self.shape, r.dtype, r, self.offset, self.strides)


def _swap(obj: Any, fn: Callable[[Any], Any], also: type | None = None) -> Any:
    """``obj`` (a kernel's context: nested tuples, lists and dataclasses of arrays) with each
    array ``a`` (and each ``also`` instance) replaced by ``fn(a)``."""
    if hasattr(obj, "nbytes") and hasattr(obj, "shape") or also is not None and isinstance(obj, also):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):      # a named tuple
        return type(obj)(*(_swap(x, fn, also) for x in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_swap(x, fn, also) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _swap(getattr(obj, f.name), fn, also)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


LOSS_TAG = 32001
GRAD_TAG = 32002


@dataclass
class RankStep:
    """What this rank does in one step (precomputed)."""

    step: Step
    tag: int
    active: bool                                     # backward runs for the step's node
    task: Task | None = None
    ti: int = -1
    recv: list[tuple[int, int, tuple[int, ...], Any]] = field(default_factory=list)  # (read, src, shape, dtype)
    remote: frozenset[int] = frozenset()             # the reads that ``recv`` brings (set once planned)
    send: list[tuple[int, Read]] = field(default_factory=list)                     # (dest, read)
    colls: list[Collective] = field(default_factory=list)
    # backward: the gradients of my remote reads I send back, of my pieces others read I
    # receive, and the collectives whose gradient flows (all only where a gradient is needed)
    grad_send: list[tuple[int, int, tuple[int, ...], Any]] = field(default_factory=list)  # recv entries
    grad_recv: list[tuple[int, Read]] = field(default_factory=list)                       # send entries
    colls_back: list[Collective] = field(default_factory=list)
    covered: set[int] = field(default_factory=set)   # reads of my task a collective supplies
    gather: tuple[int, int, int] | None = None        # Gather of a split table: (offset, rows, table rows)
    attrs: Any = None
    wanted: tuple[bool, ...] | None = None           # the inputs whose gradient backward makes
    free: list[TensorRef] = field(default_factory=list)


class Executor:
    """Runs training steps of a program on one rank.

    ``params`` keeps the trainable weights, ``constants`` maps the names of the other
    Weight sources to their values; graph inputs come with each :meth:`step`.
    """

    def __init__(self, program: Program, comm: Comm, xp: Any, params: ParamStore, loss: LossKind,
                 constants: Mapping[str, np.ndarray], training: Training = Training()):
        self.p = program
        self.comm = comm
        self.xp = xp
        self.params = params
        self.loss_kind = loss
        self.constants = constants
        self.me = comm.rank
        self.mine = [self._plan_step(k, s) for k, s in enumerate(program.steps)]
        self.order = StepOrder.of(program, training.recompute, training.recompute_segments)
        self._free = [[r for r in m.free if r not in self.order.kept] for m in self.mine]
        self._unit_refs = {w: [TensorRef(node) for node, _, _ in params._by_node[w].pieces[self.me]]
                           for w in params.units}     # ZeRO-3: each gathered weight's resident pieces
        self._resident = params.residents()
        self._cut: dict[tuple, Any] = {}           # constants' pieces, cut once
        self._fed: dict[Any, Any] = {}             # this step's inputs' pieces
        self._inputs: Mapping[str, Any] = {}
        self._lead = next((g for g in program.loss_groups if g.leader == self.me), None)
        self._member = next((g for g in program.loss_groups for r, _, _ in g.members if r == self.me), None)
        self.loss_count = loss_count(loss, program.pcg.shape(program.output).sizes)
        self.timings: dict[tuple[int, str], list[float]] | None = None
        """Set to a dict to record each compute task's seconds per (node, "fwd" | "bwd" |
        "again"): "again" is a recompute, a forward run inside the backward pass."""
        self.own_work: dict[tuple[int, str], list[tuple[float, float]]] = {}
        """With ``timings``: per (node, "fwd" | "bwd") of a parallel op whose pass makes a call,
        the pass's seconds and those of them inside the communicator (the rest is the
        executor's own work around its calls: buffers, copies, the calls' bookkeeping)."""
        self.pass_seconds: dict[str, list[float]] = {}
        """With ``timings``: the seconds of each forward and backward pass over the tasks."""
        self.clock: StepClock | None = None
        """Set to time each step's phases (``phases.py``); the caller closes each step."""
        self.ledger: Ledger | None = None
        """Measures the bytes this rank holds between actions (``ledger.py``; see :meth:`measure`)."""
        self.ctx_keys: dict[int, list] = {}
        self._unkeyed: dict[tuple[int, int], list[TensorRef]] = {}   # ZeRO-3: the ledger's keys a stash took
        self._target: Any = None
        self.loss_scale = 1.0

    def measure(self, ledger: Ledger | None) -> None:
        """Measure what this rank holds with ``ledger`` from now on (None: stop)."""
        self.ledger = ledger
        self.params.sample = ledger.sample if ledger else None

    # -- planning ------------------------------------------------------------------

    def reload(self) -> None:
        """Cut the resident pieces again from the masters (after ``params.load``)."""
        self._resident = self.params.residents()

    def _plan_step(self, k: int, step: Step) -> RankStep:
        return plan_step(self.p, self.me, k, step)

    def _read_shape(self, rd: Read) -> tuple[int, ...]:
        return read_shape(self.p.pcg, rd)

    def _dtype(self, ref: TensorRef) -> Any:
        return self.p.pcg.shape(ref).dtype.numpy

    # -- a step ----------------------------------------------------------------------

    def step(self, inputs: Mapping[str, Any], target: Any, fault: str | None = None, apply: bool = True) -> float:
        """One training step of one micro-batch (see :meth:`train_step`)."""
        return self.train_step([(inputs, target)], fault, apply)

    def train_step(self, batches: Sequence[tuple[Mapping[str, Any], Any]], fault: str | None = None,
                   apply: bool = True) -> float:
        """One training step on this rank's pieces: forward and backward of each micro-batch
        (``batches``: its inputs and target), their gradients added up, then one sync and
        update; returns the (global) loss, the mean of the micro-batches'. With ``fault``
        the rank fails with that message halfway through the first forward pass (for tests).
        Without ``apply`` the weights stay as they were and the resident pieces' gradients
        are left in ``pending`` (one micro-batch only)."""
        k = len(batches)
        if k < 1 or not apply and k > 1:
            raise ValueError(f"a step of {k} micro-batches{'' if apply else ' without an update'}")
        self.loss_scale = 1.0 / k      # the step's loss is the micro-batches' mean
        if apply:
            self.params.clear_seeds()
        clock = self.clock
        if clock:
            clock.start()
        total = 0.0
        for j, (inputs, target) in enumerate(batches):
            total += self._micro_batch(inputs, target, fault if j == 0 else None, apply, last=j == k - 1)
        if apply:
            self.params.update(self.grads)
            self._resident = self.params.residents()
        else:
            self.pending = self.grads    # --check's one-process run: the gradients, weights untouched
        self.grads = {}
        if apply and self.ledger:
            self.ledger.sample()
        if clock:
            clock.lap("optimizer", "grad_sync")
        return total / k

    def _micro_batch(self, inputs: Mapping[str, Any], target: Any, fault: str | None, apply: bool,
                     last: bool) -> float:
        """Forward, loss and backward of one micro-batch; the gradients of one before the
        last are added into the weights' buffers (``ParamStore.accumulate``)."""
        self._inputs, self._target = inputs, target
        self._fed = {}
        self.values: dict[TensorRef, Any] = dict(self._resident)
        # weights whose gradient backward makes in the sync's buffer (ParamStore.seeds)
        self.grads: dict[TensorRef, Any] = dict(self.params.seeds) if apply else {}
        self._fresh: set[TensorRef] = set(self.grads)
        self.ctx: dict[int, Any] = {}
        self.ctx_keys = {}
        ledger = self.ledger
        half = len(self.mine) // 2
        clock = self.clock
        # the buckets whose gradients are whole start their all-reduce (bucketed, in the last
        # micro-batch) or their reduce-scatter (ZeRO-2/3, in each)
        bucketed = apply and (last and self.params.bucket_bytes > 0 or self.params.scatters_in_backward)
        order = self.order
        loss = 0.0
        t0 = time.perf_counter()
        units = self.params.units
        for j, (act, k) in enumerate(order.actions):
            for w in order.first_use.get(j, ()) if units else ():     # ZeRO-3: gathered for the pass
                if w in units:
                    self.values.update(self.params.gather_unit(w))
                    if w in order.regain.get(j, ()):
                        self._restore(w)
            for w in order.prefetch.get(j, ()) if units else ():      # and the next one started
                if w in units:
                    self.params.start_gather(w)
            match act:
                case Action.FORWARD:
                    if fault and k == half:
                        raise RunError(fault)
                    self._guard(self.mine[k], self._forward if k not in order.no_context else self._forward_only)
                    for ref in self._free[k]:
                        self.values.pop(ref, None)
                case Action.LOSS:
                    if self.timings is not None:
                        self.pass_seconds.setdefault("fwd", []).append(time.perf_counter() - t0)
                    if clock:
                        clock.lap("fwd_compute", "fwd_comm")
                    loss = self._loss_step(target)
                    if clock:  # the loss's gathering and all-reduce (waiting for the other ranks) is communication
                        clock.lap("loss", "fwd_comm")
                    t0 = time.perf_counter()
                case Action.RECOMPUTE:
                    self._guard(self.mine[k], self._forward, "again")
                case Action.BACKWARD:
                    m = self.mine[k]
                    if m.active:
                        self._guard(m, self._backward)
                    if bucketed:
                        self.params.backward_passed(self.mine[k - 1].step.node if k else -1, self.grads)
                case Action.DROP:
                    for i in order.segments[k]:
                        for o in range(len(self.p.pcg.nodes[self.mine[i].step.node].outputs)):
                            self.values.pop(TensorRef(self.mine[i].step.node, o), None)
                case _:
                    assert_never(act)
            for w in order.drop.get(j, ()) if units else ():          # contexts give it up for backward
                if w in units:
                    self._stash(w)
            for w in order.last_use.get(j, ()) if units else ():      # and freed after it
                if w in units:
                    for ref in self._unit_refs[w]:
                        self.values.pop(ref, None)
            if ledger:
                ledger.sample()
        if self.timings is not None:
            self.pass_seconds.setdefault("bwd", []).append(time.perf_counter() - t0)
        self.values = {}
        if not last:
            self.params.accumulate(self.grads)
            self.grads = {}
            if ledger:
                ledger.sample()
        if clock:
            clock.lap("bwd_compute", "bwd_comm")
        return loss

    def _guard(self, m: RankStep, fn: Callable[[RankStep], None], timed: str | None = None) -> None:
        """Run ``fn(m)``; a failure becomes a RunError naming the node. ``timed``: the key its
        seconds go under (default "bwd" for a backward, "fwd" for a forward)."""
        try:
            if self.timings is None:
                fn(m)
                return
            t0, talk = time.perf_counter(), self.comm.seconds
            fn(m)
            spent = time.perf_counter() - t0
            key = (m.step.node, timed or ("bwd" if fn == self._backward else "fwd"))
            if m.task is not None and m.task.assemble is Assemble.KERNEL:
                self.timings.setdefault(key, []).append(spent)
            elif self.p.pcg.nodes[m.step.node].spec.is_parallel_op and self.comm.seconds > talk:
                self.own_work.setdefault(key, []).append((spent, self.comm.seconds - talk))
        except RunError:
            raise
        except Exception as e:
            n = self.p.pcg.nodes[m.step.node]
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise RunError(f"node {n.name or m.step.node!r} ({n.kind}): {msg}") from e

    # -- forward ---------------------------------------------------------------------

    def _local(self, rd: Read) -> Any:
        """A piece this rank holds or makes (data and constants are cut where they are read)."""
        if rd.src == LOCAL:
            return self._source_piece(rd)
        v = self.values[rd.ref]
        return v if rd.region is None else v[rd.region]

    def _source_piece(self, rd: Read) -> Any:
        i = rd.ref.node
        src = self.p.layout[i]
        node = self.p.pcg.nodes[src]
        is_input = node.kind == OpKind.Input
        key = (i, rd.coord, None if rd.region is None else tuple((s.start, s.stop) for s in rd.region))
        cache = self._fed if is_input else self._cut
        if key in cache:
            return cache[key]
        if src not in cache:
            value = self._inputs[node.name] if is_input else self.constants[node.name]
            cache[src] = self.xp.asarray(value)
        shape = self.p.pcg.nodes[i].outputs[0]
        piece = cache[src][piece_region(shape, rd.coord) or ...]   # (a 0-d piece: a view, not a scalar)
        scale = self.p.scale[i]
        if scale != 1:
            piece = piece * piece.dtype.type(scale)
        if rd.region is not None:
            piece = piece[rd.region]
        cache[key] = piece
        return piece

    def _forward_only(self, m: RankStep) -> None:
        """A recomputed step's forward: its context is not kept (backward makes it again)."""
        self._forward(m, keep=False)

    def _stash(self, w: int) -> None:
        """ZeRO-3: the contexts of weight ``w``'s readers give up its gathered pieces (each
        array that is one of them, or a view of one, becomes a :class:`_Stashed`), so the
        gather is freed after the forward pass; :meth:`_restore` gives them back."""
        held = [r for r in self._unit_refs[w] if r in self.values]
        refs = {id(root(self.values[r])): r for r in held}
        gone = {("ref", r) for r in held}
        for k in self.order.stashed.get(w, ()):
            i = self.mine[k].step.node
            if i not in self.ctx:
                continue
            ctx = self.ctx[i]
            self.ctx[i] = dataclasses.replace(ctx, saved=_swap(ctx.saved, lambda a: _Stashed.of(a, refs)))
            if i in self.ctx_keys:
                self._unkeyed[(i, w)] = [e[0][1] for e in self.ctx_keys[i] if e[0] in gone]
                self.ctx_keys[i] = [e for e in self.ctx_keys[i] if e[0] not in gone]

    def _restore(self, w: int) -> None:
        """ZeRO-3: the contexts :meth:`_stash` emptied take weight ``w``'s pieces back from its
        backward gather (each as the same view of the new array)."""
        mine = set(self._unit_refs[w])

        def back(a: Any) -> Any:
            return a.view(self.values[a.ref]) if isinstance(a, _Stashed) and a.ref in mine else a

        for k in self.order.stashed.get(w, ()):
            i = self.mine[k].step.node
            if i not in self.ctx:
                continue
            ctx = self.ctx[i]
            self.ctx[i] = dataclasses.replace(ctx, saved=_swap(ctx.saved, back, _Stashed))
            if self.ledger and i in self.ctx_keys:
                self.ledger.refresh()
                self.ctx_keys[i] += [self.ledger.value_entry(r, self.values[r]) for r in self._unkeyed.pop((i, w), ())]

    def _forward(self, m: RankStep, keep: bool = True) -> None:
        xp, t = self.xp, m.task
        ins: list[Any] = [None] * (len(t.reads) if t else 0)
        recvs = []
        for ri, src, shape, dtype in m.recv:
            buf = xp.empty(shape, dtype=dtype)
            ins[ri] = buf
            recvs.append((src, buf))
        sends = [(dst, xp.ascontiguousarray(self._local(rd))) for dst, rd in m.send]
        if sends or recvs:
            self.comm.exchange(sends, recvs, m.tag)
        if t is not None:
            for ri, rd in enumerate(t.reads):
                if ins[ri] is None and ri not in m.covered:
                    ins[ri] = self._local(rd)
        step = m.step
        if step.kind is StepKind.FUSED:
            self._fused_forward(m)
            return
        for c in m.colls:
            self._collective_forward(m, c, ins)
        if t is None:
            return
        i = step.node
        if step.kind is StepKind.COMPUTE:
            if m.gather is not None:
                ins[1] = self._shift_indices(ins[1], *m.gather)
            outs, ctx = kernels.forward(m.attrs, ins, xp)
            if m.active and keep:
                self.ctx[i] = ctx
                if self.ledger:
                    self.ctx_keys[i] = self.ledger.ctx_keys(m, ins, outs, ctx.saved)
            for k, v in enumerate(outs):
                self.values[TensorRef(i, k)] = v
            return
        if len(ins) == 1 and isinstance(ins[0], _Summed):
            out = ins[0].value
        else:
            match t.assemble:
                case Assemble.COPY:
                    out = ins[0]
                case Assemble.CONCAT:
                    out = xp.concatenate(ins, axis=t.axis)
                case Assemble.SUM:
                    out = ins[0]
                    for v in ins[1:]:
                        out = out + v
                case _:
                    raise AssertionError(t.assemble)
        self.values[TensorRef(i)] = out

    def _shift_indices(self, idx: Any, offset: int, rows: int, total: int) -> Any:
        """Global ids -> ids in this table piece; ids of other pieces -> out of range (zeros)."""
        xp = self.xp
        idx = xp.where(idx < 0, idx + total, idx) - offset
        return xp.where((idx >= 0) & (idx < rows), idx, rows)

    def _collective_forward(self, m: RankStep, c: Collective, ins: list[Any]) -> None:
        xp, t = self.xp, m.task
        tasks = m.step.tasks
        match c.kind:
            case CollectiveKind.BCAST:
                rd = tasks[c.covered[0][0]].reads[c.covered[0][1]]
                if self.me == c.root:
                    buf = xp.ascontiguousarray(self._local(Read(rd.ref, rd.coord, c.root, rd.region)))
                else:
                    buf = xp.empty(self._read_shape(rd), dtype=self._dtype(rd.ref))
                self.comm.bcast(c.group, buf, c.root)
                for ti, ri in c.covered:
                    if ti == m.ti:
                        ins[ri] = buf
            case CollectiveKind.REDUCE:
                task = tasks[c.covered[0][0]]
                rd = next(r for r in task.reads if r.src == self.me)
                buf = xp.array(self._local(rd), copy=True, order="C")
                self.comm.reduce(c.group, buf, c.root)
                if t is not None and m.ti == c.covered[0][0]:
                    ins[:] = [_Summed(buf)]
            case _:
                raise AssertionError(c.kind)

    def _fused_forward(self, m: RankStep) -> None:
        xp = self.xp
        src = m.step.source
        for c in m.colls:
            mine = xp.ascontiguousarray(self.values[src])
            if c.kind is CollectiveKind.ALLREDUCE:
                buf = xp.array(mine, copy=True, order="C")
                self.comm.allreduce(c.group, buf)
                out = buf
            else:
                recv = xp.empty((len(c.group),) + mine.shape, dtype=mine.dtype)
                self.comm.allgather(c.group, mine, recv)
                order = sorted(range(len(c.group)), key=lambda j: c.positions[j])
                out = xp.concatenate([recv[j] for j in order], axis=c.axis)
            self.values[TensorRef(m.step.node)] = out

    # -- loss ------------------------------------------------------------------------

    def _loss_step(self, target: Any) -> float:
        xp, p = self.xp, self.p
        out = p.output
        lead, member = self._lead, self._member
        sends, recvs, parts = [], [], []
        if member is not None and member.leader != self.me:
            sends.append((member.leader, xp.ascontiguousarray(self.values[out])))
        if lead is not None:
            for rank, _, part in lead.members:
                if rank == self.me:
                    parts.append((part, self.values[out]))
                else:
                    buf = xp.empty(_region_shape(part), dtype=self._dtype(out))
                    recvs.append((rank, buf))
                    parts.append((part, buf))
        self.comm.exchange(sends, recvs, LOSS_TAG)
        total = 0.0
        grad_sends, grad_recvs = [], []
        wants_grad = out in p.has_grad
        if lead is not None:
            full = xp.zeros(_region_shape(lead.region), dtype=self._dtype(out))
            for part, v in parts:
                full[part] += v
            t = target[lead.region if self.loss_kind is LossKind.MSE else lead.region[:-1]]
            total, grad = loss_and_grad(self.loss_kind, full, t, self.loss_count, xp)
            if self.loss_scale != 1.0:      # one of several micro-batches: the step's loss is their mean
                grad *= grad.dtype.type(self.loss_scale)
            if wants_grad:
                for rank, _, part in lead.members:
                    g = xp.ascontiguousarray(grad[part])
                    if rank == self.me:
                        self.grads[out] = g
                    else:
                        grad_sends.append((rank, g))
        if wants_grad and member is not None and member.leader != self.me:
            buf = xp.empty(self.values[out].shape, dtype=self._dtype(out))
            grad_recvs.append((member.leader, buf))
            self.grads[out] = buf
        self.comm.exchange(grad_sends, grad_recvs, GRAD_TAG)
        return self.comm.sum_host(total) if self.comm.size > 1 else total

    # -- backward --------------------------------------------------------------------

    def _accumulate(self, ref: TensorRef, g: Any, region: Any = None) -> None:
        if g is None:
            return
        cur = self.grads.get(ref)
        if region is None:
            if cur is None:
                self.grads[ref] = g
            elif ref in self._fresh:
                cur += g
            else:
                self.grads[ref] = cur + g
                self._fresh.add(ref)
            return
        if cur is None or ref not in self._fresh:
            dims = self.p.pcg.shape(ref).piece.dims
            base = self.xp.zeros(dims, dtype=self._dtype(ref)) if cur is None else cur.copy()
            self.grads[ref] = base
            self._fresh.add(ref)
        self.grads[ref][region] += g

    def _backward(self, m: RankStep) -> None:
        xp, p, t, step = self.xp, self.p, m.task, m.step
        if step.kind is StepKind.FUSED:
            self._fused_backward(m)
            return
        read_grads: list[Any] = []
        if t is not None:
            i = step.node
            node = p.pcg.nodes[i]
            gs = [self.grads.pop(TensorRef(i, k), None) for k in range(len(node.outputs))]
            if step.kind is StepKind.COMPUTE:
                ctx = self.ctx.pop(i, None)
                self.ctx_keys.pop(i, None)
                if all(g is None for g in gs):
                    read_grads = [None] * len(t.reads)
                else:
                    read_grads = list(kernels.backward(m.attrs, ctx, gs, xp, m.wanted))
            else:
                g = gs[0]
                match t.assemble:
                    case Assemble.COPY:
                        read_grads = [g]
                    case Assemble.CONCAT:
                        read_grads = xp.split(g, len(t.reads), axis=t.axis) if g is not None else [None] * len(t.reads)
                    case Assemble.SUM:
                        read_grads = [g] * len(t.reads)
        sends, recvs = [], []
        for ri, src, shape, dtype in m.grad_send:
            g = read_grads[ri]
            sends.append((src, xp.ascontiguousarray(g) if g is not None else xp.zeros(shape, dtype=dtype)))
        for dst, rd in m.grad_recv:
            buf = xp.empty(self._read_shape(rd), dtype=self._dtype(rd.ref))
            recvs.append((dst, buf, rd))
        if sends or recvs:
            self.comm.exchange(sends, [(d, b) for d, b, _ in recvs], m.tag)
        for _, buf, rd in recvs:
            self._accumulate(rd.ref, buf, rd.region)
        if t is not None:
            remote = m.remote
            for ri, rd in enumerate(t.reads):
                if ri in remote or ri in m.covered or rd.src == LOCAL or rd.ref not in p.has_grad:
                    continue
                self._accumulate(rd.ref, read_grads[ri], rd.region)
        for c in reversed(m.colls_back):
            self._collective_backward(m, c, read_grads)

    def _collective_backward(self, m: RankStep, c: Collective, read_grads: list[Any]) -> None:
        xp = self.xp
        tasks = m.step.tasks
        rd = tasks[c.covered[0][0]].reads[c.covered[0][1]]
        match c.kind:
            case CollectiveKind.BCAST:
                buf = xp.zeros(self._read_shape(rd), dtype=self._dtype(rd.ref))
                for ti, ri in c.covered:
                    if ti == m.ti and read_grads[ri] is not None:
                        buf += read_grads[ri]
                self.comm.reduce(c.group, buf, c.root)
                if self.me == c.root:
                    self._accumulate(rd.ref, buf, rd.region)
            case CollectiveKind.REDUCE:
                task = tasks[c.covered[0][0]]
                mine = next(r for r in task.reads if r.src == self.me)
                if self.me == c.root and read_grads and read_grads[0] is not None:
                    buf = xp.array(read_grads[0], copy=True, order="C")
                else:
                    buf = xp.zeros(self._read_shape(mine), dtype=self._dtype(mine.ref))
                self.comm.bcast(c.group, buf, c.root)
                self._accumulate(mine.ref, buf, mine.region)
            case _:
                raise AssertionError(c.kind)

    def _fused_backward(self, m: RankStep) -> None:
        xp = self.xp
        src = m.step.source
        if not m.colls_back:
            return
        g = self.grads.pop(TensorRef(m.step.node), None)
        dims = self.p.pcg.shape(src).piece.dims
        dtype = self._dtype(src)
        for c in m.colls_back:
            if c.kind is CollectiveKind.ALLREDUCE:
                buf = xp.array(g, copy=True, order="C") if g is not None else xp.zeros(dims, dtype=dtype)
                self.comm.allreduce(c.group, buf)
            else:
                n = len(c.group)
                full = g if g is not None else xp.zeros(self.p.pcg.nodes[m.step.node].outputs[0].piece.dims,
                                                         dtype=dtype)
                parts = xp.split(full, n, axis=c.axis)
                send = xp.ascontiguousarray(xp.stack([parts[c.positions[j]] for j in range(n)]))
                buf = xp.empty(dims, dtype=dtype)
                self.comm.reduce_scatter(c.group, send, buf)
            self._accumulate(src, buf)


@dataclass
class _Summed:
    """A sum a reduce collective already made (the task just takes it)."""

    value: Any


def _region_shape(region: Any) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in region)


def plan_step(p: Program, me: int, k: int, step: Step) -> RankStep:
    """What rank ``me`` does in step ``k`` of a program: its task, what it sends and
    receives, forward and backward, and the collectives it is in (worked out once)."""
    pcg = p.pcg
    node = pcg.nodes[step.node]
    active = any(TensorRef(step.node, j) in p.has_grad for j in range(len(node.outputs)))
    m = RankStep(step, k % 30000, active)
    m.colls = [c for c in step.collectives if me in c.group]
    covered_all = {(ti, ri) for c in step.collectives for ti, ri in c.covered}
    for ti, t in enumerate(step.tasks):
        for ri, rd in enumerate(t.reads):
            if (ti, ri) in covered_all or rd.src in (LOCAL, t.rank):
                continue
            if t.rank == me:
                m.recv.append((ri, rd.src, read_shape(pcg, rd), pcg.shape(rd.ref).dtype.numpy))
            elif rd.src == me:
                m.send.append((t.rank, rd))
        if t.rank == me:
            m.task, m.ti = t, ti
            m.covered = {ri for tj, ri in covered_all if tj == ti}
    if active:
        if m.task is not None:
            m.grad_send = [e for e in m.recv if m.task.reads[e[0]].ref in p.has_grad]
        m.grad_recv = [(dst, rd) for dst, rd in m.send if rd.ref in p.has_grad]
        if step.kind is StepKind.FUSED:
            m.colls_back = list(m.colls) if step.source in p.has_grad else []
        else:
            m.colls_back = [c for c in m.colls if step.tasks[c.covered[0][0]].reads[c.covered[0][1]].ref in p.has_grad]
    if step.kind is StepKind.COMPUTE:
        m.attrs = piece_attrs(node)
        m.wanted = tuple(r in p.has_grad for r in node.inputs)
        if node.kind == OpKind.Gather and m.task is not None:
            m.gather = _gather_shift(p, step.node, m.task)
        elif node.kind == OpKind.GroupedGather and m.task is not None:
            shift = _gather_shift(p, step.node, m.task)   # the kernel offsets the ids itself
            m.attrs = dataclasses.replace(m.attrs, base=shift[0]) if shift else m.attrs
    m.remote = frozenset(ri for ri, *_ in m.recv)
    m.free = [ref for ref, last in p.last_read.items()
              if last == k and ref != p.output and p.layout[ref.node] is None]
    return m


def _gather_shift(p: Program, i: int, t: Task) -> tuple[int, int, int] | None:
    """A table split along the gathered axis: this piece holds rows offset..offset+rows."""
    n = p.pcg.nodes[i]
    table = p.pcg.shape(n.inputs[0])
    axis = getattr(n.op, "axis", 0)   # a GroupedGather's tables are stacked by rows
    if table.degrees[axis] == 1:
        return None
    rows = table.piece.dims[axis]
    return t.reads[0].coord[axis] * rows, rows, table.sizes[axis]
