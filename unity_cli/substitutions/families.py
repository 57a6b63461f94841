"""Algebraic rule families that real graphs contain, one rule per arity.

The generator enumerates small graphs over two or three inputs; the rewrites that models
gain from are wider: n projections of one input (attention's Q, K and V), a layer over a
concatenation of n embeddings (XDL, DLRM), a Gemm whose bias blocks a row split. Each
family is written once, with its arity ``n`` as the parameter of a Python function, and
instantiated for every arity up to :data:`MAX_ARITY`; every instance is an ordinary rule,
proved by the same verifier as every other (a concatenation of 4 is a different term from
one of 3, so each arity is its own proof). Matching needs the arity of a graph's
operator to equal the pattern's, which is why each arity is its own rule.

Widths must be equal across the n parts (the split that undoes a concatenation names its
number of equal parts); a constraint says so, so a graph with unequal parts does not match.
"""
from __future__ import annotations

from ..ir.ops.linear import FUSED_ACTIVATIONS
from ..ir.ops.shape_ops import BATCH_SWAP, MAX_PERMUTED, all_perm_codes, code_perm, inverse_code, perm_code
from ..ir.opspec import OpKind
from .attention_rules import attention_rules
from .parallel_rules import (
    Arg,
    Expr,
    add,
    binary,
    concat,
    conv,
    gather,
    make_rule,
    matmul,
    op,
    output,
    softmax,
    split,
    split_as,
    transpose,
    unary,
)
from .rule import Constraint, Rule

MAX_ARITY = 8
"""Widest concatenation a Concat-Linear rule is instantiated for."""
MAX_SIBLINGS = 4
"""Most projections of one input that a sibling-fusion rule fuses."""


def gemm(a: Arg, w: Arg, *bias: Arg, trans_b: bool, activation: str = "") -> Expr:
    fused = {"activation": activation} if activation else {}
    return op(OpKind.Gemm, a, w, *bias, trans_a=False, trans_b=trans_b, alpha=1.0, beta=1.0, **fused)


def _weight(w: Arg, trans_b: bool) -> Arg:
    return transpose(w) if trans_b else w


def _equal_widths(names: list[str], axis: int) -> list[Constraint]:
    return [Constraint("EQUAL", ("dim", t, axis), ("dim", names[0], axis)) for t in names[1:]]


def _sum(terms: list[Arg]) -> Arg:
    acc = terms[0]
    for t in terms[1:]:
        acc = add(acc, t)
    return acc


def gemm_rules() -> list[Rule]:
    """``Gemm = MatMul (+ Add)`` and ``Gemm(x, W, b) = Gemm(x, W) + b``, both ways: a Gemm's
    bias (and transpose) made explicit, so that its product can be split along the
    contracted dim (Megatron's row split: the partial sums are reduced, then the bias is
    added once), which a Gemm with its bias inside cannot be."""
    out = []
    for trans_b in (False, True):
        tag = "-trans-b" if trans_b else ""
        w = "Wt" if trans_b else "W"
        out += [
            make_rule(f"gemm{tag}-as-matmul-add", ("x", w, "b"), gemm("x", w, "b", trans_b=trans_b),
                      add(matmul("x", _weight(w, trans_b)), "b"), params=(),
                      doc=f"Gemm(x, {w}, b) = Add(MatMul(x, {'Transpose(Wt)' if trans_b else 'W'}), b)"),
            make_rule(f"gemm{tag}-bias-as-add", ("x", w, "b"), gemm("x", w, "b", trans_b=trans_b),
                      add(gemm("x", w, trans_b=trans_b), "b"), params=(),
                      doc=f"Gemm(x, {w}, b) = Add(Gemm(x, {w}), b): the bias apart, the product as it was"),
            make_rule(f"gemm{tag}-as-matmul", ("x", w), gemm("x", w, trans_b=trans_b),
                      matmul("x", _weight(w, trans_b)), params=(),
                      doc=f"Gemm(x, {w}) = MatMul(x, {'Transpose(Wt)' if trans_b else 'W'})"),
        ]
    return out


def _fusable() -> list[tuple[str, str]]:
    """(activation, its name in rule names) for each activation a Gemm can fuse; Erf is only
    ever applied to a scaled copy of a product (Gelu written out), so it never matches."""
    return [(fn, fn.lower()) for fn in FUSED_ACTIVATIONS if fn != "Erf"]


def _layouts(trans_b: bool) -> tuple[str, str, Arg, str]:
    """(name tag, weight input, the product ``x @ W``, how a doc shows the weight)."""
    w = "Wt" if trans_b else "W"
    return ("-trans-b" if trans_b else ""), w, matmul("x", _weight(w, trans_b)), ("Transpose(Wt)" if trans_b else "W")


def _matmul_fusions(fn: str, name: str, trans_b: bool, x_rank: int) -> tuple[Rule, Rule]:
    """``f(MatMul(x, W) + b)`` and ``f(MatMul(x, W))`` = a fused Gemm, ``x`` of ``x_rank``
    (3: the Gemm's ``A`` is batched, a rule of its own with its own name)."""
    tag, w, product, shown = _layouts(trans_b)
    suffix, said = ("", "") if x_rank == 2 else ("-batched", f", x of rank {x_rank}")
    ranks = [Constraint("EQUAL", ("rank", "x"), x_rank), Constraint("EQUAL", ("rank", w), 2)]
    return (make_rule(f"matmul{tag}-add-{name}-fused{suffix}", ("x", w, "b"), unary(fn, add(product, "b")),
                      gemm("x", w, "b", trans_b=trans_b, activation=fn), params=(),
                      constraints=ranks + [Constraint("EQUAL", ("rank", "b"), 1)],
                      doc=f"{fn}(MatMul(x, {shown}) + b) = Gemm[{fn}](x, {w}, b){said}"),
            make_rule(f"matmul{tag}-{name}-fused{suffix}", ("x", w), unary(fn, product),
                      gemm("x", w, trans_b=trans_b, activation=fn), params=(), constraints=ranks,
                      doc=f"{fn}(MatMul(x, {shown})) = Gemm[{fn}](x, {w}){said}"))


def fused_activation_rules() -> list[Rule]:
    """``f(Gemm(x, W, b))`` and ``f(MatMul(x, W) + b)`` as one Gemm that applies ``f``
    itself, for each activation a Gemm can fuse (``FUSED_ACTIVATIONS``), both weight
    layouts, both ways: one kernel call, one task of the runtime's, instead of two or three.
    The reverse frees the product to be split along its contracted dim again (an
    activation of partial sums is not one of their sum, so a fused Gemm is never split so)."""
    out = []
    for fn, name in _fusable():
        for trans_b in (False, True):
            tag, w, _, _ = _layouts(trans_b)
            with_bias, bare = _matmul_fusions(fn, name, trans_b, 2)
            out += [
                make_rule(f"gemm{tag}-{name}-fused", ("x", w, "b"), unary(fn, gemm("x", w, "b", trans_b=trans_b)),
                          gemm("x", w, "b", trans_b=trans_b, activation=fn), params=(),
                          doc=f"{fn}(Gemm(x, {w}, b)) = Gemm[{fn}](x, {w}, b): one kernel call"),
                with_bias,
                make_rule(f"gemm{tag}-nobias-{name}-fused", ("x", w), unary(fn, gemm("x", w, trans_b=trans_b)),
                          gemm("x", w, trans_b=trans_b, activation=fn), params=(),
                          doc=f"{fn}(Gemm(x, {w})) = Gemm[{fn}](x, {w})"),
                bare,
            ]
    return out


def batched_fused_activation_rules() -> list[Rule]:
    """The same fusions of a rank-3 product (a layer applied to a batch of sequences, BERT's
    and GPT's feed-forward layers): ``f(MatMul(x, W) + b)`` with ``x`` of rank 3 and a
    weight matrix as one fused Gemm whose ``A`` is batched (its leading dims folded into
    the rows in the kernel). Separate rules from the rank-2 ones, so that their ids stay."""
    return [r for fn, name in _fusable() for trans_b in (False, True)
            for r in _matmul_fusions(fn, name, trans_b, 3)]


def concat_linear(n: int, uneven: bool = False) -> Rule:
    """``MatMul(Concat(a_1..a_n), W) = Σ MatMul(a_i, W_i)``, ``W_i`` the i-th row block of
    ``W`` (n equal ones, or, ``uneven``, each as tall as its part is wide): a layer over a
    concatenation is a sum of layers over its parts (with W's rows split across devices,
    the all-gather of the parts becomes one reduction). The uneven rule has no width
    constraint: a concatenation's parts are in order, so "not all equal" is no one pair
    (equal parts give the equal rule's graph, which the search's hashing drops)."""
    a = [f"a{i}" for i in range(1, n + 1)]
    blocks = _split_back("W", -2, a, -1, uneven)
    tag, rows = ("uneven-", "as wide as a_i") if uneven else ("", f"{n} equal")
    return make_rule(f"concat-linear-{tag}{n}", (*a, "W"), matmul(concat(*a, axis=-1), "W"),
                     _sum([matmul(x, blocks[i]) for i, x in enumerate(a)]), params=(),
                     constraints=[] if uneven else _equal_widths(a, -1),
                     doc=f"MatMul(Concat(a1..a{n}, -1), W) = Σ MatMul(a_i, W's row block i, {rows})")


def concat_gemm(n: int, uneven: bool = False) -> Rule:
    """The same for a biased, transposed-weight Gemm (how PyTorch exports ``nn.Linear``):
    the bias is added once, to the sum."""
    a = [f"a{i}" for i in range(1, n + 1)]
    blocks = _split_back("Wt", -1, a, -1, uneven)
    parts = [gemm(x, blocks[i], trans_b=True) for i, x in enumerate(a)]
    tag, cols = ("uneven-", "as wide as a_i") if uneven else ("", f"{n} equal")
    return make_rule(f"concat-gemm-{tag}{n}", (*a, "Wt", "b"), gemm(concat(*a, axis=-1), "Wt", "b", trans_b=True),
                     add(_sum(parts), "b"), params=(), constraints=[] if uneven else _equal_widths(a, -1),
                     doc=f"Gemm(Concat(a1..a{n}, -1), Wt, b) = Σ Gemm(a_i, Wt's column block i, {cols}) + b")


def _split_back(x: Arg, axis: int, weights: list[str], w_axis: int, uneven: bool) -> list[Expr]:
    """A fused product split back into its weights' widths: n equal parts, or (``uneven``)
    parts as wide as each weight's ``w_axis`` dim."""
    return split_as(x, axis, [(w, w_axis) for w in weights]) if uneven else split(x, axis, len(weights))


def _widths(weights: list[str], axis: int, uneven: bool) -> list[Constraint]:
    """Equal widths; or (``uneven``) the first two unequal: a group not all of one width
    always has, whichever member the match starts from, another of a different width to
    put second, so the uneven rules match exactly the groups the equal ones do not."""
    if not uneven:
        return _equal_widths(weights, axis)
    return [Constraint("UNEQUAL", ("dim", weights[0], axis), ("dim", weights[1], axis))]


def _siblings(rule: Rule, uneven: bool) -> Rule:
    """An uneven sibling fusion is left to the polish, which prices with device groups
    (``Rule.grouped_only``): flat, fusing a narrow branch with wide ones always looks a launch
    cheaper, while on device groups it may run better apart (Inception's reductions)."""
    return Rule(rule.inputs, rule.params, rule.src, rule.dst, rule.constraints, rule.name,
                {**rule.meta, "grouped_only": True}) if uneven else rule


def sibling_matmuls(n: int, uneven: bool = False) -> Rule:
    """n MatMuls of one input are one MatMul on the concatenated weights, then a Split back
    into the weights' widths (a multi-output rule: attention's Q, K and V projections, a
    model's towers on one input); equal widths, or (``uneven``) any."""
    w = [f"W{i}" for i in range(1, n + 1)]
    tag, widths = ("uneven-", "widths of W1..") if uneven else ("", f"{n} parts, W1..")
    return _siblings(make_rule(
        f"sibling-matmul-{tag}{n}", ("x", *w), [matmul("x", wi) for wi in w],
        _split_back(matmul("x", concat(*w, axis=-1)), -1, w, -1, uneven), params=(),
        constraints=_widths(w, -1, uneven),
        doc=f"MatMul(x, W1), ..., MatMul(x, W{n}) = Split(MatMul(x, Concat(W1..W{n}, -1)), -1, {widths}W{n})"), uneven)


def sibling_gemms(n: int, uneven: bool = False) -> Rule:
    """The same for biased, transposed-weight Gemms: weights concatenated along their
    rows, biases along their one dim."""
    w = [f"Wt{i}" for i in range(1, n + 1)]
    b = [f"b{i}" for i in range(1, n + 1)]
    tag, widths = ("uneven-", "widths of Wt1..") if uneven else ("", f"{n} parts, Wt1..")
    return _siblings(make_rule(
        f"sibling-gemm-{tag}{n}", ("x", *w, *b), [gemm("x", wi, bi, trans_b=True) for wi, bi in zip(w, b)],
        _split_back(gemm("x", concat(*w, axis=-2), concat(*b, axis=-1), trans_b=True), -1, w, -2, uneven), params=(),
        constraints=_widths(w, -2, uneven) + [Constraint("EQUAL", ("rank", bi), 1) for bi in b],
        doc=f"Gemm(x, Wt1, b1), ..., Gemm(x, Wt{n}, b{n}) = "
            f"Split(Gemm(x, Concat(Wt1..Wt{n}, -2), Concat(b1..b{n}, -1)), -1, {widths}Wt{n})"), uneven)


SIBLING_CONVS = (((1, 1), (0, 0, 0, 0)), ((3, 3), (1, 1, 1, 1)))
"""The 2-D convolutions (kernel, pads; stride and dilation 1, ungrouped, no bias) a
sibling-conv rule fuses: Inception's 1x1 reductions of one input, and same-size 3x3s."""


def sibling_convs(n: int, kernel: tuple[int, ...], pads: tuple[int, ...], uneven: bool = False) -> Rule:
    """n convolutions of one input are one on the weights stacked by output channels, then
    a Split back into their widths (proved by ``conv-concat-out-channels``, true for
    ungrouped convs: an output channel reads its own weight row alone)."""
    w = [f"W{i}" for i in range(1, n + 1)]
    tag = "x".join(map(str, kernel))
    kind, widths = ("uneven-", "widths of W1..") if uneven else ("", f"{n} parts, W1..")
    return _siblings(make_rule(
        f"sibling-conv{tag}-{kind}{n}", ("x", *w), [conv("x", wi, kernel, pads) for wi in w],
        _split_back(conv("x", concat(*w, axis=-4), kernel, pads), -3, w, -4, uneven), params=(),
        constraints=_widths(w, -4, uneven),
        doc=f"Conv{tag}(x, W1), ..., Conv{tag}(x, W{n}) = "
            f"Split(Conv{tag}(x, Concat(W1..W{n}, out-channels)), channels, {widths}W{n})"), uneven)


def embedding_merge(n: int) -> Rule:
    """n lookups from n tables are one lookup from the tables concatenated by rows, each
    table's ids offset by the rows before it (FBGEMM's table-batched embeddings): one kernel
    call and one weight where there were n. The tables may differ in rows (the op names
    each table's, bound where the rule applies); the ids must have one shape."""
    t = [f"T{i}" for i in range(1, n + 1)]
    ids = [f"ids{i}" for i in range(1, n + 1)]
    merged = op(OpKind.GroupedGather, concat(*t, axis=-2), *ids, n_outputs=n, rows=tuple(("dim", x, -2) for x in t))
    same_ids = [Constraint("EQUAL", ("shape", x), ("shape", ids[0])) for x in ids[1:]]
    return make_rule(f"embedding-merge-{n}", (*t, *ids), [gather(x, i, axis=-2) for x, i in zip(t, ids)],
                     [output(merged, k) for k in range(n)], params=(),
                     constraints=[Constraint("EQUAL", ("rank", x), 2) for x in t] + same_ids,
                     doc=f"Gather(T1, ids1), ..., Gather(T{n}, ids{n}) = "
                         f"GroupedGather(Concat(T1..T{n}, rows), ids1..ids{n}): ids_k offset by the rows before T_k")


def _tail(code: int) -> tuple[int, ...]:
    """A permutation code's tail as a pattern writes it: negative axes of the dims it moves."""
    perm = code_perm(code, len(str(code)))
    return tuple(p - len(perm) for p in perm)


def permute(x: Arg, tail: tuple[int, ...]) -> Expr:
    return op(OpKind.Transpose, x, perm=tail)


def _after(first: tuple[int, ...], then: tuple[int, ...]) -> tuple[int, ...]:
    """The tail of ``Transpose(Transpose(x, first), then)`` as one transpose; () if none."""
    def full(tail: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(range(MAX_PERMUTED - len(tail))) + tuple(p + MAX_PERMUTED for p in tail)
    a, b = full(first), full(then)
    code = perm_code(tuple(a[q] for q in b))   # output dim i is x's dim a[b[i]]
    return _tail(code) if code else ()


LAYOUT_UNARY = ("Relu", "Sigmoid", "Tanh")
"""Activations a transpose is moved through (each commutes with any permutation)."""


def layout_rules() -> list[Rule]:
    """Transposes of up to 4 trailing dims (attention's ``[0, 2, 1, 3]``, a channels-last
    model's ``[0, 3, 1, 2]`` and ``[0, 2, 3, 1]``), for each such permutation ``p``:

    * a transpose undone by its inverse is nothing (``transpose-cancel``), and one followed
      or preceded by the last-two swap (``k.transpose(-1, -2)``) is one transpose
      (``transpose-swap-after``/``-before``; one way: read backwards, every transpose
      would become two);
    * an activation, and the sum or product of two operands transposed alike, is the
      transposed activation, sum or product (``*-through-transpose``): moved so, a
      transpose can meet the one that undoes it; and where it is undone right after the
      activation (a converter's channels-last network), the three or four operators are
      the activation alone (``transpose-cancel-around-*``), one step that the search sees
      gain at once (one way: read backwards, every activation would match and gain two
      transposes);
    * a softmax over the last dim of a transpose is the transposed softmax over the dim the
      transpose puts last (``softmax-through-transpose``), and undone right after, the
      softmax alone (``transpose-cancel-around-softmax``);
    * a batched product of two operands whose batch dims are permuted alike is the
      permuted product (``matmul-through-batch-transpose``).

    The last-two swap's own versions of the moves are the generator's rules."""
    out = []
    swap = (-1, -2)
    for code in all_perm_codes():
        p, q = _tail(code), _tail(inverse_code(code))
        out.append(make_rule(f"transpose-cancel-{code}", ("x",), permute(permute("x", p), q), "x",
                             params=(), doc=f"Transpose(Transpose(x, {list(p)}), {list(q)}) = x"))
        if p == swap:
            continue
        for name, first, then in (("after", p, swap), ("before", swap, p)):
            one = _after(first, then)
            if one:
                out.append(_one_way(make_rule(
                    f"transpose-swap-{name}-{code}", ("x",), permute(permute("x", first), then),
                    permute("x", one), params=(),
                    doc=f"Transpose(Transpose(x, {list(first)}), {list(then)}) = Transpose(x, {list(one)})")))
        for fn in LAYOUT_UNARY:
            out.append(make_rule(f"{fn.lower()}-through-transpose-{code}", ("x",), unary(fn, permute("x", p)),
                                 permute(unary(fn, "x"), p), params=(),
                                 doc=f"{fn}(Transpose(x, {list(p)})) = Transpose({fn}(x), {list(p)})"))
            out.append(_one_way(make_rule(f"transpose-cancel-around-{fn.lower()}-{code}", ("x",),
                                          permute(unary(fn, permute("x", p)), q), unary(fn, "x"), params=(),
                                          doc=f"Transpose({fn}(Transpose(x, {list(p)})), {list(q)}) = {fn}(x)")))
        same = [Constraint("EQUAL", ("shape", "a"), ("shape", "b"))]
        for fn in ("Add", "Mul"):
            out.append(make_rule(f"{fn.lower()}-through-transpose-{code}", ("a", "b"),
                                 binary(fn, permute("a", p), permute("b", p)), permute(binary(fn, "a", "b"), p),
                                 params=(), constraints=same,
                                 doc=f"{fn}(Transpose(a, {list(p)}), Transpose(b, {list(p)})) = "
                                     f"Transpose({fn}(a, b), {list(p)})"))
            out.append(_one_way(make_rule(
                f"transpose-cancel-around-{fn.lower()}-{code}", ("a", "b"),
                permute(binary(fn, permute("a", p), permute("b", p)), q), binary(fn, "a", "b"), params=(),
                constraints=same,
                doc=f"Transpose({fn}(Transpose(a, {list(p)}), Transpose(b, {list(p)})), {list(q)}) = {fn}(a, b)")))
    for code in all_perm_codes():     # a softmax over the last dim, the swap's too
        p, q = _tail(code), _tail(inverse_code(code))
        t = p[-1]    # the dim the transpose puts last
        out.append(make_rule(f"softmax-through-transpose-{code}", ("x",), softmax(permute("x", p), -1),
                             permute(softmax("x", t), p), params=(),
                             doc=f"Softmax(Transpose(x, {list(p)}), -1) = Transpose(Softmax(x, {t}), {list(p)})"))
        out.append(_one_way(make_rule(f"transpose-cancel-around-softmax-{code}", ("x",),
                                      permute(softmax(permute("x", p), -1), q), softmax("x", t), params=(),
                                      doc=f"Transpose(Softmax(Transpose(x, {list(p)}), -1), {list(q)}) "
                                          f"= Softmax(x, {t})")))
    p = _tail(BATCH_SWAP)
    out.append(make_rule(f"matmul-through-batch-transpose-{BATCH_SWAP}", ("a", "b"),
                         matmul(permute("a", p), permute("b", p)), permute(matmul("a", "b"), p), params=(),
                         constraints=[Constraint("EQUAL", ("rank", t), 4) for t in ("a", "b")],
                         doc=f"MatMul(Transpose(a, {list(p)}), Transpose(b, {list(p)})) = "
                             f"Transpose(MatMul(a, b), {list(p)})"))
    return out


def _one_way(r: Rule) -> Rule:
    return Rule(r.inputs, r.params, r.src, r.dst, r.constraints, r.name, {**r.meta, "one_way": True})


def family_rules() -> list[Rule]:
    """Every instance of every family, in a fixed order."""
    out = gemm_rules() + fused_activation_rules()
    out += [concat_linear(n) for n in range(2, MAX_ARITY + 1)]
    out += [concat_gemm(n) for n in range(2, MAX_ARITY + 1)]
    out += [sibling_matmuls(n) for n in range(2, MAX_SIBLINGS + 1)]
    out += [sibling_gemms(n) for n in range(2, MAX_SIBLINGS + 1)]
    out += [sibling_convs(n, k, p) for k, p in SIBLING_CONVS for n in range(2, MAX_SIBLINGS + 1)]
    out += batched_fused_activation_rules()
    out += [embedding_merge(n) for n in range(2, MAX_ARITY + 1)]
    out += layout_rules()
    out += [concat_linear(n, uneven=True) for n in range(2, MAX_ARITY + 1)]
    out += [concat_gemm(n, uneven=True) for n in range(2, MAX_ARITY + 1)]
    out += [sibling_matmuls(n, uneven=True) for n in range(2, MAX_SIBLINGS + 1)]
    out += [sibling_gemms(n, uneven=True) for n in range(2, MAX_SIBLINGS + 1)]
    out += [sibling_convs(n, k, p, uneven=True) for k, p in SIBLING_CONVS for n in range(2, MAX_SIBLINGS + 1)]
    out += attention_rules()
    return [_tagged(r) for r in out]


def _tagged(r: Rule) -> Rule:
    return Rule(r.inputs, r.params, r.src, r.dst, r.constraints, r.name, {**r.meta, "origin": "family"})


FAMILY_RULES: list[Rule] = family_rules()
