"""The global schedule of one training step, derived from a mapped PCG.

Every rank builds the same :class:`Program` from the plan, so the sends one rank posts
are exactly the receives another posts. Rank ``r`` plays device ``r``: a node's view maps
its piece coordinates (``ir.pieces.coords`` order) to devices, and each device holds at
most one piece of each tensor.

* A **compute** node runs one task per output piece, on the piece's device; the task
  reads the input pieces ``ir.pieces.TaskInputs`` names, preferring a replica on its own
  device.
* A **parallel op** on activations makes each output piece from input pieces: a slice
  (Repartition), a concatenation (Combine), a copy (Replicate, Combine of replicas) or a
  sum (Reduction). Reads between devices are point-to-point messages, unless the pattern
  is a collective: ``Reduction(d)`` then ``Replicate(d)`` over the same devices is one
  all-reduce, ``Combine(dim, d)`` then ``Replicate(d)`` one all-gather (the pairs the cost
  model prices as one collective), a Replicate read by three or more devices a broadcast,
  a Reduction of three or more devices a reduce.
* **Sources** and parallel ops applied straight to them are *layouts*, set up once: data
  and constants are sliced where they are read, and a trainable weight is stored in the
  layout(s) its consumers read (:class:`ParamPlan`), so forward needs no communication
  for weights and its replicas' gradients are summed by one all-reduce per group.

Backward runs the steps in reverse: each read's gradient goes back to the device it was
read from and is added to that piece's gradient.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..cluster.machine_view import MachineView
from ..cost.model import gather_then_replicate, layout_sources, stored_layout
from ..errors import PlanError
from ..ir.ops.parallel import REPLICA_DIM, reduces_copies
from ..ir.ops.sources import WeightAttrs
from ..ir.pcg import PCG, TensorRef
from ..ir.pieces import Coord, coords, piece_region, task_inputs, with_axis
from ..ir.shapes import ParallelTensorShape

LOCAL = -1
"""A read's source for data and constants: every rank makes the piece it reads itself."""

Group = tuple[int, ...]
Region = tuple[slice, ...]


class Assemble(Enum):
    """How a task makes its output from what it read."""

    KERNEL = "kernel"     # a compute op's kernel
    COPY = "copy"         # the one piece read (or a slice of it)
    CONCAT = "concat"     # the pieces read, concatenated along ``axis``
    SUM = "sum"           # the pieces read, added up


@dataclass(frozen=True, slots=True)
class Read:
    """One input piece a task reads: ``region`` of piece ``coord`` of ``ref``, held by ``src``."""

    ref: TensorRef
    coord: Coord
    src: int
    region: Region | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """The work of one output piece of one node, on one rank."""

    node: int
    coord: Coord
    rank: int
    reads: tuple[Read, ...]
    assemble: Assemble = Assemble.KERNEL
    axis: int = 0


class CollectiveKind(Enum):
    BCAST = "broadcast"        # forward: root's piece to the readers; backward: reduce to root
    REDUCE = "reduce"          # forward: the pieces summed on the task's rank; backward: broadcast
    ALLREDUCE = "all-reduce"   # a fused Reduction -> Replicate
    ALLGATHER = "all-gather"   # a fused Combine -> Replicate


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective that stands for some reads of a step (``covered``: (task, read) indices)."""

    kind: CollectiveKind
    group: Group
    root: int = -1
    covered: tuple[tuple[int, int], ...] = ()
    positions: tuple[int, ...] = ()      # all-gather: the slice of the result each member holds
    axis: int = 0


class StepKind(Enum):
    COMPUTE = "compute"
    MOVE = "move"            # a parallel op, by tasks (and maybe broadcasts / reduces)
    FUSED = "fused"          # a parallel-op pair done as one all-reduce / all-gather


@dataclass(frozen=True)
class Step:
    """Everything every rank does for one node, forward (and in reverse, backward)."""

    node: int
    kind: StepKind
    tasks: tuple[Task, ...] = ()
    collectives: tuple[Collective, ...] = ()
    source: TensorRef | None = None      # FUSED: the tensor the pair reads


@dataclass(frozen=True)
class ParamPlan:
    """Where a trainable weight lives and how its gradient is synchronized.

    Its *residents* are the layouts its consumers read (the weight itself or the end of a
    chain of parallel ops); resident piece ``c`` is ``scale * W[region(c)]``. When every
    device holds one region of ``W`` and the regions tile it, a device keeps just its
    region (``master``) and its gradient is all-reduced over the devices holding the same
    region; otherwise every device involved keeps all of ``W`` and all-reduces all of it.
    """

    node: int
    name: str
    shape: tuple[int, ...]
    master: dict[int, Region]                          # rank -> the region of W it keeps
    group: dict[int, Group]                            # rank -> the ranks it sums gradients with
    pieces: dict[int, tuple[tuple[int, Region, float], ...]]   # rank -> (resident node, region in master, scale)


@dataclass(frozen=True)
class LossGroup:
    """Output pieces the loss needs together: the leader gathers them, computes the loss
    of ``region`` and sends each member the gradient of its ``part`` (within ``region``)."""

    leader: int
    region: Region
    members: tuple[tuple[int, Coord, Region], ...]     # (rank, piece, part of region)


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
    return _Builder(pcg, tuple(views)).build(class_axis)


class _Builder:
    def __init__(self, pcg: PCG, views: tuple[MachineView, ...]):
        self.pcg = pcg
        self.views = views
        owners, held = [], []
        for i, n in pcg:
            devs = views[i].devices(n.outputs[0])
            own = dict(zip(coords(n.outputs[0]), devs, strict=True))
            owners.append(own)
            held.append({r: c for c, r in own.items()})
        self.owners = tuple(owners)
        self.held = tuple(held)
        self.layout = tuple(layout_sources(pcg))
        self.scale = tuple(self._scale(i) for i in range(len(pcg)))

    def _scale(self, i: int) -> float:
        """A layout's value over its source's: a Reduction of replicas multiplies by its degree."""
        if self.layout[i] is None or self.pcg.nodes[i].spec.is_source:
            return 1.0
        n = self.pcg.nodes[i]
        up = self._scale(n.inputs[0].node)
        if n.kind == "Reduction":
            return up * n.op.degree
        return up

    def _trainable(self, i: int) -> bool:
        src = self.layout[i]
        op = self.pcg.nodes[src].op if src is not None else None
        return isinstance(op, WeightAttrs) and op.trainable

    # -- reads -------------------------------------------------------------------

    def read(self, ref: TensorRef, c: Coord, reader: int, region: Region | None = None,
             any_copy: bool = True) -> Read:
        """A read of piece ``c`` of ``ref`` by ``reader``; with ``any_copy`` the replica on the
        reader's device if there is one, else replica ``c``'s copy index (0 by default)."""
        i = ref.node
        if self.layout[i] is not None and not self._trainable(i):
            return Read(ref, c, LOCAL, region)
        if any_copy:
            mine = self.held[i].get(reader)
            if mine is not None and mine[:-1] == c[:-1]:
                c = mine
        return Read(ref, c, self.owners[i][c], region)

    # -- steps -------------------------------------------------------------------

    def build(self, class_axis: int | None) -> Program:
        pcg = self.pcg
        out = pcg.outputs[0]
        if self.layout[out.node] is not None:
            raise PlanError("the graph's first output does not depend on its inputs; there is nothing to train")
        fused = self._fused_pairs()
        skip = set(fused)
        steps = []
        for i, n in pcg:
            if self.layout[i] is not None or i in skip:
                continue
            if i in fused.values():
                r = next(k for k, v in fused.items() if v == i)
                steps.append(self._fused_step(r, i))
            elif n.spec.is_parallel_op:
                steps.append(self._move_step(i))
            else:
                steps.append(self._compute_step(i))
        has_grad = self._has_grad(out, skip)
        params = tuple(self._param(i) for i, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable)
        loss_groups = self._loss_groups(out, class_axis)
        groups: set[Group] = {tuple(range(self._num_ranks()))}
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
        return Program(pcg, self.views, self.owners, self.held, self.layout, self.scale, tuple(steps),
                       frozenset(has_grad), out, loss_groups, params, tuple(sorted(groups, key=lambda g: (len(g), g))),
                       last_read)

    def _num_ranks(self) -> int:
        return max((r for own in self.owners for r in own.values()), default=0) + 1

    def _compute_step(self, i: int) -> Step:
        n = self.pcg.nodes[i]
        ti = task_inputs(n, [self.pcg.shape(r) for r in n.inputs])
        tasks = []
        for t, rank in self.owners[i].items():
            reads = tuple(self.read(ref, ti.coord(j, t), rank) for j, ref in enumerate(n.inputs))
            tasks.append(Task(i, t, rank, reads))
        return Step(i, StepKind.COMPUTE, tuple(tasks))

    def _move_step(self, i: int) -> Step:
        n = self.pcg.nodes[i]
        src = n.inputs[0]
        x: ParallelTensorShape = self.pcg.shape(src)
        y = n.outputs[0]
        r = x.rank
        d = n.op.degree
        tasks = []
        for c, rank in self.owners[i].items():
            match n.kind:
                case "Repartition":
                    m = y.piece.dims[n.op.dim]
                    k = c[n.op.dim] % d
                    region = tuple(slice(k * m, (k + 1) * m) if a == n.op.dim else slice(None) for a in range(r))
                    reads = (self.read(src, with_axis(c, n.op.dim, c[n.op.dim] // d), rank, region),)
                    tasks.append(Task(i, c, rank, reads, Assemble.COPY))
                case "Combine" if n.op.dim == REPLICA_DIM:
                    cands = [with_axis(c, r + 1, c[r + 1] * d + k) for k in range(d)]
                    pick = next((cc for cc in cands if self.owners[src.node][cc] == rank), cands[0])
                    tasks.append(Task(i, c, rank, (self.read(src, pick, rank, any_copy=False),), Assemble.COPY))
                case "Combine":
                    reads = tuple(self.read(src, with_axis(c, n.op.dim, c[n.op.dim] * d + k), rank)
                                  for k in range(d))
                    tasks.append(Task(i, c, rank, reads, Assemble.CONCAT, n.op.dim))
                case "Replicate":
                    tasks.append(Task(i, c, rank, (self.read(src, with_axis(c, r + 1, c[r + 1] // d), rank),),
                                      Assemble.COPY))
                case "Reduction":
                    copies = reduces_copies(x)
                    axis = r + 1 if copies else r
                    reads = tuple(self.read(src, with_axis(c, axis, c[axis] * d + k), rank, any_copy=not copies)
                                  for k in range(d))
                    tasks.append(Task(i, c, rank, reads, Assemble.SUM))
                case _:
                    raise PlanError(f"node {i}: no runtime for parallel op {n.kind}")
        return Step(i, StepKind.MOVE, tuple(tasks), self._collectives(n.kind, tasks))

    def _collectives(self, kind: str, tasks: Sequence[Task]) -> tuple[Collective, ...]:
        """Broadcasts for a piece three or more devices read, reduces for sums of three or more."""
        out = []
        if kind == "Replicate":
            readers: dict[tuple, list[int]] = {}
            for ti, t in enumerate(tasks):
                rd = t.reads[0]
                if rd.src != LOCAL:
                    readers.setdefault((rd.ref, rd.coord, rd.src), []).append(ti)
            for (_, _, src), tis in readers.items():
                members = tuple(sorted({src} | {tasks[ti].rank for ti in tis}))
                if len(members) >= 3:
                    out.append(Collective(CollectiveKind.BCAST, members, src, tuple((ti, 0) for ti in tis)))
        elif kind == "Reduction":
            for ti, t in enumerate(tasks):
                srcs = [rd.src for rd in t.reads]
                if len(srcs) >= 3 and LOCAL not in srcs and len(set(srcs)) == len(srcs) and t.rank in srcs:
                    out.append(Collective(CollectiveKind.REDUCE, tuple(sorted(srcs)), t.rank,
                                          tuple((ti, k) for k in range(len(srcs)))))
        return tuple(out)

    def _fused_pairs(self) -> dict[int, int]:
        """The pairs the cost model prices as one all-reduce / all-gather
        (``cost.model.gather_then_replicate``) whose groups of devices agree."""
        pairs = gather_then_replicate(self.pcg, self.layout)
        return {r: p for r, p in pairs.items() if self._fused_groups(r, p) is not None}

    def _fused_groups(self, r: int, p: int) -> list[tuple[Group, tuple[int, ...]]] | None:
        """Per group of the pair: its ranks and the slice each holds (all-gather), or None
        when some group's devices differ before and after."""
        pcg = self.pcg
        red = pcg.nodes[r]
        src = red.inputs[0]
        x = pcg.shape(src)
        d = red.op.degree
        rank = x.rank
        if red.kind == "Reduction":
            axis = rank + 1 if reduces_copies(x) else rank
        else:
            axis = red.op.dim
        out = []
        for c in coords(red.outputs[0]):
            ins = [self.owners[src.node][with_axis(c, axis, c[axis] * d + k)] for k in range(d)]
            outs = [self.owners[p][with_axis(c, rank + 1, c[rank + 1] * d + k)] for k in range(d)]
            if sorted(ins) != sorted(outs) or len(set(ins)) != d:
                return None
            group = tuple(sorted(ins))
            out.append((group, tuple(ins.index(m) for m in group)))
        return out

    def _fused_step(self, r: int, p: int) -> Step:
        red = self.pcg.nodes[r]
        kind = CollectiveKind.ALLREDUCE if red.kind == "Reduction" else CollectiveKind.ALLGATHER
        axis = red.op.dim if kind is CollectiveKind.ALLGATHER else 0
        groups = self._fused_groups(r, p)
        assert groups is not None
        colls = tuple(Collective(kind, g, positions=pos, axis=axis) for g, pos in groups)
        return Step(p, StepKind.FUSED, (), colls, red.inputs[0])

    # -- gradients ---------------------------------------------------------------

    def _has_grad(self, out: TensorRef, skip: set[int]) -> set[TensorRef]:
        """Tensors whose gradient someone needs: float, downstream of a trainable weight and
        upstream of the loss."""
        pcg = self.pcg
        requires: set[TensorRef] = set()
        for i, n in pcg:
            trainable = isinstance(n.op, WeightAttrs) and n.op.trainable
            flows = trainable or any(r in requires for r in n.inputs)
            for k, s in enumerate(n.outputs):
                if flows and s.dtype.is_float:
                    requires.add(TensorRef(i, k))
        has: set[TensorRef] = set()
        active = [False] * len(pcg)
        for i in range(len(pcg) - 1, -1, -1):
            n = pcg.nodes[i]
            for k in range(len(n.outputs)):
                ref = TensorRef(i, k)
                if ref in requires and (ref == out or any(active[u] and pcg.nodes[u].inputs[pos] == ref
                                                          for u, pos in pcg.consumers[i])):
                    has.add(ref)
            active[i] = any(TensorRef(i, k) in has for k in range(len(n.outputs)))
        return has

    # -- weights -----------------------------------------------------------------

    def _param(self, w: int) -> ParamPlan:
        pcg = self.pcg
        n = pcg.nodes[w]
        residents = [i for i, m in pcg if self.layout[i] == w and stored_layout(pcg, self.layout, i)]
        regions: dict[int, list[tuple[int, Region, float]]] = {}
        for i in residents:
            shape = pcg.nodes[i].outputs[0]
            if shape.sum_degree != 1:
                raise PlanError(f"node {i}: a layout of weight {n.name!r} holds partial sums")
            for c, rank in self.owners[i].items():
                regions.setdefault(rank, []).append((i, piece_region(shape, c), self.scale[i]))
        dims = n.outputs[0].sizes
        whole = tuple(slice(0, s) for s in dims)
        per_rank = {rank: {_key(reg) for _, reg, _ in rs} for rank, rs in regions.items()}
        distinct = {k for ks in per_rank.values() for k in ks}
        tiled = all(len(ks) == 1 for ks in per_rank.values()) and \
            sum(math.prod(b - a for a, b in k) for k in distinct) == math.prod(dims) and _disjoint(distinct)
        master: dict[int, Region] = {}
        group: dict[int, Group] = {}
        pieces: dict[int, tuple[tuple[int, Region, float], ...]] = {}
        everyone = tuple(sorted(regions))
        for rank, rs in sorted(regions.items()):
            if tiled:
                key = next(iter(per_rank[rank]))
                master[rank] = tuple(slice(a, b) for a, b in key)
                group[rank] = tuple(sorted(q for q, ks in per_rank.items() if key in ks))
                pieces[rank] = tuple((i, tuple(slice(0, b - a) for a, b in key), s) for i, _, s in rs)
            else:
                master[rank] = whole
                group[rank] = everyone
                pieces[rank] = tuple((i, reg, s) for i, reg, s in rs)
        return ParamPlan(w, n.name, dims, master, group, pieces)

    # -- loss --------------------------------------------------------------------

    def _loss_groups(self, out: TensorRef, class_axis: int | None) -> tuple[LossGroup, ...]:
        shape = self.pcg.shape(out)
        owners = self.owners[out.node]
        r = shape.rank
        groups: dict[Coord, list[Coord]] = {}
        for c in coords(shape):
            if c[-1]:
                continue                        # replicas: replica 0 gets the gradient
            key = c[:r] if class_axis is None else with_axis(c[:r], class_axis, 0)
            groups.setdefault(key, []).append(c)
        result = []
        for members in groups.values():
            first = members[0]
            region = piece_region(shape, first)
            if class_axis is not None:
                region = with_axis(region, class_axis, slice(0, shape.sizes[class_axis]))  # type: ignore[arg-type]
            parts = []
            for c in members:
                own = piece_region(shape, c)
                part = tuple(slice(o.start - g.start, o.stop - g.start) for o, g in zip(own, region, strict=True))
                parts.append((owners[c], c, part))
            result.append(LossGroup(owners[first], region, tuple(parts)))
        return tuple(result)


def _key(region: Region) -> tuple[tuple[int, int], ...]:
    return tuple((s.start, s.stop) for s in region)


def _disjoint(regions: set[tuple[tuple[int, int], ...]]) -> bool:
    rs = sorted(regions)
    for i, a in enumerate(rs):
        for b in rs[i + 1:]:
            if all(max(x0, y0) < min(x1, y1) for (x0, x1), (y0, y1) in zip(a, b, strict=True)):
                return False
    return True
