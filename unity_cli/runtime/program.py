"""The global schedule of one training step, derived from a mapped PCG.

Every rank builds the same :class:`Program` from the plan, so the sends one rank posts
are exactly the receives another posts. What each node's step reads, from whom, and which
reads are collectives is decided in :mod:`unity_cli.ir.schedule` (its docstring states the
rules), the same code the cost model lists the step's data movement from
(:mod:`unity_cli.cost.moves`): the bytes a plan predicts are the bytes its ranks send.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import PlanError
from ..ir.machine_view import MachineView
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import PCG, TensorRef
from ..ir.pieces import Coord
from ..ir.recompute import Action, Recompute, gathers, node_order, weight_passes
from ..ir.schedule import (  # noqa: F401  (the executor's and weights' vocabulary)
    LOCAL,
    Assemble,
    Collective,
    CollectiveKind,
    Group,
    LossGroup,
    ParamPlan,
    Read,
    Region,
    Schedule,
    Step,
    StepKind,
    Task,
    gather_then_replicate,
    needs_grad,
)


@dataclass(frozen=True)
class Program:
    pcg: PCG
    views: tuple[MachineView, ...]
    owners: tuple[dict[Coord, int], ...]     # per node: piece -> rank
    held: tuple[dict[int, Coord], ...]       # per node: rank -> its piece
    layout: tuple[int | None, ...]           # per node: the source it is a layout of
    scale: tuple[float, ...]                 # per layout node: its value is scale * source
    steps: tuple[Step, ...]
    has_grad: frozenset[TensorRef]           # tensors whose gradients are needed
    output: TensorRef
    loss_groups: tuple[LossGroup, ...]
    params: tuple[ParamPlan, ...]
    groups: tuple[Group, ...]                # every collective's group, in setup order
    last_read: dict[TensorRef, int] = field(default_factory=dict)   # tensor -> index of the last step reading it


def single_device_views(pcg: PCG) -> tuple[MachineView, ...]:
    """Views that put every piece of an unpartitioned PCG on device 0."""
    return tuple(MachineView(0, (0,) * (n.outputs[0].rank + 2)) for _, n in pcg)


def build_program(pcg: PCG, views: Sequence[MachineView], class_axis: int | None) -> Program:
    """The schedule of a training step of ``pcg`` mapped by ``views``; the loss reads the
    first graph output, whole along ``class_axis`` (cross entropy) or elementwise (None)."""
    return _build(pcg, tuple(views), class_axis)


def _build(pcg: PCG, views: tuple[MachineView, ...], class_axis: int | None) -> Program:
    sched = Schedule(pcg, views)
    layout = sched.layout
    out = pcg.outputs[0]
    if layout[out.node] is not None:
        raise PlanError("the graph's first output does not depend on its inputs; there is nothing to train")
    fused = {r: p for r, p in gather_then_replicate(pcg, layout).items() if sched.fused_groups(r, p) is not None}
    second = {p: r for r, p in fused.items()}
    steps = []
    for i, n in pcg:
        if layout[i] is not None or i in fused:
            continue
        if i in second:
            step = sched.fused_step(second[i], i)
            assert step is not None
            steps.append(step)
        elif n.spec.is_parallel_op:
            steps.append(sched.move_step(i))
        else:
            steps.append(sched.compute_step(i))
    params = tuple(sched.param(i) for i, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable)
    loss_groups = sched.loss_groups(out, class_axis)
    owners = tuple(dict(sched.owners(i)) for i in range(len(pcg)))
    held = tuple(dict(sched.held(i)) for i in range(len(pcg)))
    ranks = max((r for own in owners for r in own.values()), default=0) + 1
    groups: set[Group] = {tuple(range(ranks))}
    for s in steps:
        groups.update(c.group for c in s.collectives)
    for p in params:
        groups.update(g for g in p.group.values() if len(g) > 1)
    last_read: dict[TensorRef, int] = {}
    for k, s in enumerate(steps):
        if s.source is not None:
            last_read[s.source] = k
        for t in s.tasks:
            for rd in t.reads:
                last_read[rd.ref] = k
    return Program(pcg, views, owners, held, layout, tuple(sched.scale(i) for i in range(len(pcg))), tuple(steps),
                   needs_grad(pcg, out), out, loss_groups, params, tuple(sorted(groups, key=lambda g: (len(g), g))),
                   last_read)


@dataclass(frozen=True)
class StepOrder:
    """The order of one micro-batch's work on every rank, under a recomputation mode
    (``ir/recompute.py``): each action with its step index (``DROP``: its segment's), what
    forward keeps no context of, and what values it keeps for a recompute. The executor
    runs it and :func:`~.planned.planned_calls` counts its calls, from this one value."""

    actions: tuple[tuple[Action, int], ...]
    no_context: frozenset[int]                  # steps whose forward keeps no context
    kept: frozenset[TensorRef]                  # values forward keeps until a recompute reads them
    segments: tuple[tuple[int, ...], ...]       # the recomputed steps of each segment, in order
    # per action index, the trainable weights (source nodes) a pass reads first there, and
    # those it reads last there (ZeRO-3 gathers before, and frees after: ir/recompute.weight_passes)
    first_use: dict[int, tuple[int, ...]] = field(default_factory=dict)
    last_use: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # per action index, the weights whose gather for a later action starts there, after its
    # own gathers are done (ZeRO-3's prefetch: ir/recompute.gathers)
    prefetch: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # per weight gathered again for backward, the steps whose contexts give it up after the
    # forward pass (at the action ``drop`` names) and take it back from the backward pass's
    # gather (at the action ``regain`` names)
    stashed: dict[int, tuple[int, ...]] = field(default_factory=dict)
    drop: dict[int, tuple[int, ...]] = field(default_factory=dict)
    regain: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @staticmethod
    def of(p: Program, mode: Recompute = Recompute.NONE, limit: int = 0) -> StepOrder:
        """The graph's :class:`~unity_cli.ir.recompute.NodeOrder` over the program's steps
        (its nodes that are no step of their own are left out); ``limit``: the segments
        recomputed (``Training.recompute_segments``)."""
        order = node_order(p.pcg, p.layout, p.has_grad, mode, limit)
        at = {s.node: k for k, s in enumerate(p.steps)}
        segs, renumber = [], {}
        for j, seg in enumerate(order.segments):
            steps = tuple(at[i] for i in seg if i in at)
            if steps:
                renumber[j] = len(segs)
                segs.append(steps)
        kept: set[TensorRef] = set()
        for seg in segs:
            made = {p.steps[k].node for k in seg}
            for k in seg:
                s = p.steps[k]
                reads = [rd.ref for t in s.tasks for rd in t.reads if rd.src != LOCAL]
                reads += [s.source] if s.source is not None else []
                kept.update(r for r in reads if r.node not in made and p.layout[r.node] is None)
        actions = [(act, -1) if act is Action.LOSS else (act, renumber[i]) if act is Action.DROP else (act, at[i])
                   for act, i in order.actions
                   if act is Action.LOSS or (i in renumber if act is Action.DROP else i in at)]
        index = {a: j for j, a in enumerate(actions)}
        # each action of the graph's order as the first of the program's at or after it
        mapped, j = [], len(actions)
        for act, i in reversed(order.actions):
            j = index.get((act, -1) if act is Action.LOSS else (act, renumber.get(i, -1)) if act is Action.DROP
                          else (act, at.get(i, -1)), j)
            mapped.append(j)
        mapped.reverse()
        passes = weight_passes(p.pcg, p.layout, order.segments)
        uses: dict[str, dict[int, list[int]]] = {"first": {}, "last": {}, "prefetch": {}, "drop": {}, "regain": {}}
        stashed: dict[int, tuple[int, ...]] = {}
        for g in gathers(order, passes):
            use, start = mapped[g.use], mapped[g.start]
            readers = [at[i] for i in passes[g.weight][g.npass].readers if i in at]
            if not readers or use >= len(actions):
                continue
            uses["first"].setdefault(use, []).append(g.weight)
            uses["last"].setdefault(index[(g.kind, readers[-1])], []).append(g.weight)
            if start < use:
                uses["prefetch"].setdefault(start, []).append(g.weight)
            if g.kind is Action.BACKWARD:
                stashed[g.weight] = tuple(readers)
                uses["regain"].setdefault(use, []).append(g.weight)
                ahead = [at[i] for i in passes[g.weight][0].readers if i in at]
                uses["drop"].setdefault(index[(Action.FORWARD, ahead[-1])], []).append(g.weight)
        out = {name: {j: tuple(ws) for j, ws in by.items()} for name, by in uses.items()}
        return StepOrder(tuple(actions), frozenset(k for s in segs for k in s), frozenset(kept), tuple(segs),
                         out["first"], out["last"], out["prefetch"], stashed, out["drop"], out["regain"])
