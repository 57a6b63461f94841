"""Baseline strategies as PCGs with parallel ops inserted, so the search can start from them.

* ``data_parallel``: the batch dim is split over the devices (a batch smaller than the
  device count uses fewer devices), weights are replicated and their gradients
  all-reduced.
* ``hybrid(tp, dp)``: the uniform Megatron-style hybrid. Tensor parallelism of degree
  ``tp`` inside groups of ``tp`` consecutive devices (inside a node when ``tp`` divides
  its devices), data parallelism of degree ``dp`` across the groups. A Linear/MatMul/
  Gemm/Conv whose input is whole is split by output columns (channels); the next one,
  whose input then arrives split along its contracted dim, by rows, ending in a
  Reduction; embedding tables (Gather on axis 0 of a weight, or a GroupedGather's) are
  split by rows. Where a width does not divide ``tp`` another legal split is tried (rows
  instead of columns, or a smaller divisor of ``tp``); an op that cannot split at all
  stays replicated in its group, and the description says which.
* ``tensor_parallel``: the hybrid with ``tp`` = the devices of the smallest node and
  ``dp`` across nodes.

All are built by one propagation pass: each operator takes the first legal split from a
policy's list of candidates, and parallel ops are inserted wherever an input's layout
differs from what that split needs. Whatever cannot be split runs replicated, so every
model gets a valid plan.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from ..cluster.spec import ClusterSpec
from ..cost.model import layout_sources
from ..deadline import check
from ..errors import ShapeError, UsageError
from ..ir.ops.conv import ConvAttrs
from ..ir.ops.gather_reduce import GatherAttrs, GroupedGatherAttrs
from ..ir.ops.linear import GemmAttrs, MatMulAttrs
from ..ir.ops.parallel import RepartitionAttrs
from ..ir.ops.sources import InputAttrs, WeightAttrs
from ..ir.opspec import SUM, WHOLE, input_layout
from ..ir.pcg import PCG, GraphBuilder, Node, TensorRef
from ..ir.recompute import Recompute, parse_recompute
from ..ir.shapes import ParallelTensorShape
from ..ir.simplify import simplify
from ..ir.training import ZERO_STAGES, Training
from .reshard import reshard

Candidate = tuple[tuple[int, ...], int]
"""A split of one operator: the degrees of its output dims and of its contracted dim."""

Policy = Callable[[Node, Sequence[ParallelTensorShape], Sequence[bool]], list[Candidate]]


class Strategy(StrEnum):
    """The plans ``unity optimize --strategy`` names (a ``str``: plans and the command line
    spell them so); a uniform hybrid is also named ``tp=T,dp=D`` (:func:`hybrid_name`)."""

    DATA_PARALLEL = "data_parallel"
    TENSOR_PARALLEL = "tensor_parallel"
    HYBRID = "hybrid"                                # the fastest uniform tp=T,dp=D
    UNITY = "unity"                                  # the joint search
    PARALLEL_ONLY = "parallel_only"
    ALGEBRAIC_THEN_PARALLEL = "algebraic_then_parallel"
    BEST = "best"                                    # every search, keeping the fastest plan


@dataclass(frozen=True)
class Baseline:
    name: str
    pcg: PCG
    devices: int
    description: str
    replicated: tuple[str, ...] = ()   # weighted ops a tensor-parallel policy left whole in their group
    degrees: tuple[int, int] | None = None   # a uniform hybrid's (tp, dp)


def largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def data_parallel(pcg: PCG, cluster: ClusterSpec) -> Baseline:
    batch = batch_size(pcg)
    dp = largest_divisor_at_most(batch, cluster.num_devices)

    def candidates(node: Node, shapes: Sequence[ParallelTensorShape], weights: Sequence[bool]) -> list[Candidate]:
        return [(_follow(node, shapes, weights), 1)]

    g = propagate(pcg, dp, dp, candidates)
    return Baseline(Strategy.DATA_PARALLEL, g, dp, f"batch {batch} split over {dp} devices, weights replicated")


def tensor_parallel(pcg: PCG, cluster: ClusterSpec) -> Baseline:
    """Megatron within each node (the smallest node's devices), data parallel across nodes."""
    tp = min(n.devices for n in cluster.nodes)
    dp = largest_divisor_at_most(batch_size(pcg), len(cluster.nodes))
    g, replicated, note = _megatron(pcg, tp, dp)
    return Baseline(Strategy.TENSOR_PARALLEL, g, tp * dp,
                    f"tensor parallel {tp} ways within each node, data parallel {dp} ways across nodes{note}",
                    replicated)


def hybrid(pcg: PCG, tp: int, dp: int, training: Training = Training()) -> Baseline:
    """The uniform ``tp=T,dp=D`` hybrid on ``T*D`` devices (see the module docstring), named
    with the step's shape it is priced under (``strategy_name``); the default views put each
    tensor-parallel group on ``T`` consecutive devices."""
    if tp < 1 or dp < 1:
        raise ShapeError(f"tp={tp},dp={dp}: degrees must be positive")
    g, replicated, note = _megatron(pcg, tp, dp)
    name = hybrid_name(tp, dp)
    return retrained(Baseline(name, g, tp * dp, f"{name}: {hybrid_layout(tp, dp)}{note}", replicated, (tp, dp)),
                     training)


def retrained(b: Baseline, training: Training) -> Baseline:
    """The hybrid ``b`` (as :func:`hybrid` builds it under the default step) named and
    described with the step's shape ``training``: one graph priced under several shapes is
    built once."""
    if training.default:
        return b
    tp, dp = b.degrees
    name = strategy_name(tp, dp, training)
    return replace(b, name=name, description=f"{name}{b.description.removeprefix(b.name)}, {training.describe()}")


def hybrid_layout(tp: int, dp: int, transposed: bool = False) -> str:
    """How a ``tp=T,dp=D`` hybrid lies on the devices, in words: each tensor-parallel group on
    consecutive devices, or (``transposed``) on devices ``D`` apart with the replicas
    consecutive (``views.transposed_views``)."""
    if tp == 1:
        return f"data parallel {dp} ways"
    if dp == 1:
        return f"tensor parallel {tp} ways in groups of {tp} consecutive devices, one group"
    if transposed:
        return (f"tensor parallel {tp} ways in groups of devices {dp} apart (across nodes), data parallel {dp} "
                "ways on consecutive devices")
    return f"tensor parallel {tp} ways in groups of {tp} consecutive devices, data parallel {dp} ways across them"


def hybrid_name(tp: int, dp: int) -> str:
    return f"tp={tp},dp={dp}"


def hybrid_degrees(devices: int, batch: int) -> list[tuple[int, int]]:
    """Every uniform hybrid ``(tp, dp)`` with ``tp * dp = devices`` whose ``dp`` divides the
    batch, ``tp`` ascending. Any divisor, not only powers of two (30 = 5 x 6)."""
    return [(devices // d, d) for d in reversed(divisors(devices)) if batch % d == 0]


def is_hybrid(strategy: str) -> bool:
    """Whether a ``--strategy`` value is meant as ``tp=T,dp=D`` (and not a strategy's name)."""
    return "=" in strategy


def parse_hybrid(strategy: str, devices: int) -> tuple[int, int]:
    """``(tp, dp)`` of ``--strategy tp=T,dp=D`` (see :func:`parse_strategy`)."""
    tp, dp, _ = parse_strategy(strategy, devices)
    return tp, dp


STRATEGY_KEYS = ("tp", "dp", "zero", "mb")
"""The keys of a hand-written ``--strategy``: tensor and data parallel degrees (one of them
at least: the other is what the device count leaves), the ZeRO stage and the micro-batches
per step (default 0 and 1); and ``zero[PATTERN]=Z``, the stage of the weights whose names
match ``PATTERN`` (``ir/training.Training.zero_by_weight``)."""
_WEIGHT_STAGE = re.compile(r"zero\[(.+)\]")


def parse_strategy(strategy: str, devices: int) -> tuple[int, int, Training]:
    """``(tp, dp, training)`` of ``--strategy tp=T,dp=D[,zero=Z][,mb=K][,recompute=R]``; a
    UsageError naming the option and the device count when it is malformed or ``T*D`` is not
    the cluster's device count."""
    t = max(d for d in divisors(devices) if d * d <= devices)
    usage = (f"--strategy {strategy[:200]!r}: expected tp=T,dp=D[,zero=Z][,zero[NAMES]=Z][,mb=K][,recompute="
             f"{'|'.join(Recompute)}[:S]] with T*D = {devices} (the cluster's device count; one of tp "
             f"and dp may be left out), e.g. tp={t},dp={devices // t}")
    values: dict[str, int] = {}
    recompute, segments = Recompute.NONE, 0
    by_weight: list[tuple[str, int]] = []
    for part in strategy.split(","):
        key, sep, value = part.partition("=")
        if (named := _WEIGHT_STAGE.fullmatch(key.strip())) and sep:
            if not whole_number(value.strip()) or int(value) not in ZERO_STAGES:
                raise UsageError(f"--strategy {strategy[:200]}: {part.strip()[:80]}: a ZeRO stage is one of "
                                 f"{', '.join(map(str, ZERO_STAGES))}")
            by_weight.append((named[1], int(value)))
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "recompute" and sep and "recompute" not in values:
            try:
                recompute, segments = parse_recompute(value)
            except ValueError as e:
                raise UsageError(f"--strategy {strategy[:200]!r}: recompute={value[:40]}: {e}") from None
            values[key] = 0
            continue
        if not sep or key not in STRATEGY_KEYS or key in values or not whole_number(value):
            raise UsageError(usage)
        values[key] = int(value)
    given = [k for k in ("tp", "dp") if k in values]
    if not given or any(values[k] < 1 for k in given):
        raise UsageError(usage)
    if len(given) == 1:     # the other degree is what the devices leave (dp=N,zero=3 is FSDP)
        (key,) = given
        if devices % values[key]:
            raise UsageError(f"--strategy {strategy[:200]}: {key}={values[key]} does not divide the cluster's "
                             f"{devices} devices (give tp and dp with T*D = {devices})")
        values["dp" if key == "tp" else "tp"] = devices // values[key]
    tp, dp = values["tp"], values["dp"]
    if tp * dp != devices:
        raise UsageError(f"--strategy {strategy[:200]}: tp*dp = {tp * dp}, but the cluster has {devices} devices "
                         f"(T*D must equal it, e.g. tp={t},dp={devices // t})")
    zero, mb = values.get("zero", 0), values.get("mb", 1)
    if zero not in ZERO_STAGES:
        raise UsageError(f"--strategy {strategy[:200]}: zero={zero}: the ZeRO stages built are "
                         f"{', '.join(map(str, ZERO_STAGES))}")
    if mb < 1:
        raise UsageError(f"--strategy {strategy[:200]}: mb={mb}: micro-batches per step must be at least 1")
    return tp, dp, Training(zero, mb, recompute, segments, tuple(by_weight))


def whole_number(text: str) -> bool:
    """Whether ``text`` is a whole number a person would write (ASCII digits, not '²')."""
    return 0 < len(text) <= 9 and text.isascii() and text.isdigit()


def strategy_name(tp: int, dp: int, training: Training = Training()) -> str:
    """A hand-written configuration's row name: ``tp=T,dp=D``, and its ZeRO stage,
    micro-batches and recomputation where not the default."""
    extra = (f",zero={training.zero}" if training.zero else "") + \
        "".join(f",zero[{p}]={z}" for p, z in training.zero_by_weight) + \
        (f",mb={training.micro_batches}" if training.micro_batches > 1 else "") + \
        (f",recompute={training.recompute_name}" if training.recompute is not Recompute.NONE else "")
    return hybrid_name(tp, dp) + extra


def _megatron(pcg: PCG, tp: int, dp: int) -> tuple[PCG, tuple[str, ...], str]:
    """The hybrid's graph, the weighted ops it left replicated and a note saying so."""
    def candidates(node: Node, shapes: Sequence[ParallelTensorShape], weights: Sequence[bool]) -> list[Candidate]:
        follow = _follow(node, shapes, weights)
        batch_only = follow[:1] + (1,) * (len(follow) - 1)  # a split the op cannot take on a feature dim
        return _weighted_split(node, shapes, weights, tp, follow) + \
            [(follow, _contracted(node, shapes)), (follow, 1), (batch_only, 1)]

    g = propagate(pcg, tp * dp, dp, candidates)
    if tp == 1:
        return g, (), ""
    splits = weighted_splits(g)
    whole = tuple(name for name, d in splits if d == 1)
    fewer = [(name, d) for name, d in splits if 1 < d < tp]
    if not splits:
        note = "; no weighted op to split"
    elif not whole and not fewer:
        note = f"; all {len(splits)} weighted ops split {tp} ways"
    else:
        parts = []
        if whole:
            parts.append(f"{len(whole)} of {len(splits)} weighted ops stayed replicated in their group "
                         f"({_names(whole)})")
        if fewer:
            parts.append(f"{len(fewer)} split fewer than {tp} ways ({_names([f'{n} {d}' for n, d in fewer])})")
        note = "; " + "; ".join(parts)
    return g, whole, note


def _names(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def weighted_splits(g: PCG) -> list[tuple[str, int]]:
    """For every op a tensor-parallel policy would split (a Linear/MatMul/Gemm/Conv reading a
    trainable weight, an embedding lookup), its name and how many shards its weight has."""
    out = []
    layout = layout_sources(g)
    for _, n in g:
        if isinstance(n.op, MatMulAttrs | GemmAttrs | ConvAttrs):
            slots = list(range(min(2, len(n.inputs))))
        elif _looks_up(n.op):
            slots = [0]
        else:
            continue
        for k in slots:
            src = layout[n.inputs[k].node]
            if src is not None and isinstance(g.nodes[src].op, WeightAttrs) and g.nodes[src].op.trainable:
                out.append((n.name or n.kind, g.shape(n.inputs[k]).shard_degree))
                break
    return out


STRATEGIES: dict[Strategy, Callable[[PCG, ClusterSpec], Baseline]] = {
    Strategy.DATA_PARALLEL: data_parallel,
    Strategy.TENSOR_PARALLEL: tensor_parallel,
}


# ---------------------------------------------------------------------------


def batch_size(pcg: PCG) -> int:
    dims = [n.op.shape.dims[0] for _, n in pcg if isinstance(n.op, InputAttrs) and n.op.shape.rank]
    return min(dims) if dims else 1


def _follow(node: Node, shapes: Sequence[ParallelTensorShape], weights: Sequence[bool]) -> tuple[int, ...]:
    """Output degrees proposed by the activations flowing in: each output dim keeps the
    largest split any activation input brings to it."""
    roles = node.spec.roles(node.op, [s.logical for s in shapes])
    out = [1] * node.outputs[0].rank
    for s, rs, is_w in zip(shapes, roles, weights, strict=True):
        if is_w:
            continue
        for d, role in zip(s.dims, rs, strict=True):
            if role not in (SUM, WHOLE):
                out[role] = max(out[role], d.degree)
    return tuple(out)


def _contracted(node: Node, shapes: Sequence[ParallelTensorShape]) -> int:
    roles = node.spec.roles(node.op, [s.logical for s in shapes])
    degs = [d.degree for s, rs in zip(shapes, roles, strict=True) for d, r in zip(s.dims, rs, strict=True) if r == SUM]
    return max(degs, default=1)


def _weighted_split(node: Node, shapes: Sequence[ParallelTensorShape], weights: Sequence[bool], tp: int,
                    follow: tuple[int, ...]) -> list[Candidate]:
    """Megatron's choices for an op with a trainable weight, in order: a row split if its
    input arrives split along the contracted dim, else a column split; then, for a width
    that does not divide ``tp``, the other of the two, and the same with each smaller
    divisor of ``tp`` (the rest of the group holding replicas)."""
    if tp <= 1 or not any(weights):
        return []
    roles = node.spec.roles(node.op, [s.logical for s in shapes])
    degrees = divisors(tp)[:0:-1]  # tp first, then smaller degrees; never 1
    if isinstance(node.op, MatMulAttrs | GemmAttrs | ConvAttrs):
        data = [i for i, w in enumerate(weights) if not w and i < 2]
        wi = [i for i, w in enumerate(weights) if w and i < 2]
        if not data or not wi:
            return []
        x = shapes[data[0]]
        k_split = max((d.degree for d, r in zip(x.dims, roles[data[0]], strict=True) if r == SUM), default=1)
        base = tuple(1 if j != 0 else g for j, g in enumerate(follow))
        col = [r for r in roles[wi[0]] if r not in (SUM, WHOLE)]
        out: list[Candidate] = [(base, k_split)] if k_split > 1 else []
        for d in degrees:
            if col:
                out.append((_with(base, col[-1], d), 1))
            out.append((base, d))
        return out
    if _looks_up(node.op) and weights[0]:
        col = [r for r in roles[0] if r not in (SUM, WHOLE)]
        out = []
        for d in degrees:  # rows (the vocabulary), else the embedding dim
            out.append((follow, d))
            if col:
                out.append((_with(follow, col[-1], d), 1))
        return out
    return []


def _looks_up(op) -> bool:
    """An embedding lookup: rows of a table (Gather on axis 0, or several tables' at once)."""
    return isinstance(op, GatherAttrs) and op.axis == 0 or isinstance(op, GroupedGatherAttrs)


def _with(degrees: tuple[int, ...], dim: int, d: int) -> tuple[int, ...]:
    return degrees[:dim] + (d,) + degrees[dim + 1:]


def propagate(pcg: PCG, pieces: int, batch_split: int, candidates: Policy) -> PCG:
    b = GraphBuilder()
    remap: dict[TensorRef, TensorRef] = {}
    trainable = _trainable_sources(pcg)
    resharded: dict[tuple[TensorRef, ParallelTensorShape], TensorRef] = {}

    def to_layout(ref: TensorRef, want: ParallelTensorShape) -> TensorRef:
        key = (ref, want)
        if key not in resharded:
            resharded[key] = reshard(b, ref, want)
        return resharded[key]

    for i, n in pcg:
        if i % 256 == 0:
            check()
        if n.spec.is_source:
            ref = b.add(n.op, (), n.name, outputs=n.outputs)[0]  # a segment's boundary input comes laid out
            if isinstance(n.op, InputAttrs) and n.op.shape.rank and batch_split > 1 and \
                    n.outputs[0].pieces == 1 and n.op.shape.dims[0] % batch_split == 0:
                ref = b.add1(RepartitionAttrs(0, batch_split), [ref])
            remap[TensorRef(i, 0)] = ref
            continue
        ins = [remap[r] for r in n.inputs]
        shapes = [b.shape(r) for r in ins]
        weights = [trainable[r.node] for r in n.inputs]
        logical = [s.logical for s in shapes]
        chosen = None
        for degrees, contracted in candidates(n, shapes, weights) + [((1,) * n.outputs[0].rank, 1)]:
            layout = input_layout(n.spec, n.op, logical, degrees, contracted, pieces)
            if layout is not None:
                chosen = layout
                break
        if chosen is None:
            raise ShapeError(f"node {n.name!r} ({n.kind}) cannot run even replicated on {pieces} devices")
        new_ins = [to_layout(r, want) for r, want in zip(ins, chosen, strict=True)]
        outs = b.add(n.op, new_ins, n.name)
        for k, o in enumerate(outs):
            remap[TensorRef(i, k)] = o
    # A graph output left as partial sums (a row-split Linear at the end) is reduced: the
    # loss needs its value, and the reduction's communication is part of the step.
    outputs = []
    for r in pcg.outputs:
        s = b.shape(remap[r])
        outputs.append(to_layout(remap[r], s.with_replicas(sum_degree=1)) if s.sum_degree > 1 else remap[r])
    return simplify(b.build(outputs))


def _trainable_sources(pcg: PCG) -> list[bool]:
    return [isinstance(n.op, WeightAttrs) and n.op.trainable for _, n in pcg]
