"""An ONNX backend (``onnx.backend.base.Backend``) that runs models through unity's
importer and kernels: the ONNX backend test suite then checks kernels and import
against ONNX's reference outputs.

``prepare`` keeps the model; ``run`` imports it at the shapes of the inputs it gets (one
import per distinct input signature) and evaluates the PCG node by node with
:func:`unity_cli.kernels.forward`. Graph inputs that the importer needs as
constants (a Reshape's shape, a Slice's bounds, reduction axes) become initializers
holding the values passed to ``run``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from ..errors import UnityError
from ..ir.opspec import OpKind
from ..ir.pcg import PCG
from ..kernels import forward
from ..onnx_import import ImportedModel, ImportOptions, import_model_proto

CONST_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}),
    "Split": frozenset({1}), "Squeeze": frozenset({1}), "Unsqueeze": frozenset({1}),
    "ReduceSum": frozenset({1}), "ReduceMean": frozenset({1}), "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}), "Dropout": frozenset({1, 2}),
    "Pad": frozenset({1, 2, 3}), "Tile": frozenset({1}), "TopK": frozenset({1}), "OneHot": frozenset({1}),
    "Trilu": frozenset({1}), "CumSum": frozenset({1}), "Range": frozenset({0, 1, 2}),
}
"""ONNX op -> positions of inputs that unity reads at import time (they become attributes)."""


class ExecutionError(UnityError):
    """A kernel failed while running a node (names the node and its op)."""


def run_pcg(pcg: PCG, sources: Mapping[str, Any], xp: Any = np) -> list[Any]:
    """The values of the graph's outputs, each source node fed ``sources[node name]``."""
    values: dict[tuple[int, int], Any] = {}
    last_use = {}
    for i, n in pcg:
        for r in n.inputs:
            last_use[(r.node, r.index)] = i
    keep = {(r.node, r.index) for r in pcg.outputs}
    for i, n in pcg:
        if n.spec.is_source:
            try:
                outs = [xp.asarray(sources[n.name])]
            except KeyError:
                raise ExecutionError(f"no value for {n.kind.lower()} {n.name!r}") from None
        elif n.spec.is_parallel_op:
            raise ExecutionError(f"node {n.name!r}: parallel op {n.kind} needs the distributed executor")
        else:
            args = [values[(r.node, r.index)] for r in n.inputs]
            try:
                outs, _ = forward(n.op, args, xp)
            except UnityError as e:
                raise ExecutionError(f"while executing node {n.name!r} ({n.kind}): {e}") from None
            except Exception as e:
                raise ExecutionError(f"while executing node {n.name!r} ({n.kind}): "
                                     f"{type(e).__name__}: {e}") from e
        for k, v in enumerate(outs):
            values[(i, k)] = v
        for r in n.inputs:  # free values after their last use, as torch.fx's Interpreter does
            key = (r.node, r.index)
            if last_use.get(key) == i and key not in keep:
                values.pop(key, None)
    return [values[(r.node, r.index)] for r in pcg.outputs]


def _array_module(device: str) -> Any:
    if device.upper().startswith("CUDA"):
        import cupy  # noqa: PLC0415  (only on GPUs)

        return cupy
    return np


class UnityBackendRep(BackendRep):
    """A prepared model: imported lazily per input signature, run with unity's kernels."""

    def __init__(self, model: onnx.ModelProto, device: str = "CPU"):
        self.model = model
        self.xp = _array_module(device)
        inits = {t.name for t in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in inits]
        uses = {(name, n.op_type, k) for n in model.graph.node for k, name in enumerate(n.input)}
        self.const_inputs = {name for name, op, k in uses if name in self.inputs and k in CONST_INPUTS.get(op, ())}
        self.weights = {t.name: t for t in model.graph.initializer}
        self._programs: dict[Any, ImportedModel] = {}

    def prepare_static(self) -> None:
        """Import now at the model's own input shapes, if they are all static, so that an
        unsupported model fails in ``prepare`` (inputs read at import must wait for ``run``)."""
        if self.const_inputs:
            return
        feeds = {}
        for vi in self.model.graph.input:
            if vi.name in self.inputs:
                tt = vi.type.tensor_type
                if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
                    return
                dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
                feeds[vi.name] = np.empty(tuple(d.dim_value for d in tt.shape.dim), dtype)
        self._program(feeds)

    def _program(self, feeds: Mapping[str, np.ndarray]) -> ImportedModel:
        key = tuple((n, v.shape, v.dtype.str, v.tobytes() if n in self.const_inputs else None)
                    for n, v in feeds.items())
        if key not in self._programs:
            self._programs[key] = self._import(feeds)
        return self._programs[key]

    def _import(self, feeds: Mapping[str, np.ndarray]) -> ImportedModel:
        model = self.model
        if self.const_inputs:
            model = onnx.ModelProto()
            model.CopyFrom(self.model)
            keep = [vi for vi in model.graph.input if vi.name not in self.const_inputs]
            del model.graph.input[:]
            model.graph.input.extend(keep)
            model.graph.initializer.extend(numpy_helper.from_array(feeds[n], n) for n in sorted(self.const_inputs))
        shapes = {n: v.shape for n, v in feeds.items() if n not in self.const_inputs}
        return import_model_proto(model, ImportOptions(input_shapes=shapes), model.graph.name or "<model>")

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = {n: np.asarray(inputs[n]) for n in self.inputs}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(self.inputs):
                raise ExecutionError(f"the model takes {len(self.inputs)} inputs, got {len(inputs)}")
            feeds = {n: np.asarray(v) for n, v in zip(self.inputs, inputs)}
        program = self._program(feeds)
        sources: dict[str, Any] = {n: v for n, v in feeds.items() if n not in self.const_inputs}
        for _, n in program.pcg:
            if n.kind == OpKind.Weight and n.name not in sources:
                if n.name in program.constants:
                    sources[n.name] = program.constants[n.name]
                elif n.name in program.weight_values:
                    sources[n.name] = program.weight_values[n.name]
                elif n.name in self.weights:
                    sources[n.name] = numpy_helper.to_array(self.weights[n.name])
        outs = run_pcg(program.pcg, sources, self.xp)
        if self.xp is not np:
            outs = [self.xp.asnumpy(o) for o in outs]
        names = [o.name for o in self.model.graph.output]
        return namedtupledict("Outputs", names)(*[np.asarray(o) for o in outs])


class UnityBackend(Backend):
    """``onnx.backend`` entry point: ``UnityBackend.prepare(model).run(inputs)``."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> UnityBackendRep:
        if not cls.supports_device(device):
            raise ExecutionError(f"device {device} is not available")
        rep = UnityBackendRep(model, device)
        rep.prepare_static()
        return rep

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        arrays = [np.asarray(v) for v in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = [n for n in node.input if n]
        graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for n, a in zip(names, arrays)]
        outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        graph = helper.make_graph([node], "run_node", graph_inputs, outputs)
        opsets = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))
        return cls.prepare(model, device).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if device.upper() == "CPU":
            return True
        if device.upper().startswith("CUDA"):
            try:
                import cupy  # noqa: PLC0415

                return cupy.cuda.runtime.getDeviceCount() > 0
            except Exception:
                return False
        return False


prepare = UnityBackend.prepare
run_model = UnityBackend.run_model
run_node = UnityBackend.run_node
supports_device = UnityBackend.supports_device
