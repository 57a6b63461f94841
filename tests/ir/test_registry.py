"""Every operator kind in the registry is whole: the runtime can run it (a kernel, or the
executor moves it: parallel ops and sources), its elementwise functions have their tables,
and the verifier either encodes it or the spec says why it is opaque."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.ir.ops.binary import BINARY
from unity_cli.ir.ops.unary import UNARY
from unity_cli.ir.opspec import Opaque, OpKind, OpSpec, all_specs, register
from unity_cli.kernels import has_kernel
from unity_cli.substitutions.axioms import AXIOMS, SYMBOLS, evaluate_term, quantified, signature
from unity_cli.substitutions.cache import default_rules_path
from unity_cli.substitutions.rule import load_rules
from unity_cli.substitutions.semantics import evaluate
from unity_cli.substitutions.verify import check_layouts, random_inputs, terms

ENCODED = {kind for kind, spec in all_specs().items() if type(spec).encode is not OpSpec.encode}
"""The kinds whose spec writes their terms in the verifier's symbols (overrides ``encode``)."""


@pytest.mark.parametrize("kind", sorted(all_specs()))
def test_each_kind_is_whole(kind):
    spec = all_specs()[kind]
    assert spec.is_parallel_op or spec.is_source or has_kernel(kind), f"{kind} has no kernel"
    if spec.is_source:
        return
    if spec.verifier == "encoded":
        assert kind in ENCODED, f"{kind} says it is encoded, and its spec has no encode"
    else:
        assert kind not in ENCODED, f"{kind} is encoded now: drop its stated opacity"
        assert isinstance(spec.verifier, Opaque) and len(spec.verifier.reason) >= 10, f"{kind}: say why it is opaque"


def test_the_elementwise_kinds_take_their_functions_from_one_table():
    specs = all_specs()
    assert set(specs["Unary"].onnx_ops) <= set(UNARY)
    assert set(specs["Binary"].onnx_ops) <= set(BINARY)


def test_the_override_scan_sees_the_encoded_kinds():
    """The scan above can fail: it finds MatMul and not Hardmax."""
    assert "MatMul" in ENCODED and "Hardmax" not in ENCODED


def test_each_symbol_has_one_owner_and_each_axiom_roots_in_its_owners_symbol():
    """An operator's laws are about its own symbol: the left side of each axiom its spec
    declares is rooted in a symbol that same spec declares."""
    s = signature()
    owner = {sym.name: kind for kind, spec in all_specs().items() for sym in spec.symbols}
    assert set(owner) == set(SYMBOLS)
    for kind, spec in all_specs().items():
        for axiom in spec.axioms:
            law, _ = quantified(axiom, s)
            root = law.lhs.decl().name()
            assert owner.get(root) == kind, f"{kind} declares {axiom.name}, whose left side is {root}'s"
    assert sum(len(spec.axioms) for spec in all_specs().values()) == len(AXIOMS)


def _shipped_instances_by_kind():
    """Per encoded kind, the instances (both sides at each layout) of up to three shipped rules
    that use it."""
    out: dict[str, list] = {}
    for rule in sorted(load_rules(default_rules_path()).rules, key=lambda r: r.id):
        kinds = {n.kind for n in rule.src.nodes + rule.dst.nodes} & ENCODED
        if not kinds or all(len(out.get(k, ())) >= 3 for k in kinds):
            continue
        instances = check_layouts(rule)
        for k in kinds:
            out.setdefault(k, []).extend(instances)
    return out


@pytest.fixture(scope="module")
def shipped_instances():
    return _shipped_instances_by_kind()


@pytest.mark.parametrize("kind", sorted(ENCODED))
def test_each_encoded_kind_means_what_its_kernel_computes(kind, shipped_instances):
    """A shipped rule uses every encoded kind, and the terms its spec writes, run through the
    symbols' meanings, equal the graph's reference semantics on random inputs, at every
    layout of up to three such rules: exactly, but where an Attention's blocked kernel sums
    its softmax in another order than the chain its terms spell (to float64 rounding)."""
    instances = shipped_instances.get(kind)
    assert instances, f"no shipped rule uses {kind}: nothing shows its terms mean what it computes"
    rng = np.random.default_rng(0)
    s = signature()
    checked = 0
    for inst in instances:
        values = random_inputs(inst.layout, rng)
        for pcg in (inst.src, inst.dst):
            try:
                got = [np.asarray(evaluate_term(t, values)) for t in terms(pcg, s)]
            except NotImplementedError:      # an uninterpreted function (a broadcasting product
                continue                     # at the grouped-query layout) means nothing to check
            checked += 1
            blocked = any(n.kind == OpKind.Attention for _, n in pcg)
            for want, term_value in zip(evaluate(pcg, values), got, strict=True):
                same = np.allclose(want, term_value, rtol=1e-12, atol=1e-12) if blocked else \
                    np.array_equal(want, term_value)
                assert same, f"{kind}: a term means other than the kernel ({inst.layout})"
    assert checked, f"{kind}: no instance of a shipped rule has terms with a meaning"


def test_the_kinds_are_one_enum_and_every_member_has_a_spec():
    """The registry and ``OpKind`` are the same set; a spec whose kind is a bare string (a
    new operator that skipped the enum) is refused when it registers."""
    assert set(all_specs()) == set(OpKind)
    assert all(type(spec.kind) is OpKind for spec in all_specs().values())

    class Stray(OpSpec):
        kind = "Stray"
    with pytest.raises(RuntimeError, match="OpKind"):
        register(Stray)
