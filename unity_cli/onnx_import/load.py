"""Reading ONNX files: clear errors for missing, truncated or non-ONNX files; weights optional."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
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
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:
            raise ModelError(f"{p}: cannot inline the model's local functions: {e}") from None
    return model


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
