"""Self-check of the ONNX test corpus: the zoo9 builders and the exported files."""

import numpy as np
import onnx
import pytest
from models.catalog import (
    EXPORTED_DIR,
    EXPORTED_MODELS,
    TINY_MODELS,
    TINY_MODELS_DIR,
    ZOO9_NAMES,
    random_feed,
    zoo9_model,
)
from models.zoo9 import check

ort = pytest.importorskip("onnxruntime")


def _session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3  # zoo9 lists initializers as inputs: ORT warns per tensor
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _dims(vi):
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("name", ZOO9_NAMES)
def test_zoo9_shape_only(name, tmp_path):
    m = zoo9_model(name)
    check(m, full_check=True)
    assert [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] == [9]
    assert m.graph.input[0].name == "data" and _dims(m.graph.input[0]) == ["N", 3, 224, 224]
    assert _dims(m.graph.output[0]) == ["N", 1000]
    inputs = {i.name for i in m.graph.input}
    assert all(t.name in inputs for t in m.graph.initializer)
    floats = [t for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert floats and all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data
                          for t in floats)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, path)
    assert path.stat().st_size < 1_000_000
    back = onnx.load(path, load_external_data=False)
    assert len(back.graph.node) == len(m.graph.node)


@pytest.mark.parametrize("name,batch", [("alexnet", 1), ("squeezenet1_1", 1),
                                        ("shufflenet", 1), ("shufflenet", 2),
                                        ("inception_v1", 1)])
def test_zoo9_runs_with_weights(name, batch):
    m = zoo9_model(name, with_weights=True)
    check(m)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    (y, *_) = _session(m).run(None, {"data": x})
    assert y.shape == (batch, 1000)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-4)


def _cases():
    for tag, folder, models in (("exported", EXPORTED_DIR, EXPORTED_MODELS),
                                ("tiny", TINY_MODELS_DIR, TINY_MODELS)):
        for filename, shapes in models:
            yield pytest.param(folder / filename, shapes, id=f"{tag}/{filename}")


@pytest.mark.parametrize("path,shapes", list(_cases()))
def test_exported_runs(path, shapes):
    assert path.is_file(), f"{path} is missing from the checkout"    # part of the repo: never skipped
    m = onnx.load(path)  # also pulls in <name>.onnx.data for dynamo files
    assert {i.name for i in m.graph.input} >= set(shapes)
    outs = _session(str(path)).run(None, random_feed(m, shapes))
    assert outs and outs[0].shape[0] == next(iter(shapes.values()))[0]
    assert all(np.isfinite(o).all() for o in outs if np.issubdtype(o.dtype, np.floating))
