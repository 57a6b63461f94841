"""ONNX → PCG.

One pass over the nodes in topological order. Each tensor gets a concrete logical shape
(from the operator specifications), and each tensor computable at import time — shape
subgraphs once input shapes are fixed, constant subgraphs — is evaluated by onnx's
reference evaluator and folded away. Every node left must have a specification.
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import hashlib
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner  # a submodule: "import onnx" alone does not load it
from onnx.reference import ReferenceEvaluator

from ..errors import ModelError, ShapeError, UnityError, UnsupportedOpError
from ..ir import PCG, DType, GraphBuilder, TensorRef, TensorShape
from ..ir.ops.sources import InputAttrs, WeightAttrs
from ..ir.opspec import spec_for_onnx
from ..ir.simplify import merge_reshapes
from .activations import recognise
from .load import check_names, check_opset, file_sha256, load_onnx, tensor_value
from .node import OnnxInput, OnnxNode

DEFAULT_BATCH = 32
FOLD_LIMIT = 1 << 24               # elements: larger computed constants stay in the graph
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}
ALIASES = {"Identity"}
# Ops that make a tensor from constants without reading many values: a fill, a broadcast, a
# cast. Their outputs are kept as broadcast views however large, and where an op reads one
# as its parameter (``OpSpec.weight_inputs``) it is a trainable weight with that value.
MAKERS = {"ConstantOfShape", "Expand", "Cast"}
# Ops whose output shape depends on the values of their inputs: planned only when folded.
DATA_DEPENDENT = {"NonZero", "Unique", "Compress", "Range", "StringSplit"}


@dataclass(frozen=True)
class ImportOptions:
    """How to make the model's shapes concrete."""

    batch_size: int | None = None
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportedModel:
    """A PCG plus what the runtime and the plan need to know about its origin."""

    pcg: PCG
    path: str
    sha256: str
    inputs: dict[str, TensorShape]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    weights: list[str]
    batch_size: int
    batch_defaulted: bool
    folded: int
    weight_values: dict[str, np.ndarray] = field(default_factory=dict)
    """Trainable weights made at import by ``MAKERS`` (a light model's ConstantOfShape
    kernels): their initial values, possibly read-only broadcast views."""
    opset: int = 0
    """The default-domain opset its ops are read at (each op's meaning at that version)."""
    recognised: dict[str, int] = field(default_factory=dict)
    """What the export wrote out as several ops and the import reads as one, how many of
    each: activations (``activations.py``), and "Reshape chain", the Reshapes gone where a
    reshape of a reshape is read as one or one to its input's own shape as none
    (``ir/simplify.merge_reshapes``)."""


def import_model(path: str | os.PathLike, options: ImportOptions = ImportOptions()) -> ImportedModel:
    """Import an ONNX file; every failure is a ModelError naming the file (and node)."""
    p = Path(path)
    return _import(_Importer(load_onnx(p), p, options), p)


def import_model_proto(model: onnx.ModelProto, options: ImportOptions = ImportOptions(),
                       name: str = "<model>") -> ImportedModel:
    """Import an in-memory model (its initializers hold their values); ``name`` stands for
    the file in messages and in ``ImportedModel.path``."""
    check_opset(model, Path(name))
    check_names(model.graph, Path(name))
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    sha256 = hashlib.sha256(model.SerializeToString()).hexdigest()
    return _import(_Importer(model, Path(name), options, sha256), Path(name))


def _import(importer: _Importer, p: Path) -> ImportedModel:
    try:
        return importer.run()
    except UnityError as e:
        msg = str(e)
        if msg.startswith(f"{p}: "):
            msg = msg[len(f"{p}: "):]
        if importer.changed:
            # A shape the user gave that the export did not have: the option is the likely culprit.
            option, name, declared, used = importer.changed[0]
            change = f"{option} changes input {name!r} from its exported {_dims(declared)} to {_dims(used)}"
            if isinstance(e, ShapeError):
                keep = ("give a multiple of the exported batch, run as micro-batches of it (mb=K)"
                        if option.startswith("--batch-size") else "keep the exported shape")
                msg = (f"{change}, which shapes baked into the model do not follow: {msg} (re-export it with "
                       f"dynamic axes, or {keep})")
            else:
                msg += f" ({change}; shapes baked into the model may not follow)"
        raise type(e)(f"{p}: {msg}") if isinstance(e, ModelError) else ModelError(f"{p}: {msg}") from None


def _dims(dims: Sequence) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


class _Importer:
    def __init__(self, model: onnx.ModelProto, path: Path, options: ImportOptions, sha256: str | None = None):
        self.model = model
        self.path = path
        self.sha256 = sha256
        self.options = options
        self.base_dir = path.parent
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.builder = GraphBuilder()
        self.shapes: dict[str, TensorShape] = {}
        self.values: dict[str, np.ndarray] = {}
        self.refs: dict[str, TensorRef] = {}
        self.initializers = {t.name: t for t in model.graph.initializer}
        # Tensors made by MAKERS from constants and read as some op's parameter: candidate
        # weights, withheld from folding like trainable initializers.
        self.made: dict[str, np.ndarray] = {}
        self.weight_values: dict[str, np.ndarray] = {}
        self.weight_uses = _weight_uses(model.graph)
        # Constants whose values are unknown (external data left out) and what is computed
        # from them alone: shapes are known, values are not.
        self.opaque: set[str] = set()
        self.constants: dict[str, np.ndarray] = {}
        self.weights: list[str] = []
        self.folded = 0
        # Inputs whose exported concrete dims --input or --batch-size changed: (option, name, exported, used).
        self.changed: list[tuple[str, str, tuple, tuple]] = []
        self.used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        self.constant_nodes = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.output}
        self.recognised: Counter[str] = Counter()

    # -- inputs ----------------------------------------------------------------

    def _input_shapes(self) -> tuple[dict[str, TensorShape], int, bool]:
        opts = self.options
        if opts.batch_size is not None and opts.batch_size < 1:
            raise ModelError(f"--batch-size must be >= 1, got {opts.batch_size}")
        graph_inputs = [i for i in self.model.graph.input if i.name not in self.initializers]
        known = {i.name for i in graph_inputs}
        for name in opts.input_shapes:
            if name not in known:
                raise ModelError(f"--input {name}: the model has no such input (inputs: {', '.join(sorted(known))})")
        batch = opts.batch_size
        if batch is None:  # inputs left symbolic share the batch of those given with --input
            batch = next((opts.input_shapes[i.name][0] for i in graph_inputs if opts.input_shapes.get(i.name)), None)
        defaulted = False
        out = {}
        for vi in graph_inputs:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type"):
                raise ModelError(f"input {vi.name!r} is not a tensor")
            dtype = _dtype(tt.elem_type, f"input {vi.name!r}")
            # As exported: sizes, and the names (or "?") of symbolic dims.
            exported = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
            if vi.name in opts.input_shapes:
                dims = tuple(opts.input_shapes[vi.name])
                if any(d < 1 for d in dims):
                    raise ModelError(f"--input {vi.name}: dims must be >= 1, got {list(dims)}")
                if tt.HasField("shape") and len(dims) != len(tt.shape.dim):
                    raise ModelError(f"--input {vi.name}: the input has {len(tt.shape.dim)} dims, "
                                     f"got {len(dims)} ({','.join(map(str, dims))})")
                if any(isinstance(e, int) and e != g for e, g in zip(exported, dims)):   # none: no shape
                    self.changed.append((f"--input {vi.name}={','.join(map(str, dims))}", vi.name, exported, dims))
                out[vi.name] = TensorShape(dims, dtype)
                continue
            dims = []
            rebatched = False
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 1:
                    what = "0 (an empty tensor)" if d.dim_value == 0 else f"{d.dim_value}, which no tensor has"
                    raise ModelError(f"input {vi.name!r} dim {k} is {what}; give its shape with "
                                     f"--input {vi.name}=d0,d1,... (every dim >= 1)")
                if k == 0 and batch is not None:
                    rebatched = d.HasField("dim_value") and d.dim_value != batch
                    dims.append(batch)
                elif d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(d.dim_value)
                elif k == 0:
                    batch, defaulted = DEFAULT_BATCH, True
                    dims.append(batch)
                else:
                    what = f"symbolic ({d.dim_param!r})" if d.dim_param else "unknown (neither a size nor a name)"
                    raise ModelError(f"input {vi.name!r} dim {k} is {what}; "
                                     f"give it with --input {vi.name}=d0,d1,...")
            if dims and rebatched:
                given = next((i.name for i in graph_inputs if opts.input_shapes.get(i.name)), None)
                option = f"--batch-size {batch}" if opts.batch_size is not None else \
                    f"the batch {batch} that --input {given} sets"
                self.changed.append((option, vi.name, exported, tuple(dims)))
            out[vi.name] = TensorShape(tuple(dims), dtype)
        if batch is None:
            batch = next((s.dims[0] for s in out.values() if s.rank), 1)
        return out, batch, defaulted

    # -- sources ---------------------------------------------------------------

    def _ref(self, name: str, frozen: bool = False) -> TensorRef:
        """The PCG tensor for an ONNX tensor name, creating weight/constant nodes lazily."""
        if name in self.refs:
            return self.refs[name]
        if name not in self.values and name not in self.initializers and name not in self.opaque \
                and name not in self.made:
            raise ModelError(f"tensor {name!r} is used before it is produced")
        shape = self.shapes[name]
        value = self.values.get(name, self.made.get(name))
        trainable = not frozen and self._trainable(name, shape, value)
        ref = self.builder.add(WeightAttrs(shape, trainable), (), name)[0]
        if trainable:
            self.weights.append(name)
            if name in self.made:
                self.weight_values[name] = self.made[name]
        elif value is not None:
            self.constants[name] = value
        self.refs[name] = ref
        return ref

    def _trainable(self, name: str, shape: TensorShape, value: np.ndarray | None) -> bool:
        """Trainable weights: float initializers (or tensors made from constants and read as a
        parameter, see ``MAKERS``) of more than one element whose values, when known, are
        finite and not mask-like (|v| >= 1e30)."""
        if not shape.dtype.is_float or shape.numel <= 1:
            return False
        if name not in self.initializers and name not in self.made:
            return False
        if value is not None and value.size:
            small = _compact(value)
            if not np.all(np.isfinite(small)) or np.abs(small).max() >= 1e30:
                return False
        return True

    # -- the pass ----------------------------------------------------------------

    def run(self) -> ImportedModel:
        inputs, batch, defaulted = self._input_shapes()
        for name, shape in inputs.items():
            self.shapes[name] = shape
            self.refs[name] = self.builder.add(InputAttrs(shape), (), name)[0]
        for name, t in self.initializers.items():
            shape = TensorShape(tuple(t.dims), _dtype(t.data_type, f"initializer {name!r}"))
            self.shapes[name] = shape
            small = shape.numel <= (1 << 16)
            value = tensor_value(t, self.base_dir, self.path) if small or not shape.dtype.is_float else None
            # Trainable weights are never folded through: only constants get a value here.
            if value is not None and not self._trainable(name, shape, value):
                self.values[name] = value
            elif value is None and not self._trainable(name, shape, None):
                self.opaque.add(name)
        nodes, self.recognised = recognise(_topological(self.model.graph), self._constant,
                                           [o.name for o in self.model.graph.output])
        for node in nodes:
            try:
                self._node(node)
            except UnityError as e:
                raise type(e)(f"node {node.name or '<unnamed>'!r} ({node.op_type}): {e}") from None
        if not self.model.graph.output:
            raise ModelError("the graph has no outputs: there is no loss to train")
        outputs = []
        for o in self.model.graph.output:
            if o.name not in self.refs and o.name not in self.values and o.name not in self.initializers \
                    and o.name not in self.made:
                raise ModelError(f"graph output {o.name!r} is never produced")
            outputs.append(self._ref(o.name))
        pcg, reshapes = merge_reshapes(self.builder.build(outputs))
        if reshapes:
            self.recognised["Reshape chain"] += reshapes
        sha256 = self.sha256 or file_sha256(self.path)
        return ImportedModel(pcg, str(self.path), sha256, inputs,
                             [o.name for o in self.model.graph.output], self.constants, self.weights,
                             batch, defaulted, self.folded, self.weight_values, self.opset, dict(self.recognised))

    def _constant(self, name: str) -> np.ndarray | None:
        """A tensor's value if it is known before any node runs (a constant initializer, or a
        Constant node's value): what ``activations.recognise`` compares to a formula's."""
        if name in self.values:
            return self.values[name]
        node = self.constant_nodes.get(name)
        if node is None:
            return None
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if isinstance(attrs.get("value"), onnx.TensorProto):
            return onnx.numpy_helper.to_array(attrs["value"])
        return np.asarray(attrs["value_float"]) if "value_float" in attrs else None

    def _node(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx"):
            raise UnsupportedOpError(f"custom-domain op {node.domain}.{node.op_type} has no specification")
        if node.op_type in ALIASES:
            src = node.input[0]
            self._alias(node.output[0], src)
            return
        ins = []
        for name in node.input:
            if name and name not in self.shapes:
                raise ModelError(f"input {name!r} is never produced")
            ins.append(OnnxInput(name, self.shapes.get(name), self.values.get(name)))
        onode = OnnxNode(node.op_type, node.name, self.opset, ins, list(node.output), OnnxNode.attributes(node))
        if self._fold(node, onode):
            return
        spec = spec_for_onnx(node.op_type)
        if spec is None and self._fold_shape_only(node):
            return
        if spec is None and node.op_type in DATA_DEPENDENT:
            raise UnsupportedOpError(f"{node.op_type}'s output shape depends on the values of its input, which "
                                     "are computed at run time; unity plans static shapes (it folds such an op "
                                     "only when its inputs are constants)")
        if spec is None:
            raise UnsupportedOpError(f"no specification for op {node.op_type} "
                                     "(it is not foldable: its inputs are not all known at import)")
        imported = spec.from_onnx(onode)
        refs = [self._ref(node.input[i], frozen=i in spec.state_inputs) for i in imported.tensor_inputs]
        outs = self.builder.add(imported.attrs, refs, node.name or node.output[0])
        extra = [o for o in node.output[len(outs):] if o in self.used]
        if extra:
            raise ModelError(f"its output {extra[0]!r} is used, but unity supports only its first {len(outs)}")
        for name, ref in zip(node.output, outs):
            if name:
                self.refs[name] = ref
                self.shapes[name] = self.builder.shape(ref).logical

    def _alias(self, dst: str, src: str) -> None:
        self.shapes[dst] = self.shapes[src]
        if src in self.opaque:
            self.opaque.add(dst)
        if src in self.values:
            self.values[dst] = self.values[src]
        if src in self.refs:
            self.refs[dst] = self.refs[src]
        elif src in self.initializers or src in self.made:
            self.refs[dst] = self._ref(src)

    def _fold(self, node: onnx.NodeProto, onode: OnnxNode) -> bool:
        """Evaluate the node now if its outputs are known at import time."""
        op = node.op_type
        if op in NONDETERMINISTIC or op in ("If", "Loop", "Scan"):
            if op in ("If", "Loop", "Scan"):
                raise UnsupportedOpError(f"control flow ({op}) is not supported")
            return False
        if op in MAKERS and all(not i.name or i.value is not None or i.name in self.made for i in onode.inputs):
            result = self._make(node, onode)
        elif op == "Shape":
            shape = self.shapes[node.input[0]].dims
            start = onode.attrs.get("start", 0)
            end = onode.attrs.get("end", len(shape))
            result = [np.array(shape[slice(start, end)], dtype=np.int64)]
        elif op == "Size":
            result = [np.array(math.prod(self.shapes[node.input[0]].dims), dtype=np.int64)]
        elif all(not i.name or i.value is not None for i in onode.inputs):
            if any(i.value is not None and i.value.size > FOLD_LIMIT for i in onode.inputs):
                return False
            result = self._evaluate(node, onode)
            if result is None:
                return False
        else:
            return False
        for name, v in zip(node.output, result):
            if not name:
                continue
            v = np.asarray(v)
            self.shapes[name] = TensorShape(tuple(v.shape), DType.from_numpy(v.dtype))
            if op in MAKERS and name in self.weight_uses and v.dtype.kind == "f" and v.size > 1:
                self.made[name] = v
            else:
                self.values[name] = v
        self.folded += 1
        return True

    def _make(self, node: onnx.NodeProto, onode: OnnxNode) -> list[np.ndarray]:
        """The output of a ``MAKERS`` op on known inputs, as a broadcast view of a compact
        value: a light model's 100M-element ConstantOfShape kernel takes no memory here."""
        ins = [None if not i.name else i.value if i.value is not None else self.made[i.name] for i in onode.inputs]
        match node.op_type:
            case "ConstantOfShape":
                fill = onode.attrs.get("value")
                v = onnx.numpy_helper.to_array(fill).reshape(-1)[:1] if fill is not None else np.zeros(1, np.float32)
                dims = tuple(int(d) for d in np.asarray(ins[0]).reshape(-1))
                if any(d < 0 for d in dims):
                    raise ModelError(f"ConstantOfShape: negative dims {list(dims)}")
                return [np.broadcast_to(v.reshape(()), dims)]
            case "Expand":
                x, dims = ins[0], tuple(int(d) for d in np.asarray(ins[1]).reshape(-1))
                try:
                    out = np.broadcast_shapes(x.shape, dims)
                except ValueError:
                    raise ModelError(f"Expand: shape {list(x.shape)} does not broadcast to {list(dims)}") from None
                return [np.broadcast_to(_compact(x), out)]
            case "Cast":
                x = ins[0]
                small = _compact(x)
                casted = self._evaluate(node, dataclasses.replace(onode, inputs=[
                    dataclasses.replace(onode.inputs[0], value=small.copy())]))
                if casted is None:
                    raise ModelError("Cast: cannot evaluate this constant node")
                return [np.broadcast_to(np.asarray(casted[0]), x.shape)]
        raise AssertionError(node.op_type)

    def _fold_shape_only(self, node: onnx.NodeProto) -> bool:
        """A node computed from constants alone is a constant even where some of their values
        are unknown (a model imported without its external data file): keep its outputs as
        constants of the shapes onnx's shape inference gives them."""
        names = [i for i in node.input if i]
        if not any(i in self.opaque for i in names) or \
                not all(i in self.values or i in self.opaque for i in names):
            return False
        graph_inputs = [onnx.helper.make_tensor_value_info(n, _onnx_type(self.shapes[n].dtype), self.shapes[n].dims)
                        for n in names]
        outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        m = self._one_node_model(node, "shape", graph_inputs, outputs)
        try:
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True).graph.output
        except Exception:
            return False
        shapes = {}
        for vi in inferred:
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            if not tt.HasField("shape") or any(d < 0 for d in dims):
                return False
            shapes[vi.name] = TensorShape(tuple(dims), _dtype(tt.elem_type, f"output {vi.name!r}"))
        if any(o and o not in shapes for o in node.output):
            return False
        for o in node.output:
            if o:
                self.shapes[o] = shapes[o]
                self.opaque.add(o)
        self.folded += 1
        return True

    def _one_node_model(self, node: onnx.NodeProto, name: str, inputs: list, outputs: list) -> onnx.ModelProto:
        """A model of ``node`` alone, at the source model's opsets and IR version: the onnx
        package's newest IR version can be newer than the installed onnxruntime reads, and
        then every constant would go to the reference evaluator (whose GatherElements fails
        on an axis longer than 64)."""
        g = onnx.helper.make_graph([node], name, inputs, outputs)
        m = onnx.helper.make_model(g, opset_imports=list(self.model.opset_import))
        m.ir_version = self.model.ir_version or m.ir_version
        return m

    def _evaluate(self, node: onnx.NodeProto, onode: OnnxNode) -> list[np.ndarray] | None:
        feeds = {i.name: i.value for i in onode.inputs if i.name}
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                        for n, v in feeds.items()]
        outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        m = self._one_node_model(node, "fold", graph_inputs, outputs)
        key = _fold_key(m, node, feeds)
        res = _FOLDED.get(key)
        if res is None:
            try:
                res = _run_ort(m, feeds)
            except Exception:
                try:  # onnxruntime refuses a few odd nodes that the reference evaluator runs
                    res = ReferenceEvaluator(m).run(None, feeds)
                except Exception as e:
                    raise ModelError(f"cannot evaluate this constant node: {type(e).__name__}: {e}") from None
            _FOLDED.put(key, [np.asarray(r) for r in res])
        res = [r.copy() for r in res]
        if any(np.asarray(r).size > FOLD_LIMIT for r in res):
            return None
        full = []
        it = iter(res)
        for o in node.output:
            full.append(next(it) if o else None)
        return full


class _Folded:
    """The results of constant nodes evaluated in this process, by what they compute (an
    LLM's layers fold the same mask alike, and a search imports a model at several batch
    sizes): at most :data:`FOLD_CACHE_BYTES` of them, the oldest dropped first."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._results: dict[bytes, list[np.ndarray]] = {}

    def get(self, key: bytes) -> list[np.ndarray] | None:
        return self._results.get(key)

    def put(self, key: bytes, results: list[np.ndarray]) -> None:
        size = sum(r.nbytes for r in results)
        if size > self.limit:
            return
        while self._results and self.held + size > self.limit:
            self.held -= sum(r.nbytes for r in self._results.pop(next(iter(self._results))))
        self._results[key] = results
        self.held += size


FOLD_CACHE_BYTES = 256 << 20
_FOLDED = _Folded(FOLD_CACHE_BYTES)


def _fold_key(model: onnx.ModelProto, node: onnx.NodeProto, feeds: Mapping[str, np.ndarray]) -> bytes:
    """What a one-node model computes: the node with its tensors named by position, the
    opsets and IR version, and every input's type, shape and bytes."""
    named = onnx.NodeProto()
    named.CopyFrom(node)
    named.ClearField("name")
    order = {n: f"i{k}" for k, n in enumerate(feeds)}
    named.input[:] = [order.get(n, "") for n in node.input]
    named.output[:] = [f"o{k}" if o else "" for k, o in enumerate(node.output)]
    h = hashlib.sha256(named.SerializeToString(deterministic=True))
    h.update(f"ir{model.ir_version};".encode())
    for op in model.opset_import:
        h.update(f"{op.domain}:{op.version};".encode())
    for v in feeds.values():
        v = np.asarray(v)
        h.update(f"{v.dtype.str}{v.dtype.name}{v.shape};".encode())
        h.update(repr(v.tolist()).encode() if v.dtype.hasobject else v.tobytes())
    return h.digest()


def _compact(v: np.ndarray) -> np.ndarray:
    """The smallest array that broadcasts to ``v``: its size-1 slice along every dim where
    it is a broadcast (stride 0), so a view of a 10⁸-element fill is one element."""
    v = np.asarray(v)
    return v[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for st, n in zip(v.strides, v.shape))]


def _weight_uses(graph: onnx.GraphProto) -> set[str]:
    """Names of the tensors some node reads as its parameter (``OpSpec.weight_inputs``),
    through Identity nodes."""
    uses = set()
    for n in graph.node:
        spec = spec_for_onnx(n.op_type)
        for i in spec.weight_inputs if spec is not None and n.domain in ("", "ai.onnx") else ():
            if i < len(n.input) and n.input[i]:
                uses.add(n.input[i])
    aliases = [(n.output[0], n.input[0]) for n in graph.node if n.op_type in ALIASES and n.input and n.output]
    grew = True
    while grew:
        grew = False
        for dst, src in aliases:
            if dst in uses and src not in uses:
                uses.add(src)
                grew = True
    return uses


@functools.cache
def _onnxruntime():
    """onnxruntime, imported with ``XDG_CACHE_HOME`` pointing at a temporary folder removed
    at exit: at import it writes a device id and a telemetry database under
    ``$XDG_CACHE_HOME`` (else ``~/.cache``)/Microsoft/DeveloperTools, and ``optimize``
    writes nothing outside its outputs."""
    tmp = tempfile.mkdtemp(prefix="unity-onnxruntime-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    keys = ("XDG_CACHE_HOME", "TMPDIR")      # and its session file under $TMPDIR
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, tmp))
    try:
        import onnxruntime  # noqa: PLC0415
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return onnxruntime


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = _onnxruntime()
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failures are expected: the reference evaluator takes over
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _onnx_type(dtype: DType) -> int:
    if dtype is DType.BFLOAT16:  # numpy has no bfloat16
        return onnx.TensorProto.BFLOAT16
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype.value))


def _dtype(elem_type: int, what: str) -> DType:
    try:
        return DType.from_onnx(elem_type)
    except ValueError as e:
        raise ModelError(f"{what}: {e}") from None


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes in a topological order (ONNX requires one; stable if already sorted)."""
    produced_by = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    order, state = [], [0] * len(graph.node)
    for start in range(len(graph.node)):
        if state[start]:
            continue
        stack = [(start, iter(graph.node[start].input))]
        state[start] = 1
        while stack:
            i, it = stack[-1]
            for name in it:
                j = produced_by.get(name)
                if j is not None and state[j] == 0:
                    state[j] = 1
                    stack.append((j, iter(graph.node[j].input)))
                    break
                if j is not None and state[j] == 1:
                    raise ModelError(f"the graph has a cycle through tensor {name!r}")
            else:
                stack.pop()
                state[i] = 2
                order.append(graph.node[i])
    return order

