"""Kernel cases for Einsum, Softmax / LogSoftmax / Hardmax (both axis semantics: one
axis from opset 13, ``[axis, rank)`` flattened before it) and IsNaN / IsInf."""
from __future__ import annotations

import numpy as np
from runtime.kernel_cases import Case, f, ints


def _special(*shape: int, dtype=np.float32) -> np.ndarray:
    """Random floats with a nan, an inf and a -inf (and a large finite value) in them."""
    x = f(*shape).astype(dtype).reshape(-1)
    x[[0, 3, 5, 6]] = [np.nan, np.inf, -np.inf, 6e4 if dtype == np.float16 else 1e30]
    return x.reshape(shape)


def _softmax_cases() -> list[Case]:
    return [
        Case("softmax_opset11_mid_axis_rank3", "Softmax", [f(2, 3, 4)], attrs={"axis": 1}, opset=11),
        Case("softmax_opset11_default_axis_rank4", "Softmax", [f(2, 3, 2, 2)], opset=11),
        Case("softmax_opset9_squeezenet_head", "Softmax", [f(2, 10, 1, 1, lo=-20, hi=20)], attrs={"axis": 1},
             opset=9),
        Case("softmax_opset11_neg_axis_rank4", "Softmax", [f(2, 3, 4, 2)], attrs={"axis": -3}, opset=11),
        Case("softmax_opset11_axis0", "Softmax", [f(2, 3, 2)], attrs={"axis": 0}, opset=11),
        Case("softmax_opset11_last_axis", "Softmax", [f(2, 3, 4)], attrs={"axis": 2}, opset=11),
        Case("logsoftmax_opset11_mid_axis_rank4", "LogSoftmax", [f(2, 3, 4, 2)], attrs={"axis": 2}, opset=11),
        Case("logsoftmax_opset9_default_axis_rank3", "LogSoftmax", [f(2, 3, 4)], opset=9),
        Case("logsoftmax_opset13_mid_axis_rank4", "LogSoftmax", [f(2, 3, 4, 2)], attrs={"axis": 1}, opset=13),
        Case("hardmax_opset11_mid_axis_rank3", "Hardmax", [f(2, 3, 4)], attrs={"axis": 1}, opset=11),
        Case("hardmax_opset9_default_axis_rank4", "Hardmax", [f(2, 3, 2, 2)], opset=9),
        Case("hardmax_opset13_mid_axis", "Hardmax", [f(2, 3, 4)], attrs={"axis": 1}, opset=13),
        Case("hardmax_default_last_axis", "Hardmax", [f(3, 5)]),
        Case("hardmax_axis0_rank3", "Hardmax", [f(3, 2, 2)], attrs={"axis": 0}),
        Case("hardmax_float64", "Hardmax", [f(4, 3).astype(np.float64)], attrs={"axis": 0},  # onnxruntime: no float64
             ref=lambda x: (np.arange(x.shape[0])[:, None] == x.argmax(axis=0)).astype(x.dtype)),
        # Ties go to the first maximum; a nudge would move them, so no finite differences here.
        Case("hardmax_ties_first", "Hardmax", [np.array([[1, 3, 3, 0], [2, 2, 2, 2], [-1, -1, -5, -1]], np.float32)],
             grad=False),
        Case("hardmax_opset11_ties_across_dims", "Hardmax",
             [np.array([[[1, 4], [4, 0]], [[2, 2], [2, 2]]], np.float32)], attrs={"axis": 1}, opset=11, grad=False),
    ]


def _einsum(cid: str, equation: str, *inputs: np.ndarray, grad: bool = True) -> Case:
    return Case(f"einsum_{cid}", "Einsum", list(inputs), attrs={"equation": equation}, opset=12, grad=grad)


def _einsum_cases() -> list[Case]:
    return [
        _einsum("matmul", "ij,jk->ik", f(3, 4), f(4, 5)),
        _einsum("matmul_implicit", "ij,jk", f(3, 4), f(4, 5)),
        _einsum("batch_matmul", "bij,bjk->bik", f(2, 3, 4), f(2, 4, 5)),
        _einsum("attention_scores", "bhqd,bhkd->bhqk", f(2, 2, 3, 4), f(2, 2, 5, 4)),
        _einsum("transpose", "ij->ji", f(3, 4)),
        _einsum("transpose_implicit", "ba", f(3, 4)),
        _einsum("permute_uppercase", "AbC->CAb", f(2, 3, 4)),
        _einsum("trace", "ii", f(4, 4)),
        _einsum("diagonal", "ii->i", f(4, 4)),
        _einsum("batch_diagonal", "bii->bi", f(2, 3, 3)),
        _einsum("diagonal_times_vector", "ii,i->i", f(3, 3), f(3)),
        _einsum("triple_diagonal", "iii->i", f(3, 3, 3)),
        _einsum("diagonal_kept_as_rows", "iij->ij", f(3, 3, 2)),
        _einsum("sum_rows", "ij->i", f(3, 4)),
        _einsum("sum_all", "ij->", f(3, 4)),
        _einsum("inner_product", "i,i", f(5), f(5)),
        _einsum("outer_product", "i,j->ij", f(3), f(4)),
        _einsum("outer_product_implicit", "i,j", f(3), f(4)),
        _einsum("sum_in_each_input", "ik,il->i", f(2, 3), f(2, 4)),
        _einsum("sum_in_one_of_two", "ik,j->ij", f(2, 3), f(4)),
        _einsum("ellipsis_matmul", "...ij,...jk->...ik", f(2, 3, 4), f(2, 4, 5)),
        _einsum("ellipsis_implicit", "...ij,jk", f(2, 2, 3, 4), f(4, 5)),
        _einsum("ellipsis_trailing", "i...->...i", f(3, 2, 4)),
        _einsum("ellipsis_empty", "...ij,...jk->...ik", f(3, 4), f(4, 2)),
        _einsum("three_inputs_chain", "ij,jk,kl->il", f(2, 3), f(3, 4), f(4, 2)),
        _einsum("three_inputs_shared", "bi,bj,bk->bijk", f(2, 3), f(2, 2), f(2, 2)),
        _einsum("three_inputs_implicit", "ab,bc,cd", f(2, 3), f(3, 2), f(2, 3)),
        _einsum("spaces", " ij , jk -> ik ", f(3, 4), f(4, 2)),
        _einsum("broadcast_size1", "ij,ij->ij", f(3, 4), f(1, 4)),
        _einsum("broadcast_size1_summed", "bij,bjk->ik", f(2, 3, 4), f(1, 4, 2)),
        _einsum("int64", "ij,jk->ik", ints(3, 4), ints(4, 2), grad=False),
        _einsum("float64", "bij,bkj->bik", f(2, 3, 4).astype(np.float64), f(2, 2, 4).astype(np.float64)),
    ]


def _isnan_isinf_cases() -> list[Case]:
    return [
        Case("isnan", "IsNaN", [_special(3, 4)], grad=False),
        Case("isnan_float16", "IsNaN", [_special(2, 5, dtype=np.float16)], grad=False),
        Case("isnan_float64_rank3", "IsNaN", [_special(2, 2, 3, dtype=np.float64)], grad=False),
        Case("isinf", "IsInf", [_special(3, 4)], grad=False),
        Case("isinf_float16", "IsInf", [_special(2, 5, dtype=np.float16)], grad=False, opset=20),
        Case("isinf_positive", "IsInf", [_special(3, 4)], attrs={"detect_negative": 0}, grad=False),
        Case("isinf_negative", "IsInf", [_special(3, 4)], attrs={"detect_positive": 0}, grad=False),
        Case("isinf_neither", "IsInf", [_special(3, 4)], attrs={"detect_positive": 0, "detect_negative": 0},
             grad=False),
        Case("isinf_float64", "IsInf", [_special(8, dtype=np.float64)], grad=False),
    ]


def cases() -> list[Case]:
    return _softmax_cases() + _einsum_cases() + _isnan_isinf_cases()
