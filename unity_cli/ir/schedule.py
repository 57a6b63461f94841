"""What the runtime does for each node of a mapped PCG: who reads which piece from whom.

The runtime (``runtime/program.py``) builds its step schedule from these functions, and
the cost model (``cost/moves.py``) lists the data the same schedule moves, so the bytes a
plan predicts are the bytes its ranks send. Nothing here touches arrays.

Rank ``r`` plays device ``r``: a node's view maps its piece coordinates
(``ir.pieces.coords`` order) to devices, and each device holds at most one piece of
each tensor.

* A **compute** node runs one task per output piece, on the piece's device; the task
  reads the input pieces ``ir.pieces.TaskInputs`` names, preferring a replica on its own
  device.
* A **parallel op** on activations makes each output piece from input pieces: a slice
  (Repartition), a concatenation (Combine), a copy (Replicate, Combine of replicas) or a
  sum (Reduction). Reads between devices are point-to-point messages, unless the pattern
  is a collective: ``Reduction(d)`` then ``Replicate(d)`` over the same devices is one
  all-reduce, ``Combine(dim, d)`` then ``Replicate(d)`` one all-gather
  (:func:`gather_then_replicate` whose groups agree), a Replicate read by three or more
  devices a broadcast, a Reduction of three or more devices a reduce.
* **Sources** and parallel ops applied straight to them are *layouts*, set up once: data
  and constants are sliced where they are read, and a trainable weight is stored in the
  layout(s) its consumers read (:class:`ParamPlan`), so forward needs no communication
  for weights and its replicas' gradients are summed by one all-reduce per group.
* The **loss** reads the first graph output: the pieces it needs together go to a leader
  (:class:`LossGroup`), which sends each member its gradient back.

Backward runs the steps in reverse: each read's gradient goes back to the device it was
read from and is added to that piece's gradient.

The functions accept partial views (a mapping from node to view): a node's step needs
only the views of the node and of what it reads, which is what lets the machine-mapping
DP price a node with the same code as the full step simulation.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..errors import PlanError
from .machine_view import MachineView
from .ops.parallel import REPLICA_DIM, CombineAttrs, ReductionAttrs, ReplicateAttrs, reduces_copies
from .ops.sources import InputAttrs, WeightAttrs
from .opspec import OpKind
from .pcg import PCG, TensorRef
from .pieces import Coord, coords, piece_region, task_inputs, with_axis
from .shapes import ParallelTensorShape
from .training import LossKind

LOCAL = -1
"""A read's source for data and constants: every rank makes the piece it reads itself."""

LOSS_VALUE_BYTES = 8
"""The loss value every rank adds to the all-reduce of the step's loss (a float64)."""

Group = tuple[int, ...]
Region = tuple[slice, ...]
Views = Mapping[int, MachineView] | Sequence[MachineView]


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


# -- structure (no views) ---------------------------------------------------------------


def layout_sources(pcg: PCG) -> list[int | None]:
    """For each node: the source it is a stored layout of (a source, or parallel ops applied
    straight to one), else None. Layouts are set up once, not paid every step."""
    out: list[int | None] = []
    for i, n in pcg:
        if n.spec.is_source:
            out.append(i)
        elif n.spec.is_parallel_op and out[n.inputs[0].node] is not None:
            out.append(out[n.inputs[0].node])
        else:
            out.append(None)
    return out


def stored_layout(pcg: PCG, layout: Sequence[int | None], i: int) -> bool:
    """Whether layout node ``i`` is the end of its chain, kept for the step: something other
    than a layout reads it, the graph returns it, or nothing reads it at all."""
    users = pcg.consumers[i]
    return any(layout[u] is None for u, _ in users) or not users or any(r.node == i for r in pcg.outputs)


def gather_then_replicate(pcg: PCG, layout: Sequence[int | None]) -> dict[int, int]:
    """Pairs ``Combine(dim, d)``/``Reduction(d)`` -> ``Replicate(d)`` (first -> second): one
    all-gather / all-reduce leaves the result on all ``d`` devices, so the pair is one
    collective when its groups of devices are the same before and after
    (:meth:`Schedule.fused`). A gather whose result the graph returns stays apart."""
    pairs = {}
    returned = {r.node for r in pcg.outputs}
    for i, n in pcg:
        if not isinstance(n.op, ReplicateAttrs) or layout[i] is not None:
            continue
        j = n.inputs[0].node
        prev = pcg.nodes[j].op
        gathers = isinstance(prev, CombineAttrs) and prev.dim != REPLICA_DIM or isinstance(prev, ReductionAttrs)
        if gathers and prev.degree == n.op.degree and len(pcg.consumers[j]) == 1 and j not in returned:
            pairs[j] = i
    return pairs


def residents(pcg: PCG, layout: Sequence[int | None], w: int) -> list[int]:
    """The stored layouts of source ``w``: where the runtime keeps its pieces for the step."""
    return all_residents(pcg, layout).get(w, [])


def all_residents(pcg: PCG, layout: Sequence[int | None]) -> dict[int, list[int]]:
    """:func:`residents` of every source that has some, in one pass."""
    out: dict[int, list[int]] = {}
    for i in range(len(pcg)):
        src = layout[i]
        if src is not None and stored_layout(pcg, layout, i):
            out.setdefault(src, []).append(i)
    return out


def trainable(pcg: PCG, layout: Sequence[int | None], i: int) -> bool:
    """Whether node ``i`` is a layout of a trainable weight."""
    src = layout[i]
    op = pcg.nodes[src].op if src is not None else None
    return isinstance(op, WeightAttrs) and op.trainable


def needs_grad(pcg: PCG, out: TensorRef) -> frozenset[TensorRef]:
    """Tensors whose gradient someone needs: float, downstream of a trainable weight and
    upstream of the loss (which reads ``out``). Kept with the graph (it is immutable): the
    cost model, the solver and the segment search ask it of the same graph many times."""
    memo = pcg.__dict__.setdefault("_needs_grad", {})
    if out not in memo:
        memo[out] = _needs_grad(pcg, out)
    return memo[out]


def _needs_grad(pcg: PCG, out: TensorRef) -> frozenset[TensorRef]:
    requires: set[TensorRef] = set()
    for i, n in pcg:
        is_param = isinstance(n.op, WeightAttrs) and n.op.trainable or isinstance(n.op, InputAttrs) and n.op.grad
        flows = is_param or any(r in requires for r in n.inputs)
        for k, s in enumerate(n.outputs):
            if flows and s.dtype.is_float:
                requires.add(TensorRef(i, k))
    has: set[TensorRef] = {out} & requires
    for i in range(len(pcg) - 1, -1, -1):   # consumers come later: they are settled first
        n = pcg.nodes[i]
        if any(TensorRef(i, k) in has for k in range(len(n.outputs))):
            has.update(r for r in n.inputs if r in requires)
    return frozenset(has)


def planned_loss(pcg: PCG, requested: str) -> LossKind:
    """The loss a plan is priced for (its targets' bytes): ``requested`` (a plan's ``--loss``),
    or for ``auto`` the one ``unity run`` takes with synthetic data (:func:`looks_like_logits`)."""
    if requested == "auto":
        return LossKind.CROSS_ENTROPY if looks_like_logits(pcg) else LossKind.MSE
    return LossKind(requested)


def looks_like_logits(pcg: PCG) -> bool:
    """Whether the first output looks like classifier logits: a float tensor of rank >= 2
    with a last dim >= 2, made by a MatMul or Gemm (maybe plus a bias Add). With synthetic
    data, ``unity run`` then trains with cross entropy over the last dim."""
    ref = pcg.outputs[0]
    out = pcg.shape(ref)
    if not out.dtype.is_float or out.rank < 2 or out.sizes[-1] < 2:
        return False
    n = pcg.nodes[ref.node]
    while n.spec.is_parallel_op:
        n = pcg.nodes[n.inputs[0].node]
    if n.kind == OpKind.Binary and n.op.fn == "Add":
        return any(_linear(pcg, r.node) for r in n.inputs)
    return _linear(pcg, ref.node)


def _linear(pcg: PCG, i: int) -> bool:
    n = pcg.nodes[i]
    while n.spec.is_parallel_op:
        n = pcg.nodes[n.inputs[0].node]
    return n.kind in (OpKind.MatMul, OpKind.Gemm)


def region_shape(region: Region, dims: Sequence[int]) -> tuple[int, ...]:
    """The shape of ``region`` of an array of shape ``dims``."""
    return tuple(len(range(*s.indices(d))) for s, d in zip(region, dims, strict=True))


def read_shape(pcg: PCG, rd: Read) -> tuple[int, ...]:
    """The shape of the array a read brings (its region of the piece, or all of it)."""
    dims = pcg.shape(rd.ref).piece.dims
    return dims if rd.region is None else region_shape(rd.region, dims)


# -- the schedule of one mapped graph ---------------------------------------------------------------


class Schedule:
    """The runtime's choices for ``pcg`` mapped by ``views`` (all nodes, or just the ones
    the asked-for steps depend on), node by node."""

    def __init__(self, pcg: PCG, views: Views, layout: Sequence[int | None] | None = None):
        self.pcg = pcg
        self.views = views
        self.layout = tuple(layout_sources(pcg)) if layout is None else tuple(layout)
        self._owners: dict[int, dict[Coord, int]] = {}
        self._held: dict[int, dict[int, Coord]] = {}
        self._local: dict[int, bool] = {}     # a layout of a constant: every rank holds it whole

    def owners(self, i: int) -> dict[Coord, int]:
        """Node ``i``'s pieces -> the ranks holding them (do not change the dict: it is shared)."""
        own = self._owners.get(i)
        if own is None:
            own = self._owners[i] = _owners(self.pcg.nodes[i].outputs[0], self.views[i])[0]
        return own

    def held(self, i: int) -> dict[int, Coord]:
        """Ranks -> the piece of node ``i`` each holds (shared, like :meth:`owners`)."""
        h = self._held.get(i)
        if h is None:
            h = self._held[i] = _owners(self.pcg.nodes[i].outputs[0], self.views[i])[1]
        return h

    def scale(self, i: int) -> float:
        """A layout's value over its source's: a Reduction of replicas multiplies by its degree."""
        if self.layout[i] is None or self.pcg.nodes[i].spec.is_source:
            return 1.0
        n = self.pcg.nodes[i]
        up = self.scale(n.inputs[0].node)
        if n.kind == OpKind.Reduction:
            return up * n.op.degree
        return up

    # -- reads -------------------------------------------------------------------

    def read(self, ref: TensorRef, c: Coord, reader: int, region: Region | None = None,
             any_copy: bool = True) -> Read:
        """A read of piece ``c`` of ``ref`` by ``reader``; with ``any_copy`` the replica on the
        reader's device if there is one, else replica ``c``'s copy index (0 by default)."""
        i = ref.node
        local = self._local.get(i)
        if local is None:
            local = self._local[i] = self.layout[i] is not None and not trainable(self.pcg, self.layout, i)
        if local:
            return Read(ref, c, LOCAL, region)
        if any_copy:
            mine = self.held(i).get(reader)
            if mine is not None and mine[:-1] == c[:-1]:
                c = mine
        return Read(ref, c, self.owners(i)[c], region)

    # -- steps -------------------------------------------------------------------

    def compute_step(self, i: int) -> Step:
        n = self.pcg.nodes[i]
        ti = task_inputs(n, [self.pcg.shape(r) for r in n.inputs])
        tasks = []
        for t, rank in self.owners(i).items():
            reads = tuple(self.read(ref, ti.coord(j, t), rank) for j, ref in enumerate(n.inputs))
            tasks.append(Task(i, t, rank, reads))
        return Step(i, StepKind.COMPUTE, tuple(tasks))

    def move_step(self, i: int) -> Step:
        n = self.pcg.nodes[i]
        src = n.inputs[0]
        x: ParallelTensorShape = self.pcg.shape(src)
        y = n.outputs[0]
        r = x.rank
        d = n.op.degree
        tasks = []
        m = y.piece.dims[n.op.dim] if n.kind == OpKind.Repartition else 0
        regions: dict[int, Region] = {}     # one region per slice of the split (a step reads each many times)
        for c, rank in self.owners(i).items():
            match n.kind:
                case OpKind.Repartition:
                    k = c[n.op.dim] % d
                    region = regions.get(k)
                    if region is None:
                        region = regions[k] = tuple(slice(k * m, (k + 1) * m) if a == n.op.dim else slice(None)
                                                    for a in range(r))
                    reads = (self.read(src, with_axis(c, n.op.dim, c[n.op.dim] // d), rank, region),)
                    tasks.append(Task(i, c, rank, reads, Assemble.COPY))
                case OpKind.Combine if n.op.dim == REPLICA_DIM:
                    cands = [with_axis(c, r + 1, c[r + 1] * d + k) for k in range(d)]
                    held = self.owners(src.node)
                    pick = next((cc for cc in cands if held[cc] == rank), cands[0])
                    tasks.append(Task(i, c, rank, (self.read(src, pick, rank, any_copy=False),), Assemble.COPY))
                case OpKind.Combine:
                    reads = tuple(self.read(src, with_axis(c, n.op.dim, c[n.op.dim] * d + k), rank)
                                  for k in range(d))
                    tasks.append(Task(i, c, rank, reads, Assemble.CONCAT, n.op.dim))
                case OpKind.Replicate:
                    tasks.append(Task(i, c, rank, (self.read(src, with_axis(c, r + 1, c[r + 1] // d), rank),),
                                      Assemble.COPY))
                case OpKind.Reduction:
                    copies = reduces_copies(x)
                    axis = r + 1 if copies else r
                    reads = tuple(self.read(src, with_axis(c, axis, c[axis] * d + k), rank, any_copy=not copies)
                                  for k in range(d))
                    tasks.append(Task(i, c, rank, reads, Assemble.SUM))
                case _:
                    raise PlanError(f"node {i}: no runtime for parallel op {n.kind}")
        return Step(i, StepKind.MOVE, tuple(tasks), self._collectives(n.kind, tasks))

    def _collectives(self, kind: OpKind, tasks: Sequence[Task]) -> tuple[Collective, ...]:
        """Broadcasts for a piece three or more devices read, reduces for sums of three or more."""
        out = []
        if kind == OpKind.Replicate:
            readers: dict[tuple, list[int]] = {}
            for ti, t in enumerate(tasks):
                rd = t.reads[0]
                if rd.src != LOCAL:
                    readers.setdefault((rd.ref, rd.coord, rd.src), []).append(ti)
            for (_, _, src), tis in readers.items():
                members = tuple(sorted({src} | {tasks[ti].rank for ti in tis}))
                if len(members) >= 3:
                    out.append(Collective(CollectiveKind.BCAST, members, src, tuple((ti, 0) for ti in tis)))
        elif kind == OpKind.Reduction:
            for ti, t in enumerate(tasks):
                srcs = [rd.src for rd in t.reads]
                if len(srcs) >= 3 and LOCAL not in srcs and len(set(srcs)) == len(srcs) and t.rank in srcs:
                    out.append(Collective(CollectiveKind.REDUCE, tuple(sorted(srcs)), t.rank,
                                          tuple((ti, k) for k in range(len(srcs)))))
        return tuple(out)

    def fused_groups(self, r: int, p: int) -> list[tuple[Group, tuple[int, ...]]] | None:
        """For the pair ``r`` -> ``p`` of :func:`gather_then_replicate`, per group: its ranks
        and the slice each holds (all-gather), or None when some group's devices differ
        before and after (then the pair runs as two moves). Needs the views of ``r``'s
        input and of ``p``."""
        pcg = self.pcg
        red = pcg.nodes[r]
        src = red.inputs[0]
        x = pcg.shape(src)
        d = red.op.degree
        rank = x.rank
        if red.kind == OpKind.Reduction:
            axis = rank + 1 if reduces_copies(x) else rank
        else:
            axis = red.op.dim
        src_owners, out_owners = self.owners(src.node), self.owners(p)
        out = []
        for c in coords(red.outputs[0]):
            ins = [src_owners[with_axis(c, axis, c[axis] * d + k)] for k in range(d)]
            outs = [out_owners[with_axis(c, rank + 1, c[rank + 1] * d + k)] for k in range(d)]
            if sorted(ins) != sorted(outs) or len(set(ins)) != d:
                return None
            group = tuple(sorted(ins))
            out.append((group, tuple(ins.index(m) for m in group)))
        return out

    def fused_step(self, r: int, p: int) -> Step | None:
        """The pair ``r`` -> ``p`` as one all-reduce / all-gather step, or None when its
        groups differ."""
        groups = self.fused_groups(r, p)
        if groups is None:
            return None
        red = self.pcg.nodes[r]
        kind = CollectiveKind.ALLREDUCE if red.kind == OpKind.Reduction else CollectiveKind.ALLGATHER
        axis = red.op.dim if kind is CollectiveKind.ALLGATHER else 0
        colls = tuple(Collective(kind, g, positions=pos, axis=axis) for g, pos in groups)
        return Step(p, StepKind.FUSED, (), colls, red.inputs[0])

    # -- weights -----------------------------------------------------------------

    def param(self, w: int, stored: Sequence[int] | None = None) -> ParamPlan:
        """Where trainable weight ``w`` lives and whom each rank sums its gradient with
        (needs the views of all of ``w``'s :func:`residents`, ``stored`` if known)."""
        pcg = self.pcg
        n = pcg.nodes[w]
        regions: dict[int, list[tuple[int, Region, float]]] = {}
        for i in (residents(pcg, self.layout, w) if stored is None else stored):
            shape = pcg.nodes[i].outputs[0]
            if shape.sum_degree != 1:
                raise PlanError(f"node {i}: a layout of weight {n.name!r} holds partial sums")
            for c, rank in self.owners(i).items():
                regions.setdefault(rank, []).append((i, piece_region(shape, c), self.scale(i)))
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
        holders: dict[tuple, list[int]] = {}
        for q in everyone:
            for k in per_rank[q]:
                holders.setdefault(k, []).append(q)
        for rank, rs in sorted(regions.items()):
            if tiled:
                key = next(iter(per_rank[rank]))
                master[rank] = tuple(slice(a, b) for a, b in key)
                group[rank] = tuple(holders[key])
                pieces[rank] = tuple((i, tuple(slice(0, b - a) for a, b in key), s) for i, _, s in rs)
            else:
                master[rank] = whole
                group[rank] = everyone
                pieces[rank] = tuple((i, reg, s) for i, reg, s in rs)
        return ParamPlan(w, n.name, dims, master, group, pieces)

    # -- loss --------------------------------------------------------------------

    def loss_groups(self, out: TensorRef, class_axis: int | None) -> tuple[LossGroup, ...]:
        """The loss's groups of output pieces: whole along ``class_axis`` (cross entropy) or
        piece by piece (None: mse); a group's first piece's rank leads it."""
        shape = self.pcg.shape(out)
        owners = self.owners(out.node)
        result = []
        for members in loss_pieces(shape, class_axis):
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


@functools.lru_cache(maxsize=1 << 12)
@functools.lru_cache(maxsize=1 << 12)
def loss_pieces(shape: ParallelTensorShape, class_axis: int | None) -> tuple[tuple[Coord, ...], ...]:
    """The output pieces the loss reads together (:meth:`Schedule.loss_groups`), the leader's first;
    replicas but the first are left out (replica 0 gets the gradient)."""
    r = shape.rank
    groups: dict[Coord, list[Coord]] = {}
    for c in coords(shape):
        if c[-1]:
            continue
        key = c[:r] if class_axis is None else with_axis(c[:r], class_axis, 0)
        groups.setdefault(key, []).append(c)
    return tuple(tuple(g) for g in groups.values())


@functools.lru_cache(maxsize=1 << 14)
def _owners(shape: ParallelTensorShape, view: MachineView) -> tuple[dict[Coord, int], dict[int, Coord]]:
    own = dict(zip(coords(shape), view.devices(shape), strict=True))
    return own, {r: c for c, r in own.items()}


def _key(region: Region) -> tuple[tuple[int, int], ...]:
    return tuple((s.start, s.stop) for s in region)


def _disjoint(regions: set[tuple[tuple[int, int], ...]]) -> bool:
    """Whether no two of the boxes overlap (all pairs at once: 192 pieces are 18k pairs)."""
    if len(regions) < 2:
        return True
    box = np.array(sorted(regions), dtype=np.int64)          # [box, dim, (start, stop)]
    lo, hi = box[:, :, 0], box[:, :, 1]
    overlap = (np.maximum(lo[:, None], lo[None]) < np.minimum(hi[:, None], hi[None])).all(axis=2)
    np.fill_diagonal(overlap, False)
    return not overlap.any()
