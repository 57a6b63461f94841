"""Hand-written parallelization rules, in the same format as generated ones.

Each rule says how to run an operator (or a pair of them) split ``d`` ways; the degree
``d`` is a parameter bound when the rule matches. They are verified by the same
verifier as every other rule. A small expression builder (:func:`op` and friends)
writes the patterns, so a rule reads like its math::

    MatMul(x, W) = Combine(MatMul(Replicate(x, d), Repartition(W, -1, d)), -1, d)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..ir.ops.unary import UNARY
from ..ir.opspec import OpKind
from .rule import AttrValue, Constraint, Param, Pattern, PatternNode, Rule

D = Param("d")


@dataclass(frozen=True)
class Expr:
    """One operator applied to rule inputs (names) or other expressions; ``index`` picks an output."""

    kind: str
    attrs: tuple[tuple[str, AttrValue], ...]
    args: tuple[Expr | str, ...]
    n_outputs: int = 1
    index: int = 0


Arg = Expr | str


def op(kind: str, *args: Arg, n_outputs: int = 1, **attrs: Any) -> Expr:
    return Expr(kind, tuple(sorted(attrs.items())), args, n_outputs)


def output(e: Expr, k: int) -> Expr:
    """Output ``k`` of a multi-output op (a Split)."""
    return Expr(e.kind, e.attrs, e.args, e.n_outputs, k)


def matmul(a: Arg, b: Arg) -> Expr:
    return op(OpKind.MatMul, a, b)


def softmax(x: Arg, axis: int) -> Expr:
    return op(OpKind.Softmax, x, axis=axis, log=False, flatten=False)


def unary(fn: str, x: Arg) -> Expr:
    return op(OpKind.Unary, x, fn=fn)


def relu(x: Arg) -> Expr:
    return unary("Relu", x)


def binary(fn: str, a: Arg, b: Arg) -> Expr:
    return op(OpKind.Binary, a, b, fn=fn)


def add(a: Arg, b: Arg) -> Expr:
    return binary("Add", a, b)


def scale(x: Arg, factor: AttrValue) -> Expr:
    return op(OpKind.Scale, x, factor=factor)


def concat(*xs: Arg, axis: int) -> Expr:
    return op(OpKind.Concat, *xs, axis=axis)


def split(x: Arg, axis: int, parts: int = 2) -> list[Expr]:
    e = op(OpKind.Split, x, axis=axis, parts=parts, n_outputs=parts)
    return [output(e, k) for k in range(parts)]


def split_as(x: Arg, axis: int, widths: Sequence[tuple[str, int]]) -> list[Expr]:
    """A Split of ``x`` along ``axis`` into parts as wide as the rule inputs' dims ``widths``
    (``(input, axis)`` each): a fused projection split back into its weights' widths."""
    e = op(OpKind.Split, x, axis=axis, sizes=tuple(("dim", t, a) for t, a in widths), n_outputs=len(widths))
    return [output(e, k) for k in range(len(widths))]


def transpose(x: Arg) -> Expr:
    return op(OpKind.Transpose, x, perm=(-1, -2))


def repartition(x: Arg, dim: int, d: AttrValue = D) -> Expr:
    return op(OpKind.Repartition, x, dim=dim, degree=d)


def combine(x: Arg, dim: int | str, d: AttrValue = D) -> Expr:
    return op(OpKind.Combine, x, dim=dim, degree=d)


def replicate(x: Arg, d: AttrValue = D) -> Expr:
    return op(OpKind.Replicate, x, degree=d)


def reduction(x: Arg, d: AttrValue = D) -> Expr:
    return op(OpKind.Reduction, x, degree=d)


def gather(table: Arg, ids: Arg, axis: int) -> Expr:
    return op(OpKind.Gather, table, ids, axis=axis)


def conv(x: Arg, w: Arg, kernel: tuple[int, ...], pads: tuple[int, ...]) -> Expr:
    n = len(kernel)
    return op(OpKind.Conv, x, w, kernel=kernel, strides=(1,) * n, pads=pads, dilations=(1,) * n, groups=1)


def pattern(outputs: Sequence[Arg], prefix: str) -> Pattern:
    """Flatten expressions into pattern nodes (equal subexpressions become one node)."""
    nodes: list[PatternNode] = []
    names: dict[Expr, tuple[str, ...]] = {}

    def visit(a: Arg) -> str:
        if isinstance(a, str):
            return a
        node_key = Expr(a.kind, a.attrs, a.args, a.n_outputs)
        if node_key not in names:
            ins = tuple(visit(x) for x in a.args)
            outs = tuple(f"{prefix}{len(nodes)}" + (f"_{k}" if a.n_outputs > 1 else "") for k in range(a.n_outputs))
            nodes.append(PatternNode(a.kind, a.attrs, ins, outs))
            names[node_key] = outs
        return names[node_key][a.index]

    outs = tuple(visit(o) for o in outputs)
    return Pattern(tuple(nodes), outs)


def make_rule(name: str, inputs: Sequence[str], src: Arg | Sequence[Arg], dst: Arg | Sequence[Arg],
              params: Sequence[str] = ("d",), constraints: Sequence[Constraint] = (), doc: str = "") -> Rule:
    """A rule from expressions: ``src = dst`` (each one expression or a list, one per output)."""
    srcs = [src] if isinstance(src, Expr | str) else list(src)
    dsts = [dst] if isinstance(dst, Expr | str) else list(dst)
    meta = {"doc": doc, "origin": "hand-written"} if doc else {"origin": "hand-written"}
    return Rule(tuple(inputs), tuple(params), pattern(srcs, "s"), pattern(dsts, "t"), tuple(constraints), name, meta)


def rank_is(t: str, r: int) -> Constraint:
    return Constraint("EQUAL", ("rank", t), r)


def _linear_rules() -> list[Rule]:
    x, w, w1, w2 = "x", "W", "W1", "W2"
    return [
        make_rule("matmul-split-output", (x, w), matmul(x, w),
                  combine(matmul(replicate(x), repartition(w, -1)), -1),
                  doc="MatMul(x, W) = Combine(MatMul(Replicate(x, d), Repartition(W, -1, d)), -1, d)"),
        make_rule("matmul-split-rows", (x, w), matmul(x, w),
                  combine(matmul(repartition(x, -2), replicate(w)), -2),
                  doc="MatMul(x, W) = Combine(MatMul(Repartition(x, -2, d), Replicate(W, d)), -2, d)"),
        make_rule("matmul-split-contracted", (x, w), matmul(x, w),
                  reduction(matmul(repartition(x, -1), repartition(w, -2))),
                  doc="MatMul(x, W) = Reduction(MatMul(Repartition(x, -1, d), Repartition(W, -2, d)), d)"),
        make_rule("megatron-mlp", (x, w1, w2), matmul(matmul(x, w1), w2),
                  reduction(matmul(matmul(replicate(x), repartition(w1, -1)), repartition(w2, -2))),
                  doc="MatMul(MatMul(x, W1), W2) = "
                      "Reduction(MatMul(MatMul(Replicate(x, d), Repartition(W1, -1, d)), Repartition(W2, -2, d)), d)"),
        make_rule("megatron-mlp-relu", (x, w1, w2), matmul(relu(matmul(x, w1)), w2),
                  reduction(matmul(relu(matmul(replicate(x), repartition(w1, -1))), repartition(w2, -2))),
                  doc="MatMul(Relu(MatMul(x, W1)), W2) = Reduction(MatMul(Relu(MatMul(Replicate(x, d), "
                      "Repartition(W1, -1, d))), Repartition(W2, -2, d)), d)"),
    ]


def _embedding_rules() -> list[Rule]:
    t, ids = "table", "ids"
    return [
        make_rule("embedding-split-rows", (t, ids), gather(t, ids, -2),
                  reduction(gather(repartition(t, -2), replicate(ids), -2)), constraints=[rank_is(t, 2)],
                  doc="Gather(table, ids) = Reduction(Gather(Repartition(table, rows, d), Replicate(ids, d)), d): "
                      "each piece looks up the ids in its rows, zeros elsewhere"),
        make_rule("embedding-split-columns", (t, ids), gather(t, ids, -2),
                  combine(gather(repartition(t, -1), replicate(ids), -2), -1), constraints=[rank_is(t, 2)],
                  doc="Gather(table, ids) = Combine(Gather(Repartition(table, -1, d), Replicate(ids, d)), -1, d)"),
    ]


def _elementwise_rules() -> list[Rule]:
    out = []
    for axis in (-1, -2):
        for fn in (name for name, f in UNARY.items() if f.activation):
            out.append(make_rule(
                f"{fn.lower()}-through-repartition{axis}", ("x",), unary(fn, repartition("x", axis)),
                repartition(unary(fn, "x"), axis),
                doc=f"{fn}(Repartition(x, {axis}, d)) = Repartition({fn}(x), {axis}, d)"))
            out.append(make_rule(
                f"{fn.lower()}-through-combine{axis}", ("x",), unary(fn, combine("x", axis)),
                combine(unary(fn, "x"), axis),
                constraints=[Constraint("DIVISIBLE_BY", ("degree", "x", axis), ("param", "d"))],
                doc=f"{fn}(Combine(x, {axis}, d)) = Combine({fn}(x), {axis}, d): compute on the shards"))
        for fn in ("Add", "Mul", "Sub"):
            out.append(make_rule(
                f"{fn.lower()}-split{axis}", ("a", "b"), binary(fn, "a", "b"),
                combine(binary(fn, repartition("a", axis), repartition("b", axis)), axis),
                doc=f"{fn}(a, b) = Combine({fn}(Repartition(a, {axis}, d), Repartition(b, {axis}, d)), {axis}, d)"))
    for fn in ("Add", "Sub"):
        out.append(make_rule(
            f"{fn.lower()}-partial-sums", ("a", "b"), binary(fn, reduction("a"), reduction("b")),
            reduction(binary(fn, "a", "b")),
            constraints=[Constraint("EQUAL", ("sum", "a"), ("param", "d")),
                         Constraint("EQUAL", ("sum", "b"), ("param", "d"))],
            doc=f"{fn}(Reduction(a, d), Reduction(b, d)) = Reduction({fn}(a, b), d): one all-reduce, not two"))
    out.append(make_rule(
        "relu-replicated", ("x",), relu("x"), combine(relu(replicate("x")), "copy"),
        doc="Relu(x) = Combine(Relu(Replicate(x, d)), copy, d)"))
    return out


def _conv_rules() -> list[Rule]:
    out = []
    for kernel, pads in (((3, 3), (1, 1, 1, 1)), ((1, 1), (0, 0, 0, 0))):
        tag = "x".join(map(str, kernel))

        def c(x: Arg, w: Arg, kernel=kernel, pads=pads) -> Expr:
            return conv(x, w, kernel, pads)

        out += [
            make_rule(f"conv{tag}-split-output-channels", ("x", "W"), c("x", "W"),
                      combine(c(replicate("x"), repartition("W", -4)), -3),
                      doc="Conv(x, W) = Combine(Conv(Replicate(x, d), Repartition(W, out-channels, d)), channels, d)"),
            make_rule(f"conv{tag}-split-input-channels", ("x", "W"), c("x", "W"),
                      reduction(c(repartition("x", -3), repartition("W", -3))),
                      doc="Conv(x, W) = "
                          "Reduction(Conv(Repartition(x, channels, d), Repartition(W, in-channels, d)), d)"),
            make_rule(f"conv{tag}-split-batch", ("x", "W"), c("x", "W"),
                      combine(c(repartition("x", -4), replicate("W")), -4),
                      doc="Conv(x, W) = Combine(Conv(Repartition(x, batch, d), Replicate(W, d)), batch, d)"),
        ]
    return out


def parallel_rules() -> list[Rule]:
    return _linear_rules() + _embedding_rules() + _elementwise_rules() + _conv_rules()


PARALLEL_RULES: list[Rule] = parallel_rules()
