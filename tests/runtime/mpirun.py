"""Helpers for `unity run` tests: plans made once per session, and real mpiexec runs.

Import as ``from runtime.mpirun import ...`` with ``tests/`` on ``sys.path``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from models.catalog import EXPORTED_DIR, mlp_model
from onnx import TensorProto, helper, numpy_helper

from unity_cli import zoo
from unity_cli.cli import cli

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "cluster_specs"
BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
UNITY = BIN / "unity"


def rewrite_model(path: Path) -> Path:
    """y = MatMul(Relu(Concat(MatMul(x, w1), MatMul(x, w2))), w3): two MatMuls share an input,
    so the search can merge them (Concat(MatMul(a, b), MatMul(a, c)) = MatMul(a, Concat(b, c)))."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in [("w1", (16, 32)), ("w2", (16, 32)), ("w3", (64, 8))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm2"),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1, name="cat"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w3"], ["y"], name="mm3")]
    g = helper.make_graph(nodes, "rewrite", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


class Plans:
    """`unity optimize` plans, made once per session and shared by the tests."""

    def __init__(self, root: Path, models: Path):
        self.root = root
        self.models = models
        self.cache: dict[tuple, Path] = {}
        self.specs = {2: SPECS / "local-cpu.yaml", 4: root / "local-cpu-4.yaml", 1: root / "local-cpu-1.yaml"}
        text = (SPECS / "local-cpu.yaml").read_text()
        for n in (1, 4):
            self.specs[n].write_text(text.replace("devices: 2", f"devices: {n}").replace(
                "name: local-cpu", f"name: local-cpu-{n}"))

    def model(self, name: str) -> Path:
        if name == "rewrite":
            path = self.root / "rewrite.onnx"
            return path if path.exists() else rewrite_model(path)
        path = self.models / f"{name}.onnx"
        return path if path.exists() else EXPORTED_DIR / f"{name}.onnx"   # the real torch exports

    def get(self, name: str, strategy: str, devices: int = 2, batch: int = 4, sync_bucket: str = "auto") -> Path:
        key = (name, strategy, devices, batch, sync_bucket)
        if key not in self.cache:
            out = self.root / f"{name}-{strategy}-{devices}-{batch}-{sync_bucket}.json"
            args = ["optimize", str(self.model(name)), "--cluster", str(self.specs[devices]), "--batch-size",
                    str(batch), "--strategy", strategy, "--out", str(out), "--json", "--sync-bucket", sync_bucket]
            if strategy == "unity":
                args += ["--max-candidates", "40"]
            r = CliRunner().invoke(cli, args)
            assert r.exit_code == 0, r.output
            self.cache[key] = out
        return self.cache[key]


def small_model(plans: Plans, tmp_path: Path, name: str) -> Path:
    """A model to train on CPU ranks by name: ``mlp``, a zoo model at its small scale
    (``llama2-7b``, ``gpt3-175b``, ...), or one of the test models (``plans.model``)."""
    if name == "mlp":
        return mlp_model(tmp_path / "mlp.onnx", hidden=24)
    if name in zoo.MODELS:
        zoo.write(name, tmp_path / "m.onnx", "small")
        return tmp_path / "m.onnx"
    return plans.model(name)


def unity_run(plan: Path | str, *args: str, ranks: int | None = 2, timeout: float = 90,
              env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``mpiexec -n ranks unity run plan args`` (``ranks`` None: without mpiexec)."""
    cmd = [str(UNITY), "run", str(plan), *args]
    if ranks is not None:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


def run_json(plan: Path | str, *args: str, ranks: int = 2, **kw) -> dict:
    r = unity_run(plan, "--json", *args, ranks=ranks, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, r.stdout           # rank 0 only
    doc = json.loads(lines[0])
    memory = doc["memory_bytes"]           # every run holds the bytes its plan predicts (runtime/ledger.py)
    assert memory["parts"]["measured"] == memory["parts"]["predicted"], memory
    assert memory["measured"] == memory["predicted"]
    planned_memory_holds(doc)
    return doc


PLANNED_OVER = 1.25
"""How far over what a rank holds the planner's account (``cost/memory.py``) may count."""


def planned_memory_holds(doc: dict) -> None:
    """Where the run trains as the plan was priced (its optimizer, and the loss the planner
    took), the bytes the planner counted on each device, which decided that the plan fits,
    are never fewer than the rank held at its peak, and at most :data:`PLANNED_OVER` times them."""
    memory = doc["memory_bytes"]
    if doc["optimizer"] != memory["plan_optimizer"] or doc["loss_kind"] != memory["plan_loss"]:
        return
    for rank, (held, planned) in enumerate(zip(memory["measured"], memory["plan"], strict=True)):
        assert held <= planned <= PLANNED_OVER * held, (rank, planned, held, planned / held)
