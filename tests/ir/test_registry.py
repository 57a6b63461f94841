"""Every operator kind in the registry is whole: the runtime can run it (a kernel, or the
executor moves it: parallel ops and sources), its elementwise functions have their tables,
and the verifier either encodes it or the spec says why it is opaque."""
from __future__ import annotations

import inspect
import re

import pytest

from unity_cli.ir.ops.binary import BINARY
from unity_cli.ir.ops.unary import UNARY
from unity_cli.ir.opspec import Opaque, OpKind, OpSpec, all_specs, register
from unity_cli.kernels import has_kernel
from unity_cli.substitutions import verify

ENCODED = set(re.findall(r'case OpKind\.([A-Za-z]+)', inspect.getsource(verify.encode)))
"""The kinds ``verify.encode`` writes in the axioms' symbols (its match cases)."""


@pytest.mark.parametrize("kind", sorted(all_specs()))
def test_each_kind_is_whole(kind):
    spec = all_specs()[kind]
    assert spec.is_parallel_op or spec.is_source or has_kernel(kind), f"{kind} has no kernel"
    if spec.is_source:
        return
    if spec.verifier == "encoded":
        assert kind in ENCODED, f"{kind} says it is encoded, and verify.encode has no case for it"
    else:
        assert kind not in ENCODED, f"{kind} is encoded now: drop its stated opacity"
        assert isinstance(spec.verifier, Opaque) and len(spec.verifier.reason) >= 10, f"{kind}: say why it is opaque"


def test_the_elementwise_kinds_take_their_functions_from_one_table():
    specs = all_specs()
    assert set(specs["Unary"].onnx_ops) <= set(UNARY)
    assert set(specs["Binary"].onnx_ops) <= set(BINARY)


def test_the_case_scan_sees_the_encoded_kinds():
    """The scan above can fail: it finds MatMul and not Softmax."""
    assert "MatMul" in ENCODED and "Softmax" not in ENCODED


def test_the_kinds_are_one_enum_and_every_member_has_a_spec():
    """The registry and ``OpKind`` are the same set; a spec whose kind is a bare string (a
    new operator that skipped the enum) is refused when it registers."""
    assert set(all_specs()) == set(OpKind)
    assert all(type(spec.kind) is OpKind for spec in all_specs().values())

    class Stray(OpSpec):
        kind = "Stray"
    with pytest.raises(RuntimeError, match="OpKind"):
        register(Stray)
