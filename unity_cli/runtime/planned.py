"""What a rank sends in a training step, without running it: the data-plane calls
:class:`~.executor.Executor` and :class:`~.weights.ParamStore` post, in order, from the same
plans (:func:`planned_calls`), and their bytes counted as :class:`~.phases.TimedComm` counts
the real calls (:func:`planned_sent`). ``unity run`` holds the two equal."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import assert_never

import numpy as np

from ..ir.buckets import SyncCall, SyncCallKind, SyncWhen, sync_buckets, sync_calls
from ..ir.pcg import TensorRef
from ..ir.schedule import read_shape
from ..ir.training import Training
from .executor import GRAD_TAG, LOSS_TAG, RankStep, plan_step
from .phases import Buf, ByteCounter, count_call
from .program import Action, CollectiveKind, Program, StepKind, StepOrder
from .weights import weight_syncs


def planned_calls(p: Program, me: int, size: int, training: Training = Training()) -> list[tuple[str, tuple]]:
    """The data-plane calls rank ``me`` of ``size`` makes in one training step, in order, as
    ``(Comm method, its arguments)`` with :class:`~.phases.Buf` standing for each array:
    what :class:`Executor` and :class:`~.weights.ParamStore` post, from the same plans:
    each micro-batch's, then the sync's (``ir/buckets.sync_calls``)."""
    # ParamStore's gradient sync, per flat bucket (ir/buckets.py) this rank is in: under ZeRO-2
    # a reduce-scatter at the end of each micro-batch; then those of the sync (an all-reduce,
    # or a reduce-scatter), and after the update the rest (ZeRO's all-gathers)
    buckets = [b for b in sync_buckets(p.pcg, weight_syncs(p), 0, training.stages(p.pcg)) if me in b.group]
    mine = [c for b in buckets for c in sync_calls(b)]
    # ZeRO-2/3: each bucket reduce-scattered once backward has made its gradients (b.ready)
    scatters = [(b.ready, _sync_calls([c for c in sync_calls(b) if c.when is SyncWhen.MICRO_BATCH]))
                for b in buckets]
    # ZeRO-3: each weight gathered before each pass that reads it
    gathers = {b.weights[0]: _sync_calls([c for c in sync_calls(b) if c.when is SyncWhen.BEFORE_USE])
               for b in buckets}
    calls = _micro_batch_calls(p, me, size, StepOrder.of(p, training.recompute, training.recompute_segments),
                                gathers, scatters) \
        * training.micro_batches
    calls += _sync_calls([c for c in mine if c.when is SyncWhen.SYNC])
    calls += _sync_calls([c for c in mine if c.when is SyncWhen.AFTER_UPDATE])
    return calls


def _sync_calls(calls: Sequence[SyncCall]) -> list[tuple[str, tuple]]:
    """:func:`planned_calls`' entries of gradient-sync calls (``ir/buckets.sync_calls``)."""
    out: list[tuple[str, tuple]] = []
    for c in calls:
        piece, whole = Buf(c.nbytes), Buf(c.nbytes * len(c.group))   # whole: the padded flat buffer
        match c.kind:
            case SyncCallKind.ALL_REDUCE:
                out.append(("allreduce", (c.group, piece)))
            case SyncCallKind.REDUCE_SCATTER:
                out.append(("reduce_scatter", (c.group, whole, piece)))
            case SyncCallKind.ALL_GATHER:
                out.append(("allgather", (c.group, piece, whole)))
            case _:
                assert_never(c.kind)
    return out


def _micro_batch_calls(p: Program, me: int, size: int, order: StepOrder,
                       gathers: Mapping[int, list[tuple[str, tuple]]],
                       scatters: Sequence[tuple[int, list[tuple[str, tuple]]]]) -> list[tuple[str, tuple]]:
    """The calls of :func:`planned_calls` that one micro-batch's forward, loss, recomputes and
    backward make, in ``order``; ``gathers``: a ZeRO-3 weight's calls before a pass reads it;
    ``scatters``: each ZeRO-2/3 bucket's ready index and calls (``ParamStore.backward_passed``)."""
    pcg = p.pcg
    mine = [plan_step(p, me, k, s) for k, s in enumerate(p.steps)]
    calls: list[tuple[str, tuple]] = []

    def nbytes(shape: tuple[int, ...], ref: TensorRef) -> Buf:
        return Buf(math.prod(shape) * pcg.shape(ref).dtype.itemsize)

    def piece(ref: TensorRef) -> Buf:
        return nbytes(pcg.shape(ref).piece.dims, ref)

    def forward(m: RankStep) -> None:
        if m.recv or m.send:
            calls.append(("exchange", ([(dst, nbytes(read_shape(pcg, rd), rd.ref)) for dst, rd in m.send],
                                       [(src, Buf(math.prod(shape) * np.dtype(dt).itemsize))
                                        for _, src, shape, dt in m.recv], m.tag)))
        if m.step.kind is StepKind.FUSED:
            calls.extend(_fused_calls(m.colls, piece(m.step.source), backward=False))
            return
        for c in m.colls:
            rd = m.step.tasks[c.covered[0][0]].reads[c.covered[0][1]]
            name = "bcast" if c.kind is CollectiveKind.BCAST else "reduce"
            calls.append((name, (c.group, nbytes(read_shape(pcg, rd), rd.ref), c.root)))

    def loss() -> None:
        out = p.output
        lead = next((g for g in p.loss_groups if g.leader == me), None)
        member = next((g for g in p.loss_groups for r, _, _ in g.members if r == me), None)
        sends = [(member.leader, piece(out))] if member is not None and member.leader != me else []
        recvs = [(r, piece(out)) for r, _, _ in lead.members if r != me] if lead is not None else []
        calls.append(("exchange", (sends, recvs, LOSS_TAG)))
        grad = out in p.has_grad
        gsends = [(r, piece(out)) for r, _, _ in lead.members if r != me] if lead is not None and grad else []
        grecvs = [(member.leader, piece(out))] if grad and member is not None and member.leader != me else []
        calls.append(("exchange", (gsends, grecvs, GRAD_TAG)))
        if size > 1:
            calls.append(("sum_host", (0.0,)))

    def backward(m: RankStep) -> None:
        if not m.active:
            return
        if m.step.kind is StepKind.FUSED:
            calls.extend(_fused_calls(m.colls_back, piece(m.step.source), backward=True))
            return
        if m.grad_send or m.grad_recv:
            calls.append(("exchange", ([(src, Buf(math.prod(shape) * np.dtype(dt).itemsize))
                                        for _, src, shape, dt in m.grad_send],
                                       [(dst, nbytes(read_shape(pcg, rd), rd.ref)) for dst, rd in m.grad_recv], m.tag)))
        for c in reversed(m.colls_back):
            task = m.step.tasks[c.covered[0][0]]
            rd = task.reads[c.covered[0][1]] if c.kind is CollectiveKind.BCAST else \
                next(r for r in task.reads if r.src == me)
            name = "reduce" if c.kind is CollectiveKind.BCAST else "bcast"
            calls.append((name, (c.group, nbytes(read_shape(pcg, rd), rd.ref), c.root)))

    issued = 0
    started: set[int] = set()
    for j, (act, k) in enumerate(order.actions):
        for w in order.first_use.get(j, ()):
            if w in started:
                started.discard(w)
                calls.append(("wait", ([None],)))
            else:
                calls.extend(gathers.get(w, ()))
        for w in order.prefetch.get(j, ()):
            if gathers.get(w):
                started.add(w)
                calls.extend(("iallgather", args) for _, args in gathers[w])
        match act:
            case Action.FORWARD | Action.RECOMPUTE:
                forward(mine[k])
            case Action.LOSS:
                loss()
            case Action.BACKWARD:
                backward(mine[k])
                after = mine[k - 1].step.node if k else -1
                while issued < len(scatters) and scatters[issued][0] > after:
                    calls.extend(scatters[issued][1])
                    issued += 1
            case Action.DROP:
                pass
            case _:
                assert_never(act)
    return calls + [c for _, cs in scatters[issued:] for c in cs]


def planned_sent(p: Program, me: int, size: int, training: Training = Training()) -> ByteCounter:
    """The bytes rank ``me`` sends in a training step, counted as :class:`~.phases.TimedComm`
    counts the real calls."""
    counter = ByteCounter()
    for name, args in planned_calls(p, me, size, training):
        count_call(counter, name, me, size, args)
    return counter


def _fused_calls(colls, src, backward: bool) -> list[tuple]:
    """The calls of a fused pair's collectives on piece ``src``: all-reduces, and forward an
    all-gather (backward its reduce-scatter) over the whole group's buffer."""
    out = []
    for c in colls:
        whole = Buf(len(c.group) * src.nbytes)
        if c.kind is CollectiveKind.ALLREDUCE:
            out.append(("allreduce", (c.group, src)))
        elif backward:
            out.append(("reduce_scatter", (c.group, whole, src)))
        else:
            out.append(("allgather", (c.group, src, whole)))
    return out
