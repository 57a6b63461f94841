"""`unity run` failures: one `error:` line, every rank exits non-zero, never a hang."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from runtime.mpirun import MPIEXEC, UNITY, unity_run

from unity_cli.plan.plan import seal


def errors(r) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


def test_rank_count_mismatch_says_how_many_and_how_to_replan(plans):
    plan = plans.get("convnet_tiny", "unity", 4)
    r = unity_run(plan, ranks=2, timeout=60)
    assert r.returncode != 0
    (line,) = errors(r)                              # rank 0 only
    assert "4 devices" in line and "2 ranks" in line and "mpiexec -n 4" in line
    assert "--cluster local-cpu" in line              # a bundled spec: works outside the repo too
    assert "Traceback" not in r.stderr


def test_without_mpiexec_is_one_rank(plans):
    r = unity_run(plans.get("convnet_tiny", "data_parallel", 2), ranks=None, timeout=60)
    assert r.returncode == 1
    assert "1 rank" in errors(r)[0]
    doc = json.loads(unity_run(plans.get("convnet_tiny", "data_parallel", 1), "--json", "--steps", "2", "--check",
                               ranks=None, timeout=60).stdout)
    assert doc["ranks"] == 1 and doc["check"]["passed"]


def test_model_hash_mismatch(plans, tmp_path):
    doc = json.loads(plans.get("convnet_tiny", "data_parallel", 2).read_text())
    doc["model"]["sha256"] = "0" * 64
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(seal(doc)))
    r = unity_run(plan, timeout=60)
    assert r.returncode != 0
    (line,) = errors(r)
    assert "SHA-256" in line and "convnet_tiny.onnx" in line


def test_a_plan_naming_other_outputs_than_its_model_is_refused(plans, tmp_path):
    doc = json.loads(plans.get("convnet_tiny", "data_parallel", 2).read_text())
    doc["model"]["outputs"] = ["not_an_output"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(seal(doc)))                 # sealed again: the check below the hash must catch it
    r = unity_run(plan, timeout=60)
    assert r.returncode != 0
    (line,) = errors(r)
    assert "model.outputs" in line and "not_an_output" in line and "convnet_tiny.onnx" in line


def test_missing_model_file_and_model_override(plans, tmp_path):
    model = tmp_path / "moved.onnx"
    shutil.copy(plans.model("convnet_tiny"), model)
    doc = json.loads(plans.get("convnet_tiny", "data_parallel", 2).read_text())
    doc["model"]["path"] = "not/there.onnx"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(seal(doc)))
    r = unity_run(plan, timeout=60)
    assert r.returncode != 0
    (line,) = errors(r)
    assert "not/there.onnx" in line and "not found" in line and "--model" in line
    r = unity_run(plan, "--model", str(model), "--steps", "1", timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_rank_failing_mid_step_ends_the_job(plans):
    """Rank 1 fails halfway through a forward pass while rank 0 waits for it: abort, not a hang."""
    plan = plans.get("bert_tiny", "tensor_parallel", 2)
    t0 = time.monotonic()
    r = unity_run(plan, "--steps", "3", env={"UNITY_FAULT_RANK": "1", "UNITY_FAULT_STEP": "1"}, timeout=30)
    assert time.monotonic() - t0 < 30
    assert r.returncode != 0
    assert errors(r), r.stderr                        # the line reached the user before the abort
    line = errors(r)[0]
    assert line.startswith("error: rank 1:") and "injected fault in step 1" in line
    assert "Traceback" not in r.stderr


def test_a_rank_killed_outright_can_be_named(plans):
    """kill -9 leaves the rank no word; with --verbose rank 0 has named every rank's pid at
    start, and mpiexec names the pid that died: together they say which rank. The job
    still ends within 10 s."""
    plan = plans.get("convnet_tiny", "data_parallel", 2)
    proc = subprocess.Popen([str(MPIEXEC), "-n", "2", str(UNITY), "run", str(plan), "--steps", "100000",
                             "--verbose"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        pids = {int(r): int(p) for r, p in re.findall(r"(\d+): pid (\d+) on ", first)}
        assert first.startswith("ranks    ") and sorted(pids) == [0, 1], first
        time.sleep(1.0)                                   # into training
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # mpiexec's word for the dead process, or, when rank 0's MPI call fails first (the
    # launcher then tears the job down without it), rank 0's own
    assert f"PID {pids[1]} " in out + err or f"rank 1 (pid {pids[1]}) is no longer running" in err, out + err


@pytest.mark.parametrize("env, words", [
    ({"UNITY_FAULT_RANK": "abc"}, ["UNITY_FAULT_RANK='abc'", "ranks 0 to 1"]),
    ({"UNITY_FAULT_RANK": "7"}, ["UNITY_FAULT_RANK='7'", "ranks 0 to 1"]),
    ({"UNITY_FAULT_RANK": "1", "UNITY_FAULT_STEP": "5"}, ["UNITY_FAULT_STEP='5'", "steps 0 to 2"]),
])
def test_a_fault_that_cannot_happen_is_an_error_not_a_pass(plans, env, words):
    r = unity_run(plans.get("convnet_tiny", "data_parallel", 2), "--steps", "3", env=env, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    line = errors(r)[0]
    assert all(w in line for w in words), line


def test_check_fails_when_the_plan_computes_something_else(plans, tmp_path):
    """A plan whose Relu became a Sigmoid still loads, but --check catches it: exit 1 on every rank."""
    doc = json.loads(plans.get("convnet_tiny", "data_parallel", 2).read_text())
    relu = next(n for n in doc["pcg"]["nodes"] if n["op"]["kind"] == "Unary" and n["op"]["fn"] == "Relu")
    relu["op"]["fn"] = "Sigmoid"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(seal(doc)))
    r = unity_run(plan, "--check", "--steps", "1", "--json", timeout=60)
    assert r.returncode != 0
    (line,) = errors(r)
    assert "--check failed" in line and "step 0: the loss differs" in line
    report = json.loads(r.stdout)
    assert report["check"]["passed"] is False and report["check"]["max_rel_err"] > 1e-4


def test_bad_options(plans):
    plan = plans.get("convnet_tiny", "data_parallel", 2)
    r = unity_run(plan, "--steps", "0", timeout=60)
    assert r.returncode != 0 and "--steps" in errors(r)[0]
    r = unity_run(plan, "--data", "nowhere.npz", timeout=60)
    assert r.returncode != 0 and "nowhere.npz" in errors(r)[0]


def test_a_dead_peer_on_this_host_is_named_and_a_live_one_is_not():
    """What rank 0 adds when its MPI call fails: which ranks beside it are gone (a zombie,
    killed but not yet reaped, counts as gone)."""
    from unity_cli.runtime.train import _gone

    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # exited, not reaped: its /proc entry says Z
        try:
            if open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.01)
    host = socket.gethostname()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        where = [(os.getpid(), host), (done.pid, host), (alive.pid, host), (zombie.pid, host), (done.pid, "elsewhere")]
        assert _gone(where, 0) == [f"rank 1 (pid {done.pid}) is no longer running",
                                   f"rank 3 (pid {zombie.pid}) is no longer running"]
    finally:
        alive.kill()
        alive.wait()
        zombie.wait()
