"""ONNX import over the whole model corpus, with onnxruntime as the shape oracle.

Every corpus file (the tiny models, the exported TorchScript/dynamo files, the opset-9
zoo look-alikes) imports at the batch the catalog lists and, where its batch dim is
symbolic, at another batch; the output shapes match what onnxruntime computes. Files
with external weights also import without their ``.onnx.data`` (only shapes matter).
"""
from __future__ import annotations

import functools
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
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
from onnx import TensorProto, helper, numpy_helper

from unity_cli.errors import ModelError, UnsupportedOpError
from unity_cli.ir import DType
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import DEFAULT_BATCH, ImportOptions, import_model

OTHER_BATCH = 3
WEIGHTED_OPS = {"MatMul": 1, "Gemm": 1, "Conv": 1, "Gather": 0}  # op -> input position of its weight


def _cases():
    for tag, folder, models in (("tiny", TINY_MODELS_DIR, TINY_MODELS),
                                ("exported", EXPORTED_DIR, EXPORTED_MODELS)):
        for filename, shapes in models:
            yield pytest.param(tag, folder / filename, shapes, id=f"{tag}/{filename}")


CASES = list(_cases())
DYNAMO_CASES = [c for c in CASES if "_dynamo" in c.id]  # the dynamo exporter writes weights to .onnx.data


def _need(tag: str, path: Path, request: pytest.FixtureRequest) -> None:
    """Every corpus file is part of the repo: a missing one fails, never skips."""
    assert path.is_file(), f"{tag} model {path} is missing from the checkout"


def _header(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def _symbolic_batch(model: onnx.ModelProto) -> bool:
    inits = {t.name for t in model.graph.initializer}
    return any(not i.type.tensor_type.shape.dim[0].HasField("dim_value")
               for i in model.graph.input if i.name not in inits)


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


@functools.cache
def _session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _at_batch(shapes: dict[str, list[int]], batch: int) -> dict[str, list[int]]:
    return {name: [batch, *dims[1:]] for name, dims in shapes.items()}


def _output_dims(imported) -> list[tuple[int, ...]]:
    return [imported.pcg.shape(r).logical.dims for r in imported.pcg.outputs]


# -- the corpus ------------------------------------------------------------------


@pytest.mark.parametrize("tag,path,shapes", CASES)
def test_output_shapes_match_onnxruntime(tag, path, shapes, request):
    _need(tag, path, request)
    header = _header(path)
    batches = [next(iter(shapes.values()))[0]]
    if _symbolic_batch(header):
        batches.append(OTHER_BATCH)
    for batch in batches:
        feed_shapes = _at_batch(shapes, batch)
        imported = import_model(path, ImportOptions(batch))
        validate(imported.pcg)
        assert {k: list(v.dims) for k, v in imported.inputs.items()} == feed_shapes
        assert imported.batch_size == batch and not imported.batch_defaulted
        sess = _session(str(path))
        got = sess.run(None, random_feed(header, feed_shapes, seed=batch))
        assert imported.outputs == [o.name for o in sess.get_outputs()]
        assert _output_dims(imported) == [tuple(o.shape) for o in got], f"batch {batch}"
        dtypes = [imported.pcg.shape(r).dtype for r in imported.pcg.outputs]
        assert dtypes == [DType.from_numpy(o.dtype) for o in got]


@pytest.mark.parametrize("tag,path,shapes", DYNAMO_CASES)
def test_import_without_external_data(tag, path, shapes, request, tmp_path):
    _need(tag, path, request)
    assert _has_external_data(_header(path))
    alone = tmp_path / path.name
    shutil.copyfile(path, alone)
    assert not (tmp_path / f"{path.name}.data").exists()
    batch = next(iter(shapes.values()))[0]
    full = import_model(path, ImportOptions(batch))
    bare = import_model(alone, ImportOptions(batch))
    validate(bare.pcg)
    assert _output_dims(bare) == _output_dims(full)
    assert bare.inputs == full.inputs
    # Without values, a constant can only look trainable, never the other way round.
    assert set(full.weights) <= set(bare.weights)
    assert bare.sha256 == full.sha256  # the model hash covers the .onnx file, not its weights


@pytest.mark.parametrize("tag,path,shapes", CASES)
def test_trainable_weights(tag, path, shapes, request):
    _need(tag, path, request)
    header = _header(path)
    imported = import_model(path, ImportOptions(next(iter(shapes.values()))[0]))
    pcg = imported.pcg
    trainable = {n.name for _, n in pcg if isinstance(n.op, WeightAttrs) and n.op.trainable}
    assert trainable == set(imported.weights)
    assert trainable, "a model with weights has trainable weights"
    for _, n in pcg:
        if isinstance(n.op, WeightAttrs) and n.op.trainable:
            assert n.op.shape.dtype.is_float, f"{n.name} is {n.op.shape.dtype.value} but trainable"
        if isinstance(n.op, WeightAttrs) and not n.op.shape.dtype.is_float:
            assert not n.op.trainable
    # The weight of every MatMul/Gemm/Conv and every embedding table read by Gather.
    inits = {t.name: t for t in header.graph.initializer}
    for node in header.graph.node:
        pos = WEIGHTED_OPS.get(node.op_type)
        if pos is None or len(node.input) <= pos or node.input[pos] not in inits:
            continue
        t = inits[node.input[pos]]
        if t.data_type == TensorProto.FLOAT and len(t.dims) >= 2:
            assert t.name in trainable, f"{node.op_type} {node.name}: weight {t.name} is not trainable"


def test_bert_tiny_weights(tiny_models):
    path = tiny_models / "bert_tiny.onnx"
    imported = import_model(path, ImportOptions(4))
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    tables = {n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits}
    assert {"m.embeddings.word_embeddings.weight", "m.embeddings.position_embeddings.weight",
            "m.embeddings.token_type_embeddings.weight"} <= tables
    matmul = {n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    assert len(matmul) == 12  # 2 layers x (q, k, v, out, fc1, fc2)
    weights = set(imported.weights)
    assert tables <= weights and matmul <= weights
    assert all(inits[w].data_type == TensorProto.FLOAT for w in weights)
    n_params = sum(math.prod(inits[w].dims) for w in weights)
    assert n_params == sum(n.op.shape.numel for _, n in imported.pcg
                           if isinstance(n.op, WeightAttrs) and n.op.trainable)


def test_constant_folding_keeps_the_source_ir_version(tiny_models, monkeypatch):
    """An onnxruntime older than the onnx package reads only older IR versions: the
    one-node models that fold constants must carry the source model's IR version, or
    every fold falls to the reference evaluator (whose GatherElements fails on bert_tiny's
    512-long position axis: onnxruntime 1.30 with onnx 1.23 did exactly this)."""
    from unity_cli.onnx_import import convert  # noqa: PLC0415

    path = tiny_models / "bert_tiny.onnx"
    source_ir = onnx.load(str(path), load_external_data=False).ir_version
    run_ort, seen = convert._run_ort, []

    def old_runtime(model, feeds):
        seen.append(model.ir_version)
        if model.ir_version > source_ir:
            raise RuntimeError(f"Unsupported model IR version: {model.ir_version}")
        return run_ort(model, feeds)

    monkeypatch.setattr(convert, "_run_ort", old_runtime)
    monkeypatch.setattr(convert, "_FOLDED", convert._Folded(convert.FOLD_CACHE_BYTES))   # folded afresh
    import_model(path, ImportOptions(4))
    assert seen and set(seen) == {source_ir}


def test_a_constant_is_folded_once_per_process_and_each_by_its_own_values(tmp_path, monkeypatch):
    """A search imports a model at several batch sizes, and an LLM's layers fold the same
    mask alike: a constant node is evaluated once per thing it computes. Two nodes of one
    op on different values, or one node read at another opset, are evaluated each."""
    from unity_cli.onnx_import import convert  # noqa: PLC0415

    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)
    nodes = [helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(a)),
             helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(b)),
             helper.make_node("Mul", ["a", "a"], ["a2"]), helper.make_node("Mul", ["b", "b"], ["b2"]),
             helper.make_node("Mul", ["a", "a"], ["a2_again"], name="same_as_a2"),
             helper.make_node("Add", ["x", "a2"], ["y"]), helper.make_node("Add", ["y", "b2"], ["y2"]),
             helper.make_node("Add", ["y2", "a2_again"], ["z"])]
    graph = helper.make_graph(nodes, "folds", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 2])])
    runs: list[tuple[str, list]] = []
    run_ort = convert._run_ort

    def counted(model, feeds):
        runs.append((model.graph.node[0].op_type, [v.tolist() for v in feeds.values()]))
        return run_ort(model, feeds)

    monkeypatch.setattr(convert, "_run_ort", counted)
    monkeypatch.setattr(convert, "_FOLDED", convert._Folded(convert.FOLD_CACHE_BYTES))
    for opset in (17, 18):
        path = tmp_path / f"folds{opset}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
        for batch in (2, 4):
            imported = import_model(path, ImportOptions(batch))
            assert imported.folded == 5     # the two Constants and the three products
            values = {k: v.tolist() for k, v in imported.constants.items()}
            assert sorted(values.values()) == [[1.0, 4.0], [1.0, 4.0], [9.0, 25.0]]
    # each Constant, a*a and b*b once at each opset: a2_again and the second batch size found folded
    assert runs == [("Constant", []), ("Constant", []), ("Mul", [[1.0, 2.0]]),
                    ("Mul", [[3.0, 5.0]])] * 2


@pytest.mark.parametrize("filename", ["convnet_tiny.onnx", "convnet_tiny_dynamo.onnx"])
def test_convnet_tiny_weights(tiny_models, filename):
    imported = import_model(tiny_models / filename, ImportOptions(4))
    shapes = sorted(n.op.shape.dims for _, n in imported.pcg if isinstance(n.op, WeightAttrs) and n.op.trainable)
    # conv 3->16 (3x3) + bias, conv 16->32 (3x3) + bias, linear 32->10 + bias
    assert shapes == sorted([(16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 32), (10,)])
    assert len(imported.weights) == 6 and not imported.constants


def test_every_file_of_the_corpus_dirs_imports(tiny_models):
    files = sorted(tiny_models.glob("*.onnx")) + sorted(EXPORTED_DIR.glob("*.onnx"))
    assert files
    for path in files:
        imported = import_model(path)  # symbolic batch dims get the default batch
        validate(imported.pcg)
        if imported.batch_defaulted:
            assert imported.batch_size == DEFAULT_BATCH


@pytest.mark.parametrize("name", ZOO9_NAMES)
def test_zoo9_shape_only(name, tmp_path):
    model = zoo9_model(name)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    assert not (tmp_path / f"{name}.weights.bin").exists()
    for batch in (1, OTHER_BATCH):
        imported = import_model(path, ImportOptions(batch))
        validate(imported.pcg)
        assert {k: v.dims for k, v in imported.inputs.items()} == {"data": (batch, 3, 224, 224)}
        assert _output_dims(imported) == [(batch, 1000)]
    # Initializers are listed as graph inputs too; they stay weights, not inputs.
    inputs = [n for _, n in imported.pcg if isinstance(n.op, InputAttrs)]
    assert [n.name for n in inputs] == ["data"]
    inits = {t.name: t for t in model.graph.initializer}
    trainable = set(imported.weights)
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm"):
            assert node.input[1] in trainable
    assert not any(inits[w].data_type != TensorProto.FLOAT for w in trainable if w in inits)


# -- options and their errors ----------------------------------------------------------


def _save(tmp_path: Path, graph: onnx.GraphProto, name: str = "m.onnx", opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _mlp(tmp_path: Path, dims=("batch", 8)) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "mlp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return _save(tmp_path, g)


def test_input_overrides_shape(tiny_models):
    path = tiny_models / "bert_tiny.onnx"
    imported = import_model(path, ImportOptions(None, {"input_ids": (2, 32)}))
    assert imported.inputs["input_ids"].dims == (2, 32)
    assert _output_dims(imported) == [(2, 32, 64)]
    assert imported.batch_size == 2 and not imported.batch_defaulted
    # --input wins over --batch-size for the input it names.
    imported = import_model(path, ImportOptions(8, {"input_ids": (2, 16)}))
    assert imported.inputs["input_ids"].dims == (2, 16)
    assert _output_dims(imported) == [(2, 16, 64)]


def test_input_override_sets_the_batch_of_the_other_inputs():
    path = EXPORTED_DIR / "dlrm_tiny.onnx"
    imported = import_model(path, ImportOptions(None, {"dense": (5, 13)}))
    assert imported.inputs["sparse"].dims == (5, 3)
    assert _output_dims(imported) == [(5, 1)]
    assert not imported.batch_defaulted


def test_symbolic_batch_defaults(tmp_path):
    imported = import_model(_mlp(tmp_path))
    assert imported.batch_defaulted and imported.batch_size == DEFAULT_BATCH
    assert imported.inputs["x"].dims == (DEFAULT_BATCH, 8)


def test_unknown_input_name(tmp_path):
    path = _mlp(tmp_path)
    with pytest.raises(ModelError, match="nope") as e:
        import_model(path, ImportOptions(None, {"nope": (2, 8)}))
    assert str(path) in str(e.value) and "inputs: x" in str(e.value)


def test_input_of_the_wrong_rank(tmp_path):
    path = _mlp(tmp_path)
    with pytest.raises(ModelError, match=r"--input x: .*2 dims, got 3"):
        import_model(path, ImportOptions(None, {"x": (2, 8, 1)}))


def test_symbolic_non_batch_dim_needs_input(tmp_path):
    path = _mlp(tmp_path, dims=("batch", "features"))
    with pytest.raises(ModelError) as e:
        import_model(path, ImportOptions(2))
    msg = str(e.value)
    assert "'x'" in msg and "dim 1" in msg and "features" in msg and "--input x=" in msg
    imported = import_model(path, ImportOptions(None, {"x": (2, 8)}))
    assert _output_dims(imported) == [(2, 4)]


@pytest.mark.parametrize("op,domain", [("Det", ""), ("FancyOp", "com.example")])
def test_unsupported_op_names_node_and_op(tmp_path, op, domain):
    node = helper.make_node(op, ["x"], ["y"], name="the_culprit", domain=domain)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    path = tmp_path / "u.onnx"
    onnx.save(helper.make_model(g, opset_imports=opsets), str(path))
    with pytest.raises(UnsupportedOpError) as e:
        import_model(path)
    msg = str(e.value)
    assert "the_culprit" in msg and op in msg and str(path) in msg


def test_same_file_twice_same_hash(tiny_models, tmp_path):
    path = tiny_models / "bert_tiny.onnx"
    a = import_model(path, ImportOptions(4))
    b = import_model(path, ImportOptions(4))
    assert a.pcg.canonical_hash == b.pcg.canonical_hash
    assert a.pcg == b.pcg
    copy = tmp_path / "elsewhere.onnx"
    shutil.copyfile(path, copy)
    assert import_model(copy, ImportOptions(4)).pcg.canonical_hash == a.pcg.canonical_hash
    assert import_model(path, ImportOptions(8)).pcg.canonical_hash != a.pcg.canonical_hash


@pytest.mark.parametrize("tag,path,shapes", CASES)
def test_canonical_hash_is_stable(tag, path, shapes, request):
    _need(tag, path, request)
    batch = next(iter(shapes.values()))[0]
    assert import_model(path, ImportOptions(batch)).pcg.canonical_hash == \
        import_model(path, ImportOptions(batch)).pcg.canonical_hash
