"""Reading ONNX files: clear errors for missing, truncated or non-ONNX files; weights optional."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner  # a submodule: "import onnx" alone does not load it
from onnx import external_data_helper, numpy_helper

from ..errors import ModelError


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """Load a model without its external data (optimizing needs shapes, not weights)."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if p.is_dir():
        raise ModelError(f"{p}: is a directory, not an ONNX file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError (and friends) on garbage
        detail = str(e).splitlines()[0] if str(e) else "unreadable"
        raise ModelError(f"{p}: not a valid ONNX file ({type(e).__name__}: {detail})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{p}: not a valid ONNX file (no graph in it)")
    if not model.opset_import:
        raise ModelError(f"{p}: the model declares no opset")
    check_opset(model, p)
    check_names(model.graph, p)
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:
            raise ModelError(f"{p}: cannot inline the model's local functions: {e}") from None
    return model


def check_opset(model: onnx.ModelProto, p: Path) -> None:
    """A ModelError for a default-domain opset beyond what the installed onnx defines: its
    ops' meaning is unknown. Old opsets are read at their own version (TopK-1 and Pad-2
    take ``k`` and ``pads`` as attributes, and unity reads them so)."""
    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise ModelError(f"{p}: opset {o.version} is newer than the installed onnx defines ({newest}): "
                             "export at that opset or older, or upgrade onnx")
        if o.domain in ("", "ai.onnx") and o.version < 1:
            raise ModelError(f"{p}: opset {o.version} does not exist (opsets start at 1)")


def check_names(graph: onnx.GraphProto, p: Path) -> None:
    """A ModelError naming a tensor declared twice as a graph input or output, or written
    twice (by two nodes, or by a node and as an input or initializer): ONNX is SSA, and a
    later writer would silently win."""
    for what, names in (("graph input", [i.name for i in graph.input]),
                        ("graph output", [o.name for o in graph.output])):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ModelError(f"{p}: {what} {name!r} is declared twice")
            seen.add(name)
    writer: dict[str, str] = {i.name: "a graph input" for i in graph.input}
    writer.update({t.name: "an initializer" for t in graph.initializer if t.name not in writer})
    for k, node in enumerate(graph.node):
        label = f"node {node.name or f'#{k}'!r} ({node.op_type})"
        for out in node.output:
            if not out:
                continue                  # an optional output left out
            if out in writer:
                raise ModelError(f"{p}: tensor {out!r} is written by {writer[out]} and again by {label}")
            writer[out] = label


def has_external_data(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def tensor_value(t: onnx.TensorProto, base_dir: Path, model_path: Path) -> np.ndarray | None:
    """The value of an initializer, reading external data if its file exists; None if absent."""
    if has_external_data(t):
        info = external_data_helper.ExternalDataInfo(t)
        if not (base_dir / info.location).exists():
            return None
        t2 = onnx.TensorProto()
        t2.CopyFrom(t)
        try:
            external_data_helper.load_external_data_for_tensor(t2, str(base_dir))
        except Exception as e:
            raise ModelError(f"{model_path}: cannot read external data of {t.name!r} "
                             f"from {info.location}: {e}") from None
        t = t2
    try:
        return numpy_helper.to_array(t)
    except Exception as e:
        raise ModelError(f"{model_path}: initializer {t.name!r} is unreadable: {e}") from None
