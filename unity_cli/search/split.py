"""Graph splitting: cut a large PCG into segments at its narrowest points.

A cut after a post-dominator of the graph's inputs leaves exactly one activation
crossing it (the residual stream between two transformer layers). Real exports often
carry a side tensor to every layer as well (an attention mask computed once), so a cut
is chosen as the position with the fewest live activations within a window of the
target segment size — the post-dominators when there are any. Sources (inputs,
weights, constants) are not activations: each segment gets its own copy of those it
reads, so a weight never crosses a cut.

Each segment then becomes a small stand-alone PCG (:func:`segment_graph`) whose
boundary tensors are inputs with a fixed parallel layout and whose outputs are brought
to a fixed layout; the search solves it once per pair of boundary layouts and once per
distinct structure (12 identical layers are one problem), and ``segments.py`` joins
the pieces by dynamic programming over the layouts.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir.ops.sources import InputAttrs
from ..ir.pcg import PCG, GraphBuilder, TensorRef
from ..ir.schedule import needs_grad
from ..ir.shapes import ParallelTensorShape, TensorShape
from .reshard import reshard

Layout = Callable[[TensorShape], ParallelTensorShape]
"""A boundary layout: the parallel shape a boundary tensor of a given logical shape takes."""


@dataclass(frozen=True)
class Segment:
    nodes: tuple[int, ...]              # compute node ids of the whole graph, topological
    inputs: tuple[TensorRef, ...]       # activations produced by earlier segments
    outputs: tuple[TensorRef, ...]      # activations read by later segments, or graph outputs


def live_counts(pcg: PCG, order: Sequence[int]) -> list[int]:
    """For each position ``p`` of ``order`` (compute nodes, topological), how many
    activations produced before ``p`` are still read at or after ``p``."""
    pos = {n: k for k, n in enumerate(order)}
    last: dict[TensorRef, int] = {}
    for k, n in enumerate(order):
        for r in pcg.nodes[n].inputs:
            if r.node in pos:
                last[r] = k
    for r in pcg.outputs:
        if r.node in pos:
            last[r] = len(order)
    delta = [0] * (len(order) + 2)
    for r, end in last.items():
        delta[pos[r.node] + 1] += 1
        delta[end + 1] -= 1
    counts, running = [], 0
    for k in range(len(order) + 1):
        running += delta[k]
        counts.append(running)
    return counts


def split(pcg: PCG, max_nodes: int) -> list[Segment]:
    """Segments of at most ``max_nodes`` compute nodes (and at least half that, except
    the last), each cut where the fewest activations cross; one segment if it is small."""
    order = [i for i, n in pcg if not n.spec.is_source]
    live = live_counts(pcg, order)
    cuts = [0]
    while len(order) - cuts[-1] > max_nodes:
        lo, hi = cuts[-1] + max(1, max_nodes // 2), cuts[-1] + max_nodes
        cuts.append(min(range(lo, hi + 1), key=lambda p: (live[p], -p)))
    cuts.append(len(order))
    owner = {}
    segments_nodes = []
    for s, (a, b) in enumerate(zip(cuts, cuts[1:])):
        segments_nodes.append(tuple(order[a:b]))
        for n in order[a:b]:
            owner[n] = s
    graph_outputs = set(pcg.outputs)
    out: list[Segment] = []
    for s, nodes in enumerate(segments_nodes):
        ins: dict[TensorRef, None] = {}
        for n in nodes:
            for r in pcg.nodes[n].inputs:
                if r.node in owner and owner[r.node] != s:
                    ins[r] = None
        outs: dict[TensorRef, None] = {}
        for n in nodes:
            for k in range(len(pcg.nodes[n].outputs)):
                r = TensorRef(n, k)
                if r in graph_outputs or any(owner[c] != s for c, _ in pcg.consumers[n]
                                              if c in owner and r in pcg.nodes[c].inputs):
                    outs[r] = None
        out.append(Segment(nodes, tuple(ins), tuple(outs)))
    return out


@dataclass(frozen=True)
class SegmentGraph:
    """A segment as a stand-alone PCG, with canonical source names so that identical
    segments give identical graphs, and the maps back to the whole graph."""

    pcg: PCG
    boundary: dict[str, TensorRef]      # boundary input name ("b<k>") -> the whole-graph tensor behind it
    sources: dict[str, str]             # canonical source name -> whole-graph source name
    names: dict[str, str]               # canonical compute-node name -> whole-graph name
    outputs: tuple[TensorRef, ...]      # whole-graph tensor behind each output
    final: tuple[bool, ...]             # which outputs are graph outputs (their layout is free)


def segment_graph(pcg: PCG, seg: Segment, layout_in: Layout | None) -> SegmentGraph:
    """The segment as a PCG whose boundary inputs come in ``layout_in`` (unpartitioned
    if None); its compute nodes are as in ``pcg``, so with a partitioned boundary it is
    not valid until a strategy is applied (see :func:`reshard_outputs`)."""
    b = GraphBuilder()
    remap: dict[TensorRef, TensorRef] = {}
    sources: dict[str, str] = {}
    names: dict[str, str] = {}
    grads = needs_grad(pcg, pcg.outputs[0]) if seg.inputs else frozenset()
    for k, r in enumerate(seg.inputs):
        shape = pcg.shape(r).logical
        target = layout_in(shape) if layout_in else ParallelTensorShape.unpartitioned(shape)
        remap[r] = b.add(InputAttrs(shape, grad=r in grads), (), f"b{k}", outputs=[target])[0]
    for n in seg.nodes:
        node = pcg.nodes[n]
        for r in node.inputs:
            if r in remap:
                continue
            src = pcg.nodes[r.node]
            assert src.spec.is_source, f"segment reads {r} from outside without a boundary"
            canon = f"{'w' if src.kind == 'Weight' else 'x'}{len(sources)}"
            sources[canon] = src.name
            remap[r] = b.add(src.op, (), canon)[0]
        canon = f"n{len(names)}"
        names[canon] = node.name
        outs = b.add(node.op, [remap[r] for r in node.inputs], canon, outputs=node.outputs)
        for k, o in enumerate(outs):
            remap[TensorRef(n, k)] = o
    final = tuple(r in set(pcg.outputs) for r in seg.outputs)
    boundary = {f"b{k}": r for k, r in enumerate(seg.inputs)}
    return SegmentGraph(b.build([remap[r] for r in seg.outputs]), boundary, sources, names, seg.outputs, final)


def reshard_outputs(pcg: PCG, final: Sequence[bool], layout: Layout | None) -> PCG:
    """``pcg`` with each output that is not ``final`` brought to ``layout``."""
    if layout is None:
        return pcg
    b = GraphBuilder()
    for n in pcg.nodes:
        b.add(n.op, n.inputs, n.name, outputs=n.outputs)
    outs = [r if last else reshard(b, r, layout(pcg.shape(r).logical))
            for r, last in zip(pcg.outputs, final, strict=True)]
    return b.build(outs)


def stitch(pcg: PCG, parts: Sequence[tuple[SegmentGraph, PCG]]) -> PCG:
    """The whole graph from solved segments (in order): boundary inputs are wired to the
    producing segment's outputs (resharded where the two layouts differ), each source is
    created once, compute nodes get their whole-graph names back."""
    b = GraphBuilder()
    produced: dict[TensorRef, TensorRef] = {}    # whole-graph tensor -> stitched tensor
    made_sources: dict[str, TensorRef] = {}
    by_name = {n.name: n for _, n in pcg if n.spec.is_source}
    for info, solved in parts:
        local: dict[TensorRef, TensorRef] = {}
        for i, n in solved:
            if n.spec.is_source:
                if n.name in info.boundary:
                    ref = produced[info.boundary[n.name]]
                    local[TensorRef(i, 0)] = reshard(b, ref, n.outputs[0])
                    continue
                real = info.sources[n.name]
                if real not in made_sources:
                    made_sources[real] = b.add(by_name[real].op, (), real)[0]
                local[TensorRef(i, 0)] = made_sources[real]
                continue
            name = info.names.get(n.name, n.name)
            outs = b.add(n.op, [local[r] for r in n.inputs], name, outputs=n.outputs)
            for k, o in enumerate(outs):
                local[TensorRef(i, k)] = o
        for whole, ref in zip(info.outputs, solved.outputs, strict=True):
            produced[whole] = local[ref]
    return b.build([produced[r] for r in pcg.outputs])

