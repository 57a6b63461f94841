"""Kernel cases of Pad, Tile, Trilu and CumSum: every mode and attribute, negative pads,
the axes input, integer and bool data."""
from __future__ import annotations

import numpy as np
from runtime.kernel_cases import Case, Const, bools, f, i64, ints


def _k(v: int) -> Const:
    return Const(np.array(v, np.int64))


def _pad_cases() -> list[Case]:
    return [
        Case("pad_attrs_opset2", "Pad", [f(2, 3, 4)], attrs={"pads": [0, 1, 2, 1, 0, 3], "value": 1.5}, opset=10),
        Case("pad_constant_default_value", "Pad", [f(2, 3), i64(1, 0, 2, 3)], opset=13),
        Case("pad_constant_value_negative_pads", "Pad", [f(3, 5, 4), i64(1, -2, 0, -1, 2, 1), Const(np.float32(-0.5))],
             opset=18),
        Case("pad_constant_zero_value_input", "Pad", [f(2, 4), i64(0, 1, 2, 0), Const(np.float32(0.0))], opset=11),
        Case("pad_axes_negative", "Pad", [f(2, 3, 4, 5), i64(1, -1, 2, 0), Const(np.float32(2.0)), i64(-1, 1)],
             opset=18),
        Case("pad_axes_no_value", "Pad", [f(2, 3, 4), i64(2, 1), None, i64(0)], opset=18),
        Case("pad_reflect", "Pad", [f(2, 4, 5), i64(0, 3, 2, 0, 1, 4)], attrs={"mode": "reflect"}),
        Case("pad_reflect_negative_pads", "Pad", [f(3, 6), i64(-1, 2, 1, -2)], attrs={"mode": "reflect"}),
        Case("pad_edge", "Pad", [f(2, 3, 4), i64(1, 0, 3, 2, 0, 1)], attrs={"mode": "edge"}),
        Case("pad_edge_negative_pads_axes", "Pad", [f(4, 3, 5), i64(-1, 2, 3, -2), None, i64(0, 2)],
             attrs={"mode": "edge"}),
        Case("pad_wrap", "Pad", [f(3, 4), i64(2, 3, 1, 4)], attrs={"mode": "wrap"}, opset=19),
        Case("pad_wrap_negative_pads", "Pad", [f(2, 5, 3), i64(0, -1, 2, 1, 2, -1)], attrs={"mode": "wrap"}, opset=19),
        Case("pad_int_constant", "Pad", [ints(2, 3), i64(1, 0, 0, 2), Const(np.int64(7))], grad=False),
        Case("pad_int_reflect", "Pad", [ints(3, 4, dtype=np.int32), i64(2, 1, 0, 3)], attrs={"mode": "reflect"},
             grad=False),
    ]


def _tile_cases() -> list[Case]:
    return [
        Case("tile", "Tile", [f(2, 3, 4), i64(2, 1, 3)]),
        Case("tile_all_repeat", "Tile", [f(3, 2), i64(3, 2)]),
        Case("tile_ones", "Tile", [f(2, 3), i64(1, 1)]),
        Case("tile_int", "Tile", [ints(2, 3), i64(1, 2)], grad=False),
    ]


def _trilu_cases() -> list[Case]:
    return [
        Case("trilu_upper_default", "Trilu", [f(4, 5)], opset=14),
        Case("trilu_lower", "Trilu", [f(3, 4, 5)], attrs={"upper": 0}, opset=14),
        Case("trilu_upper_k_positive", "Trilu", [f(2, 3, 4, 6), _k(2)], opset=14),
        Case("trilu_upper_k_negative", "Trilu", [f(5, 3), _k(-2)], opset=14),
        Case("trilu_lower_k_positive", "Trilu", [f(2, 5, 4), _k(1)], attrs={"upper": 0}, opset=14),
        Case("trilu_lower_k_negative", "Trilu", [f(4, 4), _k(-1)], attrs={"upper": 0}, opset=14),
        Case("trilu_k_out_of_range", "Trilu", [f(3, 4), _k(7)], opset=14),
        Case("trilu_int", "Trilu", [ints(3, 4), _k(1)], attrs={"upper": 0}, opset=14, grad=False),
        Case("trilu_bool", "Trilu", [bools(2, 4, 3)], opset=14, grad=False),
    ]


def _cumsum_cases() -> list[Case]:
    return [
        Case("cumsum", "CumSum", [f(3, 4), _k(1)], opset=11),
        Case("cumsum_exclusive", "CumSum", [f(4, 3), _k(0)], attrs={"exclusive": 1}, opset=14),
        Case("cumsum_reverse", "CumSum", [f(2, 5, 3), _k(1)], attrs={"reverse": 1}),
        Case("cumsum_reverse_exclusive", "CumSum", [f(2, 3, 4), _k(-1)], attrs={"reverse": 1, "exclusive": 1}),
        Case("cumsum_axis_1elem", "CumSum", [f(3, 4), i64(-2)], opset=14),
        Case("cumsum_int32", "CumSum", [ints(3, 5, dtype=np.int32), _k(1)], attrs={"exclusive": 1}, grad=False),
        Case("cumsum_int64_reverse", "CumSum", [ints(6), _k(0)], attrs={"reverse": 1}, grad=False),
    ]


def cases() -> list[Case]:
    return _pad_cases() + _tile_cases() + _trilu_cases() + _cumsum_cases()
