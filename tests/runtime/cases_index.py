"""Kernel cases of TopK, OneHot, GatherElements and ScatterElements (see ``kernel_cases``).

Indices are in range (onnxruntime refuses others, OneHot aside), and ScatterElements
without a reduction writes each position once: ONNX leaves repeated writes undefined.
TopK and the max/min scatters get tie-free random floats for their gradient checks.
"""
from __future__ import annotations

import numpy as np
from runtime.kernel_cases import Case, Const, away, f, i64, ints


def _i(rows) -> np.ndarray:
    return np.array(rows, dtype=np.int64)


def _topk() -> list[Case]:
    ties = np.array([[1, 2, 2, 0, 2], [3, 3, 1, 1, 3]], np.float32)
    return [
        Case("topk_last_largest", "TopK", [f(3, 6), i64(3)], outputs=2),
        Case("topk_axis0_smallest", "TopK", [f(5, 4), i64(2)], attrs={"axis": 0, "largest": 0}, outputs=2),
        Case("topk_neg_axis_3d", "TopK", [f(2, 5, 3), i64(4)], attrs={"axis": -2}, outputs=2),
        Case("topk_moe_router", "TopK", [f(8, 4), i64(2)], attrs={"axis": -1, "largest": 1, "sorted": 1},
             outputs=2),
        Case("topk_k_all_smallest", "TopK", [f(2, 4), i64(4)], attrs={"largest": 0}, outputs=2),
        # Any order is allowed without sorting; with k = 1 there is one.
        Case("topk_unsorted_k1", "TopK", [f(3, 5), i64(1)], attrs={"sorted": 0}, outputs=2),
        Case("topk_opset1_attr_k", "TopK", [f(3, 4)], attrs={"k": 2}, opset=1, outputs=2),
        Case("topk_opset10", "TopK", [f(3, 4), i64(3)], attrs={"axis": 0}, opset=10, outputs=2),
        # Ties: the lower index first, largest or smallest; values move piecewise there.
        Case("topk_ties_largest", "TopK", [ties, i64(3)], outputs=2, grad=False),
        Case("topk_ties_smallest", "TopK", [ties, i64(3)], attrs={"largest": 0}, outputs=2, grad=False),
        Case("topk_int64_ties", "TopK", [ints(3, 6, lo=0, hi=3), i64(4)], outputs=2),
        Case("topk_int32_axis0", "TopK", [ints(4, 3, dtype=np.int32), i64(2)], attrs={"axis": 0, "largest": 0},
             outputs=2),
    ]


def _onehot() -> list[Case]:
    return [
        Case("onehot_default_axis", "OneHot", [ints(2, 3, lo=-4, hi=4), i64(4), np.array([-1.5, 2.0], np.float32)]),
        Case("onehot_axis0_int32", "OneHot",
             [ints(3, lo=0, hi=5, dtype=np.int32), Const(np.array(5, np.int32)), f(2)], attrs={"axis": 0}),
        Case("onehot_int_values", "OneHot", [ints(2, 2, lo=-2, hi=3), i64(3), Const(_i([2, 7]))], grad=False),
        Case("onehot_axis_mid_const_values", "OneHot",
             [ints(2, 3, lo=-3, hi=3), Const(np.array(3, np.int64)), Const(np.array([0.0, 1.0], np.float32))],
             attrs={"axis": 1}),
        Case("onehot_neg_axis", "OneHot", [ints(2, 3, lo=0, hi=4), i64(4), f(2)], attrs={"axis": -2}),
        Case("onehot_out_of_range", "OneHot", [_i([[5, -6, -1], [0, 7, -5]]), i64(5), f(2)], attrs={"axis": -1}),
        Case("onehot_float_indices_depth", "OneHot",
             [np.array([[1, 3], [0, 2]], np.float32), Const(np.array([5.0], np.float32)),
              Const(np.array([0.5, 4.0], np.float32))], attrs={"axis": 1}, grad=False),
        Case("onehot_opset9", "OneHot", [ints(4, lo=0, hi=3), i64(3), f(2)], opset=9),
    ]


def _gather_elements() -> list[Case]:
    return [
        Case("gather_elements_axis0", "GatherElements", [f(4, 3), ints(2, 3, lo=-4, hi=4)]),
        Case("gather_elements_axis1_smaller", "GatherElements", [f(3, 5), ints(2, 4, lo=-5, hi=5)],
             attrs={"axis": 1}),
        # Longer than data along the axis, so indices repeat: their gradients add up.
        Case("gather_elements_neg_axis_3d", "GatherElements", [f(2, 3, 4), ints(2, 3, 6, lo=-4, hi=4)],
             attrs={"axis": -1}),
        Case("gather_elements_int32_idx", "GatherElements", [f(3, 4), ints(3, 4, lo=0, hi=3, dtype=np.int32)]),
        Case("gather_elements_int_data", "GatherElements", [ints(3, 3), ints(3, 2, lo=0, hi=3)],
             attrs={"axis": 1}, opset=11),
    ]


def _scatter_elements() -> list[Case]:
    dup = _i([[1, 0, 3], [1, 2, 3], [-3, 0, 3]])     # repeated targets in every column
    return [
        Case("scatter_elements_none_axis0", "ScatterElements", [f(4, 3), _i([[1, 0, 3], [-1, 2, 0]]), f(2, 3)]),
        Case("scatter_elements_none_axis1_neg", "ScatterElements",
             [f(3, 5), _i([[4, -5, 2], [-1, 1, 0]]), f(2, 3)], attrs={"axis": 1}),
        Case("scatter_elements_none_3d_mid", "ScatterElements",
             [f(2, 4, 3), _i([[[0, 1, 2], [3, 2, 1]], [[-1, -2, -3], [0, 0, 0]]]), f(2, 2, 3)], attrs={"axis": 1}),
        Case("scatter_elements_opset11", "ScatterElements", [f(3, 3), _i([[1, 0, 2], [0, 2, 1]]), f(2, 3)],
             opset=11),
        Case("scatter_elements_add_dups", "ScatterElements", [f(4, 3), dup, f(3, 3)],
             attrs={"reduction": "add"}, opset=16),
        Case("scatter_elements_add_axis1_smaller", "ScatterElements",
             [f(3, 4), _i([[0, 0, -1], [2, 2, 2]]), f(2, 3)], attrs={"axis": 1, "reduction": "add"}, opset=16),
        Case("scatter_elements_mul_dups", "ScatterElements", [f(4, 3), dup, away(3, 3)],
             attrs={"reduction": "mul"}, opset=16),
        # Zero updates: one zero among a position's writes, and two.
        Case("scatter_elements_mul_zeros", "ScatterElements",
             [f(4, 3), dup, np.array([[0.0, 1.5, 0.0], [-0.7, 0.0, 0.0], [1.2, 0.9, 2.0]], np.float32)],
             attrs={"reduction": "mul"}, opset=16),
        Case("scatter_elements_max_dups", "ScatterElements", [f(4, 3), dup, f(3, 3)],
             attrs={"reduction": "max"}, opset=18),
        Case("scatter_elements_min_axis1", "ScatterElements",
             [f(2, 4), _i([[3, 3, 0], [-1, 1, 1]]), f(2, 3)], attrs={"axis": -1, "reduction": "min"}, opset=18),
        Case("scatter_elements_add_int", "ScatterElements", [ints(3, 3), _i([[2, 2, 0]]), ints(1, 3)],
             attrs={"reduction": "add"}, opset=16),
        Case("scatter_elements_max_int32_idx", "ScatterElements",
             [ints(3, 2), _i([[0, 1], [0, 1]]).astype(np.int32), ints(2, 2)], attrs={"reduction": "max"}),
    ]


def cases() -> list[Case]:
    return _topk() + _onehot() + _gather_elements() + _scatter_elements()
