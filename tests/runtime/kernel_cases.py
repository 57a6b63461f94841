"""One-node ONNX models covering every kernel and its attributes, shared by the forward
(onnxruntime) and backward (finite difference) tests of ``unity_cli.kernels``.

Import as ``from runtime.kernel_cases import ...`` (``tests/`` is on ``sys.path``).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from unity_cli.ir.ops.elementwise import ScaleAttrs, Unary, UnaryAttrs
from unity_cli.ir.ops.unary import UNARY
from unity_cli.onnx_import import ImportedModel, ImportOptions, import_model_proto


@dataclass(frozen=True)
class Const:
    """An input given as an initializer (a shape, axes, bounds: read at import)."""

    value: np.ndarray


@dataclass
class Case:
    """One ONNX node (``op``, with ``inputs`` in node order, None for an omitted one), or
    for ops ONNX lacks, attrs ``direct``. The oracle is onnxruntime, or the numpy
    reference ``ref`` where onnxruntime has no kernel."""

    id: str
    op: str
    inputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 18
    outputs: int = 1
    grad: bool = True
    direct: Any = None
    ref: Any = None

    def model(self) -> onnx.ModelProto:
        names, graph_inputs, inits = [], [], []
        for k, v in enumerate(self.inputs):
            if v is None:
                names.append("")
                continue
            name = f"in{k}"
            names.append(name)
            if isinstance(v, Const):
                inits.append(numpy_helper.from_array(v.value, name))
            else:
                graph_inputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
        outs = [f"out{k}" for k in range(self.outputs)]
        node = helper.make_node(self.op, names, outs, **self.attrs)
        graph = helper.make_graph([node], self.id, graph_inputs,
                                  [helper.make_empty_tensor_value_info(o) for o in outs], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])

    def feeds(self) -> dict[str, np.ndarray]:
        return {f"in{k}": v for k, v in enumerate(self.inputs) if v is not None and not isinstance(v, Const)}

    def expected(self) -> list[np.ndarray]:
        """The oracle's outputs."""
        if self.ref is not None:
            return [self.ref(*self.inputs)]
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(self.model().SerializeToString(), so, providers=["CPUExecutionProvider"])
        return sess.run(None, self.feeds())

    def node(self) -> tuple[Any, list[np.ndarray]]:
        """The attrs of the one compute node the case imports to, and its input arrays."""
        if self.direct is not None:
            return self.direct, list(self.inputs)
        feeds = self.feeds()
        imported: ImportedModel = import_model_proto(
            self.model(), ImportOptions(input_shapes={n: v.shape for n, v in feeds.items()}))
        consts = {f"in{k}": v.value for k, v in enumerate(self.inputs) if isinstance(v, Const)}
        values = {**consts, **imported.constants, **feeds}
        computes = [n for _, n in imported.pcg if not n.spec.is_source]
        assert len(computes) == 1, f"{self.id} imports to {[n.kind for n in computes]}"
        n = computes[0]
        return n.op, [values[imported.pcg.nodes[r.node].name] for r in n.inputs]


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


_R = _rng("kernel cases")


def f(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return _R.uniform(lo, hi, shape).astype(np.float32)


def pos(*shape: int) -> np.ndarray:
    return f(*shape, lo=0.3, hi=2.0)


def away(*shape: int) -> np.ndarray:
    """Floats at least 0.1 from zero (and from the kinks of Relu, Abs, Sign)."""
    return (f(*shape, lo=0.1, hi=2.0) * np.where(_R.random(shape) < 0.5, -1, 1)).astype(np.float32)


def ints(*shape: int, lo: int = -5, hi: int = 6, dtype: Any = np.int64) -> np.ndarray:
    return _R.integers(lo, hi, shape).astype(dtype)


def i64(*values: int) -> Const:
    return Const(np.array(values, dtype=np.int64))


def bools(*shape: int) -> np.ndarray:
    return _R.random(shape) < 0.5


def _lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN straight from the ONNX spec (onnx's reference evaluator loops over the batch
    instead of the channels)."""
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = np.zeros_like(x)
    for c in range(x.shape[1]):
        sq[:, c] = (x[:, max(0, c - lo):c + hi + 1] ** 2).sum(axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(x.dtype)


UNARY_INPUTS = {"positive": pos, "away": away, "any": f}
UNARY_OPSET = {"Gelu": 20}
ONNX_UNARY = [fn for fn in Unary.onnx_ops if not UNARY[fn].boolean
              and fn != "Identity"]   # (Identity imports as an alias: it has a direct case)
"""Every unary function that is an ONNX op of its own, from the registry."""


def _cases() -> list[Case]:
    c: list[Case] = []
    for fn in ONNX_UNARY:
        c.append(Case(f"unary_{fn}", fn, [UNARY_INPUTS[UNARY[fn].domain](3, 4)], opset=UNARY_OPSET.get(fn, 18)))
    c.append(Case("unary_Sigmoid_wide", "Sigmoid", [f(4, 5, lo=-40, hi=40)]))
    c.append(Case("unary_Softplus_wide", "Softplus", [f(4, 5, lo=-40, hi=40)]))
    c.append(Case("unary_Gelu_wide", "Gelu", [f(4, 5, lo=-8, hi=8)], opset=20))
    c.append(Case("unary_Gelu_tanh", "Gelu", [f(4, 5, lo=-8, hi=8)], attrs={"approximate": "tanh"}, opset=20))
    c.append(Case("unary_Not", "Not", [bools(3, 4)]))
    c.append(Case("unary_Identity", "Identity", [f(3, 4)], direct=UnaryAttrs("Identity"), ref=lambda x: x))
    c.append(Case("scale", "Scale", [f(3, 4)], direct=ScaleAttrs(3), ref=lambda x: 3 * x))

    c += [
        Case("add_bcast", "Add", [f(2, 3, 4), f(4)]),
        Case("add_int32", "Add", [ints(3, 4, dtype=np.int32), ints(3, 1, dtype=np.int32)]),
        Case("sub_bcast", "Sub", [f(3, 1), f(2, 1, 4)]),
        Case("mul_bcast", "Mul", [f(3, 1), f(1, 4)]),
        Case("mul_scalar", "Mul", [f(2, 3), f()]),
        Case("div_bcast", "Div", [f(2, 3), pos(3)]),
        Case("div_int_truncates", "Div", [ints(4, 5, lo=-20, hi=21), np.array([3, -3, 4, -7, 1], np.int64)]),
        Case("pow", "Pow", [pos(3, 4), f(4, lo=0.5, hi=2.0)]),
        Case("pow_int_exponent", "Pow", [pos(3, 4), np.array([0, 1, 2, 3], np.int64)]),
        Case("max3_bcast", "Max", [f(3, 4), f(4), f(3, 1)]),
        Case("min2", "Min", [f(2, 3), f(2, 3)]),
        Case("max1", "Max", [f(2, 3)]),
        Case("sum3_bcast", "Sum", [f(3, 4), f(1, 4), f(3, 1)]),
        Case("sum1", "Sum", [f(2, 3)]),
        Case("equal", "Equal", [ints(3, 4, lo=0, hi=3), ints(4, lo=0, hi=3)]),
        Case("less", "Less", [f(3, 4), f(3, 1)]),
        Case("greater", "Greater", [ints(3, 4, lo=0, hi=3), ints(3, 4, lo=0, hi=3)]),
        Case("less_equal", "LessOrEqual", [ints(3, 4, lo=0, hi=3), ints(1, 4, lo=0, hi=3)]),
        Case("greater_equal", "GreaterOrEqual", [ints(3, 4, lo=0, hi=3), ints(3, 4, lo=0, hi=3)]),
        Case("and", "And", [bools(3, 4), bools(4)]),
        Case("or", "Or", [bools(3, 4), bools(3, 1)]),
        Case("mod_int", "Mod", [ints(3, 4, lo=-20, hi=21), np.array([3, -3, 4, -7], np.int64)]),
        Case("mod_float_fmod", "Mod", [f(3, 4, lo=-9, hi=9), away(4)], attrs={"fmod": 1}, grad=False),
        Case("mod_int_fmod", "Mod", [ints(3, 4, lo=-20, hi=21), np.array([3, -3, 4, -7], np.int64)],
             attrs={"fmod": 1}),
        Case("cast_float_to_int", "Cast", [f(3, 4, lo=-9, hi=9)], attrs={"to": onnx.TensorProto.INT64}),
        Case("cast_float_to_double", "Cast", [f(3, 4)], attrs={"to": onnx.TensorProto.DOUBLE}),
        Case("cast_int_to_float", "Cast", [ints(3, 4)], attrs={"to": onnx.TensorProto.FLOAT}),
        Case("cast_bool_to_float", "Cast", [bools(3, 4)], attrs={"to": onnx.TensorProto.FLOAT}),
        Case("cast_float_to_half", "Cast", [f(3, 4)], attrs={"to": onnx.TensorProto.FLOAT16}, grad=False),
        Case("where_bcast", "Where", [bools(3, 1), f(3, 4), f(4)]),
    ]

    c += [
        Case("transpose", "Transpose", [f(2, 3, 4)], attrs={"perm": [2, 0, 1]}),
        Case("transpose_default", "Transpose", [f(2, 3, 4)]),
        Case("reshape_zero_minus_one", "Reshape", [f(2, 3, 4), i64(0, -1)]),
        Case("reshape", "Reshape", [f(2, 3, 4), i64(4, 3, 2)]),
        Case("flatten", "Flatten", [f(2, 3, 4, 5)], attrs={"axis": 2}),
        Case("flatten_axis0", "Flatten", [f(2, 3, 4)], attrs={"axis": 0}),
        Case("squeeze", "Squeeze", [f(1, 3, 1, 4), i64(0, -2)]),
        Case("unsqueeze", "Unsqueeze", [f(3, 4), i64(0, 3)]),
        Case("concat_last", "Concat", [f(2, 3), f(2, 1), f(2, 4)], attrs={"axis": -1}),
        Case("concat_first", "Concat", [f(1, 3), f(2, 3)], attrs={"axis": 0}),
        Case("split_sizes", "Split", [f(2, 6), i64(1, 2, 3)], attrs={"axis": 1}, outputs=3),
        Case("split_num_outputs", "Split", [f(7, 2)], attrs={"num_outputs": 3}, outputs=3),
        Case("slice_neg_step", "Slice", [f(5, 6, 4), i64(1, -1), i64(4, -100), i64(0, 1), i64(1, -2)]),
        Case("slice_step_big_end", "Slice", [f(5, 6, 4), i64(0), i64(1000), i64(-1), i64(2)]),
        Case("slice_reverse_all", "Slice", [f(4, 3), i64(-1), i64(-1000), i64(0), i64(-1)]),
        Case("expand", "Expand", [f(3, 1), i64(2, 3, 4)]),
        Case("expand_bidirectional", "Expand", [f(1, 4), i64(3, 1)]),
    ]

    c += [
        Case("gather_axis0_neg", "Gather", [f(5, 4), np.array([[0, -1, 2], [4, -5, 0]], np.int64)]),
        Case("gather_axis1", "Gather", [f(3, 5, 2), np.array([4, 0, 4, 1], np.int64)], attrs={"axis": 1}),
        Case("gather_scalar_last", "Gather", [f(3, 5), np.array(-2, np.int64)], attrs={"axis": -1}),
        Case("gather_int32_idx", "Gather", [f(6, 3), np.array([[5, 5], [0, 1]], np.int32)]),
        Case("gathernd", "GatherND", [f(3, 4, 2), np.array([[0, 1], [2, -1], [0, 1]], np.int64)]),
        Case("gathernd_slices", "GatherND", [f(3, 4, 2), np.array([[[1]], [[-3]]], np.int64)]),
        Case("gathernd_batch", "GatherND", [f(2, 3, 4), np.array([[1], [2]], np.int64)], attrs={"batch_dims": 1}),
        Case("reduce_sum_keep0", "ReduceSum", [f(2, 3, 4), i64(1)], attrs={"keepdims": 0}, opset=13),
        Case("reduce_mean_axes", "ReduceMean", [f(2, 3, 4), i64(0, 2)]),
        Case("reduce_mean_attr_axes", "ReduceMean", [f(2, 3, 4)], attrs={"axes": [-1]}, opset=13),
        Case("reduce_max_all", "ReduceMax", [f(2, 3, 4)], attrs={"keepdims": 0}),
        Case("reduce_min_last", "ReduceMin", [f(2, 3, 4), i64(-1)]),
        Case("reduce_max_mid", "ReduceMax", [f(2, 3, 4), i64(1)]),
        Case("reduce_sum_noop", "ReduceSum", [f(2, 3)], attrs={"noop_with_empty_axes": 1}),
        Case("reduce_max_int", "ReduceMax", [ints(2, 3, 4), i64(1)]),
        Case("softmax_axis1", "Softmax", [f(2, 3, 4)], attrs={"axis": 1}, opset=13),
        Case("softmax_default", "Softmax", [f(2, 3, 4, lo=-20, hi=20)]),
        Case("logsoftmax_axis0", "LogSoftmax", [f(2, 3, 4)], attrs={"axis": 0}),
        Case("layernorm_last", "LayerNormalization", [f(2, 3, 4), pos(4), f(4)], opset=17),
        Case("layernorm_axis1_no_bias", "LayerNormalization", [f(2, 3, 4), pos(3, 4)],
             attrs={"axis": 1, "epsilon": 1e-3}, opset=17),
        Case("batchnorm", "BatchNormalization", [f(2, 3, 4, 4), pos(3), f(3), f(3), pos(3)], opset=15),
        Case("batchnorm_2d", "BatchNormalization", [f(4, 3), pos(3), f(3), f(3), pos(3)],
             attrs={"epsilon": 1e-2}, opset=15),
        Case("lrn_odd", "LRN", [f(2, 5, 3, 3)], attrs={"size": 3, "alpha": 1e-2, "beta": 0.75, "bias": 2.0}),
        Case("lrn_even", "LRN", [f(1, 6, 2, 2)], attrs={"size": 4, "alpha": 0.1, "beta": 0.5},
             ref=lambda x: _lrn(x, 4, 0.1, 0.5, 1.0)),  # onnxruntime takes odd sizes only
    ]

    c += [
        Case("matmul_batched_2d", "MatMul", [f(2, 3, 4), f(4, 5)]),
        Case("matmul_4d_2d", "MatMul", [f(2, 2, 3, 4), f(4, 5)]),      # leading dims folded into one GEMM
        Case("matmul_vec_batched", "MatMul", [f(4), f(2, 4, 5)]),
        Case("matmul_broadcast_batch", "MatMul", [f(2, 1, 3, 4), f(3, 4, 2)]),
        Case("matmul_mat_vec", "MatMul", [f(3, 4), f(4)]),
        Case("matmul_vec_vec", "MatMul", [f(4), f(4)]),
        Case("gemm", "Gemm", [f(3, 4), f(4, 5)]),
        Case("gemm_trans_a", "Gemm", [f(4, 3), f(4, 5), f(5)], attrs={"transA": 1}),
        Case("gemm_trans_b_alpha_beta", "Gemm", [f(3, 4), f(5, 4), f(3, 1)],
             attrs={"transB": 1, "alpha": 0.5, "beta": 2.0}),
        Case("gemm_trans_ab_full_c", "Gemm", [f(4, 3), f(5, 4), f(3, 5)], attrs={"transA": 1, "transB": 1}),
    ]

    c += [
        Case("conv2d_bias_pads", "Conv", [f(2, 3, 7, 7), f(4, 3, 3, 3), f(4)], attrs={"pads": [1, 1, 1, 1]}),
        Case("conv2d_groups_strides_dilations", "Conv", [f(2, 4, 9, 8), f(6, 2, 3, 2)],
             attrs={"group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1]}),
        Case("conv2d_depthwise", "Conv", [f(1, 4, 6, 6), f(4, 1, 3, 3), f(4)], attrs={"group": 4, "strides": [2, 2]}),
        Case("conv1d", "Conv", [f(2, 3, 10), f(5, 3, 4)], attrs={"strides": [3], "pads": [2, 1]}),
        Case("conv3d", "Conv", [f(1, 2, 5, 4, 4), f(3, 2, 2, 3, 2)], attrs={"pads": [0, 1, 0, 1, 0, 1]}),
        Case("conv2d_same_upper", "Conv", [f(1, 2, 7, 7), f(3, 2, 3, 3)],
             attrs={"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
        Case("maxpool2d", "MaxPool", [f(2, 3, 7, 7)], attrs={"kernel_shape": [3, 3], "strides": [2, 2],
                                                            "pads": [1, 1, 1, 1]}),
        Case("maxpool_ceil", "MaxPool", [f(1, 2, 8, 8)], attrs={"kernel_shape": [3, 3], "strides": [2, 2],
                                                               "ceil_mode": 1}),
        Case("maxpool_dilations", "MaxPool", [f(1, 2, 8, 8)], attrs={"kernel_shape": [2, 2], "dilations": [2, 2],
                                                                    "pads": [1, 0, 0, 1]}),
        Case("maxpool1d", "MaxPool", [f(2, 3, 9)], attrs={"kernel_shape": [3], "strides": [2]}),
        Case("avgpool_pads_exclude", "AveragePool", [f(2, 3, 7, 7)],
             attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        Case("avgpool_pads_include", "AveragePool", [f(2, 3, 7, 7)],
             attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        Case("avgpool_ceil", "AveragePool", [f(1, 2, 8, 8)],
             attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
        Case("avgpool_ceil_include", "AveragePool", [f(1, 2, 8, 8)],
             attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1,
                    "count_include_pad": 1}),
        Case("avgpool_dilations", "AveragePool", [f(1, 2, 8, 8)],
             attrs={"kernel_shape": [2, 2], "dilations": [2, 2]}, opset=19),
        Case("avgpool1d", "AveragePool", [f(2, 3, 9)], attrs={"kernel_shape": [4], "strides": [2], "pads": [1, 2]}),
        Case("global_avgpool", "GlobalAveragePool", [f(2, 3, 4, 5)]),
        Case("global_maxpool", "GlobalMaxPool", [f(2, 3, 4, 5)]),
        Case("global_maxpool1d", "GlobalMaxPool", [f(2, 3, 6)]),
    ]
    return c


# Cases of the operator families added later, one module each (they import the helpers above).
from runtime import cases_array, cases_einsum, cases_index  # noqa: E402

CASES = _cases() + cases_array.cases() + cases_einsum.cases() + cases_index.cases()
