"""Training the models people train today on 2 ranks: ``mpiexec -n 2 unity run --check``
matches one process for a decoder LLM, BERT with a padding mask, a vision model and the
Mixtral-like MoE (router TopK + softmax, experts gathered and batched), under data and
tensor parallelism.

SGD keeps the check about parallelization: Adam's first step is ``lr * sign(g)``, so a
gradient near zero flips an update on float32 reordering alone (issue 16's subject).
"""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from models.hf_corpus import HFModel, hf_models
from runtime.mpirun import SPECS, run_json

from unity_cli.cli import cli

MODELS = {m.file: m for m in hf_models()}
CASES = [
    ("llama_torchscript.onnx", "data_parallel"),
    ("llama_dynamo.onnx", "tensor_parallel"),
    ("bert_dynamo.onnx", "data_parallel"),
    ("bert_torchscript.onnx", "tensor_parallel"),
    ("vit_torchscript.onnx", "tensor_parallel"),
    ("swin_dynamo.onnx", "data_parallel"),
    ("mixtral_torchscript.onnx", "data_parallel"),
    ("mixtral_torchscript.onnx", "tensor_parallel"),
    ("mixtral_dynamo.onnx", "tensor_parallel"),
]


def _plan(m: HFModel, strategy: str, tmp_path) -> str:
    out = tmp_path / f"{m.file}-{strategy}.json"
    args = ["optimize", str(m.path), "--cluster", str(SPECS / "local-cpu.yaml"), "--strategy", strategy,
            "--out", str(out)]
    for name, dims in m.inputs.items():
        args += ["--input", f"{name}={','.join(map(str, dims))}"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return str(out)


@pytest.mark.parametrize("file,strategy", CASES, ids=[f"{f.removesuffix('.onnx')}-{s}" for f, s in CASES])
def test_hf_model_trains_like_one_process(file, strategy, tmp_path):
    if file not in MODELS:
        pytest.skip(f"{file} is not in the corpus")
    plan = _plan(MODELS[file], strategy, tmp_path)
    doc = run_json(plan, "--check", "--steps", "2", "--optimizer", "sgd", "--lr", "0.05", timeout=240)
    assert doc["check"]["passed"], doc["check"]
    assert doc["ranks"] == 2 and len(doc["loss"]) == 2
    assert all(x == x for x in doc["loss"])
