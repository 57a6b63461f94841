"""The model zoo (``unity zoo``): the Unity paper's seven DNNs at paper scale (structure,
parameter counts, import without weights) and small scale (onnxruntime and unity's
backend compute the same outputs), and the command's listing and errors."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from unity_cli import zoo
from unity_cli.cli import cli as main
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.backend import UnityBackend
from unity_cli.zoo.net import WeightMode, Weights

NAMES = list(zoo.MODELS)


@pytest.fixture(scope="module")
def paper() -> dict[str, zoo.Built]:
    """Every model at paper scale, shape-only, built once for the module."""
    return {n: zoo.build(n, "paper") for n in NAMES}


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _attr(node: onnx.NodeProto, name: str):
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def _inits(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {t.name: list(t.dims) for t in model.graph.initializer}


# -- paper scale -------------------------------------------------------------------

@pytest.mark.parametrize("name, published", [("resnext-50", 25.03e6), ("bert-large", 335e6),
                                             ("inception-v3", 23.83e6)])
def test_parameter_counts_match_the_published_ones(paper, name, published):
    assert paper[name].params == pytest.approx(published, rel=0.02)


def test_parameter_counts_of_the_flexflow_configurations(paper):
    tables = 8 * 1_000_000 * 64
    assert tables < paper["dlrm"].params < tables * 1.01
    assert 4 * 1_000_000 * 64 < paper["xdl"].params < 4 * 1_000_000 * 64 * 1.001
    assert paper["mlp"].params == 2 * (1024 * 8192 + 7 * 8192 * 8192)
    towers = 942 + 2 * 5270 + 2 * 2048    # first layers of the five towers, then 7 more each
    dense = (5 * 4192 + 2) * 4192 + 3 * 4192 * 4192 + 4192
    assert paper["candle-uno"].params == towers * 4192 + 5 * 7 * 4192 * 4192 + dense


def test_weights_are_external_references_and_the_batch_is_symbolic(paper):
    for name, built in paper.items():
        floats = [t for t in built.model.graph.initializer if t.data_type == TensorProto.FLOAT and t.dims]
        assert floats and all(t.data_location == TensorProto.EXTERNAL and not t.raw_data for t in floats), name
        assert built.model.ByteSize() < 1 << 20, name       # shapes only: no weight data inside
        for vi in built.model.graph.input:
            assert vi.type.tensor_type.shape.dim[0].dim_param == "N", (name, vi.name)


def test_resnext_has_grouped_bottlenecks(paper):
    m = paper["resnext-50"].model
    grouped = [n for n in m.graph.node if n.op_type == "Conv" and _attr(n, "group") != 1]
    assert len(grouped) == 3 + 4 + 6 + 3 and all(_attr(n, "group") == 32 for n in grouped)
    inits = _inits(m)
    assert inits["layer1.0.conv2.conv.weight"] == [128, 4, 3, 3]     # 32 groups x 4 channels
    assert _ops(m)["BatchNormalization"] == 1 + 3 * 16 + 4 and _ops(m)["Add"] == 16 + 1
    assert m.graph.input[0].type.tensor_type.shape.dim[2].dim_value == 224


def test_bert_large_has_24_layers_of_16_heads(paper):
    m = paper["bert-large"].model
    ops = _ops(m)
    assert ops["Softmax"] == 24 and ops["Gelu"] == 24 and ops["LayerNormalization"] == 2 * 24 + 1
    heads = {tuple(numpy_helper.to_array(t)) for t in m.graph.initializer if t.name.endswith("split_heads")}
    assert heads == {(0, 0, 16, 64)}
    inits = _inits(m)
    assert inits["embeddings.word_embeddings.weight"] == [30522, 1024]
    assert inits["encoder.layer.23.intermediate.weight"] == [1024, 4096]
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim[1:]] == [512]


def test_inception_v3_has_its_modules(paper):
    m = paper["inception-v3"].model
    modules = {n.name for n in m.graph.node if n.op_type == "Concat" and n.name.startswith("Mixed_")
               and "." not in n.name}
    assert modules == {"Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
                       "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c"}
    kernels = Counter(tuple(_attr(n, "kernel_shape")) for n in m.graph.node if n.op_type == "Conv")
    assert kernels[(1, 7)] and kernels[(7, 1)] and kernels[(1, 3)] and kernels[(3, 1)]
    assert m.graph.input[0].type.tensor_type.shape.dim[2].dim_value == 299


def test_recommendation_and_dense_models_structure(paper):
    dlrm, xdl = _inits(paper["dlrm"].model), _inits(paper["xdl"].model)
    assert sorted(k for k, v in dlrm.items() if v == [1_000_000, 64]) == [f"emb_{t}.weight" for t in range(8)]
    upper = next(t for t in paper["dlrm"].model.graph.initializer if t.name == "interaction.upper")
    assert len(numpy_helper.to_array(upper)) == 9 * 8 // 2       # pairs of 8 embeddings + the bottom MLP
    assert _ops(paper["dlrm"].model)["Sigmoid"] == 1
    assert sum(v == [1_000_000, 64] for v in xdl.values()) == 4
    mlp = _inits(paper["mlp"].model)
    assert sum(v == [8192, 8192] for v in mlp.values()) == 2 * 7
    candle = _inits(paper["candle-uno"].model)
    assert sum(v[1:] == [4192] for v in candle.values()) == 5 * 8 + 4
    assert len(paper["candle-uno"].model.graph.input) == 7


@pytest.mark.parametrize("name", NAMES)
def test_paper_scale_imports_without_weights(paper, name, tmp_path):
    path = tmp_path / f"{name}.onnx"
    onnx.save(paper[name].model, str(path))
    imported = import_model(path, ImportOptions(2))
    assert imported.batch_size == 2
    numel = sum(n.op.shape.numel for _, n in imported.pcg if n.name in imported.weights)
    assert 0 <= paper[name].params - numel <= 1      # the importer keeps a one-element bias as a constant


def test_batch_size_fixes_the_batch_dim():
    m = zoo.build("bert-large", "paper", batch_size=3).model
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [3, 512]


# -- small scale -------------------------------------------------------------------

def _feeds(model: onnx.ModelProto, batch: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        dims = [batch if d.dim_param else d.dim_value for d in tt.shape.dim]
        if tt.elem_type == TensorProto.INT64:
            feeds[vi.name] = rng.integers(0, 30, dims).astype(np.int64)   # every small table has >= 30 rows
        else:
            feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def _ort(model: onnx.ModelProto | str, feeds) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", NAMES)
def test_small_scale_runs_the_same_in_onnxruntime_and_unity(name, tmp_path):
    path = tmp_path / f"{name}.onnx"
    built, data = zoo.write(name, path, "small", weights=True)
    assert data is None and not path.with_name(path.name + ".data").exists()
    onnx.checker.check_model(built.model, full_check=True)
    assert built.params < 100_000
    feeds = _feeds(built.model)
    expected = _ort(str(path), feeds)
    got = UnityBackend.prepare(onnx.load(str(path))).run(feeds)
    for e, g in zip(expected, got):
        assert np.all(np.isfinite(e)) and np.abs(e).max() > 0
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(e).max())))
    assert len(import_model(path, ImportOptions(4)).pcg) > 10


def test_streamed_external_weights_equal_inline_ones(tmp_path):
    """The EXTERNAL mode (what --weights does at paper scale) writes the same seeded values."""
    path = tmp_path / "mlp.onnx"
    with open(tmp_path / "mlp.onnx.data", "wb") as sink:
        external = zoo.build("mlp", "small", weights=Weights(WeightMode.EXTERNAL, "mlp.onnx.data", sink)).model
    onnx.save(external, str(path))
    inline = zoo.build("mlp", "small", weights=Weights(WeightMode.INLINE)).model
    feeds = _feeds(inline)
    np.testing.assert_array_equal(_ort(str(path), feeds)[0], _ort(inline, feeds)[0])


def test_a_stale_data_file_is_removed_when_no_weights_are_written(tmp_path):
    path = tmp_path / "xdl.onnx"
    stale = tmp_path / "xdl.onnx.data"
    stale.write_bytes(b"left by an earlier --weights run")
    built, data = zoo.write("xdl", path, "paper")
    assert data is None and not stale.exists()
    assert import_model(path, ImportOptions(2)).weights


# -- the command -------------------------------------------------------------------

def _invoke(args: list[str]):
    return CliRunner().invoke(main, args)


def test_list_names_every_model_with_its_parameters():
    r = _invoke(["zoo", "--list"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == NAMES
    assert "25.0M" in lines[0] and "335.1M" in lines[1]


def test_zoo_writes_the_model(tmp_path):
    out = tmp_path / "m.onnx"
    r = _invoke(["zoo", "DLRM", "--out", str(out), "--scale", "small", "--batch-size", "5"])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output and "weights inline" in r.output
    assert import_model(out).batch_size == 5


@pytest.mark.parametrize("args, message", [
    (["zoo", "resnet"], "unknown zoo model 'resnet'; did you mean 'resnext-50'?"),
    (["zoo", "bert", "--scale", "small"], "did you mean 'bert-large'?"),
    (["zoo", "mlp", "--scale", "tiny"], "--scale: unknown scale 'tiny' (choose from paper, small)"),
    (["zoo", "mlp", "--batch-size", "0"], "--batch-size must be an integer >= 1 and <= 2147483647, got 0"),
    (["zoo", "mlp", "--out", "/no/such/dir/m.onnx"], "directory /no/such/dir does not exist"),
    (["zoo"], "give a model NAME"),
])
def test_errors_are_one_line_and_exit_1(args, message):
    r = _invoke(args)
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and r.output.startswith("error: ") and message in r.output, r.output
    assert "Traceback" not in r.output


def test_paper_model_files_are_small_without_weights(tmp_path):
    out = tmp_path / "bert.onnx"
    r = _invoke(["zoo", "bert-large", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "shape-only" in r.output and out.stat().st_size < 1 << 20
    assert not Path(str(out) + ".data").exists()
    assert math.isclose(zoo.paper_parameters("bert-large"), 335_143_938, rel_tol=0)
