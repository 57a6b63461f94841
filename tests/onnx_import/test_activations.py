"""Written-out activations read as one op (``onnx_import/activations.py``): every export's
Gelu, in both forms and from both exporters, becomes one Unary, and the imported model
computes what onnxruntime computes on the original file; anything that is not exactly the
formula stays as it was."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models.catalog import EXPORTED_DIR
from onnx import TensorProto, helper, numpy_helper

from unity_cli.ir.opspec import OpKind
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.model_io import weight_values
from unity_cli.substitutions.semantics import evaluate

EXPORTS = [("tiny", "bert_tiny.onnx", "Gelu"), ("tiny", "bert_tiny_dynamo.onnx", "Gelu"),
           ("exported", "vit_tiny.onnx", "Gelu"), ("exported", "vit_tiny_dynamo.onnx", "Gelu"),
           ("exported", "gpt2_tiny.onnx", "Gelu (tanh)"), ("exported", "gpt2_tiny_dynamo.onnx", "Gelu (tanh)")]


def _feeds(session: ort.InferenceSession, imported, rng) -> dict[str, np.ndarray]:
    out = {}
    for i in session.get_inputs():
        dims = imported.inputs[i.name].dims
        out[i.name] = rng.integers(0, 2, dims).astype(np.int64) if "int" in i.type else \
            rng.standard_normal(dims).astype(np.float32)
    return out


def _unary_fns(pcg) -> list[str]:
    return [n.op.fn for _, n in pcg if n.kind == OpKind.Unary]


@pytest.mark.parametrize("where,name,kind", EXPORTS, ids=[n for _, n, _ in EXPORTS])
def test_an_exports_gelu_is_one_op_and_computes_what_onnxruntime_does(tiny_models, where, name, kind):
    path = (tiny_models if where == "tiny" else EXPORTED_DIR) / name
    imported = import_model(path, ImportOptions())
    assert imported.recognised.get(kind) == 2                      # one per layer of the two
    assert set(imported.recognised) <= {kind, "Reshape chain"}
    gelus = [n.name for _, n in imported.pcg if n.kind == OpKind.Unary and n.op.fn.startswith("Gelu")]
    assert all(gelus) and len(set(gelus)) == 2                    # named, each its own
    if name == "bert_tiny.onnx":   # after the module the written-out ops shared
        assert gelus == [f"/m/encoder/layer.{k}/intermediate/intermediate_act_fn/Gelu" for k in (0, 1)]
    fns = _unary_fns(imported.pcg)
    assert fns.count("GeluTanh" if "tanh" in kind else "Gelu") == 2 and "Erf" not in fns and "Tanh" not in fns
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _feeds(session, imported, np.random.default_rng(0))
    w = weight_values(path, imported, [imported.pcg], seed=0)
    got = evaluate(imported.pcg, {**feeds, **w.trainable, **w.constants})
    want = session.run(None, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)


def _gelu_model(path: Path, sqrt2: float = float(np.sqrt(2.0)), half: float = 0.5, also_read: bool = False,
                half_first: bool = False) -> Path:
    """``y = x * 0.5 * (1 + erf(x / sqrt2))`` written out as PyTorch writes it (``half_first``:
    ``(x * 0.5) * (1 + erf)``), its constants as given; ``also_read``: the Erf's output is a
    second graph output."""
    c = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("s", sqrt2), ("one", 1.0), ("h", half))]
    nodes = [helper.make_node("Div", ["x", "s"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"])]
    if half_first:
        nodes += [helper.make_node("Mul", ["h", "x"], ["m"]), helper.make_node("Mul", ["a", "m"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "h"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])]
    if also_read:
        outs.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, ["batch", 8]))
    g = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          outs, c)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("half_first", [False, True])
def test_the_factors_may_come_in_any_order(tmp_path, half_first):
    imported = import_model(_gelu_model(tmp_path / "g.onnx", half_first=half_first), ImportOptions(batch_size=4))
    assert imported.recognised == {"Gelu": 1} and _unary_fns(imported.pcg) == ["Gelu"]


@pytest.mark.parametrize("change", [dict(sqrt2=1.5), dict(half=0.25), dict(also_read=True)],
                         ids=["another-divisor", "another-half", "erf-also-read"])
def test_what_is_not_exactly_gelu_stays_as_it_was(tmp_path, change):
    """Another constant, or an intermediate someone else reads: no Gelu, and the values are
    onnxruntime's."""
    path = _gelu_model(tmp_path / "g.onnx", **change)
    imported = import_model(path, ImportOptions(batch_size=4))
    assert imported.recognised == {} and "Erf" in _unary_fns(imported.pcg)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = evaluate(imported.pcg, {"x": x, **imported.constants})
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
