"""`--data` is checked before training: token ids inside their table, finite numbers, no
array the graph does not read; each failure one line naming the array (#13)."""
from __future__ import annotations

import numpy as np
import pytest

from unity_cli.errors import UsageError
from unity_cli.ir.dtypes import DType
from unity_cli.ir.shapes import TensorShape
from unity_cli.runtime.data import Data
from unity_cli.runtime.loss import LossKind

INPUTS = {"ids": TensorShape((4, 6), DType.INT64), "x": TensorShape((4, 3), DType.FLOAT32)}
ROWS = 500


def _data(**arrays):
    good = {"ids": np.zeros((4, 6), np.int64), "x": np.zeros((4, 3), np.float32),
            "labels": np.zeros(4, np.int64)}
    good.update(arrays)
    return Data(INPUTS, (4, 10), LossKind.CROSS_ENTROPY, 0, {"ids": ROWS}, good, "d.npz")


def test_good_data_passes_including_negative_ids_counted_from_the_end():
    ids = np.array([[0, ROWS - 1, -ROWS, -1, 7, 8]] * 4, np.int64)
    assert _data(ids=ids).batches == 1


@pytest.mark.parametrize("bad", [ROWS, 10**6, -ROWS - 1, -10**6])
def test_token_ids_outside_their_table_name_the_array(bad):
    ids = np.zeros((4, 6), np.int64)
    ids[2, 3] = bad
    with pytest.raises(UsageError) as e:
        _data(ids=ids)
    msg = str(e.value)
    assert "'ids'" in msg and str(bad) in msg and str(ROWS) in msg and "\n" not in msg


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_not_finite_inputs_and_labels_name_the_array(value):
    x = np.zeros((4, 3), np.float32)
    x[1, 2] = value
    with pytest.raises(UsageError, match=r"'x' holds NaN or infinity \(at index \[1, 2\]\)"):
        _data(x=x)
    labels = np.zeros((4, 10), np.float32)
    labels[0, 0] = value
    with pytest.raises(UsageError, match="'labels' holds NaN or infinity"):
        Data(INPUTS, (4, 10), LossKind.MSE, 0, {"ids": ROWS},
             {"ids": np.zeros((4, 6), np.int64), "x": np.zeros((4, 3), np.float32), "labels": labels}, "d.npz")


def test_an_array_the_graph_does_not_read_is_refused():
    with pytest.raises(UsageError, match="array 'idz' is not a graph input nor 'labels'"):
        _data(idz=np.zeros((4, 6), np.int64))
