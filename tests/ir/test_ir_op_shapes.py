"""Each operator specification's logical shape inference against onnxruntime.

Every ONNX op type the registry imports gets one or more one-node models (several
attribute variants each). The model runs in onnxruntime on random inputs, is imported
with ``import_model`` and the PCG's output shapes (sizes and dtype) must equal what
onnxruntime produced. Constant operands (shapes, axes, bounds, sizes) are initializers
or ``Constant`` nodes, so the importer folds them into attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from unity_cli.errors import ModelError
from unity_cli.ir import DType
from unity_cli.ir.ops.elementwise import Unary
from unity_cli.ir.ops.unary import UNARY
from unity_cli.ir.opspec import all_specs
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportedModel, ImportOptions, import_model

BIG = np.iinfo(np.int64).max


@dataclass(frozen=True)
class In:
    """A graph input fed with random values (ints drawn from [low, high))."""

    shape: tuple[int, ...]
    dtype: Any = np.float32
    low: int = 0
    high: int = 3


@dataclass(frozen=True)
class Const:
    """A constant operand given by a ``Constant`` node rather than an initializer."""

    value: np.ndarray


@dataclass
class Case:
    op: str
    inputs: list[Any]              # In | np.ndarray (initializer) | Const | "" (omitted)
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    n_outputs: int = 1


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _build(case: Case, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    nodes, inputs, inits, feeds, names = [], [], [], {}, []
    for k, item in enumerate(case.inputs):
        name = f"in{k}"
        if isinstance(item, str):
            names.append(item)
            continue
        names.append(name)
        if isinstance(item, In):
            dt = np.dtype(item.dtype)
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dt), item.shape))
            if dt == np.bool_:
                feeds[name] = rng.integers(0, 2, item.shape).astype(bool)
            elif np.issubdtype(dt, np.integer):
                feeds[name] = np.asarray(rng.integers(item.low, item.high, item.shape)).astype(dt)
            else:
                feeds[name] = np.asarray(rng.standard_normal(item.shape) + 0.1).astype(dt)
        elif isinstance(item, Const):
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(item.value)))
        else:
            inits.append(numpy_helper.from_array(np.asarray(item), name))
    outs = [f"y{k}" for k in range(case.n_outputs)]
    nodes.append(helper.make_node(case.op, names, outs, name="the_node", **case.attrs))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = min(model.ir_version, 10)
    return model, feeds


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check_against_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path,
                       options: ImportOptions | None = None) -> ImportedModel:
    expected = _run_ort(model, feeds)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    imported = import_model(path, options or ImportOptions())
    validate(imported.pcg)
    got = [imported.pcg.shape(r) for r in imported.pcg.outputs]
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.sizes == e.shape, f"output {k}: unity {g.sizes}, onnxruntime {e.shape}"
        assert g.dtype == DType.from_numpy(e.dtype), f"output {k}: unity {g.dtype}, onnxruntime {e.dtype}"
        assert g.degrees == (1,) * g.rank and g.sum_degree == 1 and g.copy_degree == 1
    return imported


# ---------------------------------------------------------------------------
# The cases, by op family. Each id reads "<op>-<variant>".

F3 = In((2, 3, 4))
CASES: dict[str, Case] = {}


def _add(case_id: str, case: Case) -> None:
    assert case_id not in CASES
    CASES[case_id] = case


ONNX_UNARY = [fn for fn in Unary.onnx_ops if not UNARY[fn].boolean
              and fn not in ("Gelu", "Dropout")]   # (these two have cases of their own below)
for _op in ONNX_UNARY:   # at the opset that brought the op, if later than 17 (Mish: 18)
    _add(f"{_op}-3d", Case(_op, [F3], opset=max(17, onnx.defs.get_schema(_op).since_version)))
_add("Relu-scalar", Case("Relu", [In(())]))
_add("Relu-1d", Case("Relu", [In((5,))]))
_add("Exp-f64", Case("Exp", [In((3, 2), np.float64)]))
_add("Neg-int64", Case("Neg", [In((3, 2), np.int64)]))
_add("Gelu-default", Case("Gelu", [F3], opset=20))
_add("Gelu-tanh", Case("Gelu", [F3], {"approximate": "tanh"}, opset=20))
_add("Not-bool", Case("Not", [In((2, 3), np.bool_)]))
_add("Dropout-plain", Case("Dropout", [F3]))
_add("Dropout-ratio", Case("Dropout", [F3, np.array(0.25, np.float32)]))
_add("Dropout-ratio-training-false", Case("Dropout", [F3, np.array(0.5, np.float32), np.array(False)]))
_add("Dropout-opset10-attr", Case("Dropout", [F3], {"ratio": 0.3}, opset=10))

_add("Cast-f32-to-i64", Case("Cast", [F3], {"to": TensorProto.INT64}))
_add("Cast-i64-to-f32", Case("Cast", [In((4, 2), np.int64)], {"to": TensorProto.FLOAT}))
_add("Cast-f32-to-f16", Case("Cast", [F3], {"to": TensorProto.FLOAT16}))
_add("Cast-f32-to-bool", Case("Cast", [F3], {"to": TensorProto.BOOL}))
_add("Cast-bool-to-i32", Case("Cast", [In((3,), np.bool_)], {"to": TensorProto.INT32}))

BROADCASTS = {
    "same": ((2, 3, 4), (2, 3, 4)),
    "rank3-rank1": ((2, 3, 4), (4,)),
    "rank1-rank3": ((4,), (2, 3, 4)),
    "both-ways": ((2, 1, 4), (3, 1)),
    "scalar-left": ((), (2, 3)),
    "scalar-right": ((2, 3), ()),
    "ones": ((1,), (5,)),
    "rank4-rank2": ((2, 1, 3, 1), (3, 4)),
}
for _op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater",
            "LessOrEqual", "GreaterOrEqual"):
    for _v in ("same", "rank3-rank1", "both-ways") if _op not in ("Add", "Mul") else BROADCASTS:
        _a, _b = BROADCASTS[_v]
        _add(f"{_op}-{_v}", Case(_op, [In(_a), In(_b)]))
for _op in ("And", "Or"):
    _add(f"{_op}-both-ways", Case(_op, [In((2, 1, 4), np.bool_), In((3, 1), np.bool_)]))
_add("Mod-int", Case("Mod", [In((2, 3), np.int64, 0, 20), In((3,), np.int64, 1, 5)]))
_add("Mod-fmod-float", Case("Mod", [In((2, 3)), In((2, 1))], {"fmod": 1}))
_add("Pow-int-exponent", Case("Pow", [In((2, 3)), In((3,), np.int64, 0, 3)]))
_add("Add-int64", Case("Add", [In((2, 3), np.int64), In((1,), np.int64)]))
_add("Add-initializer", Case("Add", [In((2, 3)), np.ones((3,), np.float32)]))
_add("Equal-int64", Case("Equal", [In((2, 3), np.int64), In((3,), np.int64)]))
for _op in ("Sum", "Max", "Min"):
    _add(f"{_op}-3-inputs", Case(_op, [In((2, 3, 4)), In((3, 1)), In((4,))]))
_add("Sum-1-input", Case("Sum", [In((2, 3))]))
_add("Max-2-inputs-scalar", Case("Max", [In((2, 3)), In(())]))

_add("Where-3way", Case("Where", [In((2, 1, 4), np.bool_), In((3, 1)), In((4,))]))
_add("Where-same", Case("Where", [In((2, 3), np.bool_), In((2, 3)), In((2, 3))]))
_add("Where-int64", Case("Where", [In((3,), np.bool_), In((2, 3), np.int64), In((), np.int64)]))

MATMULS = {
    "2d": ((3, 4), (4, 5)),
    "1d-2d": ((4,), (4, 5)),
    "2d-1d": ((3, 4), (4,)),
    "1d-1d": ((4,), (4,)),
    "batched-2d": ((2, 3, 4), (4, 5)),
    "batched-both": ((2, 3, 4), (2, 4, 5)),
    "broadcast-batch": ((2, 1, 3, 4), (5, 4, 6)),
    "broadcast-batch-ones": ((1, 3, 4), (2, 4, 5)),
    "1d-batched": ((4,), (2, 4, 5)),
    "batched-1d": ((2, 3, 4), (4,)),
}
for _v, (_a, _b) in MATMULS.items():
    _add(f"MatMul-{_v}", Case("MatMul", [In(_a), In(_b)]))
_add("MatMul-weight-initializer", Case("MatMul", [In((2, 3, 4)), np.ones((4, 5), np.float32)]))

GEMMS = {
    "plain": ((3, 4), (4, 5), None, {}),
    "transA": ((4, 3), (4, 5), None, {"transA": 1}),
    "transB": ((3, 4), (5, 4), None, {"transB": 1}),
    "transA-transB": ((4, 3), (5, 4), None, {"transA": 1, "transB": 1}),
    "C-full": ((3, 4), (4, 5), (3, 5), {"alpha": 0.5, "beta": 2.0}),
    "C-row": ((3, 4), (4, 5), (5,), {}),
    "C-1xN": ((3, 4), (4, 5), (1, 5), {}),
    "C-Mx1": ((3, 4), (4, 5), (3, 1), {}),
    "C-scalar": ((3, 4), (4, 5), (), {}),
    "C-transB": ((3, 4), (5, 4), (5,), {"transB": 1}),
}
for _v, (_a, _b, _c, _attrs) in GEMMS.items():
    _ins = [In(_a), In(_b)] + ([] if _c is None else [In(_c)])
    _add(f"Gemm-{_v}", Case("Gemm", _ins, _attrs))
_add("Gemm-opset9-C-required", Case("Gemm", [In((3, 4)), In((5, 4)), In((5,))], {"transB": 1}, opset=9))

CONVS = {
    "2d": ((2, 4, 9, 9), (6, 4, 3, 3), False, {}),
    "2d-bias": ((2, 4, 9, 9), (6, 4, 3, 3), True, {}),
    "2d-stride-pad": ((2, 4, 9, 9), (6, 4, 3, 3), True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "2d-asym-pads": ((1, 3, 8, 7), (5, 3, 3, 2), False, {"pads": [0, 1, 2, 0], "strides": [2, 3]}),
    "2d-dilation": ((1, 3, 10, 10), (4, 3, 3, 3), False, {"dilations": [2, 3]}),
    "2d-groups": ((2, 4, 7, 7), (6, 2, 3, 3), True, {"group": 2}),
    "2d-depthwise": ((2, 4, 7, 7), (4, 1, 3, 3), False, {"group": 4, "pads": [1, 1, 1, 1]}),
    "2d-depthwise-multiplier": ((2, 4, 7, 7), (8, 1, 3, 3), False, {"group": 4}),
    "2d-same-upper": ((1, 3, 9, 8), (4, 3, 3, 3), False, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "2d-same-lower": ((1, 3, 9, 8), (4, 3, 4, 3), False, {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "2d-valid": ((1, 3, 9, 8), (4, 3, 3, 2), False, {"auto_pad": "VALID", "strides": [2, 2]}),
    "2d-kernel-shape-attr": ((1, 3, 6, 6), (4, 3, 2, 2), False, {"kernel_shape": [2, 2]}),
    "2d-1x1": ((2, 8, 5, 5), (3, 8, 1, 1), True, {}),
    "1d": ((2, 3, 10), (5, 3, 3), False, {}),
    "1d-stride-pad-dilation": ((2, 3, 11), (5, 3, 3), True, {"strides": [2], "pads": [2, 1], "dilations": [2]}),
    "3d": ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), False, {"strides": [1, 2, 1]}),
    "3d-pads": ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), True, {"pads": [1, 0, 1, 0, 2, 1]}),
}
for _v, (_x, _w, _bias, _attrs) in CONVS.items():
    _ins = [In(_x), In(_w)] + ([In((_w[0],))] if _bias else [])
    _add(f"Conv-{_v}", Case("Conv", _ins, _attrs))
_add("Conv-weight-initializer", Case("Conv", [In((2, 3, 6, 6)), np.ones((4, 3, 3, 3), np.float32)], {}))

POOLS = {
    "k2": ((2, 3, 8, 8), {"kernel_shape": [2, 2]}),
    "k3-s2": ((2, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "k3-s2-pad": ((2, 3, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asym-pads": ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 2, 0]}),
    "ceil": ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "ceil-pad": ((1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    "ceil-last-window-in-pad": ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [0, 0, 1, 1],
                                                "ceil_mode": 1}),
    "ceil-exact": ((1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "same-upper": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same-lower": ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "valid": ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    "1d": ((2, 3, 10), {"kernel_shape": [3], "strides": [2]}),
}
for _op in ("MaxPool", "AveragePool"):
    for _v, (_x, _attrs) in POOLS.items():
        _add(f"{_op}-{_v}", Case(_op, [In(_x)], dict(_attrs)))
_add("MaxPool-dilation", Case("MaxPool", [In((1, 2, 9, 9))], {"kernel_shape": [2, 2], "dilations": [2, 2]}))
_add("MaxPool-dilation-ceil", Case("MaxPool", [In((1, 2, 10, 10))],
                                   {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [2, 2], "ceil_mode": 1}))
_add("AveragePool-count-include-pad", Case("AveragePool", [In((1, 2, 7, 7))],
                                           {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}))
_add("AveragePool-count-include-pad-ceil", Case("AveragePool", [In((1, 2, 8, 8))],
                                                {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                                 "count_include_pad": 1, "ceil_mode": 1}))
_add("MaxPool-opset9", Case("MaxPool", [In((1, 2, 8, 8))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                             "pads": [0, 0, 1, 1]}, opset=9))
for _op in ("GlobalAveragePool", "GlobalMaxPool"):
    _add(f"{_op}-2d", Case(_op, [In((2, 3, 5, 4))]))
    _add(f"{_op}-1d", Case(_op, [In((2, 3, 7))]))

_add("BatchNormalization-4d", Case("BatchNormalization", [In((2, 3, 4, 4))] + [In((3,))] * 4, opset=15))
_add("BatchNormalization-2d", Case("BatchNormalization", [In((5, 3))] + [In((3,))] * 4, {"epsilon": 1e-3}, opset=15))
_add("BatchNormalization-opset9", Case("BatchNormalization", [In((2, 3, 4, 4))] + [In((3,))] * 4, opset=9))
_add("LayerNormalization-last", Case("LayerNormalization", [F3, In((4,)), In((4,))]))
_add("LayerNormalization-axis1", Case("LayerNormalization", [F3, In((3, 4)), In((3, 4))], {"axis": 1}))
_add("LayerNormalization-neg-axis-no-bias", Case("LayerNormalization", [F3, In((3, 4))], {"axis": -2}))
_add("LayerNormalization-scale-initializer", Case("LayerNormalization", [F3, np.ones((4,), np.float32)],
                                                  {"epsilon": 1e-6}))
for _op in ("Softmax", "LogSoftmax"):
    _add(f"{_op}-default", Case(_op, [F3]))
    _add(f"{_op}-axis0", Case(_op, [F3], {"axis": 0}))
    _add(f"{_op}-axis1", Case(_op, [F3], {"axis": 1}))
    _add(f"{_op}-axis-neg2", Case(_op, [F3], {"axis": -2}))
    _add(f"{_op}-opset11-last", Case(_op, [In((3, 5))], opset=11))
_add("LRN-size3", Case("LRN", [In((2, 5, 4, 4))], {"size": 3}))
_add("LRN-size5-params", Case("LRN", [In((1, 4, 3, 3))], {"size": 5, "alpha": 1e-3, "beta": 0.5, "bias": 2.0}))

RESHAPES = {
    "zero-minus1": ((2, 3, 4), _i64(0, -1)),
    "flat": ((2, 3, 4), _i64(-1)),
    "zero-middle": ((2, 3, 4), _i64(2, 0, 2, -1)),
    "explicit": ((2, 3, 4), _i64(4, 6)),
    "add-ones": ((2, 3, 4), _i64(1, 24, 1)),
    "from-scalar": ((), _i64(1, 1)),
    "to-scalar": ((1, 1), np.array([], dtype=np.int64)),
}
for _v, (_x, _shape) in RESHAPES.items():
    _add(f"Reshape-{_v}", Case("Reshape", [In(_x), _shape]))
_add("Reshape-allowzero-no-zeros", Case("Reshape", [In((2, 3, 4)), _i64(3, -1, 2)], {"allowzero": 1}, opset=14))
_add("Reshape-allowzero0-copies-dim", Case("Reshape", [In((2, 3, 4)), _i64(0, 0, 2, 2)], {"allowzero": 0}, opset=14))
_add("Reshape-constant-node", Case("Reshape", [In((2, 3, 4)), Const(_i64(6, -1))]))

for _axis in (0, 1, 2, 3, -1, -3):
    _add(f"Flatten-axis{_axis}", Case("Flatten", [In((2, 3, 4))], {"axis": _axis}))
_add("Flatten-default", Case("Flatten", [In((2, 3, 4, 5))]))
_add("Flatten-opset9", Case("Flatten", [In((2, 3, 4))], {"axis": 2}, opset=9))

_add("Squeeze-opset13-input", Case("Squeeze", [In((2, 1, 3, 1)), _i64(1)], opset=13))
_add("Squeeze-opset13-neg", Case("Squeeze", [In((2, 1, 3, 1)), _i64(-1, 1)], opset=13))
_add("Squeeze-opset13-all", Case("Squeeze", [In((1, 2, 1, 3, 1))], opset=13))
_add("Squeeze-opset13-constant-node", Case("Squeeze", [In((2, 1, 3)), Const(_i64(1))], opset=13))
_add("Squeeze-opset11-attr", Case("Squeeze", [In((2, 1, 3, 1))], {"axes": [3]}, opset=11))
_add("Squeeze-opset11-all", Case("Squeeze", [In((1, 2, 1))], opset=11))
_add("Squeeze-to-scalar", Case("Squeeze", [In((1, 1)), _i64(0, 1)], opset=13))
_add("Unsqueeze-opset13-input", Case("Unsqueeze", [In((2, 3)), _i64(0, -1)], opset=13))
_add("Unsqueeze-opset13-unsorted", Case("Unsqueeze", [In((2, 3)), _i64(3, 0)], opset=13))
_add("Unsqueeze-opset13-middle", Case("Unsqueeze", [In((2, 3)), _i64(1, 2)], opset=13))
_add("Unsqueeze-opset11-attr", Case("Unsqueeze", [In((2, 3))], {"axes": [1, 3]}, opset=11))
_add("Unsqueeze-opset11-neg", Case("Unsqueeze", [In((2, 3))], {"axes": [-1]}, opset=11))
_add("Unsqueeze-scalar", Case("Unsqueeze", [In(()), _i64(0)], opset=13))

_add("Split-sizes-input", Case("Split", [In((2, 5, 4)), _i64(2, 3)], {"axis": 1}, opset=13, n_outputs=2))
_add("Split-sizes-input-neg-axis", Case("Split", [In((2, 5, 4)), _i64(1, 1, 2)], {"axis": -1}, opset=13,
                                        n_outputs=3))
_add("Split-sizes-attr", Case("Split", [In((6, 3))], {"axis": 0, "split": [1, 2, 3]}, opset=11, n_outputs=3))
_add("Split-even-default", Case("Split", [In((6, 3))], opset=13, n_outputs=3))
_add("Split-even-axis1", Case("Split", [In((2, 4, 3))], {"axis": 1}, opset=11, n_outputs=2))
_add("Split-num-outputs", Case("Split", [In((2, 6))], {"axis": 1, "num_outputs": 3}, opset=18, n_outputs=3))
_add("Split-num-outputs-uneven", Case("Split", [In((7, 2))], {"axis": 0, "num_outputs": 3}, opset=18, n_outputs=3))
_add("Split-num-outputs-uneven4", Case("Split", [In((2, 7))], {"axis": -1, "num_outputs": 4}, opset=18,
                                       n_outputs=4))
_add("Split-sizes-input-opset18", Case("Split", [In((2, 5)), _i64(4, 1)], {"axis": 1}, opset=18, n_outputs=2))

SLICES = {
    "basic": ((6, 5), [_i64(1), _i64(4)], None),
    "axes": ((6, 5, 4), [_i64(1, 0), _i64(3, 2), _i64(2, 1)], None),
    "neg-start": ((6, 5), [_i64(-3), _i64(BIG), _i64(0)], None),
    "neg-end": ((6, 5), [_i64(0), _i64(-1), _i64(1)], None),
    "out-of-range": ((6, 5), [_i64(-100, 2), _i64(100, 1000)], None),
    "step2": ((7, 5), [_i64(1), _i64(7), _i64(0), _i64(2)], None),
    "step3-neg-axis": ((4, 8), [_i64(0), _i64(8), _i64(-1), _i64(3)], None),
    "reverse": ((6, 5), [_i64(-1), _i64(-BIG), _i64(1), _i64(-1)], None),
    "reverse-step2": ((7, 5), [_i64(5), _i64(0), _i64(0), _i64(-2)], None),
    "reverse-out-of-range": ((6, 5), [_i64(100), _i64(-100), _i64(0), _i64(-3)], None),
    "empty": ((6, 5), [_i64(4), _i64(2), _i64(0)], None),
    "multi-steps": ((6, 5, 4), [_i64(0, 4, -1), _i64(6, 0, -5), _i64(0, 1, 2), _i64(2, -1, -2)], None),
}
for _v, (_x, _operands, _) in SLICES.items():
    _add(f"Slice-{_v}", Case("Slice", [In(_x)] + _operands, opset=13))
_add("Slice-constant-nodes", Case("Slice", [In((6, 5)), Const(_i64(1)), Const(_i64(-1)), Const(_i64(1))]))
_add("Slice-skipped-axes", Case("Slice", [In((6, 5)), _i64(1), _i64(3), "", _i64(2)], opset=13))
_add("Slice-opset9-attr", Case("Slice", [In((6, 5))], {"starts": [1, -2], "ends": [100, 5], "axes": [0, 1]}, opset=9))
_add("Slice-opset9-default-axes", Case("Slice", [In((6, 5))], {"starts": [2], "ends": [-1]}, opset=9))

_add("Gather-axis0", Case("Gather", [In((5, 4)), In((2, 3), np.int64, 0, 5)]))
_add("Gather-axis1", Case("Gather", [In((2, 5, 4)), In((3,), np.int64, 0, 5)], {"axis": 1}))
_add("Gather-axis-neg", Case("Gather", [In((2, 5, 4)), In((2, 2), np.int64, -4, 4)], {"axis": -1}))
_add("Gather-scalar-index-axis0", Case("Gather", [In((5, 4)), In((), np.int64, 0, 5)]))
_add("Gather-scalar-index-axis1", Case("Gather", [In((2, 5, 4)), In((), np.int64, 0, 5)], {"axis": 1}))
_add("Gather-int32-indices", Case("Gather", [In((5, 4)), In((3,), np.int32, 0, 5)]))
_add("Gather-constant-indices", Case("Gather", [In((5, 4)), _i64(4, 0, -1)], {"axis": 0}))
_add("Gather-int64-data", Case("Gather", [In((5, 4), np.int64), In((2,), np.int64, 0, 4)], {"axis": 1}))

_add("GatherND-full-index", Case("GatherND", [In((2, 3, 4)), In((5, 3), np.int64, 0, 2)]))
_add("GatherND-partial-index", Case("GatherND", [In((2, 3, 4)), In((2, 2), np.int64, 0, 2)]))
_add("GatherND-batch-dims1", Case("GatherND", [In((2, 3, 4)), In((2, 1), np.int64, 0, 3)], {"batch_dims": 1}))
_add("GatherND-batch-dims1-deep", Case("GatherND", [In((2, 3, 4)), In((2, 5, 2), np.int64, 0, 3)],
                                       {"batch_dims": 1}))
_add("GatherND-batch-dims2", Case("GatherND", [In((2, 3, 4, 5)), In((2, 3, 1), np.int64, 0, 4)],
                                  {"batch_dims": 2}))

for _op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
    attr_opset = 11 if _op == "ReduceSum" else 13     # ReduceSum took axes as an input from opset 13
    _add(f"{_op}-attr-keepdims", Case(_op, [In((2, 3, 4))], {"axes": [1]}, opset=attr_opset))
    _add(f"{_op}-attr-no-keepdims", Case(_op, [In((2, 3, 4))], {"axes": [0, -1], "keepdims": 0}, opset=attr_opset))
    _add(f"{_op}-attr-all", Case(_op, [In((2, 3, 4))], {"keepdims": 0}, opset=attr_opset))
    _add(f"{_op}-attr-all-keepdims", Case(_op, [In((2, 3, 4))], opset=attr_opset))
    _add(f"{_op}-input-keepdims", Case(_op, [In((2, 3, 4)), _i64(-2)], opset=18))
    _add(f"{_op}-input-no-keepdims", Case(_op, [In((2, 3, 4)), _i64(2, 0)], {"keepdims": 0}, opset=18))
    _add(f"{_op}-input-none", Case(_op, [In((2, 3, 4))], {"keepdims": 0}, opset=18))
    _add(f"{_op}-input-noop-empty", Case(_op, [In((2, 3, 4))], {"noop_with_empty_axes": 1}, opset=18))
_add("ReduceSum-opset13-input", Case("ReduceSum", [In((2, 3, 4)), _i64(1)], {"keepdims": 0}, opset=13))
_add("ReduceSum-opset13-constant-node", Case("ReduceSum", [In((2, 3, 4)), Const(_i64(0, 2))], opset=13))
_add("ReduceSum-opset13-noop-empty-input", Case("ReduceSum", [In((2, 3)), np.array([], np.int64)],
                                                {"noop_with_empty_axes": 1}, opset=13))
_add("ReduceMean-opset18-empty-axes-input", Case("ReduceMean", [In((2, 3)), np.array([], np.int64)],
                                                 {"keepdims": 0}, opset=18))

_add("Expand-bigger-rank", Case("Expand", [In((3, 1)), _i64(2, 1, 4)]))
_add("Expand-smaller-rank", Case("Expand", [In((2, 3, 1)), _i64(4)]))
_add("Expand-ones", Case("Expand", [In((3, 4)), _i64(1, 1)]))
_add("Expand-same", Case("Expand", [In((1, 4)), _i64(3, 4)]))
_add("Expand-scalar", Case("Expand", [In(()), _i64(2, 3)]))
_add("Expand-constant-node", Case("Expand", [In((3, 1)), Const(_i64(3, 5))]))

_add("Concat-axis1-3-inputs", Case("Concat", [In((2, 1, 4)), In((2, 3, 4)), In((2, 2, 4))], {"axis": 1}))
_add("Concat-axis0", Case("Concat", [In((2, 3)), In((4, 3))], {"axis": 0}))
_add("Concat-axis-neg", Case("Concat", [In((2, 3)), In((2, 1))], {"axis": -1}))
_add("Concat-1-input", Case("Concat", [In((2, 3))], {"axis": 0}))
_add("Concat-int64", Case("Concat", [In((2,), np.int64), In((3,), np.int64)], {"axis": 0}))

_add("Transpose-default", Case("Transpose", [In((2, 3, 4))]))
_add("Transpose-perm", Case("Transpose", [In((2, 3, 4))], {"perm": [1, 2, 0]}))
_add("Transpose-perm-4d", Case("Transpose", [In((2, 3, 4, 5))], {"perm": [0, 2, 1, 3]}))
_add("Transpose-1d", Case("Transpose", [In((5,))]))

# Ops that exporters emit in attention, MoE routers and windowed vision models.
_add("IsNaN-3d", Case("IsNaN", [F3]))
_add("IsInf-positive-only", Case("IsInf", [F3], {"detect_negative": 0}))
_add("Pad-constant-input", Case("Pad", [In((2, 3, 4)), _i64(0, 1, 0, 0, 2, 3)]))
_add("Pad-reflect-axes", Case("Pad", [In((2, 5, 6)), _i64(1, 2, 2, 1), "", _i64(-2, -1)], {"mode": "reflect"},
                             opset=18))
_add("Pad-edge-crop", Case("Pad", [In((2, 5, 6)), _i64(0, -1, 2, 0, 1, 0)], {"mode": "edge"}))
_add("Pad-opset2-attr", Case("Pad", [In((3, 4))], {"pads": [1, 0, 0, 2], "value": 1.5}, opset=2))
_add("Tile-2d", Case("Tile", [In((2, 3)), _i64(3, 2)]))
_add("Tile-int64", Case("Tile", [In((2, 1, 3), np.int64), _i64(1, 4, 1)]))
_add("Trilu-upper-k", Case("Trilu", [In((2, 4, 5)), np.array(1, np.int64)], opset=14))
_add("Trilu-lower", Case("Trilu", [In((3, 6))], {"upper": 0}, opset=14))
_add("CumSum-exclusive-reverse", Case("CumSum", [In((2, 5)), np.array(1, np.int64)], {"exclusive": 1, "reverse": 1}))
_add("CumSum-int32-axis0", Case("CumSum", [In((4, 3), np.int32, 0, 9), np.array([0], np.int64)]))
_add("TopK-largest", Case("TopK", [In((3, 8)), _i64(3)], n_outputs=2))
_add("TopK-smallest-axis0", Case("TopK", [In((6, 4)), _i64(2)], {"axis": 0, "largest": 0}, n_outputs=2))
_add("TopK-opset1-attr", Case("TopK", [In((2, 7))], {"k": 2}, opset=1, n_outputs=2))
_add("OneHot-default-axis", Case("OneHot", [In((2, 3), np.int64, 0, 5), np.array(5, np.int64),
                                            np.array([0.0, 1.0], np.float32)]))
_add("OneHot-axis0", Case("OneHot", [In((4,), np.int64, -3, 3), np.array([3], np.int64),
                                     np.array([2, 7], np.int64)], {"axis": 0}))
_add("GatherElements-axis1", Case("GatherElements", [In((3, 4)), In((3, 2), np.int64, 0, 4)], {"axis": 1}))
_add("ScatterElements-add", Case("ScatterElements", [In((4, 3)), In((2, 3), np.int64, 0, 4), In((2, 3))],
                                 {"axis": 0, "reduction": "add"}, opset=18))
_add("Einsum-batch-matmul", Case("Einsum", [In((2, 3, 4)), In((2, 4, 5))], {"equation": "bij,bjk->bik"}))
_add("Einsum-implicit", Case("Einsum", [In((3, 4)), In((4, 5))], {"equation": "ij,jk"}))
_add("Einsum-ellipsis-sum", Case("Einsum", [In((2, 3, 4))], {"equation": "...ij->...i"}))
_add("Hardmax-opset13", Case("Hardmax", [In((2, 3, 4))], {"axis": 1}, opset=13))
_add("Hardmax-opset11-flatten", Case("Hardmax", [In((2, 3, 4))], {"axis": 1}, opset=11))
_add("Softmax-opset11-inner-axis", Case("Softmax", [In((2, 3, 4))], {"axis": 0}, opset=11))
_add("LogSoftmax-opset9-axis1", Case("LogSoftmax", [In((2, 5, 1, 1))], opset=9))


# ---------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", list(CASES))
def test_shape_matches_onnxruntime(case_id, tmp_path):
    case = CASES[case_id]
    model, feeds = _build(case)
    imported = _check_against_ort(model, feeds, tmp_path)
    # The op under test reaches the PCG as one node (its constant operands are folded
    # into attributes); Identity is an alias and leaves no node.
    ops = [n for _, n in imported.pcg if not n.spec.is_source]
    assert len(ops) == (0 if case.op == "Identity" else 1), [n.kind for n in ops]
    if ops:
        assert ops[0].name == "the_node"
        assert case.op in ops[0].spec.onnx_ops


def test_every_imported_onnx_op_has_a_case():
    covered = {c.op for c in CASES.values()}
    imported = {op for spec in all_specs().values() for op in spec.onnx_ops}
    missing = sorted(imported - covered)
    assert not missing, f"no shape test for {missing}"


REJECTED = {
    "Flatten-axis-out-of-range": (Case("Flatten", [In((2, 3, 4))], {"axis": -4}), "axis -4"),
    "TopK-runtime-k": (Case("TopK", [In((2, 5)), In((1,), np.int64, 1, 3)], n_outputs=2), "computed at run time"),
    "Reshape-two-minus1": (Case("Reshape", [In((2, 3, 4)), _i64(-1, -1)]), "more than one -1"),
    "Reshape-runtime-shape": (Case("Reshape", [In((2, 3, 4)), In((2,), np.int64)]), "computed at run time"),
}


@pytest.mark.parametrize("case_id", list(REJECTED))
def test_bad_nodes_are_refused_with_their_name(case_id, tmp_path):
    case, why = REJECTED[case_id]
    model, _ = _build(case)
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelError, match=f"the_node.*{case.op}.*{why}"):
        import_model(path)


# ---------------------------------------------------------------------------
# Constant folding of shape subgraphs.


def _shape_subgraph_model(batch: int | str) -> onnx.ModelProto:
    """y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) followed by a MatMul,
    the way exporters flatten ``x.view(x.size(0), -1)``."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"], name="flatten"),
        helper.make_node("Shape", ["flat"], ["s2"], start=1),
        helper.make_node("Cast", ["s2"], ["s2f"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["flat", "w"], ["h"], name="fc"),
        helper.make_node("Add", ["h", "s2f"], ["y"], name="add_const"),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(_i64(0), "axes0"),
             numpy_helper.from_array(_i64(-1), "minus1"),
             numpy_helper.from_array(np.random.default_rng(1).standard_normal((12, 5)).astype(np.float32), "w")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, "fold", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 10)
    return model


@pytest.mark.parametrize("batch", [2, "N"], ids=["static-batch", "symbolic-batch"])
def test_shape_subgraph_is_folded(batch, tmp_path):
    model = _shape_subgraph_model(batch)
    path = tmp_path / "fold.onnx"
    onnx.save(model, path)
    options = ImportOptions(batch_size=3) if batch == "N" else ImportOptions()
    n = 3 if batch == "N" else 2
    imported = import_model(path, options)
    pcg = imported.pcg
    validate(pcg)
    kinds = [n_.kind for _, n_ in pcg if not n_.spec.is_source]
    assert kinds == ["Reshape", "MatMul", "Binary"]
    assert imported.folded >= 6
    reshape = pcg.nodes[pcg.find("flatten")]
    assert reshape.op.dims == (n, 12)
    # The folded Shape(flat)[1:] = [12] is a constant operand of the Add.
    assert any(np.array_equal(v, np.array([12.0], np.float32)) for v in imported.constants.values())
    x = np.random.default_rng(0).standard_normal((n, 3, 4)).astype(np.float32)
    (y,) = _run_ort(model, {"x": x})
    assert pcg.shape(pcg.outputs[0]).sizes == y.shape == (n, 5)
    assert pcg.shape(pcg.outputs[0]).dtype == DType.FLOAT32
