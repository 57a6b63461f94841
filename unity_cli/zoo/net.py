"""A small ONNX graph builder for the model zoo: nodes, inputs, and weights that are
written inline, streamed to an external data file, or left as shape-only references.

Paper-scale models hold hundreds of millions of parameters, so their initializers are
external-data references (``data_location = EXTERNAL``); planning needs only their
shapes, and the importer treats a missing data file as "values unknown". With weights
requested the values are streamed into that file as they are made, never held at once.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 20         # Gelu is an ONNX op from opset 20 on
IR_VERSION = 10
BATCH = "N"        # the symbolic batch dim every zoo model starts with
ALIGN = 4096       # external tensors start on page boundaries, as onnx's own writer does

Init = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]



def external_ref(name: str, dims: tuple[int, ...] | list[int], location: str, offset: int = 0) -> TensorProto:
    """A float32 initializer whose data is ``4 * prod(dims)`` bytes at ``offset`` of the file
    ``location`` (which need not exist: planning needs shapes, not values). onnx's own
    ``set_external_data`` wants the data in hand, so the reference is written here."""
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(int(d) for d in dims)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(math.prod(dims) * 4))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t

class WeightMode(enum.Enum):
    """Where initializer values go."""

    INLINE = "inline"        # raw data inside the .onnx file
    EXTERNAL = "external"    # streamed to a data file beside it
    ABSENT = "absent"        # external references to a file that is not written (shapes only)


@dataclass(frozen=True, slots=True)
class Weights:
    """How a model's weights are stored: the mode and, for external data, the file name
    (relative to the .onnx file) and an open stream to write it (EXTERNAL only)."""

    mode: WeightMode
    location: str = ""
    sink: BinaryIO | None = None


def he_normal(fan_in: int) -> Init:
    """N(0, 2/fan_in): keeps activations O(1) through ReLU stacks (He et al.)."""
    std = math.sqrt(2.0 / max(fan_in, 1))
    return lambda rng, dims: rng.standard_normal(dims, dtype=np.float32) * np.float32(std)


def normal(std: float) -> Init:
    return lambda rng, dims: rng.standard_normal(dims, dtype=np.float32) * np.float32(std)


def uniform(lo: float, hi: float) -> Init:
    return lambda rng, dims: rng.random(dims, dtype=np.float32) * np.float32(hi - lo) + np.float32(lo)


def const(v: float) -> Init:
    return lambda rng, dims: np.full(dims, v, dtype=np.float32)


class Net:
    """Accumulates one ONNX graph. ``param`` counts trainable values (what a framework's
    parameter count counts); ``buffer`` is for state that is not trained (BN statistics)."""

    def __init__(self, name: str, weights: Weights, seed: int = 0):
        self.name = name
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.params = 0
        self._offset = 0
        self._names: set[str] = set()

    # -- graph -----------------------------------------------------------------

    def input(self, name: str, dims: Sequence[int | str], elem_type: int = TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(dims)))
        return name

    def output(self, name: str, dims: Sequence[int | str], elem_type: int = TensorProto.FLOAT) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(dims)))

    def node(self, op: str, inputs: Sequence[str], name: str, **attrs) -> str:
        """Add one node with one output, named like the node (names are unique)."""
        if name in self._names:
            raise ValueError(f"duplicate node name {name!r}")
        self._names.add(name)
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        return name

    # -- initializers ------------------------------------------------------------

    def param(self, name: str, dims: Sequence[int], init: Init) -> str:
        """A trainable float32 initializer."""
        dims = tuple(int(d) for d in dims)
        self.params += math.prod(dims)
        return self._float(name, dims, init)

    def buffer(self, name: str, dims: Sequence[int], init: Init) -> str:
        """A float32 initializer that is state, not a parameter (BN running mean/var)."""
        return self._float(name, tuple(int(d) for d in dims), init)

    def ints(self, name: str, values: Sequence[int] | np.ndarray) -> str:
        """An int64 constant, always inline (shapes, axes, indices)."""
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def scalar(self, name: str, value: float) -> str:
        """A float32 scalar constant, always inline (one element is never a weight)."""
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def _float(self, name: str, dims: tuple[int, ...], init: Init) -> str:
        mode = self.weights.mode
        if mode is WeightMode.INLINE:
            self.inits.append(numpy_helper.from_array(init(self.rng, dims).astype(np.float32), name))
            return name
        t = external_ref(name, dims, self.weights.location, self._offset)
        if mode is WeightMode.EXTERNAL:
            sink = self.weights.sink
            assert sink is not None, "external weights need a data file to stream to"
            sink.seek(self._offset)
            sink.write(init(self.rng, dims).astype("<f4").tobytes())
        self._offset += -(-math.prod(dims) * 4 // ALIGN) * ALIGN
        self.inits.append(t)
        return name

    # -- finish -----------------------------------------------------------------

    def model(self, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="unity zoo", doc_string=doc)
        m.ir_version = IR_VERSION
        return m
