"""The model a plan names: find and check it, its weight values, and saving trained weights."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelError, PlanError
from ..files import write_atomic
from ..ir.ops.sources import WeightAttrs
from ..ir.opspec import OpKind
from ..ir.pcg import PCG
from ..ir.shapes import TensorShape
from ..onnx_import import ImportedModel, ImportOptions, import_model
from ..onnx_import.load import file_sha256, load_onnx, tensor_value
from ..plan.plan import Plan


def resolve_model(plan: Plan, override: str | None) -> Path:
    """The model file (``--model`` or the plan's path, relative to the CWD), checked
    against the plan's SHA-256."""
    path = Path(override if override is not None else plan.model["path"])
    if not path.is_file():
        how = "" if override is not None else " (named by the plan; pass --model FILE if it moved)"
        raise PlanError(f"model file {path} not found{how}")
    digest = file_sha256(path)
    want = plan.model.get("sha256")
    if digest != want:
        raise PlanError(f"{path}: its SHA-256 {digest[:12]}… is not the plan's {str(want)[:12]}…: the plan was "
                        "made for another model (re-run unity optimize on this one)")
    return path


def import_for_plan(path: Path, plan: Plan, batches: int = 1) -> ImportedModel:
    """The original PCG, imported with the input shapes the plan was made for (``batches``
    of them at once: each input's leading dim, the batch, that many times larger)."""
    shapes = {name: tuple(int(d) * (batches if k == 0 else 1) for k, d in enumerate(v["dims"]))
              for name, v in plan.model.get("inputs", {}).items()}
    batch = plan.model.get("batch_size")
    return import_model(path, ImportOptions(batch_size=batch * batches if batch else batch, input_shapes=shapes))


@dataclass(frozen=True)
class WeightValues:
    trainable: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    missing: tuple[str, ...]             # weights without data in the file, initialized randomly


def weight_values(path: Path, imported: ImportedModel, graphs: list[PCG], seed: int) -> WeightValues:
    """Values of every Weight source of ``graphs``: constants folded at import, initializers
    (with their external data when it is there), weights the importer made from constants
    (a light model's ConstantOfShape kernels); a weight whose data is missing starts random
    (normal, std 0.02; seeded), a constant zeros (BatchNorm variances ones)."""
    model = load_onnx(path)
    inits = {t.name: t for t in model.graph.initializer}
    variances = {n.inputs[4].node for g in graphs for _, n in g if n.kind == OpKind.BatchNormalization}
    var_names = {g.nodes[i].name for g in graphs for i in variances if i < len(g.nodes)}
    rng = np.random.default_rng([seed, 1])
    trainable: dict[str, np.ndarray] = {}
    constants: dict[str, np.ndarray] = {}
    missing = []
    seen: dict[str, WeightAttrs] = {}
    for g in graphs:
        for _, n in g:
            if isinstance(n.op, WeightAttrs) and n.name not in seen:
                seen[n.name] = n.op
    def load(name: str, op: WeightAttrs) -> np.ndarray:
        dims, dtype = op.shape.dims, op.shape.dtype.numpy
        value = imported.constants.get(name)
        if value is None:
            value = imported.weight_values.get(name)
        if value is None and name in inits:
            value = tensor_value(inits[name], path.parent, path)
        if value is None:
            missing.append(name)
            if op.trainable:
                value = rng.normal(0.0, 0.02, size=dims)
            else:
                value = np.ones(dims) if name in var_names else np.zeros(dims)
        # Trained weights are updated in place: a broadcast view of a fill becomes an array.
        value = np.array(value, dtype=dtype) if op.trainable else np.asarray(value).astype(dtype, copy=False)
        if value.shape != dims:
            raise ModelError(f"{path}: weight {name!r} holds {list(value.shape)}, the graph wants {list(dims)}")
        return value

    values: dict[str, np.ndarray] = {}
    for name in sorted(n for n, op in seen.items() if not op.parts):
        values[name] = load(name, seen[name])
    for name in sorted(n for n, op in seen.items() if op.parts):
        # A folded weight is its parts, concatenated: the very values the original graph's
        # weights of those names get (a part missing from the file is drawn once, for both).
        op = seen[name]
        for part, size in op.parts:
            if part not in values:
                dims = list(op.shape.dims)
                dims[op.part_axis] = size
                seen[part] = WeightAttrs(TensorShape(tuple(dims), op.shape.dtype), op.trainable)
                values[part] = load(part, seen[part])
        values[name] = np.concatenate([values[part] for part, _ in op.parts], axis=op.part_axis)
    for name, value in values.items():
        (trainable if seen[name].trainable else constants)[name] = value
    return WeightValues(trainable, constants, tuple(missing))


def unfold(values: dict[str, np.ndarray], pcg: PCG) -> dict[str, np.ndarray]:
    """``values`` (of a plan's weights, or their gradients) with each folded weight of
    ``pcg`` replaced by its parts, under the model's own names."""
    out = dict(values)
    for _, n in pcg:
        if isinstance(n.op, WeightAttrs) and n.op.parts and n.name in out:
            whole = out.pop(n.name)
            bounds = np.cumsum([size for _, size in n.op.parts])[:-1]
            for (part, _), piece in zip(n.op.parts, np.split(np.asarray(whole), bounds, axis=n.op.part_axis),
                                        strict=True):
                out[part] = piece
    return out


def save_trained(path: Path, out: str | os.PathLike, weights: dict[str, np.ndarray]) -> int:
    """Write the model with ``weights`` in place of its initializers of the same names, all
    data inside the file; returns how many initializers it replaced."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise ModelError(f"{path}: cannot reload the model to save it: {e}") from None
    replaced = 0
    for t in model.graph.initializer:
        w = weights.get(t.name)
        if w is None:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                v = tensor_value(t, path.parent, path)
                if v is not None:
                    t.CopyFrom(numpy_helper.from_array(v, t.name))
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        t.CopyFrom(numpy_helper.from_array(np.asarray(w).astype(dtype), t.name))
        replaced += 1
    try:
        write_atomic(out, model.SerializeToString())
    except (OSError, ValueError) as e:
        raise ModelError(f"--save {out}: cannot write: {e}") from None
    return replaced
