"""Where the test-corpus ONNX models are, and how to feed them.

Import as ``from models.catalog import ...`` with ``tests/`` on ``sys.path``.

* ``TINY_MODELS_DIR``: ``tests/models/tiny``, the tiny models the tests train (vendored: a plain clone has them)
  (BERT and a convnet, TorchScript and dynamo exports, with their ``export.py``),
  vendored so a plain clone tests them.
* ``EXPORTED_DIR``: ``tests/models/exported``, real torch.onnx exports (see its
  README.md and export.py).
* ``EXPORTED_MODELS`` / ``TINY_MODELS``: ``(filename, {input name: shape})``
  with the shapes the files were exported with.  TorchScript files (no
  ``_dynamo``) have a dynamic batch axis 0 named ``batch``; dynamo files are
  static.
* ``zoo9_model(name, with_weights=False)``: the opset-9 model-zoo look-alikes
  of ``models.zoo9``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from models.zoo9 import ZOO9

from unity_cli.zoo.net import external_ref

TINY_MODELS_DIR = Path(__file__).resolve().parent / "tiny"
EXPORTED_DIR = Path(__file__).resolve().parent / "exported"

InputShapes = dict[str, list[int]]

EXPORTED_MODELS: list[tuple[str, InputShapes]] = [
    ("gpt2_tiny.onnx", {"input_ids": [2, 16]}),
    ("gpt2_tiny_dynamo.onnx", {"input_ids": [2, 16]}),
    ("vit_tiny.onnx", {"pixel_values": [2, 3, 32, 32]}),
    ("vit_tiny_dynamo.onnx", {"pixel_values": [2, 3, 32, 32]}),
    ("dlrm_tiny.onnx", {"dense": [2, 13], "sparse": [2, 3]}),
    ("dlrm_tiny_dynamo.onnx", {"dense": [2, 13], "sparse": [2, 3]}),
    ("inception_tiny.onnx", {"x": [2, 3, 32, 32]}),
    ("inception_tiny_dynamo.onnx", {"x": [2, 3, 32, 32]}),
]

TINY_MODELS: list[tuple[str, InputShapes]] = [
    ("bert_tiny.onnx", {"input_ids": [4, 32]}),
    ("bert_tiny_dynamo.onnx", {"input_ids": [4, 32]}),
    ("convnet_tiny.onnx", {"x": [4, 3, 16, 16]}),
    ("convnet_tiny_dynamo.onnx", {"x": [4, 3, 16, 16]}),
]

# Exclusive upper bound for integer inputs (vocabulary / embedding-table rows).
INT_INPUT_HIGH = {"input_ids": 500, "sparse": 1000}

ZOO9_NAMES: tuple[str, ...] = tuple(ZOO9)


def zoo9_model(name: str, with_weights: bool = False) -> onnx.ModelProto:
    """A ``models.zoo9`` model: shape-only (external, absent weights) by default."""
    try:
        builder = ZOO9[name]
    except KeyError:
        raise KeyError(f"unknown zoo9 model {name!r}; known: {', '.join(ZOO9)}") from None
    return builder(with_weights=with_weights)


def random_feed(model: onnx.ModelProto, shapes: InputShapes,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the given shapes, with each input's dtype taken from the
    model (int64 inputs drawn below ``INT_INPUT_HIGH``, default 10)."""
    rng = np.random.default_rng(seed)
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    feed = {}
    for name, shape in shapes.items():
        dtype = onnx.helper.tensor_dtype_to_np_dtype(types[name])
        if np.issubdtype(dtype, np.integer):
            feed[name] = rng.integers(0, INT_INPUT_HIGH.get(name, 10), shape).astype(dtype)
        else:
            feed[name] = rng.standard_normal(shape).astype(dtype)
    return feed


def model_path(filename: str, folder: Path | None = None) -> Path:
    """Path of an exported (default) or tiny model file."""
    return (folder or EXPORTED_DIR) / filename


def list_exported(which: Sequence[tuple[str, InputShapes]] = EXPORTED_MODELS,
                  folder: Path | None = None) -> list[tuple[Path, InputShapes]]:
    """``(path, shapes)`` for the files of a list that exist on disk."""
    return [(model_path(f, folder), s) for f, s in which if model_path(f, folder).is_file()]


def absent_initializer(name: str, dims: Sequence[int]) -> onnx.TensorProto:
    """A float initializer whose data lives in an external file that does not exist (shape only)."""
    return external_ref(name, list(dims), "absent.bin")


def mlp_model(path: Path, d_in: int = 16, hidden: int = 32, d_out: int = 8, shape_only: bool = False) -> Path:
    """Save x[batch, d_in] -> MatMul -> Relu -> MatMul -> y[batch, d_out] (two Linears in a row)."""
    from onnx import TensorProto, helper, numpy_helper

    if shape_only:
        w1, w2 = absent_initializer("w1", [d_in, hidden]), absent_initializer("w2", [hidden, d_out])
    else:
        rng = np.random.default_rng(0)
        w1 = numpy_helper.from_array(rng.standard_normal((d_in, hidden)).astype(np.float32), "w1")
        w2 = numpy_helper.from_array(rng.standard_normal((hidden, d_out)).astype(np.float32), "w2")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
                           helper.make_node("Relu", ["h"], ["r"], name="relu"),
                           helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d_out])], [w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def shared_input_model(path: Path, batch: int = 64, d: int = 1024, hidden: int = 32768,
                       shape_only: bool = True) -> Path:
    """Save two Linears that share their input, concatenated, Relu, then a Linear back:
    y = Relu(Concat(x W1, x W2)) W3 (the shape of a gated or multi-branch MLP)."""
    from onnx import TensorProto, helper, numpy_helper

    shapes = {"w1": [d, hidden], "w2": [d, hidden], "w3": [2 * hidden, d]}
    if shape_only:
        inits = [absent_initializer(k, v) for k, v in shapes.items()]
    else:
        rng = np.random.default_rng(0)
        inits = [numpy_helper.from_array((rng.standard_normal(v) / np.sqrt(v[0])).astype(np.float32), k)
                 for k, v in shapes.items()]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="left"),
             helper.make_node("MatMul", ["x", "w2"], ["b"], name="right"),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=-1, name="concat"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w3"], ["y"], name="out")]
    g = helper.make_graph(nodes, "shared_input", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, d])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path
