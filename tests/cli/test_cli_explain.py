"""`unity explain`: a saved plan explained, with the data-parallel comparison per operator."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from unity_cli.cli import cli

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


def make_plan(tmp_path, model, strategy="tensor_parallel"):
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(SPECS / "dgx-a100-8.yaml"),
                                 "--batch-size", "16", "--strategy", strategy, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_explain_text_compares_with_data_parallel(tmp_path, tiny_models):
    plan = make_plan(tmp_path, tiny_models / "convnet_tiny.onnx")
    r = CliRunner().invoke(cli, ["explain", str(plan), "--operators", "20"])
    assert r.exit_code == 0, r.output
    assert "tensor_parallel" in r.output and "data_parallel" in r.output
    assert "heaviest operators" in r.output and "vs DP" in r.output
    ratios = [line.split()[-1] for line in r.output.splitlines() if line.strip().endswith("x")
              and "ms" in line]
    assert any(x.rstrip("x").replace(".", "").isdigit() for x in ratios)


def test_explain_json(tmp_path, tiny_models):
    plan = make_plan(tmp_path, tiny_models / "convnet_tiny.onnx")
    r = CliRunner().invoke(cli, ["explain", str(plan), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["strategy"] == "tensor_parallel"
    keys = {"name", "kind", "compute_ms", "comm_ms", "data_parallel_ms"}
    assert doc["operators"] and keys <= set(doc["operators"][0])
    assert any(op["data_parallel_ms"] is not None for op in doc["operators"])
    # how the gradients are synced: flat here (no profile measured an overlap)
    assert doc["sync"]["bucket_bytes"] == 0 and doc["sync"]["all_reduces"] >= 1 and doc["sync"]["bytes"] > 0


def test_explain_says_how_the_sync_runs(tmp_path, tiny_models):
    out = tmp_path / "plan.json"
    for bucket, want in (("flat", "after backward"), ("4KiB", "in buckets of at least 4.0 KiB")):
        r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                                     str(SPECS / "dgx-a100-8.yaml"), "--batch-size", "16", "--strategy",
                                     "data_parallel", "--sync-bucket", bucket, "--out", str(out)])
        assert r.exit_code == 0, r.output
        shown = CliRunner().invoke(cli, ["explain", str(out)]).output.splitlines()
        (line,) = [x for x in shown if x.startswith("sync")]
        assert want in line, line
        out.unlink()


def test_explain_without_the_model_says_so(tmp_path, tiny_models):
    model = tmp_path / "convnet.onnx"
    shutil.copy(tiny_models / "convnet_tiny.onnx", model)
    plan = make_plan(tmp_path, model)
    model.unlink()
    r = CliRunner().invoke(cli, ["explain", str(plan)])
    assert r.exit_code == 0, r.output
    assert "is not here" in r.output


def test_explain_a_broken_plan_is_one_line(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text("{}")
    r = CliRunner().invoke(cli, ["explain", str(bad)])
    assert r.exit_code == 1
    assert "error:" in r.output and "format" in r.output


def test_the_peak_is_held_to_the_memory_of_its_own_device(tmp_path, tiny_models):
    """On a cluster of mixed devices the summary measures the peak against the device that
    holds it (an A100-40GB's plan was shown against a V100's 16 GiB), and against "per device"
    where every device holds as much."""
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "convnet_tiny.onnx"), "--cluster",
                                 str(SPECS / "mixed-a100-v100.yaml"), "--batch-size", "16", "--strategy",
                                 "tensor_parallel", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    memory = doc["predicted"]["memory_bytes"]
    busiest = memory.index(max(memory))
    kind = "a100-40gb" if busiest < 16 else "v100-16gb"
    line = next(x for x in r.output.splitlines() if x.startswith("chosen"))
    assert line.endswith(f"of {'40.0' if busiest < 16 else '16.0'} GiB on device {busiest} ({kind})"), line
    plan = make_plan(tmp_path, tiny_models / "convnet_tiny.onnx")
    r = CliRunner().invoke(cli, ["explain", str(plan)])
    assert next(x for x in r.output.splitlines() if x.startswith("chosen")).endswith("of 40.0 GiB per device")
