"""The models people train today, as both torch exporters write them (``tests/models/hf/``):
decoders (Llama, Mistral, Qwen2, Phi, GPT-NeoX), a Mixtral-like MoE, T5, BERT with a
padding mask, ViT, ConvNeXt, Swin and Whisper.

Every file imports, computes what onnxruntime computes (at its exported batch and, where
the batch is dynamic, at another), and plans on ``dgx-a100-8``; the files unity refuses
on purpose are refused in one line that says why.
"""
from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from models.hf_corpus import REFUSED, HFModel, hf_models

from unity_cli.cli import cli
from unity_cli.errors import UnsupportedOpError
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.backend import UnityBackend

MODELS = hf_models()
PLANNED = [m for m in MODELS if m.file not in REFUSED]
FAMILIES = {"llama", "mistral", "qwen2", "phi", "gpt_neox", "mixtral", "t5", "bert", "vit", "convnext", "swin",
            "whisper"}


def _id(m: HFModel) -> str:
    return m.file.removesuffix(".onnx")


@functools.cache
def _session(path: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def test_the_corpus_covers_every_family_with_both_exporters():
    assert {(m.family, m.exporter) for m in PLANNED} >= {(f, e) for f in FAMILIES for e in ("torchscript", "dynamo")}
    assert set(REFUSED) <= {m.file for m in MODELS}
    assert WHOLE_STEP_SEARCH <= {m.file for m in PLANNED}


@pytest.mark.parametrize("m", PLANNED, ids=_id)
def test_forward_matches_onnxruntime(m: HFModel):
    model = onnx.load(str(m.path))
    batches = [m.batch] + ([3] if m.exporter == "torchscript" else [])   # dynamo files are static
    for batch in batches:
        feed = m.feed(batch, seed=batch)
        imported = import_model(m.path, ImportOptions(input_shapes={k: v.shape for k, v in feed.items()}))
        validate(imported.pcg)
        want = _session(str(m.path)).run(None, feed)
        got = UnityBackend.prepare(model).run(feed)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, f"batch {batch}"
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"batch {batch}")


@pytest.mark.parametrize("file,word", sorted(REFUSED.items()))
def test_refused_files_say_why_in_one_line(file, word):
    m = next(m for m in MODELS if m.file == file)
    with pytest.raises(UnsupportedOpError) as e:
        import_model(m.path, ImportOptions(m.batch))
    msg = str(e.value)
    assert word in msg and "depends on the values" in msg and "\n" not in msg


WHOLE_STEP_SEARCH = {"llama_dynamo.onnx", "whisper_torchscript.onnx"}
"""The files planned with default options: the step's shape searched too (ZeRO stage,
micro-batches, recomputation: ``search/step.py``, a sweep that reads the graph the same way
whatever the model); the others are planned at one step shape, where the searches
(rewrites, the solver, the mapping) still walk every graph."""


@pytest.mark.parametrize("m", PLANNED, ids=_id)
def test_plans_on_dgx_a100_8(m: HFModel, cluster_dir, tmp_path):
    out = tmp_path / "plan.json"
    shapes = [f"{k}={','.join(map(str, v))}" for k, v in m.inputs.items()]
    args = ["optimize", str(m.path), "--cluster", str(cluster_dir / "dgx-a100-8.yaml"), "--out", str(out),
            "--max-candidates", "10", "--json"]
    if m.file not in WHOLE_STEP_SEARCH:
        args += ["--zero", "0", "--micro-batches", "1", "--recompute", "none"]
    for s in shapes:
        args += ["--input", s]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["predicted"]["feasible"] and plan["predicted"]["step_time_ms"] > 0
