"""Attention's rule family: the chain a decoder's export writes for softmax attention is one
Attention operator (``ir/ops/attention.py``), whose kernels keep no [Sq, Sk] scores::

    MatMul(Softmax(Add(Mul(MatMul(q, Transpose(k)), s), mask), -1), v) = Attention[mask, factor](q, k, v, mask, s)

one rule for each form of the chain: with or without the additive mask, with or without the
scale (a one-element constant ``s``: no rule can read a tensor's value as an attribute, so the
Attention takes it as its ``factor`` input), and with k transposed in the chain (as exports
write ``k.transpose(-1, -2)``) or given transposed (``kT``: the Attention gets it transposed
back, a copy of [Sk, d], not of the scores). A pattern says nothing of the batch and head
dims, so each rule matches grouped-query attention too, where q is [.., kv_heads, group, S, d]
and k, v [.., kv_heads, 1, S, d]; the verifier proves it at that layout as well
(``verify.grouped_query_layouts``).

What the proof shows: the verifier encodes an Attention as the chain of operators it stands
for, each in its own spec's terms (:meth:`~unity_cli.ir.ops.attention.Attention.encode`), so
for these rules both sides are one term (the ``kT`` form's two transposes cancel in
Transpose's own encoding) and z3 closes ``src != dst`` by congruence, with no axiom used. That
is a proof of the pattern: the source is, operator for operator, the chain the Attention
means (with the same axes, operand order and broadcasting symbols), and a chain that differs
anywhere is not proved. It proves nothing about softmax itself, which the verifier does not
model beyond its axis: that the blocked kernels compute the chain is the kernels' tests'
business (``tests/ir/test_attention.py``), as it is for every operator.
"""
from __future__ import annotations

from ..ir.opspec import OpKind
from .parallel_rules import Arg, Expr, add, binary, make_rule, matmul, op, softmax, transpose
from .rule import Constraint, Rule


def attention(q: Arg, k: Arg, v: Arg, *, mask: Arg | None = None, factor: Arg | None = None) -> Expr:
    """An Attention of scale 1 over q, k (not transposed) and v, with the optional inputs given."""
    extra = [t for t in (mask, factor) if t is not None]
    return op(OpKind.Attention, q, k, v, *extra, scale=1.0, mask=mask is not None, factor=factor is not None)


def attention_rule(masked: bool, scaled: bool, pretransposed: bool) -> Rule:
    """The chain as one Attention, in one of its forms (see the module docstring)."""
    key = "kT" if pretransposed else "k"
    scores: Arg = matmul("q", key if pretransposed else transpose(key))
    said = f"MatMul(q, {key if pretransposed else 'Transpose(k)'})"
    if scaled:
        scores, said = binary("Mul", scores, "s"), f"Mul({said}, s)"
    if masked:
        scores, said = add(scores, "mask"), f"Add({said}, mask)"
    inputs = ("q", key, "v") + (("mask",) if masked else ()) + (("s",) if scaled else ())
    dst = attention("q", transpose(key) if pretransposed else key, "v", mask="mask" if masked else None,
                    factor="s" if scaled else None)
    name = "attention" + "-masked" * masked + "-scaled" * scaled + "-pretransposed-k" * pretransposed
    args = ", ".join(("q", "Transpose(kT)" if pretransposed else "k", "v") + inputs[3:])
    flags = ", ".join(f for f, on in (("mask", masked), ("factor", scaled)) if on)
    return make_rule(name, inputs, matmul(softmax(scores, -1), "v"), dst, params=(),
                     constraints=[Constraint("EQUAL", ("rank", "s"), 0)] if scaled else [],
                     doc=f"MatMul(Softmax({said}, -1), v) = Attention{f'[{flags}]' if flags else ''}({args})")


def attention_rules() -> list[Rule]:
    """Every form of the chain, in a fixed order (``families.family_rules`` ships them)."""
    return [attention_rule(masked, scaled, pretransposed)
            for pretransposed in (False, True) for masked in (True, False) for scaled in (True, False)]
