"""onnx's own "light" model zoo (AlexNet, VGG-19, ZFNet-512, SqueezeNet, ResNet-50, ...), as
the onnx wheel ships it: every weight is a ``ConstantOfShape`` fill, so the files are small.

Each imports, its fills become trainable weights that take no memory until a run
materializes them, and the small ones compute what onnxruntime computes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.backend import UnityBackend

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.name for p in LIGHT.glob("light_*.onnx")) if LIGHT.is_dir() else []
FORWARD = {"light_bvlc_alexnet.onnx", "light_squeezenet.onnx", "light_zfnet512.onnx", "light_resnet50.onnx"}

pytestmark = pytest.mark.skipif(not MODELS, reason="this onnx wheel ships no light models")


@pytest.mark.parametrize("name", MODELS)
def test_light_model_imports_with_its_fills_as_weights(name):
    path = LIGHT / name
    model = onnx.load(str(path))
    imported = import_model(path, ImportOptions())  # their batch of 1 is baked into Reshapes
    validate(imported.pcg)
    (out,) = imported.pcg.outputs
    assert imported.pcg.shape(out).logical.dims[:2] == (1, 1000)
    params = {n.input[k] for n in model.graph.node for k in (1, 2)
              if n.op_type in ("Conv", "Gemm") and k < len(n.input)}
    fills = {o for n in model.graph.node if n.op_type == "ConstantOfShape" for o in n.output}
    assert params & fills and params & fills <= set(imported.weights)
    # Made weights are broadcast views: VGG-19's 143M parameters cost nothing at import.
    assert sum(v.base.nbytes if v.base is not None else v.nbytes
               for v in imported.weight_values.values()) < 1 << 20


@pytest.mark.parametrize("name", sorted(FORWARD & set(MODELS)))
def test_light_model_forward_matches_onnxruntime(name):
    path = LIGHT / name
    model = onnx.load(str(path))
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {_data_input(model): x})
    got = UnityBackend.prepare(model).run([x])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def _data_input(model: onnx.ModelProto) -> str:
    inits = {t.name for t in model.graph.initializer}
    return next(i.name for i in model.graph.input if i.name not in inits)
