"""`unity run` options: --json, --save, --data, --optimizer, --loss, --lr, the summary."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import numpy_helper
from runtime.mpirun import run_json, unity_run

from unity_cli.cli import cli


def test_json_fields(plans):
    doc = run_json(plans.get("convnet_tiny", "data_parallel", 2), "--steps", "3", "--check")
    for key in ("steps", "loss", "measured_step_time_ms", "predicted_step_time_ms", "ratio", "check"):
        assert key in doc
    assert doc["steps"] == 3 and len(doc["loss"]) == 3 and len(doc["step_times_ms"]) == 3
    assert doc["measured_step_time_ms"] > 0 and doc["predicted_step_time_ms"] > 0
    assert doc["ratio"] == pytest.approx(doc["measured_step_time_ms"] / doc["predicted_step_time_ms"])
    assert set(doc["check"]) >= {"passed", "max_rel_err"}
    assert doc["optimizer"] == "adam"               # the plan's optimizer
    assert doc["loss_kind"] == "cross_entropy"      # [batch, 10] logits from a Gemm


def test_summary_on_rank_0_only(plans):
    r = unity_run(plans.get("convnet_tiny", "data_parallel", 2), "--steps", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ms per step measured") == 1
    assert "predicted" in r.stdout and "measured / predicted" in r.stdout
    head, measured, predicted = [line.split() for line in r.stdout.splitlines()
                                 if line.split()[:1] in (["phases"], ["measured"], ["predicted"])]
    assert head[:3] == ["phases", "ms/step", "fwd"] and len(measured) == 10 and predicted[8:] == ["-", "-"]


@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
def test_phases_measured_and_predicted(plans, strategy):
    """Per phase: measured (mean over ranks) beside the cost model's (mean over devices).
    Data parallelism all-reduces gradients and moves little in forward; tensor parallelism
    moves activations in forward and backward."""
    doc = run_json(plans.get("bert_tiny", strategy, 2), "--steps", "4")
    measured, predicted = doc["phases_ms"]["measured"], doc["phases_ms"]["predicted"]
    assert set(measured) == {"fwd_compute", "fwd_comm", "loss", "bwd_compute", "bwd_comm", "grad_sync",
                             "optimizer", "waiting", "other"}
    assert set(predicted) == set(measured) - {"waiting", "other"}
    assert all(v >= 0 for v in [*measured.values(), *predicted.values()])
    assert measured["fwd_compute"] > 0 and measured["bwd_compute"] > 0 and measured["optimizer"] > 0
    assert sum(measured.values()) <= 1.5 * max(doc["step_times_ms"][1:])
    if strategy == "data_parallel":
        # (forward, data parallelism moves only a batch slice of a replicated embedding and the loss value)
        assert predicted["fwd_comm"] < predicted["grad_sync"] and measured["grad_sync"] > 0
    else:
        assert predicted["fwd_comm"] > 0 and measured["fwd_comm"] > 0


def test_save_writes_trained_weights(plans, tmp_path):
    out = tmp_path / "trained.onnx"
    doc = run_json(plans.get("convnet_tiny", "tensor_parallel", 2), "--steps", "2", "--save", str(out),
                   "--optimizer", "sgd", "--lr", "0.1")
    assert doc["saved"] == str(out)
    before = {t.name: numpy_helper.to_array(t) for t in onnx.load(plans.model("convnet_tiny")).graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert set(after) == set(before)
    changed = [n for n in before if before[n].shape == after[n].shape and not np.allclose(before[n], after[n])]
    assert "head.weight" in changed and len(changed) >= 4
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    assert y.shape == (4, 10) and np.isfinite(y).all()


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_each_optimizer_matches_one_process(plans, optimizer):
    doc = run_json(plans.get("bert_tiny", "tensor_parallel", 2), "--steps", "2", "--check", "--optimizer", optimizer)
    assert doc["optimizer"] == optimizer and doc["check"]["passed"], doc["check"]


def test_each_loss_matches_one_process(plans):
    plan = plans.get("convnet_tiny", "tensor_parallel", 2)
    for loss in ("mse", "cross_entropy"):
        doc = run_json(plan, "--steps", "2", "--check", "--loss", loss)
        assert doc["loss_kind"] == loss and doc["check"]["passed"], doc["check"]
    doc = run_json(plans.get("bert_tiny", "data_parallel", 2), "--steps", "1")
    assert doc["loss_kind"] == "mse"                 # hidden states, not logits


def test_data_npz(plans, tmp_path):
    """Two batches of real data, integer labels (so cross entropy), cycled over 3 steps."""
    rng = np.random.default_rng(3)
    data = tmp_path / "data.npz"
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    labels = rng.integers(0, 10, size=8)
    np.savez(data, x=x, labels=labels)
    plan = plans.get("convnet_tiny", "data_parallel", 2)
    doc = run_json(plan, "--steps", "3", "--data", str(data), "--check", "--optimizer", "sgd", "--lr", "0")
    assert doc["loss_kind"] == "cross_entropy" and doc["check"]["passed"]
    assert doc["loss"][0] == pytest.approx(doc["loss"][2], rel=1e-5)    # lr 0: batch 0 again at step 2
    assert doc["loss"][0] != pytest.approx(doc["loss"][1], rel=1e-5)
    np.savez(data, x=x[:4], labels=rng.standard_normal((4, 10)).astype(np.float32))
    assert run_json(plan, "--steps", "1", "--data", str(data))["loss_kind"] == "mse"
    np.savez(data, x=x[:3], labels=labels[:3])
    r = unity_run(plan, "--data", str(data))
    assert r.returncode != 0 and "'x' has shape [3, 3, 16, 16]" in r.stderr


def test_model_without_weight_data_trains_from_random_weights(plans, tmp_path):
    """The dynamo export keeps its weights in a .onnx.data file; without it, unity run warns and
    starts from seeded random weights (and --check still holds)."""
    model = tmp_path / "convnet_tiny_dynamo.onnx"
    shutil.copy(plans.model("convnet_tiny_dynamo"), model)
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(plans.specs[2]), "--batch-size", "4",
                                 "--strategy", "data_parallel", "--out", str(plan)])
    assert r.exit_code == 0, r.output
    r = unity_run(plan, "--steps", "2", "--check", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning:") == 1 and "initialized randomly" in r.stderr
    doc = json.loads(r.stdout)
    assert doc["check"]["passed"] and doc["warnings"]
