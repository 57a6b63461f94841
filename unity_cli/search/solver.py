"""The inner level of the search: choose every operator's parallelization at once.

For a fixed graph, each compute operator picks an *option*: the degrees of its output dims
and of its contracted dim, the rest of the devices holding replicas. An option is legal
when the operator's specification accepts the input layouts it implies
(:func:`unity_cli.ir.opspec.input_layout`), so every option is an instance of the
verified parallelization rules (partition a dim, contract with partial sums, replicate).

Options come from a logical 2-D mesh ``M0 x M1 = N`` of the devices, as in Alpa: each mesh
axis goes to one output dim, to the contracted dim, or to replicas. Every factorization of
``N`` is solved (6 = 2 x 3, 48 = 8 x 6, 30 = 5 x 6: never only powers of two), so data
parallelism, Megatron's column-then-row pairs, TP x DP hybrids of any factorization,
row-split embedding tables beside data-parallel dense layers, and a different choice per
layer are all points of one space.

The objective adds, per operator, its piece's forward + backward time and its weights'
optimizer update; per edge, the time of the parallel ops that bring the producer's layout
to what the consumer reads (the resharding, its backward only where the gradient flows);
per trainable weight read replicated, its gradient all-reduce; and, at a graph output left
as partial sums, their reduction. All are priced by the cost model (``cost.model``) on tiny
graphs, so the solver and the final pricing agree on every piece. Memory per device is a
hard constraint, added up from what the final pricing counts (``cost/memory.py``): each
operator's kept activations and weights with their gradients and optimizer state, each
edge's resharding buffers, and what no option changes (``step_bytes``); never less than
the pricing's busiest moment but for the values in flight, which it checks on the realized graph.

The choice is solved exactly by dynamic programming over the graph's structure: variable
elimination (``elimination.py``), whose work is linear in the number of layers and whose
tables span two or three operators on DNNs with residual connections. When its optimum
needs more memory than a device has, memory is priced at a rate and the elimination rerun
(Lagrangian relaxation): each rate's optimum is a lower bound, and the cheapest that fits
is kept. A program whose bound does not close and that is small enough goes to HiGHS
(``scipy.optimize.milp``, one binary per (operator, option), per edge one variable per pair
tied to the two choices by its marginals), so small problems are always exact; a large one
keeps the relaxation's plan. The additive objective cannot see the step simulation run the
weight sync beside the backward pass, so each mesh is solved with the sync charged in full
and not at all, and each optimum is priced by the simulation; the fastest wins.
``brute_force`` enumerates the same space and is the tests' oracle. The solved graph is then
machine-mapped and priced by ``cost.model.estimate`` like any other candidate.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import assert_never

import numpy as np

from ..cluster.spec import ClusterSpec
from ..cost.memory import outputs_held, step_bytes
from ..cost.model import (
    CostConfig,
    CostContext,
    _compute_time,
    cost_of_phases,
    device_capacity,
    estimate,
    price_table,
    update_seconds,
)
from ..cost.moves import node_moves, phase_calls
from ..cost.strides import copies as runtime_copies
from ..deadline import check
from ..errors import ShapeError
from ..ir.machine_view import MachineView
from ..ir.ops.elementwise import UnaryAttrs
from ..ir.ops.shape_ops import ReshapeAttrs
from ..ir.ops.sources import InputAttrs, WeightAttrs
from ..ir.opspec import SUM, backward_mask, input_layout
from ..ir.pcg import PCG, GraphBuilder, Node, TensorRef
from ..ir.recompute import Recompute, recomputed
from ..ir.schedule import layout_sources, needs_grad
from ..ir.shapes import ParallelTensorShape
from ..ir.simplify import simplify
from ..ir.training import Stages, shard_elements
from .elimination import Elimination, TooWide
from .groups import Grouping, group_ranges, groupings
from .mesh import Mesh, factorizations
from .reshard import reshard, unit_layouts
from .views import default_views
from .workers import fork_map, in_worker, large

COPY = "copy"

VARIABLE_LIMIT = 400_000
"""Integer programs larger than this (variables) are not solved: the caller keeps its other
starts. A count, not seconds, so the same inputs give the same plan on any machine."""
SYNC_WEIGHTS = (1.0, 0.0)
"""How much of the weight-gradient sync each solve charges. The additive objective cannot
see what the step simulation runs side by side (one group's sync beside another's
backward, independent branches): charged in full it overprices data parallelism, charged
nothing it underprices it. Each mesh is solved at both ends and the simulation picks."""
NODE_LIMIT = 2_000
"""Branch-and-bound nodes HiGHS may explore per program (a work bound, not a time one)."""


class Again(Enum):
    """Whether backward recomputes an operator (``ir/recompute.py``): the memory it keeps
    through forward, and its forward paid twice. (The recompute workspace, one segment's,
    and a recomputed resharding's second forward are priced by the final pricing only.)"""

    NO = "no"                  # kept: its outputs and context
    KEEPS_OUTPUT = "output"    # recomputed; its outputs kept for a reader outside its segment
    ALL = "all"                # recomputed; nothing kept


def _again(pcg: PCG, grads: frozenset[TensorRef], mode: Recompute, limit: int = 0) -> dict[int, Again]:
    segment = {i: s for s, seg in enumerate(recomputed(pcg, layout_sources(pcg), grads, mode, limit)) for i in seg}
    return {i: Again.ALL if all(segment.get(u) == s for u, _ in pcg.consumers[i]) else Again.KEEPS_OUTPUT
            for i, s in segment.items()}


class Tensor(Enum):
    """What a tensor an operator reads is, to the solver's prices."""

    ACTIVATION = "activation"   # made by another operator: resharded per step, forward and backward
    WEIGHT = "weight"           # trainable: laid out once, its replicas' gradients synced every step
    CONSTANT = "constant"       # laid out once, nothing recurs
    INPUT = "input"             # fed by the data loader, cut where it is read


@dataclass(frozen=True, slots=True)
class Option:
    """One parallelization of one operator: its output dims' degrees and its contracted degree."""

    degrees: tuple[int, ...]
    contracted: int
    inputs: tuple[ParallelTensorShape, ...]      # the layouts it reads
    outputs: tuple[ParallelTensorShape, ...]     # the layouts it makes


@dataclass(frozen=True)
class Problem:
    """The cost tables of one graph on one mesh (see the module docstring)."""

    pcg: PCG
    pieces: int
    nodes: tuple[int, ...]                              # compute nodes, in graph order
    options: dict[int, tuple[Option, ...]]
    node_cost: dict[int, tuple[float, ...]]             # per option: compute + weight sync + output reduction
    node_memory: dict[int, tuple[float, ...]]
    edges: tuple[tuple[int, int, np.ndarray], ...]      # (producer, consumer, cost[producer option, consumer option])
    capacity: float
    node_sync: dict[int, tuple[float, ...]] | None = None   # per option: the part of node_cost that is weight sync
    edge_memory: tuple[np.ndarray, ...] | None = None   # per edge, bytes per device of its resharding (None: 0)
    fixed: float = 0.0      # bytes per device whatever the assignment (:func:`step_bytes`)

    def edge_memories(self) -> list[np.ndarray]:
        """Each edge's memory table, zeros where none was given."""
        if self.edge_memory is None:
            return [np.zeros(t.shape) for _, _, t in self.edges]
        return list(self.edge_memory)

    def sync_weighted(self, weight: float) -> Problem:
        """The same problem with weight sync charged at ``weight`` times its price: the step
        simulation runs the sync beside the backward pass, so the additive objective's full
        charge is an upper bound on what it costs, and nothing is a lower one."""
        if weight == 1.0 or self.node_sync is None:
            return self
        cost = {i: tuple(c - (1.0 - weight) * s for c, s in zip(self.node_cost[i], self.node_sync[i], strict=True))
                for i in self.nodes}
        return replace(self, node_cost=cost, node_sync=None)

    def objective(self, choice: dict[int, int]) -> float:
        """The additive cost of one assignment (node -> option index)."""
        total = sum(self.node_cost[i][choice[i]] for i in self.nodes)
        return total + sum(float(c[choice[u], choice[v]]) for u, v, c in self.edges)

    def memory(self, choice: dict[int, int]) -> float:
        """Bytes per device of one assignment: its operators' and its edges' resharding."""
        total = self.fixed + sum(self.node_memory[i][choice[i]] for i in self.nodes)
        return total + sum(float(m[choice[u], choice[v]])
                           for (u, v, _), m in zip(self.edges, self.edge_memories(), strict=True))

    def fits(self, choice: dict[int, int]) -> bool:
        return self.memory(choice) <= self.capacity


@dataclass(frozen=True)
class Solution:
    pcg: PCG                       # the graph with the chosen parallel ops inserted
    objective: float
    mesh: Mesh
    choice: dict[int, Option]
    views: tuple[MachineView, ...]           # the default views, or with its branches on their device groups
    step_time: float                         # the step simulation's, under ``views``
    grouping: Grouping | None = None         # None: every operator on every device


def node_options(n: Node, shapes: Sequence[ParallelTensorShape], mesh: Mesh) -> tuple[Option, ...]:
    """The legal options of compute node ``n`` (inputs whole, as in the plain graph) on ``mesh``."""
    mesh = Mesh(*mesh)
    pieces = mesh.devices
    logical = [s.logical for s in shapes]
    rank = n.outputs[0].rank
    has_sum = any(SUM in rs for rs in n.spec.roles(n.op, logical))
    targets: list[int | str] = list(range(rank)) + ([SUM] if has_sum else []) + [COPY]
    seen, out = set(), []
    for t0, t1 in itertools.product(targets, repeat=2):
        degrees = [1] * rank
        contracted = 1
        for t, m in ((t0, mesh[0]), (t1, mesh[1])):
            if t == SUM:
                contracted *= m
            elif t != COPY:
                degrees[t] *= m
        key = (tuple(degrees), contracted)
        if key in seen:
            continue
        seen.add(key)
        layout = input_layout(n.spec, n.op, logical, key[0], contracted, pieces)
        if layout is None:
            continue
        try:
            outs = n.spec.infer_parallel(n.op, layout)
        except ShapeError:
            continue
        out.append(Option(key[0], contracted, tuple(layout), tuple(outs)))
    return tuple(out)


SHARED_LIMIT = 200_000
"""Entries each of the solver's shared price tables keeps before it starts afresh."""


class _Pricer:
    """Times of resharding and of weight layouts, priced by the cost model on tiny graphs:
    each resharding's moves found once at its unit sizes (:func:`unit_layouts`), then
    priced at every size it is asked for."""

    def __init__(self, cluster: ClusterSpec, config: CostConfig):
        self.cluster, self.config = cluster, config
        self._cache = price_table(cluster, config.unshaped, "solver moves", SHARED_LIMIT)
        self._units = price_table(cluster, config.unshaped, "solver unit moves", SHARED_LIMIT)

    def move(self, source: ParallelTensorShape, target: ParallelTensorShape, kind: Tensor = Tensor.ACTIVATION,
             grad: bool = True) -> float:
        """Seconds per step to bring ``source`` to ``target``: an activation's parallel ops
        (their gradients sent back in backward when ``grad``), or a weight's gradient
        all-reduce (its layout is set up once; only its replicas' sync recurs)."""
        return self.priced(source, target, kind, grad)[0]

    def priced(self, source: ParallelTensorShape, target: ParallelTensorShape, kind: Tensor = Tensor.ACTIVATION,
               grad: bool = True) -> tuple[float, float]:
        """``(seconds, bytes)``: :meth:`move`'s time, and the most memory any one device holds
        of the parallel ops' buffers (as ``cost.model.memory_per_device`` counts them)."""
        key = (source, target, kind, grad)
        if key not in self._cache:
            self._cache[key] = self._price(source, target, kind, grad)
        return self._cache[key]

    def _price(self, source: ParallelTensorShape, target: ParallelTensorShape, kind: Tensor,
               grad: bool) -> tuple[float, float]:
        if source == target and kind is Tensor.ACTIVATION:
            return 0.0, 0.0
        try:
            small, big, factor = unit_layouts(source, target)
        except ShapeError:
            return math.inf, math.inf
        key = (small, big, kind, grad)
        if key not in self._units:
            self._units[key] = self._unit(small, big, kind, grad)
        unit = self._units[key]
        if unit is None:
            return math.inf, math.inf
        ctx, views, parts, held = unit
        cluster, profile = self.cluster, self.config.profile
        costs = [cost_of_phases(ctx, i, views, {ph: c.seconds(cluster, profile, factor) for ph, c in calls.items()})
                 for i, calls in parts]
        seconds = sum(c.compute_fwd + c.compute_bwd + c.comm_fwd + c.comm_bwd + c.grad_sync for c in costs)
        return seconds, held * factor

    def _unit(self, source: ParallelTensorShape, target: ParallelTensorShape, kind: Tensor, grad: bool) -> tuple | None:
        """The resharding's tiny graph at these sizes: (its cost context, views, each parallel
        op's calls per phase, the most bytes any device holds of its buffers); None: no
        resharding reaches ``target``."""
        b = GraphBuilder()
        if kind is Tensor.ACTIVATION:
            # Made by an op (a source's layout is set up once, not paid per step) that reads a
            # trainable weight when the tensor's gradient flows back, so backward is priced too.
            op = WeightAttrs(source.logical, True) if grad else InputAttrs(source.logical)
            x = b.add(op, (), "x", outputs=[source])[0]
            x = b.add1(UnaryAttrs("Identity"), [x], "producer")
        else:
            x = b.add1(WeightAttrs(source.logical, kind is Tensor.WEIGHT), (), "w")
        first = len(b.nodes)
        try:
            y = reshard(b, x, target)
        except ShapeError:
            return None
        pcg = b.build([y])
        # The cost model's per-node prices, as estimate() takes them (no step simulation
        # needed; a parallel op's compute is the executor's own work around its calls), of
        # the resharding's nodes only: not the stand-in producer's weight sync,
        # nor the loss this tiny graph ends in.
        ctx = CostContext.of(pcg, self.cluster, self.config)
        views = default_views(pcg)
        parts = tuple((i, phase_calls(node_moves(ctx.structure, i, views, self.config.dtype), self.cluster,
                                      self.config.profile)) for i in range(first, len(pcg)))
        if kind is not Tensor.ACTIVATION:
            return ctx, views, parts, 0.0       # a weight's pieces are counted with the operator that reads them
        devs = [views[i].devices(n.outputs[0]) for i, n in pcg]
        held = float(outputs_held(pcg, devs, range(first, len(pcg)), self.config, self.cluster.num_devices).max())
        return ctx, views, parts, held


class Tables:
    """Cost tables shared by the problems of one run: keyed by what they depend on (an
    operator, the layouts it reads, the mesh), so a rewritten graph prices only the
    operators and edges the rewrite made (the outer search's incremental re-solve)."""

    def __init__(self, cluster: ClusterSpec, config: CostConfig):
        self.cluster, self.config = cluster, config
        self.pricer = _Pricer(cluster, config)
        self.device = min((cluster.device_type(d) for d in range(cluster.num_devices)),
                          key=lambda t: t.flops(config.dtype.value))
        shaped = replace(config, memory_limit=None, sync_bucket=None)   # (a solve's room: its problem's)
        self.nodes = price_table(cluster, shaped, "solver nodes", SHARED_LIMIT)
        self.edges = price_table(cluster, shaped, "solver edges", SHARED_LIMIT)
        self._stages: tuple[PCG | None, Stages] = (None, Stages(config.training.zero, {}))

    def stages(self, pcg: PCG) -> Stages:
        """Each weight's ZeRO stage in ``pcg`` (``ir/training.py``), made once per graph."""
        if self.config.training.mixed and self._stages[0] is not pcg:
            self._stages = (pcg, self.config.training.stages(pcg))
        return self._stages[1]

    def _shared(self) -> tuple[dict, ...]:
        return self.nodes, self.edges, self.pricer._cache, self.pricer._units

    def taken(self, known: tuple[frozenset, ...]) -> tuple[dict, ...]:
        """What was priced beyond the keys ``known`` (in a worker: what it adds to the run's tables)."""
        return tuple({k: v for k, v in d.items() if k not in seen} for d, seen in zip(self._shared(), known))

    def known(self) -> tuple[frozenset, ...]:
        return tuple(frozenset(d) for d in self._shared())

    def merge(self, taken: tuple[dict, ...]) -> None:
        for d, new in zip(self._shared(), taken):
            d.update(new)

    def node(self, pcg: PCG, i: int, mesh: Mesh, returned: bool,
             grads: frozenset[TensorRef], copies: bool = False, again: Again = Again.NO) -> tuple:
        """(options, cost per option, memory per option, weight sync per option) of compute
        node ``i``; ``grads``: the tensors whose gradient flows (backward makes only those);
        ``copies``: where a CPU makes a transposing copy (``cost.strides.copies``); ``again``:
        whether backward recomputes it (``ir/recompute.py``)."""
        n = pcg.nodes[i]
        kinds = tuple(_source_kind(pcg.nodes[r.node]) for r in n.inputs)
        inputs = tuple(pcg.shape(r) for r in n.inputs)
        mask = backward_mask(n.spec, inputs, [r in grads for r in n.inputs])
        stages = self.stages(pcg)     # each weight input's ZeRO stage
        zeros = tuple(stages[r.node] if k is Tensor.WEIGHT else 0 for r, k in zip(n.inputs, kinds, strict=True))
        key = (n.op, inputs, kinds, mesh, returned, mask, copies, again, zeros)
        hit = self.nodes.get(key)
        if hit is None:
            hit = self.nodes[key] = self._node(pcg, n, mesh, returned, kinds, mask, copies, again, zeros)
        return hit

    def _node(self, pcg: PCG, n: Node, mesh: Mesh, returned: bool, kinds: tuple,
              mask: tuple[bool, ...] | None, copies: bool, again: Again, zeros: tuple[int, ...]) -> tuple:
        config, pricer, device = self.config, self.pricer, self.device
        opts = node_options(n, [pcg.shape(r) for r in n.inputs], mesh)
        if not opts:
            raise ShapeError(f"node {n.name!r} ({n.kind}) has no legal parallelization on {mesh.devices} "
                             "devices")
        per_param = config.weight_bytes
        micro = config.training.micro_batches    # forward and backward (and their moves) run per micro-batch
        costs, mems, syncs = [], [], []
        for o in opts:
            fwd, bwd = _compute_time(n.op, o.inputs, o.outputs, device, config.dtype, config.profile, mask, copies)
            t = (fwd * (2 if again is not Again.NO else 1) + bwd) * micro
            sync = 0.0
            # (a reshape's output is a view of its input: it holds no buffer, ``cost.memory.stored_nodes``)
            held = again is not Again.ALL and not isinstance(n.op, ReshapeAttrs)
            mem = sum(s.piece.numel * config.dtype.itemsize for s in o.outputs) if held else 0
            if again is Again.NO:
                mem += n.spec.saved(n.op, [s.piece for s in o.inputs],
                                    [s.piece for s in o.outputs]).extra_bytes(config.dtype.itemsize)
            for r, want, kind, zero in zip(n.inputs, o.inputs, kinds, zeros, strict=True):
                match kind:
                    case Tensor.WEIGHT:
                        # (under ZeRO the sync is a reduce-scatter and an all-gather: the all-reduce's
                        # bytes, priced as it; the update runs on the replica's shard)
                        moved = pricer.move(pcg.shape(r), want, kind)
                        if zero >= 3:    # each micro-batch: a reduce-scatter, and a gather per pass
                            moved *= micro * 3 / 2      # (forward, and backward's or the recompute's)
                        elif zero >= 2:  # a reduce-scatter (half the all-reduce) every micro-batch
                            moved *= (micro + 1) / 2
                        numel = want.piece.numel
                        updated = shard_elements(numel, want.copy_degree) if zero and moved > 0 else numel
                        t += moved + update_seconds(updated, device, config, synced=moved > 0)
                        sync += moved
                        mem += per_param.per_device(numel, want.copy_degree, zero)
                        if micro > 1 and want.copy_degree == 1:     # accumulated beside backward's
                            mem += per_param.grad * numel
                    case Tensor.CONSTANT:       # (held whole: :func:`step_bytes`)
                        t += pricer.move(pcg.shape(r), want, kind)
                    case Tensor.INPUT:
                        pass
                    case Tensor.ACTIVATION:
                        pass                                             # priced on its edge
                    case _:
                        assert_never(kind)
            if returned:
                for s in o.outputs[:1]:
                    if s.sum_degree > 1:
                        seconds, held = pricer.priced(s, s.with_replicas(sum_degree=1))
                        t += seconds * micro
                        mem += held
            costs.append(t)
            mems.append(float(mem))
            syncs.append(sync)
        return opts, tuple(costs), tuple(mems), tuple(syncs)

    def edge(self, ukey: tuple, vkey: tuple, index: int, k: int, grad: bool,
             producer: tuple[Option, ...], consumer: tuple[Option, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The resharding times, and its memory per device, from each producer option's
        output ``index`` to each consumer option's input ``k``."""
        key = (ukey, vkey, index, k, grad)
        hit = self.edges.get(key)
        if hit is None:
            both = np.array([[self.pricer.priced(a.outputs[index], b.inputs[k], grad=grad) for b in consumer]
                             for a in producer]).reshape(len(producer), len(consumer), 2)
            hit = self.edges[key] = (both[:, :, 0] * self.config.training.micro_batches, both[:, :, 1])
        return hit


def _source_kind(n: Node) -> Tensor:
    if isinstance(n.op, WeightAttrs):
        return Tensor.WEIGHT if n.op.trainable else Tensor.CONSTANT
    return Tensor.INPUT if isinstance(n.op, InputAttrs) else Tensor.ACTIVATION


def build_problem(pcg: PCG, cluster: ClusterSpec, config: CostConfig, mesh: Mesh,
                  tables: Tables | None = None, meshes: Mapping[int, Mesh] | None = None) -> Problem:
    """The cost tables of ``pcg`` (a plain graph: no parallel ops) on ``mesh``; ``meshes``:
    the operators laid out on a group of fewer devices (``groups.py``), with its mesh."""
    mesh = Mesh(*mesh)
    meshes = None if meshes is None else {i: Mesh(*m) for i, m in meshes.items()}
    tables = tables or Tables(cluster, config)
    nodes = tuple(i for i, n in pcg if not n.spec.is_source)
    if any(pcg.nodes[i].spec.is_parallel_op for i in nodes):
        raise ShapeError("the solver takes a graph without parallel ops")
    options: dict[int, tuple[Option, ...]] = {}
    node_cost: dict[int, tuple[float, ...]] = {}
    node_memory: dict[int, tuple[float, ...]] = {}
    node_sync: dict[int, tuple[float, ...]] = {}
    returned = {r.node for r in pcg.outputs}
    grads = needs_grad(pcg, pcg.outputs[0])
    copies = runtime_copies(pcg, cluster)
    again = _again(pcg, grads, config.training.recompute, config.training.recompute_segments)
    keys = {}
    on = {i: mesh if meshes is None else meshes.get(i, mesh) for i in nodes}
    for i in nodes:
        check()
        priced = tables.node(pcg, i, on[i], i in returned, grads, i in copies, again.get(i, Again.NO))
        options[i], node_cost[i], node_memory[i], node_sync[i] = priced
        keys[i] = (pcg.nodes[i].op, tuple(pcg.shape(r) for r in pcg.nodes[i].inputs), i in returned, on[i])
    edges, edge_memory = [], []
    for v in nodes:
        n = pcg.nodes[v]
        for k, r in enumerate(n.inputs):
            u = r.node
            if u not in options:
                continue
            check()
            table, held = tables.edge(keys[u], keys[v], r.index, k, r in grads, options[u], options[v])
            edges.append((u, v, table))
            edge_memory.append(held)
    capacity = float(device_capacity(cluster, config).min())
    return Problem(pcg, mesh.devices, nodes, options, node_cost, node_memory, tuple(edges), capacity,
                   node_sync, tuple(edge_memory), step_bytes(pcg, cluster, config))


def prune_dominated(p: Problem) -> tuple[Problem, dict[int, tuple[int, ...]]]:
    """``p`` without dominated options, and each node's kept option indices. Option ``b``
    of a node is dominated by ``a`` when ``a`` costs no more compute and memory and no more
    on every edge against every option of the other end: replacing ``b`` by ``a`` in any
    assignment never makes it worse, so the optimum survives (of equal options the first
    stays). Removing options can make others dominated, so passes repeat until none goes."""
    keep = {i: np.arange(len(p.options[i])) for i in p.nodes}
    tables = [t for _, _, t in p.edges]
    held = p.edge_memories()
    incident: dict[int, list[tuple[int, bool]]] = {i: [] for i in p.nodes}
    for e, (u, v, _) in enumerate(p.edges):
        incident[u].append((e, True))
        incident[v].append((e, False))
    changed = True
    while changed:
        changed = False
        for i in p.nodes:
            k = keep[i]
            if len(k) < 2:
                continue
            parts = [np.asarray(p.node_cost[i])[k][:, None], np.asarray(p.node_memory[i])[k][:, None]]
            for e, out in incident[i]:
                parts += [tables[e], held[e]] if out else [tables[e].T, held[e].T]
            sig = np.concatenate(parts, axis=1)
            le = (sig[:, None, :] <= sig[None, :, :]).all(axis=2)       # le[a, b]: a no worse than b
            eq = le & le.T
            order = np.arange(len(k))
            beats = le & (~eq | (order[:, None] < order[None, :]))
            np.fill_diagonal(beats, False)
            alive = ~beats.any(axis=0)
            if alive.all():
                continue
            changed = True
            keep[i] = k[alive]
            for e, out in incident[i]:
                tables[e] = tables[e][alive, :] if out else tables[e][:, alive]
                held[e] = held[e][alive, :] if out else held[e][:, alive]
    q = Problem(p.pcg, p.pieces, p.nodes, {i: tuple(p.options[i][j] for j in keep[i]) for i in p.nodes},
                {i: tuple(p.node_cost[i][j] for j in keep[i]) for i in p.nodes},
                {i: tuple(p.node_memory[i][j] for j in keep[i]) for i in p.nodes},
                tuple((u, v, t) for (u, v, _), t in zip(p.edges, tables, strict=True)), p.capacity,
                edge_memory=tuple(held), fixed=p.fixed)
    return q, {i: tuple(int(j) for j in keep[i]) for i in p.nodes}


def solve_problem(p: Problem) -> dict[int, int] | None:
    """The assignment of least objective that fits in memory (None: none fits, or the
    program is too large), on the problem without its dominated options
    (:func:`prune_dominated`).

    First by variable elimination, ignoring memory (the dynamic program over the graph's
    structure, ``elimination.py``): when its optimum fits, no assignment that fits is
    cheaper, so it is the answer. When memory binds, the elimination is repeated with memory
    priced at a rate (Lagrangian relaxation, :func:`_priced_memory`): each run's optimum
    bounds the answer from below, and the cheapest that fits is kept. When the two meet,
    that is the answer; otherwise a program of at most :data:`MILP_VARIABLES` goes to the
    integer program with memory as a constraint (exact), and a larger one keeps the
    cheapest that fits, unless the relaxation found none: then a program of at most
    :data:`MILP_FEASIBLE_VARIABLES` goes to the integer program to find one. A graph too
    entangled to eliminate goes to the integer program."""
    q, kept = prune_dominated(p)
    least = q.fixed + sum(min(q.node_memory[i]) for i in q.nodes) + \
        sum(float(m.min()) for m in q.edge_memories() if m.size)
    if least > q.capacity:
        return None     # even each operator's and edge's leanest choice does not fit: nothing can (memory adds up)
    sizes = {i: len(q.options[i]) for i in q.nodes}
    try:
        plan = Elimination(sizes, [(u, v) for u, v, _ in q.edges])
        value, choice = plan.run(q.node_cost, [t for _, _, t in q.edges])
        if not math.isfinite(value):
            return None
        if not q.fits(choice):
            choice, proved = _priced_memory(q, plan)
            size = _variables(q)
            if not proved and (size <= MILP_VARIABLES or choice is None and size <= MILP_FEASIBLE_VARIABLES):
                choice = _solve_milp(q)
    except TooWide:
        choice = _solve_milp(q)
    return None if choice is None else {i: kept[i][k] for i, k in choice.items()}


MILP_VARIABLES = 5_000
"""The largest integer program (variables) solved when memory binds and the Lagrangian
bound has not closed: beyond it, the cheapest assignment that fits that the relaxation
found is kept (a count, so the path taken is the same on every machine). HiGHS's root LP
grows fast with the edges' resharding memory in its memory row: on BERT-tiny at batch 4
over 8 A100s held to 1.5 MiB, its two 23,000-variable programs took 10 and 14 s each, per
candidate graph of the outer search (3.5 min in all), to improve the relaxation's answer
by 1.1 % and 0.8 %."""
MILP_FEASIBLE_VARIABLES = 40_000
"""The largest integer program solved when the Lagrangian search found nothing that fits:
finding a plan that fits is worth the time a better one is not."""
RATE_STEPS = 24
"""Eliminations per Lagrangian search: the rate's doublings and then its bisections."""


def _variables(p: Problem) -> int:
    return sum(len(o) for o in p.options.values()) + sum(t.size for _, _, t in p.edges)


def _priced_memory(p: Problem, plan: Elimination) -> tuple[dict[int, int] | None, bool]:
    """The cheapest assignment that fits among the optima of ``objective + rate * memory``
    over rates found by doubling then bisection, and whether it is proved optimal: some
    rate's optimum ``x`` gives the lower bound ``objective(x) + rate * (memory(x) -
    capacity)`` on every assignment that fits, and the kept one meets it (to 1e-9)."""
    memory = {i: np.asarray(p.node_memory[i]) for i in p.nodes}
    cost = {i: np.asarray(p.node_cost[i]) for i in p.nodes}
    tables = [t for _, _, t in p.edges]
    held = p.edge_memories()

    def at(rate: float) -> tuple[dict[int, int], float, float]:
        _, x = plan.run({i: cost[i] + rate * memory[i] for i in p.nodes},
                        [t + rate * m for t, m in zip(tables, held, strict=True)])
        return x, p.objective(x), p.memory(x)

    scale = max(float(np.max(c[np.isfinite(c)], initial=0.0)) for c in cost.values()) or 1.0
    rate = scale / max(p.capacity, 1.0)
    best, best_value, bound = None, math.inf, -math.inf
    low, high = 0.0, None
    for _ in range(RATE_STEPS):
        x, value, used = at(rate)
        bound = max(bound, value + rate * (used - p.capacity))
        if used <= p.capacity:
            if value < best_value:
                best, best_value = x, value
            high = rate
        else:
            low = rate
        if best is not None and best_value - bound <= 1e-9 * abs(best_value):
            return best, True
        rate = rate * 4 if high is None else (low + high) / 2 if low > 0 else high / 4
    return best, False


def _solve_milp(p: Problem) -> dict[int, int] | None:
    # Imported here: scipy.optimize takes half a second to import, and the elimination
    # answers most problems without it.
    from scipy.optimize import Bounds, LinearConstraint, milp  # noqa: PLC0415
    from scipy.sparse import coo_array  # noqa: PLC0415

    index: dict[tuple[int, int], int] = {}   # (node, option) -> column
    for i in p.nodes:
        for k in range(len(p.options[i])):
            index[(i, k)] = len(index)
    c = [0.0] * len(index)
    for (i, k), j in index.items():
        c[j] = p.node_cost[i][k]
    rows, cols, vals, lo, hi = [], [], [], [], []

    def constraint(terms: Sequence[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for col, v in terms:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    for i in p.nodes:
        constraint([(index[(i, k)], 1.0) for k in range(len(p.options[i]))], 1.0, 1.0)
    memory_row = len(lo)
    constraint([(index[(i, k)], p.node_memory[i][k]) for i in p.nodes for k in range(len(p.options[i]))],
               -np.inf, p.capacity - p.fixed)
    integrality = [1] * len(index)
    upper_y: list[float] = []
    for (u, v, table), held in zip(p.edges, p.edge_memories(), strict=True):
        # y_ab = x_ua * x_vb through its marginals: sum_b y_ab = x_ua, sum_a y_ab = x_vb. The
        # relaxation of this form is tight on trees (local consistency), so little branching.
        first = len(c)
        na, nb = table.shape
        for a_, b_ in itertools.product(range(na), range(nb)):
            cost = float(table[a_, b_])
            c.append(cost if math.isfinite(cost) else 0.0)
            integrality.append(0)
            upper_y.append(1.0 if math.isfinite(cost) else 0.0)
            if math.isfinite(cost) and held[a_, b_] > 0:   # the edge's resharding buffers, in the memory row
                rows.append(memory_row)
                cols.append(len(c) - 1)
                vals.append(float(held[a_, b_]))
        for a_ in range(na):
            constraint([(first + a_ * nb + b_, 1.0) for b_ in range(nb)] + [(index[(u, a_)], -1.0)], 0.0, 0.0)
        for b_ in range(nb):
            constraint([(first + a_ * nb + b_, 1.0) for a_ in range(na)] + [(index[(v, b_)], -1.0)], 0.0, 0.0)
        if len(c) > VARIABLE_LIMIT:
            return None
    n = len(c)
    a = coo_array((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    upper = np.concatenate([np.ones(len(index)), np.array(upper_y)])
    # In microseconds: HiGHS's tolerances are absolute, and step times are 1e-6 .. 1 s.
    res = milp(np.array(c) * 1e6, constraints=LinearConstraint(a, lo, hi), integrality=np.array(integrality),
               bounds=Bounds(np.zeros(n), upper),
               options={"node_limit": NODE_LIMIT, "mip_rel_gap": 0.0, "presolve": True})
    if res.x is None:
        return None
    x = res.x
    choice = {}
    for i in p.nodes:
        ks = [k for k in range(len(p.options[i])) if x[index[(i, k)]] > 0.5]
        choice[i] = ks[0]
    return choice


def brute_force(p: Problem) -> tuple[float, dict[int, int]] | None:
    """Every assignment, for the tests: (least objective, its assignment) among those that fit."""
    best = None
    for combo in itertools.product(*(range(len(p.options[i])) for i in p.nodes)):
        choice = dict(zip(p.nodes, combo, strict=True))
        if not p.fits(choice):
            continue
        value = p.objective(choice)
        if best is None or value < best[0] - 1e-15:
            best = (value, choice)
    return best


def realize(p: Problem, choice: dict[int, int]) -> PCG:
    """The graph with each operator's chosen layouts: parallel ops inserted where a consumer
    reads another layout than its producer makes (shared by consumers that read the same)."""
    pcg = p.pcg
    b = GraphBuilder()
    remap: dict[TensorRef, TensorRef] = {}
    cache: dict[tuple[TensorRef, ParallelTensorShape], TensorRef] = {}
    for i, n in pcg:
        if n.spec.is_source:
            remap[TensorRef(i, 0)] = b.add(n.op, (), n.name, outputs=n.outputs)[0]
            continue
        opt = p.options[i][choice[i]]
        ins = []
        for r, want in zip(n.inputs, opt.inputs, strict=True):
            key = (remap[r], want)
            if key not in cache:
                cache[key] = reshard(b, remap[r], want)
            ins.append(cache[key])
        for k, o in enumerate(b.add(n.op, ins, n.name)):
            remap[TensorRef(i, k)] = o
    outputs = []
    for r in pcg.outputs:
        s = b.shape(remap[r])
        outputs.append(reshard(b, remap[r], s.with_replicas(sum_degree=1)) if s.sum_degree > 1 else remap[r])
    return simplify(b.build(outputs))


def solve(pcg: PCG, cluster: ClusterSpec, config: CostConfig = CostConfig(),
          devices: int | None = None, tables: Tables | None = None, grouped: bool = True) -> Solution | None:
    """The best parallelization of ``pcg`` over ``devices`` (default: all) devices, over every
    mesh factorization; None if no program was small enough to solve or none fits. Pass one
    ``tables`` to solve many graphs of a run: each prices only what the others did not.
    With ``grouped``, the graph's independent branches are also solved on disjoint device
    groups (:func:`regroup`)."""
    n = devices or cluster.num_devices
    tables = tables or Tables(cluster, config)
    # Side by side only while the run's tables are cold: a later solve (a rewritten graph)
    # prices only what the rewrite made, less than a fork costs.
    spread = large(n) and not tables.edges
    known = tables.known() if spread else ()

    def mesh_solutions(mesh: Mesh) -> tuple[list[Solution], tuple[dict, ...]]:
        found = list(_solutions(pcg, cluster, config, mesh, tables))
        return found, tables.taken(known) if in_worker() else ()

    best: Solution | None = None
    for found, taken in fork_map(mesh_solutions, factorizations(n), spread):
        tables.merge(taken)
        for sol in found:
            if best is None or sol.step_time < best.step_time * (1 - 1e-12):
                best = sol
    if best is None or not grouped or n != cluster.num_devices:
        return best
    return regroup(pcg, cluster, config, best, tables)


def regroup(pcg: PCG, cluster: ClusterSpec, config: CostConfig, flat: Solution, tables: Tables) -> Solution:
    """``flat`` (``pcg`` solved with every operator on every device), or the fastest solution
    of ``pcg``'s groupings (:func:`groups.groupings`, on ``flat``'s mesh) where the step
    simulation finds one faster."""
    items = groupings(pcg, cluster)
    spread = large(cluster.num_devices) and len(items) > 1     # side by side, as the meshes
    known = tables.known() if spread else ()    # (the run's table keys: only where workers send theirs)

    def grouped(grouping: Grouping) -> tuple[list[Solution], tuple[dict, ...]]:
        meshes = {i: flat.mesh.sub(r.count) for i, r in grouping.ranges}
        found = list(_solutions(pcg, cluster, config, flat.mesh, tables, meshes, grouping))
        return found, tables.taken(known) if in_worker() else ()

    best = flat
    for found, taken in fork_map(grouped, items, spread):
        tables.merge(taken)
        for sol in found:
            if sol.step_time < best.step_time * (1 - 1e-12):
                best = sol
    return best


def _solutions(pcg: PCG, cluster: ClusterSpec, config: CostConfig, mesh: Mesh, tables: Tables,
               meshes: Mapping[int, Mesh] | None = None, grouping: Grouping | None = None):
    """The optima of one mesh (and grouping) that fit, each priced by the step simulation."""
    try:
        p = build_problem(pcg, cluster, config, mesh, tables, meshes)
    except ShapeError:
        return
    tried: set[tuple[int, ...]] = set()
    for weight in SYNC_WEIGHTS:
        choice = solve_problem(p.sync_weighted(weight))
        if choice is None or (key := tuple(choice[i] for i in p.nodes)) in tried:
            continue
        tried.add(key)
        # The optima are compared as the final pricing sees them: the step simulation
        # overlaps what the additive objective adds up.
        g = realize(p, choice)
        ranges = None if grouping is None else group_ranges(pcg, grouping, g)
        if grouping is not None and ranges is None:
            continue
        views = default_views(g, ranges)
        rep = estimate(g, views, cluster, config)
        if rep.feasible:
            yield Solution(g, p.objective(choice), mesh, {i: p.options[i][k] for i, k in choice.items()},
                           views, rep.step_time, grouping)
