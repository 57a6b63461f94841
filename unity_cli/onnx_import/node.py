"""A read-only view of one ONNX node with concrete input shapes and known constant values,
handed to an operator specification's ``from_onnx``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import helper

from ..errors import ModelError
from ..ir.ops.common import norm_axes
from ..ir.shapes import TensorShape


@dataclass(frozen=True, slots=True)
class OnnxInput:
    name: str                      # "" for an omitted optional input
    shape: TensorShape | None
    value: np.ndarray | None       # known at import time (a constant)


@dataclass
class OnnxNode:
    op_type: str
    name: str
    opset: int
    inputs: list[OnnxInput]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def attributes(proto) -> dict[str, Any]:
        out = {}
        for a in proto.attribute:
            v = helper.get_attribute_value(a)
            if isinstance(v, list):
                v = [x.decode() if isinstance(x, bytes) else x for x in v]
            out[a.name] = v.decode() if isinstance(v, bytes) else v
        return out

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and bool(self.inputs[i].name)

    def const_input(self, i: int, what: str) -> np.ndarray:
        """Input ``i`` as a constant; an error naming the node if it is computed at run time."""
        if not self.has_input(i):
            raise ModelError(f"input {i} ({what}) is missing")
        v = self.inputs[i].value
        if v is None:
            raise ModelError(f"input {i} ({what}) is computed at run time; unity needs it constant "
                             "(give concrete input shapes with --batch-size / --input)")
        return np.asarray(v)

    def axes_raw(self) -> list[int]:
        if "axes" in self.attrs:
            return [int(a) for a in self.attrs["axes"]]
        if self.has_input(1):
            return [int(a) for a in self.const_input(1, "axes").reshape(-1)]
        return []

    def axes(self, rank: int, default: list[int] | None) -> tuple[int, ...]:
        raw = self.axes_raw()
        if not raw:
            if default is None:
                raise ModelError("axes are required")
            raw = default
        try:
            return norm_axes(self.op_type, raw, rank)
        except Exception as e:
            raise ModelError(str(e)) from None
