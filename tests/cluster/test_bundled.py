"""The cluster specs ship with the package: ``--cluster NAME`` works from any folder, and
``unity clusters`` lists them (#13, group 6)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from models.catalog import mlp_model

from unity_cli.cli import cli
from unity_cli.cluster import bundled_clusters, load_cluster
from unity_cli.errors import ClusterSpecError

REPO = Path(__file__).resolve().parents[2]
UNITY = str(Path(sys.executable).parent / "unity")


def test_every_spec_of_the_repo_ships_and_nothing_else():
    repo = {p.stem: p.read_bytes() for p in sorted((REPO / "cluster_specs").glob("*.yaml"))}
    shipped = {name: p.read_bytes() for name, p in bundled_clusters().items()}
    assert shipped == repo


def test_a_name_loads_the_same_spec_as_its_path():
    for name in bundled_clusters():
        spec = load_cluster(name)
        assert spec == load_cluster(REPO / "cluster_specs" / f"{name}.yaml")
        assert load_cluster(f"{name}.yaml") == spec == load_cluster(f"cluster_specs/{name}.yaml")


def test_an_unknown_name_lists_the_bundled_ones():
    with pytest.raises(ClusterSpecError) as e:
        load_cluster("dgx-a100-9")
    assert "dgx-a100-9: no such file" in str(e.value)
    assert all(name in str(e.value) for name in bundled_clusters())


def test_a_file_wins_over_a_bundled_name(tmp_path, monkeypatch):
    text = (REPO / "cluster_specs" / "dgx-a100-8.yaml").read_text().replace("count: 1", "count: 2")
    (tmp_path / "dgx-a100-8").write_text(text + "inter_node_link:\n  bandwidth: 25 GB/s\n  latency: 5 us\n")
    monkeypatch.chdir(tmp_path)
    assert load_cluster("dgx-a100-8").num_devices == 16


def test_unity_clusters_lists_each_with_its_devices():
    r = CliRunner().invoke(cli, ["clusters"])
    assert r.exit_code == 0, r.output
    rows = r.output.splitlines()
    assert len(rows) == len(bundled_clusters())
    for row, (name, path) in zip(rows, bundled_clusters().items(), strict=True):
        assert row.split()[0] == name
        assert f"{load_cluster(path).num_devices} devices" in row


def test_optimize_by_name_outside_the_repo(tmp_path):
    model = mlp_model(tmp_path / "mlp.onnx")
    r = subprocess.run([UNITY, "optimize", str(model), "--cluster", "local-cpu", "--out", "plan.json",
                        "--max-candidates", "4"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["cluster"]["name"] == "local-cpu"


@pytest.mark.parametrize("spec,nodes,per", [("dgx-a100-80:64", 8, 8), ("dgx-h100:1024", 128, 8), ("dgx-h100:8", 1, 8),
                                            ("dgx-a100-80:4", 1, 4), ("summit-192:48", 8, 6), ("local-cpu:3", 1, 3),
                                            ("h200-8:16", None, None), ("dgx-a100-80:12", None, None),
                                            ("dgx-a100-80:0", None, None), ("mixed-a100-v100:8", None, None)])
def test_a_spec_sized_by_name(spec, nodes, per):
    """``SPEC:N``: the spec's identical nodes, as many as hold N devices (a one-machine spec
    without a network grows its node); a size that is not whole nodes, a spec without an
    inter-node link grown past one node, or one of unlike nodes: one line that says so."""
    if nodes is None:
        with pytest.raises(ClusterSpecError) as e:
            load_cluster(spec)
        assert spec in str(e.value) and "\n" not in str(e.value)
        return
    c = load_cluster(spec)
    base = load_cluster(spec.split(":")[0])
    assert c.name == spec and c.num_devices == nodes * per == int(spec.split(":")[1])
    assert len(c.nodes) == nodes and all(n.devices == per and n.device == base.nodes[0].device for n in c.nodes)
    assert c.inter_link == base.inter_link


def test_optimize_on_a_sized_cluster(tmp_path):
    model = mlp_model(tmp_path / "mlp.onnx")
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", "dgx-a100-80:16", "--batch-size", "32",
                                 "--out", str(out), "--strategy", "data_parallel"])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["cluster"]["name"] == "dgx-a100-80:16" and plan["predicted"]["devices"] == 16


@pytest.mark.parametrize("spec", ["dgx-a100-80:9999992", "nosuch:8", "dgx-a100-80:-8", "dgx-a100-80:"])
def test_a_bad_size_is_one_line_naming_it(spec):
    with pytest.raises(ClusterSpecError) as e:
        load_cluster(spec)
    assert str(e.value).startswith(spec + ":") and "\n" not in str(e.value)
