"""Matrix products: MatMul (numpy semantics, batched, broadcasting) and Gemm.

Sharding ``x``'s rows or ``W``'s columns shards the output; sharding the contracted
dim of both leaves partial sums (``MatMul(x, W)`` with ``K`` split ``d`` ways has
``sum_degree = d`` and needs a ``Reduction``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...errors import ShapeError
from ..kernel import Kernel, unbroadcast
from ..opspec import OMIT_DEFAULT, SUM, WHOLE, Imported, OpCost, OpKind, OpSpec, Role, Saved, register, spec_by_kind
from ..shapes import TensorShape
from ..terms import Axiom, Law, Symbol, need
from .common import broadcast_dims, need_inputs, streaming_cost
from .elementwise import UnaryAttrs
from .shape_ops import BATCH_SWAP
from .unary import UNARY, term


@dataclass(frozen=True, slots=True)
class MatMulAttrs:
    pass


@dataclass(frozen=True, slots=True)
class GemmAttrs:
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    activation: str = field(default="", metadata={OMIT_DEFAULT: True})
    """A unary activation (:data:`FUSED_ACTIVATIONS`) applied to the result in the same
    kernel call: ``Relu(Gemm(x, W, b))`` as one piece. Not ONNX: only a rewrite makes it
    (``substitutions/families.py``); "" is none."""


FUSED_ACTIVATIONS = tuple(fn for fn, f in UNARY.items() if f.activation and not f.opaque and f.backward is not None)
"""The activations a Gemm can fuse: pointwise, differentiable, and modelled by the verifier."""


def _matmul_dims(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """(batch dims, K, output dims) of numpy matmul; raises on mismatch."""
    if not a or not b:
        raise ShapeError("MatMul of a scalar")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul: inner dims differ: {list(a)} @ {list(b)}")
    batch = broadcast_dims("MatMul", [TensorShape(a2[:-2]), TensorShape(b2[:-2])])
    out = batch + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())
    return batch, a2[-1], out


def product_cost(a: TensorShape, b: TensorShape, out: TensorShape, k: int,
                 wanted: tuple[bool, bool] = (True, True)) -> OpCost:
    """A matrix product's work: ``2 K`` flops per output element; backward computes
    ``dA = dY @ B^T`` and ``dB = A^T @ dY`` (those ``wanted``), each as large as the
    forward, and accumulates each into its buffer (read and written once more)."""
    flops = 2.0 * out.numel * k
    return OpCost(flops, float(a.nbytes + b.nbytes + out.nbytes), *product_grads(flops, a, b, out, wanted))


def product_grads(flops: float, a: TensorShape, b: TensorShape, out: TensorShape,
                  wanted: tuple[bool, bool]) -> tuple[float, float, int, int]:
    """Backward of a product of ``flops`` (``a`` times ``b`` makes ``out``): per wanted
    gradient one GEMM as large as the forward, reading ``dY`` and the other operand, and
    the gradient written and accumulated. (fwd kernels, bwd flops, bwd bytes, bwd kernels)."""
    wa, wb = wanted
    moved = wa * (out.nbytes + b.nbytes + 2 * a.nbytes) + wb * (out.nbytes + a.nbytes + 2 * b.nbytes)
    return flops * (wa + wb), float(moved), 1, wa + wb


def _matmul_meaning(run, a, b):
    need(a.ndim >= 2 and b.ndim >= 2 and (a.shape[:-2] == b.shape[:-2] or b.ndim == 2)
         and a.shape[-1] == b.shape[-2], f"matmul of shapes {a.shape} and {b.shape}")
    return run(MatMulAttrs(), a, b)[0]


# ---------------------------------------------------------------------------
# Kernels: forward and backward against ``xp`` (``ir/kernel.py``).
# MatMul (numpy semantics: batched, broadcasting, 1-D operands) and Gemm.


def _folds(a, b) -> bool:
    """Whether ``a @ b`` is one 2-D GEMM with ``a``'s leading dims folded into its rows (a
    batched activation times a weight matrix): numpy would otherwise run one small GEMM per
    leading index (1.5x slower on BERT's [16, 32, 128] @ [128, 512]), and backward would
    sum the weight's gradient over them instead of taking it in one GEMM."""
    return b.ndim == 2 and a.ndim > 2


def matmul_forward(op, xs, xp):
    a, b = xs
    if _folds(a, b):
        return [xp.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[1:])], (a, b)
    return [xp.matmul(a, b)], (a, b)


def matmul_backward(op, ctx, gs, xp, wanted):
    a, b = ctx
    g = gs[0]
    want_a, want_b = wanted
    if _folds(a, b):
        g2 = g.reshape(-1, g.shape[-1])
        return [xp.matmul(g2, b.T).reshape(a.shape) if want_a else None,
                xp.matmul(a.reshape(-1, a.shape[-1]).T, g2) if want_b else None]
    # Promote 1-D operands to matrices as matmul does, and g to the promoted output.
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if b.ndim == 1:
        g = g[..., None]
    if a.ndim == 1:
        g = g[..., None, :]
    ga = unbroadcast(xp.matmul(g, xp.swapaxes(b2, -1, -2)), a2.shape, xp).reshape(a.shape) if want_a else None
    gb = unbroadcast(xp.matmul(xp.swapaxes(a2, -1, -2), g), b2.shape, xp).reshape(b.shape) if want_b else None
    return [ga, gb]


def gemm_forward(op, xs, xp):
    """``Y = f(alpha * A' @ B' + beta * C)`` with ``A'``, ``B'`` transposed as the flags
    say and ``f`` the fused activation (none by default). A batched ``A`` (a fused piece
    of a rank-3 product) is one 2-D GEMM with its leading dims folded into the rows."""
    a, b = xs[0], xs[1]
    a2 = a.T if op.trans_a else a
    b2 = b.T if op.trans_b else b
    lead = a2.shape[:-1]
    a2 = a2.reshape(-1, a2.shape[-1]) if a2.ndim > 2 else a2
    y = xp.matmul(a2, b2)
    if len(lead) > 1:
        y = y.reshape(lead + (b2.shape[-1],))
    if op.alpha != 1.0:
        y = y * op.alpha
    if len(xs) == 3:
        c = xs[2]
        y = y + (c if op.beta == 1.0 else c * op.beta)
    z = None
    if op.activation:   # the product is kept only where the activation's backward needs it
        z, y = y, UNARY[op.activation].forward(y, xp)
        z = None if UNARY[op.activation].from_output else z
    return [y], (a2, b2, xs[2].shape if len(xs) == 3 else None, z, y, a.shape)


def gemm_backward(op, ctx, gs, xp, wanted):
    a2, b2, c_shape, z, y, a_shape = ctx
    if op.activation:   # through the activation first, as its own kernel would
        gs = [UNARY[op.activation].backward(y if z is None else z, y, gs[0], xp)]
    g = gs[0] * op.alpha if op.alpha != 1.0 else gs[0]
    g = g.reshape(-1, g.shape[-1]) if g.ndim > 2 else g      # a batched A's rows, folded as forward folded them
    # A transposed operand's gradient is computed in its own layout (C-contiguous), never
    # returned as a transposed view: adding a strided view into the weight's gradient cost
    # 25x a contiguous add (9 ms per 1024 x 1024).
    ga = (xp.matmul(b2, g.T) if op.trans_a else xp.matmul(g, b2.T).reshape(a_shape)) if wanted[0] else None
    gb = (xp.matmul(g.T, a2) if op.trans_b else xp.matmul(a2.T, g)) if wanted[1] else None
    out = [ga, gb]
    if c_shape is not None and wanted[2]:
        gc = gs[0] * op.beta if op.beta != 1.0 else gs[0]
        out.append(unbroadcast(gc, c_shape, xp))
    return out


@register
class MatMul(OpSpec):
    kind = OpKind.MatMul
    kernel = Kernel(matmul_forward, matmul_backward, selective=True)
    attrs_type = MatMulAttrs
    onnx_ops = ("MatMul",)
    weight_inputs = (1,)

    def saved(self, attrs, inputs, outputs):
        """Both operands."""
        return Saved((0, 1))

    def from_onnx(self, node) -> Imported:
        return Imported(MatMulAttrs(), (0, 1))

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2)
        a, b = inputs
        if a.dtype != b.dtype:
            raise ShapeError(f"MatMul: input types differ ({a.dtype.value}, {b.dtype.value})")
        return (TensorShape(_matmul_dims(a.dims, b.dims)[2], a.dtype),)

    def roles(self, attrs, inputs):
        a, b = inputs
        batch, _, out = _matmul_dims(a.dims, b.dims)
        nb = len(batch)
        roles_a: list[Role] = []
        for k, d in enumerate(a.dims[:-2]):
            pos = nb - (a.rank - 2) + k
            roles_a.append(WHOLE if d == 1 and batch[pos] != 1 else pos)
        if a.rank > 1:
            roles_a.append(nb)
        roles_a.append(SUM)
        roles_b: list[Role] = []
        for k, d in enumerate(b.dims[:-2]):
            pos = nb - (b.rank - 2) + k
            roles_b.append(WHOLE if d == 1 and batch[pos] != 1 else pos)
        roles_b.append(SUM)
        if b.rank > 1:
            roles_b.append(len(out) - 1)
        return (tuple(roles_a), tuple(roles_b))

    def terms(self, attrs, n):
        return ((0, 1),)

    selective_backward = True

    def cost(self, attrs, inputs, outputs):
        return self.cost_of_grads(attrs, inputs, outputs, (True, True))

    def cost_of_grads(self, attrs, inputs, outputs, wanted):
        a, b = inputs
        _, k, _ = _matmul_dims(a.dims, b.dims)
        return product_cost(a, b, outputs[0], k, (bool(wanted[0]), bool(wanted[1])))

    def encode(self, s, attrs, x, ins, outs):
        a, b = ins
        return [s.matmul(x[0], x[1])] if min(a.rank, b.rank) >= 2 and (a.sizes[:-2] == b.sizes[:-2] or b.rank == 2) \
            else None

    # equal batch dims, or a matrix on the right, shared by every batch index (a layer's weight)
    symbols = (Symbol("matmul", ("T", "T"), _matmul_meaning),)
    axioms = (   # associative, bilinear, and how it meets concatenations
        Axiom("matmul-assoc", lambda s, v: Law(s.matmul(s.matmul(v.a, v.b), v.c),
                                               s.matmul(v.a, s.matmul(v.b, v.c)))),
        Axiom("matmul-add-left", lambda s, v: Law(s.matmul(s.add(v.a, v.b), v.c),
                                                  s.add(s.matmul(v.a, v.c), s.matmul(v.b, v.c)))),
        Axiom("matmul-add-right", lambda s, v: Law(s.matmul(v.a, s.add(v.b, v.c)),
                                                   s.add(s.matmul(v.a, v.b), s.matmul(v.a, v.c)))),
        Axiom("matmul-scale-left", lambda s, v: Law(s.matmul(s.scale(v.k, v.a), v.b),
                                                    s.scale(v.k, s.matmul(v.a, v.b)))),
        Axiom("matmul-scale-right", lambda s, v: Law(s.matmul(v.a, s.scale(v.k, v.b)),
                                                     s.scale(v.k, s.matmul(v.a, v.b)))),
        Axiom("matmul-concat-rows", lambda s, v: Law(
            s.matmul(s.concat(-2, v.n1, v.n2, v.a, v.b), v.c),
            s.concat(-2, v.n1, v.n2, s.matmul(v.a, v.c), s.matmul(v.b, v.c)))),
        Axiom("matmul-concat-cols", lambda s, v: Law(
            s.matmul(v.a, s.concat(-1, v.n1, v.n2, v.b, v.c)),
            s.concat(-1, v.n1, v.n2, s.matmul(v.a, v.b), s.matmul(v.a, v.c)))),
        # a permutation of the batch dims alone (of up to 4 dims, there is one: 1023) commutes
        # with the product; one way, since a permuted matrix on the right must be batched
        Axiom("matmul-permute-batch", lambda s, v: Law(s.matmul(s.permute(v.k, v.a), s.permute(v.k, v.b)),
                                                       s.permute(v.k, s.matmul(v.a, v.b)), v.k == BATCH_SWAP, False)),
        Axiom("matmul-concat-batch", lambda s, v: Law(
            s.matmul(s.concat(v.ax, v.n1, v.n2, v.a, v.b), s.concat(v.ax, v.n1, v.n2, v.c, v.d)),
            s.concat(v.ax, v.n1, v.n2, s.matmul(v.a, v.c), s.matmul(v.b, v.d)), v.ax <= -3, False)),
        Axiom("matmul-concat-contracted", lambda s, v: Law(
            s.matmul(s.concat(-1, v.n1, v.n2, v.a, v.b), s.concat(-2, v.n1, v.n2, v.c, v.d)),
            s.add(s.matmul(v.a, v.c), s.matmul(v.b, v.d)), two_way=False)),
        Axiom("matmul-concat-contracted-left", lambda s, v: Law(
            s.matmul(s.concat(-1, v.n1, v.n2, v.a, v.b), v.c),
            s.add(s.matmul(v.a, s.split(-2, v.n1, v.n2, 0, v.c)), s.matmul(v.b, s.split(-2, v.n1, v.n2, 1, v.c))))),
        Axiom("matmul-concat-contracted-right", lambda s, v: Law(
            s.matmul(v.a, s.concat(-2, v.n1, v.n2, v.b, v.c)),
            s.add(s.matmul(s.split(-1, v.n1, v.n2, 0, v.a), v.b), s.matmul(s.split(-1, v.n1, v.n2, 1, v.a), v.c)))),
    )


@register
class Gemm(OpSpec):
    kind = OpKind.Gemm
    kernel = Kernel(gemm_forward, gemm_backward, selective=True)
    attrs_type = GemmAttrs
    onnx_ops = ("Gemm",)
    weight_inputs = (1, 2)

    def from_onnx(self, node) -> Imported:
        a = node.attrs
        attrs = GemmAttrs(bool(a.get("transA", 0)), bool(a.get("transB", 0)),
                          float(a.get("alpha", 1.0)), float(a.get("beta", 1.0)))
        return Imported(attrs, tuple(range(len(node.inputs))))

    def _mkn(self, attrs, inputs) -> tuple[tuple[int, ...], int, int]:
        """(the output's dims but the last, K, N). ``A`` is 2-D as ONNX has it, or, in a
        fused piece only (``activation`` set, never transposed), batched: a rank-3
        product and its activation as one kernel call (BERT's feed-forward layer)."""
        a, b = inputs[0], inputs[1]
        batched = a.rank > 2 and bool(attrs.activation) and not attrs.trans_a
        if (a.rank != 2 and not batched) or b.rank != 2:
            raise ShapeError(f"Gemm needs 2-D A and B, got {list(a.dims)} and {list(b.dims)}")
        *rows, k = a.dims[::-1] if attrs.trans_a else a.dims
        k2, n = b.dims[::-1] if attrs.trans_b else b.dims
        if k != k2:
            raise ShapeError(f"Gemm: inner dims differ ({k} vs {k2})")
        return tuple(rows), k, n

    def infer(self, attrs, inputs):
        need_inputs(self.kind, inputs, 2, 3)
        if attrs.activation and attrs.activation not in FUSED_ACTIVATIONS:
            raise ShapeError(f"Gemm: cannot fuse activation {attrs.activation!r} (only {', '.join(FUSED_ACTIVATIONS)})")
        rows, _, n = self._mkn(attrs, inputs)
        full = (*rows, n)
        if len(inputs) == 3 and broadcast_dims("Gemm", [TensorShape(full), inputs[2]]) != full:
            raise ShapeError(f"Gemm: C of shape {list(inputs[2].dims)} does not broadcast to {list(full)}")
        return (TensorShape(full, inputs[0].dtype),)

    def roles(self, attrs, inputs):
        rows, _, n = self._mkn(attrs, inputs)
        r = len(rows) + 1
        ra: tuple[Role, ...] = (SUM, 0) if attrs.trans_a else (*range(r - 1), SUM)
        rb: tuple[Role, ...] = (r - 1, SUM) if attrs.trans_b else (SUM, r - 1)
        out = [ra, rb]
        if len(inputs) == 3:
            c = inputs[2]
            full = (*rows, n)
            out.append(tuple(WHOLE if d == 1 and full[r - c.rank + i] != 1 else r - c.rank + i
                             for i, d in enumerate(c.dims)))
        return tuple(out)

    def terms(self, attrs, n):
        if attrs.activation:    # an activation of partial sums is not the activation of their sum
            return ()
        return ((0, 1), (2,)) if n == 3 else ((0, 1),)

    selective_backward = True

    def saved(self, attrs, inputs, outputs):
        """Both operands, the output, and the product before its activation where the
        activation's backward reads it."""
        fused = attrs.activation and not UNARY[attrs.activation].from_output
        return Saved((0, 1), (0,), (outputs[0],) if fused else ())

    def cost(self, attrs, inputs, outputs):
        return self.cost_of_grads(attrs, inputs, outputs, (True,) * len(inputs))

    def cost_of_grads(self, attrs, inputs, outputs, wanted):
        """The product priced as MatMul prices it, and ``+ C`` as the Add it is (one more
        pass over Y, in the same kernel call): a Gemm and its MatMul + Add differ by a
        launch, which is all the runtime saves by fusing them."""
        _, k, _ = self._mkn(attrs, inputs)
        cost = product_cost(inputs[0], inputs[1], outputs[0], k, (bool(wanted[0]), bool(wanted[1])))
        if len(inputs) == 3:
            bias = streaming_cost([outputs[0], inputs[2]], outputs)
            if not wanted[2]:
                bias = replace(bias, bwd_flops=0.0, bwd_bytes=0.0)
            cost = cost.followed_by(bias)
        if attrs.activation:    # the activation priced as its Unary prices it, in the same call
            cost = cost.followed_by(spec_by_kind(OpKind.Unary).cost(UnaryAttrs(attrs.activation), outputs, outputs))
        return cost

    def encode(self, s, attrs, x, ins, outs):
        if not (float(attrs.alpha).is_integer() and float(attrs.beta).is_integer()):
            return None
        y = s.matmul(s.transpose(x[0]) if attrs.trans_a else x[0], s.transpose(x[1]) if attrs.trans_b else x[1])
        y = y if attrs.alpha == 1 else s.scale(int(attrs.alpha), y)
        if len(x) == 3:    # + beta C, broadcast as Add broadcasts it
            c = x[2] if attrs.beta == 1 else s.scale(int(attrs.beta), x[2])
            y = (s.add if ins[2].sizes == outs[0].sizes else s.badd)(y, c)
        return [term(s, attrs.activation, y) if attrs.activation else y]
