"""Gather (embedding lookup), GroupedGather (n lookups in one table) and reductions.

Splitting an embedding table by rows (``Gather`` axis 0) makes each piece look up only
the ids in its range and leave zeros elsewhere, so the output holds partial sums: the
"partition an embedding table" parallelization.

``GroupedGather`` is n embedding lookups from n tables stored as one, concatenated by
rows (FBGEMM's table-batched embeddings): each table's ids are offset by the rows of the
tables before it, and one lookup serves all of them. The rule family
``embedding-merge-n`` (``substitutions/families.py``) makes it from n Gathers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ShapeError
from ..dtypes import DType
from ..kernel import Kernel, first_extremum, scatter_add
from ..opspec import OMIT_DEFAULT, SUM, WHOLE, Imported, Opaque, OpCost, OpKind, OpSpec, Saved, register, spec_by_kind
from ..shapes import TensorShape
from ..terms import Axiom, Law, Symbol, need
from .common import need_inputs, norm_axes, norm_axis, streaming_cost


@dataclass(frozen=True, slots=True)
class GatherAttrs:
    axis: int


@dataclass(frozen=True, slots=True)
class GroupedGatherAttrs:
    rows: tuple[int, ...]
    """Rows of each table, in the order they are concatenated (and their ids passed)."""
    base: int = field(default=0, metadata={OMIT_DEFAULT: True})
    """The global row of this piece's first row: a piece of a table split by rows
    (the executor sets it; 0 for a whole table)."""


@dataclass(frozen=True, slots=True)
class ReduceAttrs:
    mode: str                      # "sum" | "mean" | "max" | "min"
    axes: tuple[int, ...]
    keepdims: bool = True


REDUCE_MODES = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min"}


def _gather_meaning(run, ax, table, ids):
    need(-table.ndim <= ax <= -1, f"axis {ax} of a rank-{table.ndim} tensor")
    ids = ids.astype("int64")
    need(bool(((ids >= 0) & (ids < table.shape[ax])).all()), "gather: ids out of range")
    return run(GatherAttrs(table.ndim + ax), table, ids)[0]


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# Gather, GatherND and the reductions.
# Gather and GatherND take negative indices as ONNX does (counted from the end). Beyond
# ONNX, a Gather index outside ``[-n, n)`` yields zeros (and no gradient): a piece of an
# embedding table split by rows looks up only the ids in its range, so the executor can
# pass each piece its shifted ids with those of other pieces mapped out of range.
# Backward scatters-adds into the table; indices get None.


def gather_forward(op, xs, xp):
    data, idx = xs
    n = data.shape[op.axis]
    valid = (idx >= -n) & (idx < n)
    local = xp.where(valid, idx, 0)
    local = xp.where(local < 0, local + n, local)
    y = xp.take(data, local, axis=op.axis)
    if not bool(valid.all()):
        shape = (1,) * op.axis + valid.shape + (1,) * (data.ndim - op.axis - 1)
        y = y * valid.reshape(shape).astype(y.dtype)
    return [y], (data.shape, local, valid)


def gather_backward(op, ctx, gs, xp):
    shape, local, valid = ctx
    g = gs[0]
    a, r = op.axis, local.ndim
    # Bring the index dims to the front: g_t[i, prefix..., suffix...] is row local[i]'s gradient.
    g_t = xp.moveaxis(g, tuple(range(a, a + r)), tuple(range(r)))
    g_t = g_t.reshape((local.size,) + shape[:a] + shape[a + 1:])
    keep = valid.reshape(-1)
    gd = xp.zeros((shape[a],) + shape[:a] + shape[a + 1:], dtype=g.dtype)
    scatter_add(gd, local.reshape(-1)[keep], g_t[keep], xp)
    return [xp.moveaxis(gd, 0, a), None]


def _grouped_rows(op, xs, xp):
    """Every table's ids as rows of this piece, flat and in table order: an id counts from
    its own table's end when negative (as ``Gather``'s do), and one outside its table, or
    outside this piece, becomes a row past the piece's end (zeros, as ``Gather`` gives).
    One pass over all the ids, whatever the number of tables."""
    table, ids = xs[0], xs[1:]
    rows, n = table.shape[0], ids[0].size
    flat = xp.concatenate([idx.reshape(-1) for idx in ids])
    size = xp.repeat(xp.asarray(op.rows, dtype=flat.dtype), n)
    start = xp.repeat(xp.asarray([sum(op.rows[:k]) - op.base for k in range(len(op.rows))], dtype=flat.dtype), n)
    local = xp.where(flat < 0, flat + size, flat)
    valid = (local >= 0) & (local < size)
    local += start
    return xp.where(valid & (local >= 0) & (local < rows), local, rows)


def grouped_gather_forward(op, xs, xp):
    table, ids = xs[0], xs[1:]
    flat = _grouped_rows(op, xs, xp)
    (y,), ctx = gather_forward(GatherAttrs(0), [table, flat], xp)
    n = ids[0].size
    tail = table.shape[1:]
    return [y[k * n:(k + 1) * n].reshape(idx.shape + tail) for k, idx in enumerate(ids)], ctx


def grouped_gather_backward(op, ctx, gs, xp):
    """Each output's gradient scatter-added into one zeroed table gradient, a table at a
    time (no concatenation of the gradients: a copy their separate Gathers never made)."""
    shape, local, valid = ctx
    n = local.size // len(op.rows)
    gd = xp.zeros(shape, dtype=next(g for g in gs if g is not None).dtype)
    for k, g in enumerate(gs):
        if g is None:
            continue
        keep = valid[k * n:(k + 1) * n]
        scatter_add(gd, local[k * n:(k + 1) * n][keep], g.reshape((n,) + shape[1:])[keep], xp)
    return [gd] + [None] * len(op.rows)


def _gathernd_index(data_shape, idx, b, xp):
    """The advanced index into ``data.reshape((B,) + data_shape[b:])`` that GatherND reads."""
    k = idx.shape[-1]
    batch = 1
    for d in data_shape[:b]:
        batch *= d
    flat = idx.reshape((batch, -1, k))
    m = flat.shape[1]
    rows = xp.broadcast_to(xp.arange(batch)[:, None], (batch, m))
    cols = tuple(flat[..., j] % data_shape[b + j] for j in range(k))  # negative indices count from the end
    return (batch,) + tuple(data_shape[b:]), (rows,) + cols


def gathernd_forward(op, xs, xp):
    data, idx = xs
    b = op.batch_dims
    k = idx.shape[-1]
    flat_shape, index = _gathernd_index(data.shape, idx, b, xp)
    y = data.reshape(flat_shape)[index]
    return [y.reshape(idx.shape[:-1] + data.shape[b + k:])], (data.shape, idx)


def gathernd_backward(op, ctx, gs, xp):
    shape, idx = ctx
    b, k = op.batch_dims, idx.shape[-1]
    flat_shape, index = _gathernd_index(shape, idx, b, xp)
    g = gs[0].reshape(index[0].shape + tuple(shape[b + k:]))
    gd = xp.zeros(flat_shape, dtype=g.dtype)
    scatter_add(gd, index, g, xp)
    return [gd.reshape(shape), None]


def reduce_forward(op, xs, xp):
    x = xs[0]
    axes = tuple(sorted(a % x.ndim for a in op.axes)) if x.ndim else ()
    if not axes:
        return [x], (x, axes, x)
    match op.mode:
        case "sum":
            y = x.sum(axis=axes, keepdims=True)
        case "mean":
            y = x.mean(axis=axes, keepdims=True).astype(x.dtype)
        case "max":
            y = x.max(axis=axes, keepdims=True)
        case "min":
            y = x.min(axis=axes, keepdims=True)
        case _:
            raise AssertionError(op.mode)
    out = y if op.keepdims else y.reshape(tuple(s for d, s in enumerate(x.shape) if d not in axes))
    return [out], (x, axes, y)


def reduce_backward(op, ctx, gs, xp):
    x, axes, y = ctx
    if not axes:
        return [gs[0]]
    g = gs[0].reshape(y.shape)  # back to keepdims form
    if op.mode == "sum":
        return [xp.broadcast_to(g, x.shape).copy()]
    if op.mode == "mean":
        count = 1
        for a in axes:
            count *= x.shape[a]
        return [xp.broadcast_to(g / count, x.shape).copy()]
    return [g * first_extremum(x, y, axes, xp)]


@register
class Gather(OpSpec):
    kind = OpKind.Gather
    kernel = Kernel(gather_forward, gather_backward)
    attrs_type = GatherAttrs
    onnx_ops = ("Gather",)
    weight_inputs = (0,)

    def saved(self, attrs, inputs, outputs):
        """The ids made local to the table's piece, and which of them it holds."""
        ids = inputs[1]
        return Saved(extra=(ids, TensorShape(ids.dims, DType.BOOL)))

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        return Imported(GatherAttrs(norm_axis("Gather", int(node.attrs.get("axis", 0)), rank)), (0, 1))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        data, idx = inputs
        if idx.dtype not in (DType.INT64, DType.INT32):
            raise ShapeError(f"Gather indices must be integers, got {idx.dtype.value}")
        a = attrs.axis
        return (TensorShape(data.dims[:a] + idx.dims + data.dims[a + 1:], data.dtype),)

    def roles(self, attrs, inputs):
        data, idx = inputs
        a, r = attrs.axis, idx.rank
        rd = tuple(d if d < a else (SUM if d == a else d + r - 1) for d in range(data.rank))
        if a != 0:
            rd = tuple(WHOLE if x == SUM else x for x in rd)
        return (rd, tuple(range(a, a + r)))

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(inputs[1].nbytes + 2 * outputs[0].nbytes)
        # Backward scatters-adds into the table: a read-modify-write of the rows touched.
        return OpCost(0.0, moved, float(outputs[0].numel), 2 * moved, 1)

    def encode(self, s, attrs, x, ins, outs):
        return [s.gather(attrs.axis - ins[0].rank, x[0], x[1])]

    symbols = (Symbol("gather", ("I", "T", "T"), _gather_meaning),)   # gather(ax, table, ids), ax from the end
    axioms = (   # linear in its table
        Axiom("gather-add", lambda s, v: Law(s.gather(v.ax, s.add(v.a, v.b), v.c),
                                             s.add(s.gather(v.ax, v.a, v.c), s.gather(v.ax, v.b, v.c)),
                                             two_way=False)),
        Axiom("gather-scale", lambda s, v: Law(s.gather(v.ax, s.scale(v.k, v.a), v.c),
                                               s.scale(v.k, s.gather(v.ax, v.a, v.c)))),
    )


@register
class GroupedGather(OpSpec):
    """``GroupedGather[rows](table, ids_1..ids_n)``: output ``k`` is ``Gather(T_k, ids_k)``,
    ``T_k`` the ``k``-th block of ``rows[k]`` rows of ``table``; one kernel call for all n
    (the ids offset and concatenated, one lookup, its result handed out in n views)."""

    kind = OpKind.GroupedGather
    kernel = Kernel(grouped_gather_forward, grouped_gather_backward)
    attrs_type = GroupedGatherAttrs
    weight_inputs = (0,)

    def saved(self, attrs, inputs, outputs):
        """Gather's, over all the tables' ids at once."""
        n = sum(t.numel for t in inputs[1:])
        return Saved(extra=(TensorShape((n,), inputs[1].dtype), TensorShape((n,), DType.BOOL)))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, len(attrs.rows) + 1)
        table, ids = inputs[0], inputs[1:]
        if table.rank < 1 or sum(attrs.rows) != table.dims[0] or min(attrs.rows, default=0) < 1:
            raise ShapeError(f"GroupedGather: tables of {list(attrs.rows)} rows in a table of {list(table.dims)}")
        for idx in ids:
            if idx.dtype not in (DType.INT64, DType.INT32):
                raise ShapeError(f"GroupedGather indices must be integers, got {idx.dtype.value}")
            if idx.dims != ids[0].dims:
                raise ShapeError(f"GroupedGather: ids of shapes {list(ids[0].dims)} and {list(idx.dims)} differ")
        return tuple(TensorShape(ids[0].dims + table.dims[1:], table.dtype) for _ in ids)

    def roles(self, attrs, inputs):
        table, ids = inputs[0], inputs[1:]
        r = ids[0].rank
        return ((SUM,) + tuple(range(r, r + table.rank - 1)),) + tuple(tuple(range(r)) for _ in ids)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(sum(s.nbytes for s in inputs[1:]) + 2 * sum(s.nbytes for s in outputs))
        return OpCost(0.0, moved, float(sum(s.numel for s in outputs)), 2 * moved, 1)

    def encode(self, s, attrs, x, ins, outs):
        """Output k is ``gather`` from the k-th block of the table, cut as ``Split`` cuts it."""
        split = spec_by_kind(OpKind.Split)
        blocks = split.encode(s, split.attrs_type(0, attrs.rows), x[:1], ins[:1], outs)
        return [s.gather(-ins[0].rank, t, ids) for t, ids in zip(blocks, x[1:], strict=True)]


@register
class Reduce(OpSpec):
    kind = OpKind.Reduce
    kernel = Kernel(reduce_forward, reduce_backward)
    verifier = Opaque("a reduction over some dims: no axioms yet")
    attrs_type = ReduceAttrs
    onnx_ops = tuple(sorted(REDUCE_MODES))

    def saved(self, attrs, inputs, outputs):
        """The input and the reduction (none over no axes: the output is the input)."""
        return Saved((0,), (0,) if attrs.axes and inputs[0].rank else ())

    def from_onnx(self, node) -> Imported:
        rank = node.inputs[0].shape.rank
        if not node.axes_raw() and node.attrs.get("noop_with_empty_axes", 0):
            axes: tuple[int, ...] = ()  # no axes + noop_with_empty_axes: the identity
        else:
            axes = node.axes(rank, default=list(range(rank)))
        return Imported(ReduceAttrs(REDUCE_MODES[node.op_type], tuple(axes), bool(node.attrs.get("keepdims", 1))),
                        (0,))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 1)
        x = inputs[0]
        axes = norm_axes(self.kind, attrs.axes, x.rank)
        if attrs.keepdims:
            dims = tuple(1 if d in axes else s for d, s in enumerate(x.dims))
        else:
            dims = tuple(s for d, s in enumerate(x.dims) if d not in axes)
        return (TensorShape(dims, x.dtype),)

    def roles(self, attrs, inputs):
        x = inputs[0]
        axes = norm_axes(self.kind, attrs.axes, x.rank)
        reduced = SUM if attrs.mode == "sum" else WHOLE
        roles, j = [], 0
        for d in range(x.rank):
            if d in axes:
                roles.append(reduced)
                j += attrs.keepdims
            else:
                roles.append(j)
                j += 1
        return (tuple(roles),)

    def terms(self, attrs, n):
        return ((0,),) if attrs.mode in ("sum", "mean") else ()

    def cost(self, attrs, inputs, outputs):
        return streaming_cost(inputs, outputs, inputs[0].numel / max(outputs[0].numel, 1))


@dataclass(frozen=True, slots=True)
class GatherNDAttrs:
    batch_dims: int = 0


@register
class GatherND(OpSpec):
    """``GatherND``: exporters emit it to pick the upper triangle of an interaction matrix."""

    kind = OpKind.GatherND
    kernel = Kernel(gathernd_forward, gathernd_backward)
    verifier = Opaque("a multi-dim index gather: no axioms yet")
    attrs_type = GatherNDAttrs
    onnx_ops = ("GatherND",)

    def saved(self, attrs, inputs, outputs):
        """The indices."""
        return Saved((1,))

    def from_onnx(self, node) -> Imported:
        return Imported(GatherNDAttrs(int(node.attrs.get("batch_dims", 0))), (0, 1))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        data, idx = inputs
        b, k = attrs.batch_dims, idx.dims[-1] if idx.rank else 0
        if idx.rank < 1 or b + k > data.rank or data.dims[:b] != idx.dims[:b]:
            raise ShapeError(f"GatherND of {list(data.dims)} by indices {list(idx.dims)} (batch_dims={b})")
        return (TensorShape(idx.dims[:-1] + data.dims[b + k:], data.dtype),)

    def roles(self, attrs, inputs):
        data, idx = inputs
        b, k = attrs.batch_dims, idx.dims[-1]
        tail = idx.rank - 1
        rd = tuple(d if d < b else (WHOLE if d < b + k else tail + d - b - k) for d in range(data.rank))
        ri = tuple(d if d < b else WHOLE for d in range(idx.rank))
        return (rd, ri)

    def terms(self, attrs, n):
        return ((0,),)

    def cost(self, attrs, inputs, outputs):
        moved = float(inputs[1].nbytes + 2 * outputs[0].nbytes)
        return OpCost(0.0, moved, 0.0, 2 * moved, 1)
