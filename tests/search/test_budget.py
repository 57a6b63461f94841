"""``--budget`` is a ceiling over the whole run (import, baselines, mapping, solver,
searches), not only the search: what it leaves no time for is left out and named, and
the plan of last resort (data parallelism under its default views) is always there (#13)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig
from unity_cli.deadline import OutOfTime, ceiling, check, left
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.optimize import optimize

UNITY = str(Path(sys.executable).parent / "unity")


def test_a_ceiling_raises_once_passed_and_none_lifts_it():
    check()                                   # no ceiling: never
    assert left() is None
    with ceiling(time.monotonic() - 1):
        with pytest.raises(OutOfTime):
            check()
        with ceiling(None):                   # work that must finish
            check()
    with ceiling(time.monotonic() + 3600):
        check()
        assert 3500 < left() <= 3600


def test_a_budget_already_spent_keeps_the_plan_of_last_resort(tiny_models, cluster_dir):
    pcg = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(batch_size=8)).pcg
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    res = optimize(pcg, cluster, CostConfig(), "best", (), budget=1.0, started=time.monotonic() - 10)
    assert res.chosen.baseline.name == "data_parallel" and set(res.candidates) == {"data_parallel"}
    assert res.cut_by_budget and res.not_priced == ("tensor_parallel", "hybrid", "parallel_only",
                                                     "algebraic_then_parallel", "unity")
    # A strategy asked for by name is priced whatever the ceiling.
    tp = optimize(pcg, cluster, CostConfig(), "tensor_parallel", (), budget=1.0, started=time.monotonic() - 10)
    assert tp.chosen.baseline.name == "tensor_parallel" and "tensor_parallel" not in tp.not_priced


def _chain(path: Path, n: int) -> Path:
    """``n`` operators in a row (a MatMul every fourth, Relus between): long, not wide."""
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        if i % 4 == 0:
            inits.append(numpy_helper.from_array(np.zeros((16, 16), np.float32), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"t{i}"]))
        else:
            nodes.append(helper.make_node("Relu", [prev], [f"t{i}"]))
        prev = f"t{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 16])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_budget_holds_on_a_long_chain(tmp_path):
    """2,500 operators: without the ceiling on every stage this ran past a minute (a mapping
    DP that recursed once per layer, and unbounded baselines and solver). The bound is
    loose, for a loaded machine: the floor (import, the data-parallel plan, writing it) is
    a few seconds on an idle one."""
    model = _chain(tmp_path / "chain.onnx", 2500)
    out = tmp_path / "plan.json"
    t0 = time.monotonic()
    r = subprocess.run([UNITY, "optimize", str(model), "--cluster", "dgx-a100-8", "--budget", "5", "--out",
                        str(out)], capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert elapsed < 30, elapsed
    search = json.loads(out.read_text())["search"]
    assert search["cut_by_budget"] is True and "unity" in search["not_priced"]
    assert sum("--budget 5 s cut the search short; left out:" in line for line in r.stdout.splitlines()) == 1
