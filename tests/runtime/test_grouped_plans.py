"""Parallel branches on disjoint device groups, run: a model of independent towers, planned
for 2-4 CPU ranks, puts its towers on their own ranks (``unity explain`` says which); the
plan trains like the model on one process under `mpiexec -n P unity run --check`, and each
rank sends the bytes the plan predicts."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from runtime.mpirun import SPECS, UNITY, run_json

from unity_cli.cli import cli


def towers_model(path, batch: int, width: int = 256, count: int = 4, depth: int = 2):
    """``count`` towers of ``depth`` MatMul + Relu on one input, concatenated, then a head:
    each tower's weights are large beside its activations, so syncing them everywhere costs
    more than running each tower on its own ranks."""
    rng = np.random.default_rng(5)
    nodes, inits, outs = [], [], []
    for t in range(count):
        x = "x"
        for k in range(depth):
            w = f"w{t}_{k}"
            inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width))
                                                 .astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [x, w], [f"m{t}_{k}"], name=f"tower{t}.{k}"))
            nodes.append(helper.make_node("Relu", [f"m{t}_{k}"], [f"h{t}_{k}"], name=f"tower{t}.relu{k}"))
            x = f"h{t}_{k}"
        outs.append(x)
    nodes.append(helper.make_node("Concat", outs, ["c"], axis=1, name="cat"))
    inits.append(numpy_helper.from_array(rng.standard_normal((width * count, 6)).astype(np.float32) * 0.05, "head"))
    nodes.append(helper.make_node("MatMul", ["c", "head"], ["y"], name="head"))
    g = helper.make_graph(nodes, "towers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 6])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_towers_on_their_own_ranks_train_like_the_model(tmp_path, ranks):
    spec = tmp_path / f"local-cpu-{ranks}.yaml"
    spec.write_text((SPECS / "local-cpu.yaml").read_text().replace("devices: 2", f"devices: {ranks}"))
    model = towers_model(tmp_path / "towers.onnx", batch=8)
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(spec), "--out", str(plan),
                                 "--max-candidates", "30"])
    assert r.exit_code == 0, r.output
    assert "branches side by side" in r.output
    r = CliRunner().invoke(cli, ["explain", str(plan), "--json"])
    assert r.exit_code == 0, r.output
    groups = json.loads(r.output)["branches"]
    assert len(groups) >= 2
    seen: set[int] = set()
    for g in groups:                       # disjoint, and every tower operator in one of them
        assert seen.isdisjoint(g["devices"])
        seen.update(g["devices"])
    assert seen <= set(range(ranks))
    towers = [{name.split(".")[0] for name in g["operators"] if name.startswith("tower")} for g in groups]
    assert sum(1 for t in towers if t) >= 2
    assert all(a.isdisjoint(b) for k, a in enumerate(towers) for b in towers[k + 1:])   # a tower in one group
    doc = run_json(plan, "--check", "--steps", "2", "--optimizer", "sgd", ranks=ranks)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"], doc["comm_bytes"]


def test_a_grouped_plan_is_the_same_bytes_across_hash_seeds(tmp_path):
    """Default options (stopped by a count of work): the grouped, fused plan is byte-identical
    under different PYTHONHASHSEEDs."""
    spec = tmp_path / "local-cpu-3.yaml"
    spec.write_text((SPECS / "local-cpu.yaml").read_text().replace("devices: 2", "devices: 3"))
    model = towers_model(tmp_path / "towers.onnx", batch=8)
    plans = []
    for seed in ("2", "777"):
        out = tmp_path / f"plan{seed}.json"
        r = subprocess.run([str(UNITY), "optimize", str(model), "--cluster", str(spec), "--out", str(out)],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED=seed), timeout=300)
        assert r.returncode == 0, r.stderr
        assert "branches side by side" in r.stdout
        plans.append(out.read_bytes())
    assert plans[0] == plans[1]


def test_the_report_lists_the_groups(tmp_path):
    """`unity report` of a grouped plan lists its device groups; of a data-parallel plan, none."""
    model = towers_model(tmp_path / "towers.onnx", batch=8)
    for strategy, grouped in (("best", True), ("data_parallel", False)):
        plan, html = tmp_path / f"{strategy}.json", tmp_path / f"{strategy}.html"
        r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(SPECS / "local-cpu.yaml"), "--out",
                                     str(plan), "--strategy", strategy, "--max-candidates", "20"])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(html)])
        assert r.exit_code == 0, r.output
        text = html.read_text()
        assert ("<dt>branches</dt>" in text) == grouped
        if grouped:
            assert "device 0: tower" in text and "device 1: tower" in text
