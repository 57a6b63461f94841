"""The plan's PCG as an SVG diagram: operators coloured by how they are parallelized,
parallel ops as small glyphs, rewritten operators marked with their rule, repeated layers
collapsed into one box each (with a detail diagram per box) when the graph is large.

Weights and the parallel ops that lay them out are not drawn: each operator's tooltip
lists the weights it reads with their layout, which is what tells tensor parallelism
from data parallelism.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..cost.model import CostConfig, CostContext, layout_sources, node_cost
from ..ir.ops.sources import WeightAttrs
from ..ir.opspec import OpKind
from ..ir.printer import op_label
from ..ir.shapes import ParallelTensorShape
from ..plan.plan import Plan
from .layout import Group, Layout, find_groups, layered_layout
from .markup import clip, devices_label, esc, ms, num
from .operators import node_label, shape_label

CATEGORIES = {
    "data": "data parallel (batch split)",
    "tensor": "tensor parallel (other dim split, or partial sums)",
    "hybrid": "data + tensor parallel",
    "replicated": "replicated (identical copies)",
    "single": "one device",
}
GLYPHS = {OpKind.Repartition: "P", OpKind.Combine: "C", OpKind.Replicate: "R", OpKind.Reduction: "Σ"}
OP_W, OP_H, POP, GROUP_W, GROUP_H = 148.0, 34.0, 22.0, 204.0, 48.0


def category(shape: ParallelTensorShape, batch: int) -> str:
    """How a tensor is spread: its leading dim is the batch when its size is a multiple of
    the batch size (importers keep the batch leading; ``[B*S, H]`` counts too)."""
    if shape.pieces == 1:
        return "single"
    lead = shape.rank > 0 and shape.dims[0].degree > 1
    batch_split = lead and batch > 1 and shape.dims[0].size % batch == 0
    other = (lead and not batch_split) or shape.sum_degree > 1 or any(d.degree > 1 for d in shape.dims[1:])
    if batch_split and other:
        return "hybrid"
    return "data" if batch_split else "tensor" if other else "replicated"


@dataclass(frozen=True, slots=True)
class OpView:
    """What the diagram shows of one operator."""

    id: int
    name: str
    label: str
    kind: str
    detail: str            # the op's attributes, e.g. Combine(dim=2, degree=8)
    category: str
    shape: str
    devices: tuple[int, ...]
    view: str
    compute_ms: float
    comm_ms: float
    parallel: bool
    weights: tuple[str, ...]
    rewrites: tuple[int, ...]  # positions in the plan's rewrites


@dataclass(frozen=True)
class Diagram:
    ops: dict[int, OpView]
    edges: tuple[tuple[int, int], ...]
    groups: tuple[Group, ...]   # collapsed in the overview; empty when everything is drawn
    hidden: int                 # weights and their layout ops, not drawn


def build_diagram(plan: Plan, config: CostConfig, collapse: bool | None = None, max_nodes: int = 120) -> Diagram:
    """The visible operators and edges of ``plan`` with the cost model's per-operator times
    (those ``unity explain`` shows); repeated layers are collapsed when ``collapse`` is
    True, or when it is None and more than ``max_nodes`` operators are visible."""
    pcg, views = plan.pcg, plan.views
    ctx = CostContext.of(pcg, plan.cluster, config)
    layout = layout_sources(pcg)
    hidden = {i for i in range(len(pcg)) if layout[i] is not None and isinstance(pcg.nodes[layout[i]].op, WeightAttrs)}
    batch = int(plan.model.get("batch_size") or 1)
    at: dict[str, list[int]] = {}
    for k, r in enumerate(plan.rewrites):
        at.setdefault(str(r.get("at", "")), []).append(k)
    names = {n.name for _, n in pcg}
    # A rewrite's target nodes have no name (the importer names every node), and the node
    # named in ``at`` was matched and replaced: those rewrites are marked on unnamed ops.
    lost = tuple(k for k, r in enumerate(plan.rewrites) if r.get("at") not in names)
    ops: dict[int, OpView] = {}
    edges: list[tuple[int, int]] = []
    for i, n in pcg:
        if i in hidden:
            continue
        shape = n.outputs[0]
        c = node_cost(ctx, i, views)
        weights = tuple(f"{node_label(pcg, layout[r.node])} {shape_label(pcg.shape(r))}"
                        for r in n.inputs if r.node in hidden)
        v = views[i]
        ops[i] = OpView(i, n.name, node_label(pcg, i), n.kind, op_label(n.op), category(shape, batch),
                        shape_label(shape), tuple(sorted(set(v.devices(shape)))),
                        f"start {v.start}, strides {','.join(map(str, v.strides))}",
                        (c.compute_fwd + c.compute_bwd) * 1e3, c.comm * 1e3,
                        n.spec.is_parallel_op, weights,
                        tuple(at.get(n.name, ())) if n.name else () if n.spec.is_parallel_op else lost)
        edges += [(r.node, i) for r in n.inputs if r.node not in hidden]
    edges = sorted(set(edges))
    if collapse is None:
        collapse = len(ops) > max_nodes
    sigs = {i: f"{o.detail}|{o.shape}|{o.category}" for i, o in ops.items()}
    groups = find_groups({i: o.name for i, o in ops.items()}, edges, signatures=sigs) if collapse else []
    return Diagram(ops, tuple(edges), tuple(groups), len(hidden))


# ---------------------------------------------------------------------------------------
# SVG

def render_overview(d: Diagram) -> str:
    """The whole graph, each collapsed group as one box (``data-group`` = its position)."""
    owner = {v: k for k, g in enumerate(d.groups) for v in g.nodes}
    rep = {k: g.nodes[0] for k, g in enumerate(d.groups)}
    keys = [i for i in d.ops if i not in owner] + list(rep.values())
    sizes = {i: _size(d.ops[i]) for i in d.ops if i not in owner}
    sizes.update({rep[k]: (GROUP_W, GROUP_H) for k in rep})

    def key(v: int) -> int:
        return rep[owner[v]] if v in owner else v

    edges = sorted({(key(u), key(v)) for u, v in d.edges if key(u) != key(v)})
    lay = layered_layout(sizes, edges)
    body = []
    for v in sorted(keys):
        if v in owner:
            body.append(_group_box(d, owner[v], lay.pos[v]))
        else:
            body.append(_op(d.ops[v], lay.pos[v]))
    return _svg("overview", lay, body, "the plan's operators")


def render_group(d: Diagram, k: int) -> str:
    """One collapsed group's operators (all its instances) and the edges among them."""
    members = set(d.groups[k].nodes)
    sizes = {i: _size(d.ops[i]) for i in members}
    lay = layered_layout(sizes, [(u, v) for u, v in d.edges if u in members and v in members])
    body = [_op(d.ops[i], lay.pos[i]) for i in sorted(members)]
    return _svg(f"group-{k}", lay, body, f"operators of {d.groups[k].label}")


def _size(o: OpView) -> tuple[float, float]:
    return (POP, POP) if o.parallel else (OP_W, OP_H)


def _svg(ident: str, lay: Layout, body: Sequence[str], what: str) -> str:
    paths = [f'<path d="{_route(pts)}"/>' for _, pts in sorted(lay.routes.items())]
    return (f'<svg id="{ident}" class="diagram zoomable" viewBox="0 0 {num(lay.width)} {num(lay.height)}" '
            f'role="img" aria-label="{esc(what)}"><g class="viewport"><g class="edges">' + "".join(paths) +
            '</g><g class="nodes">' + "\n".join(body) + "</g></g></svg>")


def _route(pts: Sequence[tuple[float, float]]) -> str:
    """A smooth path through the points (top to bottom), leaving and entering each vertically."""
    (x0, y0), out = pts[0], [f"M{num(pts[0][0])},{num(pts[0][1])}"]
    for x1, y1 in pts[1:]:
        if x1 == x0:
            out.append(f"L{num(x1)},{num(y1)}")
        else:
            dy = (y1 - y0) / 2
            out.append(f"C{num(x0)},{num(y0 + dy)} {num(x1)},{num(y1 - dy)} {num(x1)},{num(y1)}")
        x0, y0 = x1, y1
    return "".join(out)


def op_tooltip(o: OpView, rewrites: Sequence[Mapping] = ()) -> str:
    lines = [o.label, f"{o.kind}: {o.detail}" if o.detail != o.kind else o.kind,
             f"parallel shape {o.shape}: {CATEGORIES[o.category]}",
             f"{devices_label(o.devices)} (view {o.view})",
             f"forward + backward: compute {ms(o.compute_ms)}, communication {ms(o.comm_ms)}"]
    lines += [f"reads weight {w}" for w in o.weights]
    if o.rewrites and o.name:
        lines.append("rewrite " + ", ".join(str(k + 1) for k in o.rewrites) + " applied here")
    elif o.rewrites:
        lines.append("made by rewrite " + (" or ".join(str(k + 1) for k in o.rewrites)))
    return "\n".join(lines)


def _op(o: OpView, at: tuple[float, float]) -> str:
    x, y = at
    rw = " rw" if o.rewrites else ""
    head = (f'<g class="op cat-{o.category}{rw}{" pop p-" + o.kind if o.parallel else ""}" data-node="{o.id}" '
            f'transform="translate({num(x)},{num(y)})"><title>{esc(op_tooltip(o))}</title>')
    if o.parallel:
        h = POP / 2
        shape = {OpKind.Repartition: f'<path d="M{num(h)},0L{num(POP)},{num(h)}L{num(h)},{num(POP)}L0,{num(h)}Z"/>',
                 OpKind.Combine: f'<circle cx="{num(h)}" cy="{num(h)}" r="{num(h)}"/>',
                 OpKind.Replicate: f'<rect width="{num(POP)}" height="{num(POP)}" rx="3"/>',
                 OpKind.Reduction: f'<path d="M0,0L{num(POP)},0L{num(h)},{num(POP)}Z"/>'}[o.kind]
        mid = f'<text x="{num(h)}" y="{num(h + 4)}" class="g">{GLYPHS[o.kind]}</text>'
        return head + shape + mid + _badge(o.rewrites, POP) + "</g>"
    short = o.label if "/" not in o.label else "/".join(o.label.rsplit("/", 2)[-2:])
    return (head + f'<rect width="{num(OP_W)}" height="{num(OP_H)}" rx="4"/>'
            f'<text x="6" y="14" class="k">{esc(o.kind)}</text>'
            f'<text x="6" y="28">{esc(clip(short, 21))}</text>' + _badge(o.rewrites, OP_W) + "</g>")


def _badge(rewrites: Sequence[int], width: float) -> str:
    if not rewrites:
        return ""
    text = ",".join(str(k + 1) for k in rewrites[:3]) + ("…" if len(rewrites) > 3 else "")
    w = 8 + 6 * len(text)
    return (f'<g class="badge" transform="translate({num(width - w / 2)},-7)"><rect x="{num(-w / 2)}" '
            f'width="{num(w)}" height="14" rx="7"/><text y="11">{esc(text)}</text></g>')


def group_summary(d: Diagram, k: int) -> tuple[str, dict[str, int], float, float, tuple[int, ...]]:
    """A group's colour (its most common category among compute ops), category counts,
    compute and communication time, and the rewrites inside it."""
    ops = [d.ops[i] for i in d.groups[k].nodes]
    counts: dict[str, int] = {}
    for o in ops:
        if not o.parallel:
            counts[o.category] = counts.get(o.category, 0) + 1
    main = max(sorted(counts), key=counts.__getitem__) if counts else "single"
    rewrites = tuple(sorted({r for o in ops for r in o.rewrites}))
    return main, counts, sum(o.compute_ms for o in ops), sum(o.comm_ms for o in ops), rewrites


def _group_box(d: Diagram, k: int, at: tuple[float, float]) -> str:
    g = d.groups[k]
    main, counts, comp, comm, rewrites = group_summary(d, k)
    what = f" of {g.key}N" if g.key else ""  # a group found by structure has no name to index
    tip = [f"{g.label}: {len(g.nodes)} operators{what}",
           ", ".join(f"{n} {c}" for c, n in sorted(counts.items())),
           f"forward + backward: compute {ms(comp)}, communication {ms(comm)}", "click to expand"]
    tip += [f"rewrite {r + 1}" for r in rewrites]
    total = sum(counts.values()) or 1
    bar, x = [], 6.0
    for c in CATEGORIES:  # a strip of category shares along the bottom
        if counts.get(c):
            w = (GROUP_W - 12) * counts[c] / total
            bar.append(f'<rect class="share cat-{c}" x="{num(x)}" y="{num(GROUP_H - 9)}" width="{num(w)}" height="4"/>')
            x += w
    x, y = at
    return (f'<g class="group cat-{main}{" rw" if rewrites else ""}" data-group="{k}" tabindex="0" '
            f'transform="translate({num(x)},{num(y)})"><title>{esc(chr(10).join(tip))}</title>'
            f'<rect class="under" x="4" y="4" width="{num(GROUP_W)}" height="{num(GROUP_H)}" rx="5"/>'
            f'<rect width="{num(GROUP_W)}" height="{num(GROUP_H)}" rx="5"/>'
            f'<text x="8" y="17" class="k">{esc(clip(g.label, 30))}</text>'
            f'<text x="8" y="31">{len(g.nodes)} ops · click to expand</text>' + "".join(bar) +
            _badge(rewrites, GROUP_W) + "</g>")
