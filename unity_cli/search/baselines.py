"""Baseline strategies as PCGs with parallel ops inserted, so the search can start from them.

* ``data_parallel``: the batch dim is split over the devices (a batch smaller than the
  device count uses fewer devices), weights are replicated and their gradients
  all-reduced.
* ``tensor_parallel``: Megatron-style within a node: a Linear/MatMul/Conv whose input is
  whole is split by output columns (channels), and the next one, whose input then
  arrives split along its contracted dim, by rows, ending in a Reduction; embedding
  tables are split by rows; data parallel across nodes.

Both are built by one propagation pass: each operator takes the first legal split from a
policy's list of candidates, and parallel ops are inserted wherever an input's layout
differs from what that split needs. Whatever cannot be split runs replicated, so every
model gets a valid plan.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..cluster.spec import ClusterSpec
from ..errors import ShapeError
from ..ir.ops.conv import ConvAttrs
from ..ir.ops.gather_reduce import GatherAttrs
from ..ir.ops.linear import GemmAttrs, MatMulAttrs
from ..ir.ops.parallel import RepartitionAttrs
from ..ir.ops.sources import InputAttrs, WeightAttrs
from ..ir.opspec import SUM, WHOLE, input_layout
from ..ir.pcg import PCG, GraphBuilder, Node, TensorRef
from ..ir.shapes import ParallelTensorShape
from ..ir.simplify import simplify
from .reshard import reshard

Candidate = tuple[tuple[int, ...], int]
"""A split of one operator: the degrees of its output dims and of its contracted dim."""


@dataclass(frozen=True)
class Baseline:
    name: str
    pcg: PCG
    devices: int
    description: str


def largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def data_parallel(pcg: PCG, cluster: ClusterSpec) -> Baseline:
    batch = batch_size(pcg)
    dp = largest_divisor_at_most(batch, cluster.num_devices)

    def candidates(node: Node, shapes: Sequence[ParallelTensorShape], weights: Sequence[bool]) -> list[Candidate]:
        return [(_follow(node, shapes, weights), 1)]

    g = propagate(pcg, dp, dp, candidates)
    return Baseline("data_parallel", g, dp, f"batch {batch} split over {dp} devices, weights replicated")


def tensor_parallel(pcg: PCG, cluster: ClusterSpec) -> Baseline:
    per_node = min(n.devices for n in cluster.nodes)
    batch = batch_size(pcg)
    dp = largest_divisor_at_most(batch, len(cluster.nodes))
    tp = per_node
    total = dp * tp

    def candidates(node: Node, shapes: Sequence[ParallelTensorShape], weights: Sequence[bool]) -> list[Candidate]:
        follow = _follow(node, shapes, weights)
        out = []
        split = _weighted_split(node, shapes, weights, tp, follow)
        out.extend(split)
        out.append((follow, _contracted(node, shapes)))
        out.append((follow, 1))
        return out

    g = propagate(pcg, total, dp, candidates)
    return Baseline("tensor_parallel", g, total,
                    f"tensor parallel {tp} ways within each node, data parallel {dp} ways across nodes")


STRATEGIES: dict[str, Callable[[PCG, ClusterSpec], Baseline]] = {
    "data_parallel": data_parallel,
    "tensor_parallel": tensor_parallel,
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
    """Megatron's choices for an op with a trainable weight: row split if its input arrives
    split along the contracted dim, else column split."""
    if tp <= 1 or not any(weights):
        return []
    roles = node.spec.roles(node.op, [s.logical for s in shapes])
    if isinstance(node.op, MatMulAttrs | GemmAttrs | ConvAttrs):
        data = [i for i, w in enumerate(weights) if not w and i < 2]
        wi = [i for i, w in enumerate(weights) if w and i < 2]
        if not data or not wi:
            return []
        x = shapes[data[0]]
        k_split = max((d.degree for d, r in zip(x.dims, roles[data[0]], strict=True) if r == SUM), default=1)
        base = tuple(1 if j != 0 else g for j, g in enumerate(follow))
        if k_split == tp:
            return [(base, tp)]
        w_roles = roles[wi[0]]
        col = [r for r in w_roles if r not in (SUM, WHOLE)]
        if col:
            degs = list(base)
            degs[col[-1]] = tp
            return [(tuple(degs), 1)]
        return []
    if isinstance(node.op, GatherAttrs) and weights[0] and node.op.axis == 0:
        return [(follow, tp)]
    return []


def propagate(pcg: PCG, pieces: int, batch_split: int,
               candidates: Callable[[Node, Sequence[ParallelTensorShape], Sequence[bool]], list[Candidate]]) -> PCG:
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
