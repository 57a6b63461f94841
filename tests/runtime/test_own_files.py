"""Never destroy a user's file: an output that is one of the command's inputs (directly or
through a symlink), or lies in a missing folder, is refused in one line before any work, and
every file is written whole (a temp file in the same folder, then a rename)."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from runtime.mpirun import unity_run

from unity_cli import files
from unity_cli.cli import cli


def _one_line_error(output: str, *words: str) -> None:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in output


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_optimize_refuses_to_write_the_plan_over_its_model(plans, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(plans.model("convnet_tiny").read_bytes())
    before = model.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(model)
    for out in (model, link):
        r = _invoke("optimize", str(model), "--out", str(out))
        assert r.exit_code != 0
        _one_line_error(r.output, "--out", str(out), "model")
        assert model.read_bytes() == before
    r = _invoke("optimize", str(model), "--out", str(tmp_path / "p.json"), "--report", str(model))
    assert r.exit_code != 0
    _one_line_error(r.output, "--report", "model")
    assert model.read_bytes() == before and not (tmp_path / "p.json").exists()


def test_outputs_in_a_missing_folder_are_refused_before_the_work(plans, tmp_path):
    model = plans.model("convnet_tiny")
    r = _invoke("optimize", str(model), "--out", str(tmp_path / "no" / "plan.json"))
    assert r.exit_code != 0
    _one_line_error(r.output, "--out", "does not exist")
    plan = plans.get("convnet_tiny", "data_parallel", 1)
    r = _invoke("report", str(plan), "-o", str(plan))
    assert r.exit_code != 0
    _one_line_error(r.output, "--out", "plan")


def test_run_refuses_a_save_over_its_plan_or_model_before_step_zero(plans, tmp_path):
    plan = plans.get("convnet_tiny", "data_parallel", 1)
    before = plan.read_bytes()
    model = plans.model("convnet_tiny")
    model_bytes = model.read_bytes()
    for save, what in ((plan, "plan"), (model, "model"), (tmp_path / "missing" / "m.onnx", "does not exist")):
        r = unity_run(plan, "--steps", "1000000", "--save", str(save), ranks=None, timeout=60)
        assert r.returncode != 0                       # refused at once, or 10^6 steps would time out
        _one_line_error(r.stderr, "--save", what)
    assert plan.read_bytes() == before and model.read_bytes() == model_bytes


def test_a_write_replaces_a_symlink_and_never_leaves_half_a_file(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    dest = tmp_path / "out.json"
    dest.symlink_to(victim)
    files.write_atomic(dest, "new")
    assert victim.read_text() == "keep me"              # the link was replaced, not followed
    assert not dest.is_symlink() and dest.read_text() == "new"
    assert oct(dest.stat().st_mode & 0o777) == oct(0o666 & ~files._umask())

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        files.write_atomic(dest, "half")
    assert dest.read_text() == "new"                    # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim.txt"]   # no temp left


def test_optimize_writes_nothing_but_its_outputs(plans, tmp_path):
    """A fresh HOME, TMPDIR and working folder: after optimize (whose import runs
    onnxruntime to fold constants) only the plan has appeared. onnxruntime writes a device
    id and a telemetry database under ~/.cache at import; unity points it at a temp folder
    that it removes at exit."""
    import subprocess
    import sys

    home, tmp, work = (tmp_path / d for d in ("home", "tmp", "work"))
    for d in (home, tmp, work):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env.update(HOME=str(home), TMPDIR=str(tmp))
    model = plans.model("bert_tiny_dynamo")
    r = subprocess.run([sys.executable, "-m", "unity_cli.cli", "optimize", str(model), "--max-candidates", "5",
                        "--out", "plan.json"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    appeared = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert appeared == ["home", "tmp", "work", "work/plan.json"], appeared
