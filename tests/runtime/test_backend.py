"""ONNX's backend node tests through :class:`unity_cli.runtime.backend.UnityBackend`:
importer and kernels against ONNX's reference outputs, for the op types unity imports.

``benchmarks/onnx_backend.py`` runs the same tests outside pytest and prints the pass
rate per op type.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

from unity_cli.ir.ops.unary import UNARY
from unity_cli.ir.opspec import all_specs
from unity_cli.runtime.backend import UnityBackend

# ONNX op -> the names of its node tests (test names end in _cpu / _cuda).
INCLUDE: dict[str, str] = {
    "Abs": r"test_abs_", "Add": r"test_add_", "And": r"test_and", "AveragePool": r"test_averagepool_",
    "BatchNormalization": r"test_batchnorm_", "Cast": r"test_cast_", "Ceil": r"test_ceil_",
    "Concat": r"test_concat_", "Conv": r"test_(basic_)?conv_", "Cos": r"test_cos_(example_)?c",
    "Div": r"test_div_", "Dropout": r"test_dropout_", "Equal": r"test_equal_", "Erf": r"test_erf_",
    "Exp": r"test_exp_(example_)?c", "Expand": r"test_expand_", "Flatten": r"test_flatten_",
    "Floor": r"test_floor_", "Gather": r"test_gather_(?!elements)", "GatherND": r"test_gathernd_",
    "Gelu": r"test_gelu_", "Gemm": r"test_gemm_", "GlobalAveragePool": r"test_globalaveragepool_",
    "GlobalMaxPool": r"test_globalmaxpool_", "Greater": r"test_greater_", "GreaterOrEqual": r"test_greater_equal",
    "Identity": r"test_identity_", "LRN": r"test_lrn_", "LayerNormalization": r"test_layer_normalization_",
    "Less": r"test_less_", "LessOrEqual": r"test_less_equal", "Log": r"test_log_(example_)?c",
    "LogSoftmax": r"test_logsoftmax_", "MatMul": r"test_matmul_", "Max": r"test_max_",
    "MaxPool": r"test_maxpool_", "Min": r"test_min_", "Mod": r"test_mod_", "Mul": r"test_mul_",
    "Neg": r"test_neg_", "Not": r"test_not_", "Or": r"test_or", "Pow": r"test_pow_",
    "Reciprocal": r"test_reciprocal_", "ReduceMax": r"test_reduce_max_", "ReduceMean": r"test_reduce_mean_",
    "ReduceMin": r"test_reduce_min_", "ReduceSum": r"test_reduce_sum_(?!square)", "Relu": r"test_relu_",
    "Reshape": r"test_reshape_", "Sigmoid": r"test_sigmoid_", "Sign": r"test_sign_",
    "Sin": r"test_sin_(example_)?c", "Slice": r"test_slice_", "Softmax": r"test_softmax_",
    "Softplus": r"test_softplus_", "Split": r"test_split_(?!to_sequence)", "Sqrt": r"test_sqrt_",
    "Squeeze": r"test_squeeze_", "Sub": r"test_sub_", "Sum": r"test_sum_", "Tanh": r"test_tanh_",
    "Transpose": r"test_transpose_", "Unsqueeze": r"test_unsqueeze_", "Where": r"test_where_",
    "IsNaN": r"test_isnan", "IsInf": r"test_isinf", "Pad": r"test_(constant|reflect|edge|wrap)_pad",
    "Tile": r"test_tile", "TopK": r"test_top_k", "OneHot": r"test_onehot_",
    "ScatterElements": r"test_scatter_elements_", "GatherElements": r"test_gather_elements_",
    "Trilu": r"test_tri[lu]_", "CumSum": r"test_cumsum_", "Einsum": r"test_einsum_",
    "Hardmax": r"test_hardmax_", "Range": r"test_range_", "NonZero": r"test_nonzero_",
}
# Ops without a specification of their own: their tests pass only where the importer
# folds them (Range's bounds are read at import, so its output is a constant) or
# refuses them (NonZero's output shape depends on its input's values).
FOLDED_ONLY = {"Range", "NonZero"}


def _snake(op: str) -> str:
    """An ONNX op's name as its node tests spell it (LayerNormalization -> layer_normalization)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


# Tests that fail for known reasons, by reason.
EXCLUDE: dict[str, list[str]] = {
    # Element types the IR has no DType for (strings, 8/4/2-bit floats and ints).
    "unsupported dtype": [r"_string", r"FLOAT8", r"FLOAT4", r"INT4", r"INT2",
                          r"UINT4", r"UINT2", r"BFLOAT16"],
    # The importer needs every dim >= 1.
    "zero-size dims": [r"empty_set", r"allowzero_reordered", r"zero_size_splits", r"test_tri[lu]_zero"],
    # Only the first output is supported: LayerNormalization's Mean/InvStdDev, Dropout's
    # mask, MaxPool's Indices, BatchNormalization's training-mode running stats.
    # (The *_expanded LayerNormalization tests run: their graphs compute only Y.)
    "extra outputs": [r"test_layer_normalization_(?!.*_expanded)", r"dropout.*mask", r"maxpool_with_argmax",
                      r"batchnorm_.*training_mode"],
    # Plans train in inference semantics: Dropout is the identity.
    "training-mode dropout is random": [r"test_training_dropout"],
    # Optional and sequence-typed inputs are not tensors.
    "non-tensor input": [r"identity_opt", r"identity_sequence"],
    # These expansions use CastLike of a run-time tensor, which unity does not import.
    # (ONNX expands its activation functions so; unity imports the functions themselves.)
    "expansion uses CastLike": [rf"test_({'|'.join(_snake(fn) for fn in UNARY)}).*_expanded"],
    # Range's expansion is a Loop: control flow is not imported.
    "expansion uses Loop": [r"test_range_.*_expanded"],
    # The output's shape depends on the input's values: refused unless the input is a constant.
    "data-dependent shape": [r"test_nonzero_"],
}



# An op not listed takes ONNX's own naming: Softsign's node tests are test_softsign*.
for _op in sorted({op for s in all_specs().values() for op in s.onnx_ops} - set(INCLUDE)):
    INCLUDE[_op] = rf"test_{_snake(_op)}(_|$)"

with warnings.catch_warnings():  # onnx's test-case modules warn while computing expected outputs
    warnings.simplefilter("ignore")
    backend_test = onnx.backend.test.BackendTest(UnityBackend, __name__)
for pattern in INCLUDE.values():
    backend_test.include(pattern)
for patterns in EXCLUDE.values():
    for pattern in patterns:
        backend_test.exclude(pattern)

# Only the node tests: the model tests need downloads.
OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]


def test_every_imported_onnx_op_has_backend_tests():
    ops = {op for s in all_specs().values() for op in s.onnx_ops}
    assert ops | FOLDED_ONLY == set(INCLUDE)
    names = [n for n in dir(OnnxBackendNodeModelTest) if n.startswith("test_")]
    for op, pattern in INCLUDE.items():
        assert any(re.search(pattern, n) for n in names), f"no ONNX node test matches {op}'s {pattern!r}"


def test_run_node():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, alpha=2.0)
    a, b, c = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.arange(4, dtype=np.float32)
    (y,) = UnityBackend.run_node(node, [a, b, c])
    np.testing.assert_array_equal(y, 6 + np.arange(4)[None, :].repeat(2, axis=0))


def test_unsupported_op_raises_on_prepare():
    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    with pytest.raises(Exception, match="Det"):
        UnityBackend.prepare(helper.make_model(graph))


def test_devices():
    assert UnityBackend.supports_device("CPU")
    assert not UnityBackend.supports_device("TPU")
