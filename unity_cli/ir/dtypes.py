"""Element types, with their sizes and their ONNX / numpy names."""
from __future__ import annotations

from enum import Enum

import numpy as np
from onnx import TensorProto


class DType(Enum):
    """An element type of a tensor in the PCG."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    UINT64 = "uint64"
    UINT32 = "uint32"
    UINT16 = "uint16"
    UINT8 = "uint8"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64)

    @property
    def numpy(self) -> np.dtype:
        # numpy has no bfloat16: kernels compute it as float32.
        return np.dtype("float32" if self is DType.BFLOAT16 else self.value)

    @staticmethod
    def from_onnx(elem_type: int) -> DType:
        try:
            return _FROM_ONNX[elem_type]
        except KeyError:
            known = elem_type in TensorProto.DataType.values()
            name = TensorProto.DataType.Name(elem_type) if known else str(elem_type)
            raise ValueError(f"unsupported element type {name}") from None

    @staticmethod
    def from_numpy(dtype: np.dtype) -> DType:
        return DType(np.dtype(dtype).name)


_ITEMSIZE = {
    DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT64: 8,
    DType.INT64: 8, DType.INT32: 4, DType.INT16: 2, DType.INT8: 1,
    DType.UINT64: 8, DType.UINT32: 4, DType.UINT16: 2, DType.UINT8: 1, DType.BOOL: 1,
}

_FROM_ONNX = {
    TensorProto.FLOAT: DType.FLOAT32, TensorProto.FLOAT16: DType.FLOAT16,
    TensorProto.BFLOAT16: DType.BFLOAT16, TensorProto.DOUBLE: DType.FLOAT64,
    TensorProto.INT64: DType.INT64, TensorProto.INT32: DType.INT32,
    TensorProto.INT16: DType.INT16, TensorProto.INT8: DType.INT8, TensorProto.UINT64: DType.UINT64,
    TensorProto.UINT32: DType.UINT32, TensorProto.UINT16: DType.UINT16, TensorProto.UINT8: DType.UINT8,
    TensorProto.BOOL: DType.BOOL,
}
