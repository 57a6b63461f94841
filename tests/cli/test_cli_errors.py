"""The ``unity`` command on bad input: exit 1, one ``error:`` line naming what is at fault,
no traceback (unless ``--debug``); and the happy path's summary and ``--json``.

Most cases use click's CliRunner (stderr is captured apart from stdout); a few run the
installed console script in a subprocess, as a user would.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from models.catalog import EXPORTED_DIR, mlp_model
from onnx import TensorProto, helper, numpy_helper

from unity_cli.cli import cli as main
from unity_cli.plan.plan import load_plan

REPO = Path(__file__).resolve().parents[2]
DGX8 = REPO / "cluster_specs" / "dgx-a100-8.yaml"


def _unity_command() -> list[str]:
    exe = Path(sys.executable).parent / "unity"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "unity_cli.cli"]


def _run(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_unity_command() + args, capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=120)


def _invoke(args: list[str]):
    return CliRunner().invoke(main, args)


def _assert_one_error_line(code: int, stdout: str, stderr: str, *needles: str) -> str:
    assert code == 1, f"exit {code}\nstdout: {stdout}\nstderr: {stderr}"
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in stdout + stderr
    assert stdout == ""
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def _check(args: list[str], *needles: str) -> str:
    r = _invoke(args)
    return _assert_one_error_line(r.exit_code, r.stdout, r.stderr, *needles)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    """A tiny valid model: MatMul -> Relu -> MatMul."""
    return mlp_model(tmp_path_factory.mktemp("cli") / "mlp.onnx")

def _yaml(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the model file -----------------------------------------------------------------


def test_missing_model_file_subprocess(tmp_path):
    missing = tmp_path / "nope.onnx"
    r = _run(["optimize", str(missing), "--cluster", str(DGX8), "--out", str(tmp_path / "p.json")])
    _assert_one_error_line(r.returncode, r.stdout, r.stderr, str(missing), "no such file")


def test_truncated_onnx_subprocess(tmp_path):
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes((EXPORTED_DIR / "inception_tiny.onnx").read_bytes()[:100])
    r = _run(["optimize", str(bad), "--cluster", str(DGX8), "--out", str(tmp_path / "p.json")])
    _assert_one_error_line(r.returncode, r.stdout, r.stderr, str(bad), "not a valid ONNX file")
    assert not (tmp_path / "p.json").exists()


def test_text_file_as_onnx(tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is not a model\n" * 20)
    _check(["optimize", str(bad), "--cluster", str(DGX8)], str(bad), "not a valid ONNX file")


@pytest.mark.parametrize("op,domain", [("Det", ""), ("FancyOp", "com.example")])
def test_unknown_op(tmp_path, op, domain):
    node = helper.make_node(op, ["x"], ["y"], name="odd_one", domain=domain)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    path = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(g, opset_imports=opsets), str(path))
    _check(["optimize", str(path), "--cluster", str(DGX8)], str(path), "odd_one", op)


def test_constant_that_cannot_be_evaluated_subprocess(tmp_path):
    """Folding falls back from onnxruntime to the reference evaluator; onnxruntime's own
    log line must not leak onto stderr (it writes to fd 2, so this needs a subprocess)."""
    data = numpy_helper.from_array(np.arange(3, dtype=np.int64), "table")
    index = numpy_helper.from_array(np.array([5], dtype=np.int64), "index")
    g = helper.make_graph([helper.make_node("Gather", ["table", "index"], ["c"], name="bad_gather"),
                           helper.make_node("Add", ["x", "c"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, None)], [data, index])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    r = _run(["optimize", str(path), "--cluster", str(DGX8), "--out", str(tmp_path / "p.json")])
    _assert_one_error_line(r.returncode, r.stdout, r.stderr, str(path), "bad_gather", "Gather")


# -- the cluster file -----------------------------------------------------------------


def test_missing_cluster_file(tmp_path, mlp):
    missing = tmp_path / "nowhere.yaml"
    _check(["optimize", str(mlp), "--cluster", str(missing)], str(missing), "no such file")


def test_cluster_yaml_does_not_parse(tmp_path, mlp):
    path = _yaml(tmp_path, "name: [unclosed\nnodes: {\n")
    _check(["optimize", str(mlp), "--cluster", str(path)], str(path), "YAML does not parse")


def test_empty_cluster_yaml(tmp_path, mlp):
    path = _yaml(tmp_path, "")
    _check(["optimize", str(mlp), "--cluster", str(path)], str(path), "empty")


def test_negative_bandwidth(tmp_path, mlp):
    text = DGX8.read_text().replace("bandwidth: 300 GB/s", "bandwidth: -300 GB/s")
    assert "-300 GB/s" in text
    path = _yaml(tmp_path, text)
    _check(["optimize", str(mlp), "--cluster", str(path)], str(path), "nodes.intra_link.bandwidth", "positive")


def test_unknown_cluster_key(tmp_path, mlp):
    path = _yaml(tmp_path, DGX8.read_text() + "bogus_key: 3\n")
    _check(["optimize", str(mlp), "--cluster", str(path)], str(path), "bogus_key", "unknown key")


def test_misspelled_nested_key(tmp_path, mlp):
    path = _yaml(tmp_path, DGX8.read_text().replace("latency: 2 us", "latncy: 2 us"))
    _check(["optimize", str(mlp), "--cluster", str(path)], str(path), "nodes.intra_link")


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_batch_size(mlp, value):
    _check(["optimize", str(mlp), "--cluster", str(DGX8), "--batch-size", value], "--batch-size", value)


@pytest.mark.parametrize("value,needle", [
    ("x", "NAME=d0,d1"),
    ("=4,16", "NAME=d0,d1"),
    ("x=a,b", "integers"),
    ("x=4,0", "positive"),
    ("x=", "positive"),
])
def test_malformed_input_option(mlp, value, needle):
    _check(["optimize", str(mlp), "--cluster", str(DGX8), "--input", value], "--input", needle)


def test_input_option_names_unknown_input(mlp):
    _check(["optimize", str(mlp), "--cluster", str(DGX8), "--input", "tokens=4,16"], "tokens", "no such input")


def test_unknown_strategy(mlp, tmp_path):
    _check(["optimize", str(mlp), "--cluster", str(DGX8), "--strategy", "nonsense",
            "--out", str(tmp_path / "p.json")], "--strategy", "nonsense", "data_parallel")
    assert not (tmp_path / "p.json").exists()


def test_out_in_missing_directory(mlp, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "plan.json"
    _check(["optimize", str(mlp), "--cluster", str(DGX8), "--out", str(out)], str(out))
    assert not out.parent.exists()


def test_memory_infeasible(mlp, tmp_path):
    text = DGX8.read_text().replace("capacity: 40 GiB", "capacity: 1 KiB")
    path = _yaml(tmp_path, text)
    _check(["optimize", str(mlp), "--cluster", str(path), "--out", str(tmp_path / "p.json")],
           "fits", "needs", "which has 1.0 KiB")


def test_internal_error_is_one_line(mlp, monkeypatch, tmp_path):
    import unity_cli.search.step as search

    def boom(*args, **kwargs):
        raise RuntimeError("something broke")

    monkeypatch.setattr(search, "optimize", boom)
    line = _check(["optimize", str(mlp), "--cluster", str(DGX8), "--out", str(tmp_path / "p.json")],
                  "internal error", "something broke", "--debug")
    assert "RuntimeError" in line


# -- --debug, --help --------------------------------------------------------------------------


def test_debug_shows_traceback_subprocess(tmp_path):
    missing = tmp_path / "nope.onnx"
    r = _run(["--debug", "optimize", str(missing), "--cluster", str(DGX8)])
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "ModelError" in r.stderr
    assert r.stderr.splitlines()[-1] == f"error: {missing}: no such file"


def test_debug_after_the_command(tmp_path):
    r = _invoke(["optimize", str(tmp_path / "nope.onnx"), "--debug"])
    assert r.exit_code == 1
    assert "Traceback" in r.stderr
    assert r.stderr.splitlines()[-1].startswith("error: ")


def test_help_lists_optimize():
    r = _invoke(["--help"])
    assert r.exit_code == 0
    assert "optimize" in r.stdout
    r = _invoke(["optimize", "--help"])
    assert r.exit_code == 0
    for option in ("--cluster", "--batch-size", "--input", "--strategy", "--out", "--json", "--debug"):
        assert option in r.stdout


# -- the happy path ----------------------------------------------------------------------------------


def test_optimize_bert_tiny_subprocess(tiny_models, tmp_path):
    model = tiny_models / "bert_tiny.onnx"
    out = tmp_path / "plan.json"
    r = _run(["optimize", str(model), "--cluster", "cluster_specs/dgx-a100-8.yaml", "--out", str(out),
              "--max-candidates", "40"], cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    for name in ("data_parallel", "tensor_parallel", "parallel_only", "algebraic_then_parallel", "unity"):
        assert name in r.stdout
    chosen = [line for line in r.stdout.splitlines() if line.startswith("chosen")]
    assert len(chosen) == 1
    plan = load_plan(out)
    assert plan.strategy in chosen[0]
    assert plan.strategy in ("unity", "parallel_only", "algebraic_then_parallel", "data_parallel",
                             "tensor_parallel")  # the default (best) is the fastest of all
    assert plan.predicted["step_time_ms"] <= min(b["step_time_ms"] for b in plan.baselines.values())
    # the joint search starts from the baselines: it is never slower than they are
    base = plan.baselines
    assert base["unity"]["step_time_ms"] <= min(base["data_parallel"]["step_time_ms"],
                                                base["tensor_parallel"]["step_time_ms"]) * (1 + 1e-9)
    assert "--batch-size" in r.stdout  # the symbolic batch was defaulted, and the summary says so
    assert str(out) in r.stdout


def test_optimize_json(tiny_models, tmp_path):
    out = tmp_path / "plan.json"
    r = _invoke(["optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster", str(DGX8), "--batch-size", "4",
                 "--out", str(out), "--json",
                 "--max-candidates", "40"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    assert {"predicted", "baselines", "strategy"} <= set(doc)
    predicted = doc["predicted"]
    for key in ("step_time_ms", "compute_ms", "comm_ms", "memory_bytes"):
        assert key in predicted
    assert len(predicted["memory_bytes"]) == 8
    assert set(doc["baselines"]) == {"data_parallel", "tensor_parallel", "hybrid", "parallel_only",
                                     "algebraic_then_parallel", "unity"}
    for b in doc["baselines"].values():
        assert b["step_time_ms"] > 0
    assert predicted["step_time_ms"] == doc["baselines"][doc["strategy"]]["step_time_ms"]
    assert predicted["step_time_ms"] == min(b["step_time_ms"] for b in doc["baselines"].values() if b["feasible"])
    assert doc["notes"] == []  # --batch-size was given
    assert load_plan(out).strategy == doc["strategy"]


@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
def test_forced_strategy(mlp, tmp_path, strategy):
    out = tmp_path / "plan.json"
    r = _invoke(["optimize", str(mlp), "--cluster", str(DGX8), "--batch-size", "8", "--strategy", strategy,
                 "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["strategy"] == strategy
    assert load_plan(out).strategy == strategy


def test_a_closed_pipe_is_not_an_error():
    """`unity zoo --list | head -1`: the reader leaves early; no 'internal error', exit 0."""
    p = subprocess.Popen([*_unity_command(), "zoo", "--list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before it writes: its first write meets a closed pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "error" not in err, err
