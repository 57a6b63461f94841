"""The plan file: save -> load -> save is the identity, files are byte-identical across
processes, the content is what the design lists, and ``load_plan`` refuses a bad plan
with a PlanError naming the file and the field."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from models.catalog import EXPORTED_DIR, mlp_model

from unity_cli.cluster import load_cluster, parse_cluster
from unity_cli.cost.model import CostConfig
from unity_cli.errors import PlanError
from unity_cli.ir.machine_view import check_view
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.plan.build import make_plan
from unity_cli.plan.plan import FORMAT, Plan, load_plan, plan_from_json, seal
from unity_cli.search.optimize import optimize

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "cluster_specs"
REQUIRED = ("model", "cluster", "config", "strategy", "pcg", "predicted", "baselines")


def _make(model_path: Path, cluster_name: str, batch: int, strategy: str = "best") -> Plan:
    imported = import_model(model_path, ImportOptions(batch))
    cluster = load_cluster(SPECS / f"{cluster_name}.yaml")
    config = CostConfig()
    return make_plan(imported, cluster, config, optimize(imported.pcg, cluster, config, strategy))


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory) -> Path:
    return mlp_model(tmp_path_factory.mktemp("plan") / "mlp.onnx")

@pytest.fixture(scope="module")
def bert_plan(tiny_models) -> Plan:
    return _make(tiny_models / "bert_tiny.onnx", "dgx-a100-8", 4, "data_parallel")


@pytest.fixture()
def plan_doc(bert_plan) -> dict:
    return json.loads(bert_plan.dumps())


def _roundtrip(plan: Plan, tmp_path: Path) -> None:
    first = tmp_path / "a.json"
    plan.save(first)
    loaded = load_plan(first)
    second = tmp_path / "b.json"
    loaded.save(second)
    assert first.read_bytes() == second.read_bytes()
    assert loaded.pcg == plan.pcg
    assert loaded.pcg.canonical_hash == plan.pcg.canonical_hash
    assert loaded.views == plan.views
    assert loaded.cluster == plan.cluster
    assert loaded.predicted == plan.predicted and loaded.baselines == plan.baselines
    assert loaded.model == plan.model and loaded.strategy == plan.strategy and loaded.config == plan.config


def test_roundtrip_bert(bert_plan, tmp_path):
    _roundtrip(bert_plan, tmp_path)


@pytest.mark.parametrize("cluster", ["dgx-a100-8", "dgx-a100-32", "mixed-a100-v100"])
@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
def test_roundtrip_strategies(mlp_path, tmp_path, cluster, strategy):
    _roundtrip(_make(mlp_path, cluster, 8, strategy), tmp_path)


def test_roundtrip_exported(tmp_path):
    _roundtrip(_make(EXPORTED_DIR / "gpt2_tiny.onnx", "dgx-a100-32", 8, "tensor_parallel"), tmp_path)


def test_plan_content(bert_plan, tiny_models):
    doc = json.loads(bert_plan.dumps())
    assert doc["format"] == FORMAT == "unity-plan/1"
    model = tiny_models / "bert_tiny.onnx"
    assert doc["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert doc["model"]["inputs"] == {"input_ids": {"dims": [4, 32], "dtype": "int64"}}
    assert doc["model"]["batch_size"] == 4
    cluster = load_cluster(SPECS / "dgx-a100-8.yaml")
    assert parse_cluster(doc["cluster"]) == cluster
    assert doc["strategy"] in doc["baselines"]
    assert set(doc["baselines"]) == {"data_parallel", "tensor_parallel"}
    for b in doc["baselines"].values():
        assert {"step_time_ms", "compute_ms", "comm_ms", "max_memory_bytes", "devices", "feasible"} <= set(b)
    predicted = doc["predicted"]
    assert {"step_time_ms", "compute_ms", "comm_ms", "memory_bytes"} <= set(predicted)
    assert len(predicted["memory_bytes"]) == cluster.num_devices
    assert max(predicted["memory_bytes"]) == predicted["max_memory_bytes"] > 0
    assert predicted["step_time_ms"] == doc["baselines"][doc["strategy"]]["step_time_ms"] > 0
    nodes = doc["pcg"]["nodes"]
    assert [n["id"] for n in nodes] == list(range(len(nodes)))
    for n in nodes:
        assert n["outputs"], n
        for s in n["outputs"]:
            assert set(s) == {"sizes", "degrees", "dtype", "sum", "copy"}
            assert len(s["sizes"]) == len(s["degrees"])
        assert set(n["view"]) == {"start", "strides"}
    for i, n in bert_plan.pcg:
        assert check_view(bert_plan.views[i], n.outputs[0], cluster.num_devices) is None


def test_plan_text_is_canonical(bert_plan):
    text = bert_plan.dumps()
    assert text.endswith("\n")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=1) + "\n"
    assert "NaN" not in text and "Infinity" not in text


def test_byte_identical_across_processes(tmp_path):
    """Different PYTHONHASHSEEDs (and so different set/dict-of-str orders) give the same bytes.

    A small work count (--max-candidates) keeps it quick; the default stop counts work too
    (test_joint.test_deterministic_across_hash_seeds runs it with default options)."""
    exe = Path(sys.executable).parent / "unity"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "unity_cli.cli"]
    model = EXPORTED_DIR / "gpt2_tiny.onnx"
    outs = []
    for seed in ("1", "12345"):
        out = tmp_path / seed / "plan.json"
        out.parent.mkdir()
        r = subprocess.run(cmd + ["optimize", str(model), "--cluster", str(SPECS / "dgx-a100-8.yaml"),
                                  "--batch-size", "8", "--out", str(out), "--max-candidates", "10"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_same_inputs_same_bytes_in_process(mlp_path):
    a = _make(mlp_path, "dgx-a100-32", 16).dumps()
    b = _make(mlp_path, "dgx-a100-32", 16).dumps()
    assert a == b


# -- refusing bad plans ---------------------------------------------------------------------


def _load_doc(doc, tmp_path: Path) -> PlanError:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(seal(doc)))   # edited on purpose: sealed again, so the checks below the hash run
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert str(e.value).startswith(f"{path}: ")
    return e.value


def _node_index(doc: dict, kind: str) -> int:
    return next(i for i, n in enumerate(doc["pcg"]["nodes"]) if n["op"]["kind"] == kind)


def test_rejects_wrong_format(plan_doc, tmp_path):
    plan_doc["format"] = "unity-plan/0"
    msg = str(_load_doc(plan_doc, tmp_path))
    assert "format" in msg and "unity-plan/0" in msg


@pytest.mark.parametrize("key", REQUIRED)
def test_rejects_missing_key(plan_doc, tmp_path, key):
    del plan_doc[key]
    assert f"{key}: missing" in str(_load_doc(plan_doc, tmp_path))


def test_rejects_wrong_stored_shape(plan_doc, tmp_path):
    i = _node_index(plan_doc, "MatMul")
    name = plan_doc["pcg"]["nodes"][i]["name"]
    plan_doc["pcg"]["nodes"][i]["outputs"][0]["sizes"][-1] += 1
    msg = str(_load_doc(plan_doc, tmp_path))
    assert "pcg" in msg and f"%{i}" in msg and name in msg and "stored outputs" in msg


def test_rejects_wrong_stored_degree(plan_doc, tmp_path):
    i = _node_index(plan_doc, "MatMul")
    out = plan_doc["pcg"]["nodes"][i]["outputs"][0]
    out["degrees"][0] = 2 if out["degrees"][0] != 2 else 1
    assert f"%{i}" in str(_load_doc(plan_doc, tmp_path))


def test_rejects_view_outside_cluster(plan_doc, tmp_path):
    i = _node_index(plan_doc, "MatMul")
    plan_doc["pcg"]["nodes"][i]["view"]["start"] = 7
    msg = str(_load_doc(plan_doc, tmp_path))
    assert f"pcg.nodes[{i}].view" in msg and "outside" in msg


def test_rejects_view_with_wrong_strides(plan_doc, tmp_path):
    i = _node_index(plan_doc, "MatMul")
    plan_doc["pcg"]["nodes"][i]["view"]["strides"] = [1]
    msg = str(_load_doc(plan_doc, tmp_path))
    assert f"pcg.nodes[{i}].view" in msg


def test_rejects_overlapping_view(plan_doc, tmp_path):
    i = _node_index(plan_doc, "Repartition")
    view = plan_doc["pcg"]["nodes"][i]["view"]
    view["strides"] = [0] * len(view["strides"])
    msg = str(_load_doc(plan_doc, tmp_path))
    assert f"pcg.nodes[{i}].view" in msg and "same device" in msg


@pytest.mark.parametrize("field", ["op", "inputs", "outputs", "view"])
def test_rejects_malformed_node(plan_doc, tmp_path, field):
    i = _node_index(plan_doc, "MatMul")
    del plan_doc["pcg"]["nodes"][i][field]
    msg = str(_load_doc(plan_doc, tmp_path))
    assert f"pcg.nodes[{i}]" in msg and field in msg


def test_rejects_unknown_op(plan_doc, tmp_path):
    i = _node_index(plan_doc, "MatMul")
    plan_doc["pcg"]["nodes"][i]["op"]["kind"] = "Frobnicate"
    msg = str(_load_doc(plan_doc, tmp_path))
    assert f"pcg.nodes[{i}]" in msg and "Frobnicate" in msg


def test_rejects_bad_cluster(plan_doc, tmp_path):
    plan_doc["cluster"]["nodes"][0]["devices"] = 0
    msg = str(_load_doc(plan_doc, tmp_path))
    assert msg.split(": ", 1)[1].startswith("cluster:") and "devices" in msg


def test_rejects_dangling_output(plan_doc, tmp_path):
    plan_doc["pcg"]["outputs"] = [[10_000, 0]]
    assert "pcg" in str(_load_doc(plan_doc, tmp_path))


def test_rejects_non_object(tmp_path):
    assert "not a JSON object" in str(_load_doc([1, 2, 3], tmp_path))


def test_rejects_non_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("this is { not json\n")
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert str(path) in str(e.value) and "not a JSON plan" in str(e.value)


def test_rejects_binary_and_missing_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlanError, match="not a JSON plan"):
        load_plan(path)
    with pytest.raises(PlanError, match="no such file"):
        load_plan(tmp_path / "absent.json")


def test_plan_from_json_does_not_mutate(plan_doc):
    before = copy.deepcopy(plan_doc)
    plan_from_json(plan_doc)
    assert plan_doc == before


# -- an edited plan never runs (#13) ----------------------------------------------------------------


def _edits():
    def drop_node(doc):     # one node removed and the rest renumbered: a different graph
        nodes = doc["pcg"]["nodes"]
        del nodes[len(nodes) // 2]
        for i, n in enumerate(nodes):
            n["id"] = i

    def step_time(doc):
        doc["predicted"]["step_time_ms"] *= 0.5

    def strategy(doc):
        doc["strategy"] = "magic"

    def inputs(doc):
        name = next(iter(doc["model"]["inputs"]))
        doc["model"]["inputs"][name]["dims"][0] += 1

    return [drop_node, step_time, strategy, inputs]


@pytest.mark.parametrize("edit", _edits(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("command", ["run", "explain", "report"])
def test_an_edited_plan_is_refused_in_one_line(plan_doc, tmp_path, edit, command):
    from click.testing import CliRunner

    from unity_cli.cli import cli

    edit(plan_doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc, sort_keys=True, indent=1))
    args = [command, str(path)] + (["-o", str(tmp_path / "r.html")] if command == "report" else [])
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert str(path) in r.output and "edited" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400"])
def test_not_finite_numbers_or_no_hash_are_refused(plan_doc, tmp_path, value):
    path = tmp_path / "plan.json"
    text = json.dumps(plan_doc, sort_keys=True).replace(
        f'"step_time_ms": {json.dumps(plan_doc["predicted"]["step_time_ms"])}', f'"step_time_ms": {value}')
    assert value in text
    path.write_text(text)
    with pytest.raises(PlanError, match="NaN or infinity"):
        load_plan(path)
    del plan_doc["content_sha256"]
    path.write_text(json.dumps(plan_doc))
    with pytest.raises(PlanError, match="content_sha256: missing"):
        load_plan(path)


def test_a_plan_as_written_loads_and_its_hash_covers_everything(plan_doc, tmp_path, bert_plan):
    path = tmp_path / "plan.json"
    bert_plan.save(path)
    assert load_plan(path).to_json() == bert_plan.to_json()
    assert set(plan_doc) - {"content_sha256"} == set(bert_plan.to_json())
