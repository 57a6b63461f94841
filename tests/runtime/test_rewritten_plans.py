"""Every rule family's rewritten form runs: `mpiexec -n P unity run --check` on a plan whose
graph a family rule rewrote trains like the original model on one process (the check
compares against the model as the user wrote it), and the bytes each rank sends equal the
bytes the plan predicts."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from models.families import (
    bags,
    channels_last,
    embeddings,
    family_plans,
    ffn,
    linears,
    qkv,
    reductions,
    torch_mlp,
    towers,
    uneven_bags,
)
from onnx import numpy_helper
from runtime.mpirun import SPECS, run_json

CASES = [  # model, family instance, ranks
    (qkv, "sibling-matmul-3", 2),
    (qkv, "sibling-matmul-2", 3),
    (linears, "sibling-gemm-2", 2),
    (linears, "concat-gemm-2", 3),
    (linears, "gemm-trans-b-as-matmul-add", 2),
    (bags, "concat-linear-3", 2),
    (torch_mlp, "gemm-trans-b-relu-fused", 2),
    (torch_mlp, "gemm-trans-b-relu-fused", 3),
    (towers, "sibling-conv1x1-2", 2),
    (towers, "sibling-conv1x1-2", 3),
    (ffn, "matmul-add-relu-fused-batched", 2),
    (ffn, "matmul-add-relu-fused-batched", 3),
    (embeddings, "embedding-merge-3", 2),
    (embeddings, "embedding-merge-2", 3),
    (uneven_bags, "concat-linear-uneven-3", 2),
    (uneven_bags, "concat-linear-uneven-3", 3),
    (reductions, "sibling-conv1x1-uneven-3", 2),
    (reductions, "sibling-conv1x1-uneven-2", 3),
    (channels_last, "relu-through-transpose-120+transpose-cancel-120", 2),
    (channels_last, "transpose-cancel-around-relu-120+relu-through-transpose-120", 3),
]


@pytest.mark.parametrize("make,rule_name,ranks", CASES, ids=[f"{r}-{n}" for _, r, n in CASES])
def test_a_rewritten_plan_trains_like_the_model(tmp_path, make, rule_name, ranks):
    _, plan = family_plans(tmp_path, make, rule_name, SPECS / "local-cpu.yaml", ranks)
    doc = run_json(plan, "--check", "--steps", "2", ranks=ranks)
    assert doc["check"]["passed"], doc["check"]
    got = doc["comm_bytes"]
    assert got["measured"] == got["predicted"], got


@pytest.mark.parametrize("ranks", [2, 3])
def test_merged_tables_split_by_rows_train_like_the_model(tmp_path, ranks):
    """Three tables of unequal rows merged into one, the merged table split by rows over the
    ranks (each rank looks up the ids in its rows, the partial sums reduced): `--check`
    passes, and the bytes sent are those predicted."""
    from unity_cli.search.baselines import tensor_parallel
    _, plan = family_plans(tmp_path, embeddings, "embedding-merge-3", SPECS / "local-cpu.yaml", ranks,
                           baseline=tensor_parallel)
    doc = json.loads(plan.read_text())
    (merged,) = [n for n in doc["pcg"]["nodes"] if n["op"]["kind"] == "GroupedGather"]
    (table,) = [n for n in doc["pcg"]["nodes"] if n["op"].get("parts")]
    assert [p[0] for p in table["op"]["parts"]] == ["t0", "t1", "t2"]
    assert any(n["op"]["kind"] == "Repartition" and n["inputs"][0][0] == doc["pcg"]["nodes"].index(table)
               for n in doc["pcg"]["nodes"]), "the merged table is not split"
    run = run_json(plan, "--check", "--steps", "2", ranks=ranks)
    assert run["check"]["passed"], run["check"]
    assert run["comm_bytes"]["measured"] == run["comm_bytes"]["predicted"], run["comm_bytes"]


@pytest.mark.parametrize("make,rule_name,parts,others", [(qkv, "sibling-matmul-3", ["wq", "wk", "wv"], ["wo"]),
                                                         (embeddings, "embedding-merge-3", ["t0", "t1", "t2"], ["wo"])],
                         ids=["qkv", "tables"])
def test_fused_weights_are_stored_fused_and_saved_as_the_models(tmp_path, make, rule_name, parts, others):
    """Q, K and V fused (three tables merged): the plan holds one weight of their three (no
    Concat runs each step); `--save` writes the model's own three initializers, trained as
    the unfused plan trains them."""
    plain, fused = family_plans(tmp_path, make, rule_name, SPECS / "local-cpu.yaml", 2)
    doc = json.loads(fused.read_text())
    kinds = [n["op"]["kind"] for n in doc["pcg"]["nodes"]]
    assert "Concat" not in kinds or make is embeddings   # (its model concatenates the lookups)
    (folded,) = [n for n in doc["pcg"]["nodes"] if n["op"].get("parts")]
    assert [p[0] for p in folded["op"]["parts"]] == parts
    saved = {}
    for name, plan in (("plain", plain), ("fused", fused)):
        out = tmp_path / f"{name}.onnx"
        run_json(plan, "--steps", "3", "--optimizer", "adam", "--save", str(out))
        saved[name] = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    assert sorted(saved["fused"]) == sorted(saved["plain"]) == sorted(parts + others)
    model = tmp_path / f"{make.__name__}-8.onnx"
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(model)).graph.initializer}
    for name, value in saved["plain"].items():
        assert not np.allclose(value, original[name])              # trained
        np.testing.assert_allclose(saved["fused"][name], value, rtol=1e-4, atol=1e-6)


def test_the_searched_bias_split_trains_like_the_model(tmp_path, cluster_dir):
    """The joint search's plan for a PyTorch-style MLP on 4 PCIe GPUs (the bias set apart,
    the second Gemm split by rows: ``tests/search/test_joint.py``), run on 4 CPU ranks."""
    from search.test_joint import pcie_cluster

    from unity_cli.cli import cli
    model = torch_mlp(tmp_path / "mlp.onnx", width=1024, layers=1)
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(pcie_cluster(tmp_path, cluster_dir)),
                                 "--batch-size", "64", "--out", str(plan)])
    assert r.exit_code == 0, r.output
    doc = json.loads(plan.read_text())
    # the bias set apart, and the first layer's ReLU fused into its Gemm (one launch fewer)
    assert sorted(w["name"] for w in doc["rewrites"]) == ["gemm-trans-b-bias-as-add", "gemm-trans-b-relu-fused"]
    assert all(w["bought"] for w in doc["rewrites"])
    assert "gemm-trans-b-bias-as-add" in r.output and "communication -" in r.output   # the summary says why
    html = tmp_path / "plan.html"
    assert CliRunner().invoke(cli, ["report", str(plan), "--out", str(html)]).exit_code == 0
    assert "changed step time -" in html.read_text()                                  # and so does the report
    run = run_json(plan, "--check", "--steps", "2", ranks=4)
    assert run["check"]["passed"], run["check"]
    assert run["comm_bytes"]["measured"] == run["comm_bytes"]["predicted"]
