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
