"""Inputs that used to run for minutes, blow up or round silently, refused in one line
naming the file and field (#13, groups 3 and 4)."""
from __future__ import annotations

import time
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from models.catalog import mlp_model
from onnx import TensorProto, helper

from unity_cli.cli import cli

REPO = Path(__file__).resolve().parents[2]
DGX8 = (REPO / "cluster_specs" / "dgx-a100-8.yaml").read_text()


def _error(args: list[str], *needles: str) -> str:
    t0 = time.monotonic()
    r = CliRunner().invoke(cli, args)
    assert time.monotonic() - t0 < 60                # refused, not worked through
    assert r.exit_code == 1, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and all(n in lines[0] for n in needles), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return mlp_model(tmp_path_factory.mktemp("refusals") / "mlp.onnx")


@pytest.mark.parametrize("old, new, field, word", [
    ("bandwidth: 300 GB/s", "bandwidth: 1e1000000 GB/s", "nodes.intra_link.bandwidth", "out of range"),
    ("capacity: 40 GiB", "capacity: 0.4 B", "memory.capacity", "at least 1 byte"),
    ("count: 1", "count: 1000000000", "nodes.count", "65536"),
    ("devices: 8", "devices: 1000000", "nodes.devices", "65536"),
    ("count: 1", "count: 9000", "nodes", "at most 65536"),
])
def test_cluster_values_out_of_range(tmp_path, mlp, old, new, field, word):
    text = DGX8.replace(old, new)
    assert new in text
    if "count: 9000" in new:    # 9000 nodes of 8: each field in range, the total not
        text += "inter_node_link:\n  bandwidth: 25 GB/s\n  latency: 5 us\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    _error(["optimize", str(mlp), "--cluster", str(path), "--out", str(tmp_path / "p.json")], str(path), field, word)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("command", ["explain", "report", "run"])
def test_json_nested_too_deeply(tmp_path, command):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    _error([command, str(path)] + (["-o", str(tmp_path / "r.html")] if command == "report" else []),
           str(path), "nested too deeply")


def test_a_graph_without_outputs(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], [])
    path = tmp_path / "none.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    _error(["optimize", str(path), "--out", str(tmp_path / "p.json")], str(path), "no outputs")


def _bomb(levels: int = 9) -> str:
    """A billion-laughs value: a flow list whose each item repeats the one before nine times
    (9^9 strings behind a few hundred bytes)."""
    items = ['&a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    items += [f"&a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, levels)]
    return "[" + ", ".join(items) + "]"


@pytest.mark.parametrize("where", ["name", "count", "unknown key"])
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, mlp, where):
    """In a typed field (the schema would walk every value) or under an unknown key."""
    if where == "name":
        text = DGX8.replace("name: dgx-a100-8", f"name: {_bomb()}", 1)
    elif where == "count":
        text = DGX8.replace("count: 1", f"count: {_bomb()}", 1)
    else:
        text = DGX8 + f"extra: {_bomb()}\n"
    assert "*a7" in text
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    line = _error(["optimize", str(mlp), "--cluster", str(path), "--out", str(tmp_path / "p.json")], str(path))
    assert "expands to more than 100,000 values" in line, line


def test_a_yaml_document_too_big_or_too_deep(tmp_path, mlp):
    big = tmp_path / "big.yaml"
    big.write_text(DGX8 + "#" + "x" * (1 << 20) + "\n")
    _error(["optimize", str(mlp), "--cluster", str(big), "--out", str(tmp_path / "p.json")], str(big), "MiB")
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 20_000 + "]" * 20_000 + "\n")   # far past the recursion limit
    _error(["optimize", str(mlp), "--cluster", str(deep), "--out", str(tmp_path / "p.json")], str(deep))
