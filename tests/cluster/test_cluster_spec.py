"""Cluster specs: the shipped YAMLs, the data model, and one clear line per bad input."""
from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from unity_cli.cluster import (
    ClusterSpec,
    DeviceKind,
    DeviceType,
    Link,
    NodeSpec,
    load_cluster,
    parse_cluster,
)
from unity_cli.errors import ClusterSpecError

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


# ------------------------------------------------------------------ shipped specs

@pytest.mark.parametrize(
    ("file", "devices", "nodes"),
    [
        ("local-cpu.yaml", 2, 1),
        ("dgx-a100-8.yaml", 8, 1),
        ("dgx-a100-32.yaml", 32, 4),
        ("summit-192.yaml", 192, 32),
        ("h200-8.yaml", 8, 1),
        ("mixed-a100-v100.yaml", 26, 5),
        ("dgx-a100-80.yaml", 8, 1),
        ("dgx-h100.yaml", 8, 1),
    ],
)
def test_shipped_specs_load(file: str, devices: int, nodes: int) -> None:
    spec = load_cluster(SPECS / file)
    assert spec.num_devices == devices
    assert len(spec.nodes) == nodes
    assert parse_cluster(spec.to_dict()) == spec


def test_every_shipped_yaml_is_covered() -> None:
    shipped = {p.name for p in SPECS.glob("*.yaml")}
    assert shipped == {"local-cpu.yaml", "dgx-a100-8.yaml", "dgx-a100-32.yaml",
                       "summit-192.yaml", "h200-8.yaml", "mixed-a100-v100.yaml", "dgx-a100-80.yaml",
                       "dgx-h100.yaml"}


def test_shipped_numbers_are_in_si_units() -> None:
    a100 = load_cluster(SPECS / "dgx-a100-32.yaml")
    device = a100.device_type(0)
    assert device.kind is DeviceKind.GPU
    assert device.flops("float32") == 19.5e12
    assert device.flops("tfloat32") == 156e12
    assert device.flops("bfloat16") == 312e12
    assert device.memory_bandwidth == 1.555e12
    assert device.memory_capacity == 40 * 2**30
    assert device.launch_overhead == 5e-6
    assert a100.nodes[0].intra_link == Link(300e9, 2e-6)
    assert a100.inter_link == Link(25e9, 5e-6)
    summit = load_cluster(SPECS / "summit-192.yaml")
    assert summit.device_type(191).flops("float16") == 125e12
    assert summit.device_type(0).flops("bfloat16") == 15.7e12  # falls back to float32
    assert summit.inter_link.bandwidth == 25e9
    h200 = load_cluster(SPECS / "h200-8.yaml").device_type(7)
    assert (h200.flops("bfloat16"), h200.memory_capacity) == (989e12, 141 * 10**9)
    cpu = load_cluster(SPECS / "local-cpu.yaml").device_type(1)
    assert cpu.kind is DeviceKind.CPU and cpu.launch_overhead == 6e-6


def test_mixed_cluster_overrides() -> None:
    spec = load_cluster(SPECS / "mixed-a100-v100.yaml")
    assert [n.devices for n in spec.nodes] == [8, 8, 4, 4, 2]
    assert [n.name for n in spec.nodes] == ["node0", "node1", "node2", "node3", "workstation"]
    assert spec.device_type(15).name == "a100-40gb"
    assert spec.device_type(16).name == "v100-16gb"
    assert spec.nodes[1].intra_link.bandwidth == 300e9  # from node_defaults
    assert spec.nodes[2].intra_link.bandwidth == 50e9  # overridden
    assert spec.device_offsets == (0, 8, 16, 20, 24)


# ------------------------------------------------------------------ data model

A100 = DeviceType("a100", DeviceKind.GPU, (("float32", 19.5e12), ("bfloat16", 312e12)),
                  1.555e12, 40 * 2**30, 5e-6)
NVLINK = Link(300e9, 2e-6)
SLOW = Link(10e9, 3e-6)
IB = Link(25e9, 5e-6)


def _cluster() -> ClusterSpec:
    nodes = (NodeSpec("node0", A100, 4, NVLINK), NodeSpec("node1", A100, 2, SLOW),
             NodeSpec("node2", A100, 4, NVLINK))
    return ClusterSpec("toy", nodes, IB)


def test_global_indices_are_node_major() -> None:
    spec = _cluster()
    assert spec.num_devices == 10
    assert spec.device_offsets == (0, 4, 6)
    assert [spec.node_of(g) for g in range(10)] == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert [spec.local_index(g) for g in range(10)] == [0, 1, 2, 3, 0, 1, 0, 1, 2, 3]
    assert spec.device_type(5) is A100
    with pytest.raises(IndexError):
        spec.node_of(10)
    with pytest.raises(IndexError):
        spec.node_of(-1)


def test_peak_flops_are_canonical_and_fall_back_to_float32() -> None:
    assert A100.peak_flops == (("bfloat16", 312e12), ("float32", 19.5e12))
    assert A100.flops("float16") == 19.5e12
    half_only = DeviceType("x", DeviceKind.GPU, (("float16", 1e12),), 1e9, 1, 0.0)
    with pytest.raises(ClusterSpecError, match="no peak FLOP/s for bfloat16"):
        half_only.flops("bfloat16")


def test_link_for_picks_intra_or_inter() -> None:
    spec = _cluster()
    assert spec.link_for([0, 1, 3]) == NVLINK
    assert spec.link_for(range(4, 6)) == SLOW
    assert spec.link_for([0, 6]) == IB  # one device per node: only the network
    assert spec.link_for(range(10)) == SLOW  # node1's intra link is slower than IB
    assert spec.link_for([0, 1, 6, 7]) == IB
    single = spec.link_for([3, 3])
    assert single.bandwidth == math.inf and single.latency == 0.0
    assert spec.link_for([]).bandwidth == math.inf


def test_first_n_devices() -> None:
    spec = _cluster()
    assert spec.first(10) is spec
    part = spec.first(5)
    assert part.num_devices == 5
    assert [(n.name, n.devices) for n in part.nodes] == [("node0", 4), ("node1", 1)]
    assert part.inter_link == IB
    assert spec.first(4).nodes == (spec.nodes[0],)
    summit = load_cluster(SPECS / "summit-192.yaml").first(16)
    assert summit.num_devices == 16 and len(summit.nodes) == 3
    assert parse_cluster(summit.to_dict()) == summit
    for bad in (0, 11, -1):
        with pytest.raises(ClusterSpecError, match="toy"):
            spec.first(bad)


def test_to_dict_is_canonical_json_and_round_trips() -> None:
    spec = _cluster()
    data = spec.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert [g["count"] for g in data["nodes"]] == [1, 1, 1]
    again = parse_cluster(data)
    assert again == spec
    assert again.to_dict() == data
    # Plain numbers survive JSON exactly; runs of identical nodes are grouped.
    summit = load_cluster(SPECS / "summit-192.yaml").to_dict()
    assert summit["nodes"] == [{"count": 32, "device": "v100-16gb", "devices": 6,
                                "intra_link": {"bandwidth": 50e9, "latency": 2e-6}}]
    assert parse_cluster(json.loads(json.dumps(summit))).to_dict() == summit


def test_a_cache_round_trips_and_only_where_given() -> None:
    cpu = load_cluster(SPECS / "local-cpu.yaml")
    device = cpu.nodes[0].device
    assert (device.cache_capacity, device.cache_bandwidth) == (2**20, 30e9)
    assert device.bandwidth(2**20) == 30e9 and device.bandwidth(2**20 + 1) == device.memory_bandwidth
    data = cpu.to_dict()
    assert data["device_types"]["cpu-core"]["memory"]["cache"] == {"capacity": 2**20, "bandwidth": 30e9}
    assert parse_cluster(json.loads(json.dumps(data))) == cpu
    gpu = load_cluster(SPECS / "dgx-a100-8.yaml")
    assert "cache" not in gpu.to_dict()["device_types"]["a100-40gb"]["memory"]
    assert gpu.nodes[0].device.bandwidth(1) == gpu.nodes[0].device.memory_bandwidth


def test_named_nodes_round_trip() -> None:
    nodes = (NodeSpec("alpha", A100, 2, NVLINK), NodeSpec("node1", A100, 2, NVLINK),
             NodeSpec("node2", A100, 2, NVLINK))
    spec = ClusterSpec("named", nodes, IB)
    data = spec.to_dict()
    assert [g.get("name") for g in data["nodes"]] == ["alpha", None]
    assert parse_cluster(data) == spec


def test_cluster_invariants() -> None:
    with pytest.raises(ClusterSpecError, match="no nodes"):
        ClusterSpec("empty", (), IB)
    with pytest.raises(ClusterSpecError, match="duplicate node name"):
        ClusterSpec("dup", (NodeSpec("a", A100, 1, NVLINK),) * 2, IB)
    other = DeviceType("a100", DeviceKind.GPU, (("float32", 1e12),), 1e9, 1, 0.0)
    with pytest.raises(ClusterSpecError, match="two different device types"):
        ClusterSpec("clash", (NodeSpec("a", A100, 1, NVLINK), NodeSpec("b", other, 1, NVLINK)), IB)


# ------------------------------------------------------------------ bad input

GOOD: dict[str, Any] = {
    "name": "test",
    "device_types": {
        "gpu-a": {
            "kind": "gpu",
            "peak_flops": {"float32": "10 TFLOP/s", "bfloat16": "100 TFLOP/s"},
            "memory": {"bandwidth": "1 TB/s", "capacity": "16 GiB"},
        },
    },
    "nodes": [
        {"count": 2, "devices": 4, "device": "gpu-a",
         "intra_link": {"bandwidth": "100 GB/s", "latency": "2 us"}},
        {"devices": 2, "device": "gpu-a", "intra_link": {"bandwidth": "50 GB/s", "latency": "2 us"}},
    ],
    "inter_node_link": {"bandwidth": "200 Gb/s", "latency": "5 us"},
}


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets (or, with value DELETE, removes) a dotted path of GOOD."""
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        target: Any = data
        for part in parents:
            target = target[part]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return mutate


DELETE = object()


def test_good_fixture_is_good(tmp_path: Path) -> None:
    spec = load_cluster(_write(tmp_path, GOOD))
    assert spec.num_devices == 10
    assert spec.inter_link == Link(25e9, 5e-6)


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        # unknown keys: typos must not pass silently
        (_set("nodez", 1), "nodez", "unknown key"),
        (_set("inter_node_link.bandwith", "1 GB/s"), "inter_node_link.bandwith",
         "did you mean 'bandwidth'"),
        (_set("nodes.1.device_count", 2), "nodes[1].device_count", "unknown key"),
        (_set("device_types.gpu-a.peak_flops.fp8", "1 PFLOP/s"),
         "device_types.gpu-a.peak_flops.fp8", "unknown key"),
        (_set("device_types.gpu-a.memory.size", "1 GB"), "device_types.gpu-a.memory.size",
         "unknown key"),
        # missing required fields
        (_set("name", DELETE), "name", "missing required field"),
        (_set("device_types", DELETE), "device_types", "missing required field"),
        (_set("nodes", DELETE), "nodes", "missing required field"),
        (_set("device_types.gpu-a.memory.capacity", DELETE), "device_types.gpu-a.memory.capacity",
         "missing required field"),
        (_set("device_types.gpu-a.kind", DELETE), "device_types.gpu-a.kind", "missing"),
        (_set("nodes.1.intra_link.latency", DELETE), "nodes[1].intra_link.latency", "missing"),
        (_set("nodes.0.device", DELETE), "nodes[0].device", "missing required field"),
        (_set("inter_node_link", DELETE), "inter_node_link", "the cluster has 3 nodes"),
        # wrong types
        (_set("nodes.0.devices", "eight"), "nodes[0].devices", "must be an integer"),
        (_set("nodes.0.devices", 2.5), "nodes[0].devices", "must be an integer"),
        (_set("nodes.0.devices", True), "nodes[0].devices", "must be an integer"),
        (_set("nodes", 5), "nodes", "must be a mapping or a list"),
        (_set("name", 7), "name", "must be a string"),
        (_set("device_types.gpu-a.peak_flops", [1, 2]), "device_types.gpu-a.peak_flops",
         "must be a mapping, got a list"),
        (_set("device_types.gpu-a.memory.bandwidth", [1]), "device_types.gpu-a.memory.bandwidth",
         "must be a number or a string with a unit"),
        (_set("device_types.gpu-a.kind", "tpu"), "device_types.gpu-a.kind", "must be one of"),
        # non-positive quantities
        (_set("nodes.1.intra_link.bandwidth", "-5 GB/s"), "nodes[1].intra_link.bandwidth",
         "must be a positive quantity, got -5 GB/s"),
        (_set("nodes.1.intra_link.bandwidth", 0), "nodes[1].intra_link.bandwidth",
         "must be a positive quantity"),
        (_set("device_types.gpu-a.memory.capacity", "0 GiB"), "device_types.gpu-a.memory.capacity",
         "must be a positive quantity"),
        (_set("device_types.gpu-a.peak_flops.float32", -1), "device_types.gpu-a.peak_flops.float32",
         "must be a positive quantity"),
        (_set("device_types.gpu-a.memory.bandwidth", "0 TB/s"), "device_types.gpu-a.memory.bandwidth",
         "positive"),
        (_set("inter_node_link.latency", "-1 us"), "inter_node_link.latency",
         "must be a non-negative quantity, got -1 us"),
        (_set("device_types.gpu-a.launch_overhead", -1e-6), "device_types.gpu-a.launch_overhead",
         "non-negative"),
        # units
        (_set("inter_node_link.bandwidth", "200 Gbs"), "inter_node_link.bandwidth",
         "unknown unit 'Gbs'"),
        (_set("nodes.0.intra_link.latency", "2 GB"), "nodes[0].intra_link.latency",
         "is a size, but a duration is expected"),
        (_set("device_types.gpu-a.memory.capacity", "16 gigs"), "device_types.gpu-a.memory.capacity",
         "unknown unit"),
        # references and counts
        (_set("nodes.1.device", "gpu-b"), "nodes[1].device", "unknown device type 'gpu-b'"),
        (_set("nodes", []), "nodes", "must not be empty"),
        (_set("nodes.0.count", 0), "nodes[0].count", "must be at least 1"),
        (_set("nodes.0.devices", 0), "nodes[0].devices", "must be at least 1"),
        (_set("device_types", {}), "device_types", "must not be empty"),
        (_set("device_types.gpu-a.peak_flops", {}), "device_types.gpu-a.peak_flops",
         "must not be empty"),
        (_set("name", ""), "name", "must not be empty"),
        # a cache: both fields, inside memory, smaller and faster than memory
        (_set("device_types.gpu-a.memory.cache", {"capacity": "1 MiB"}), "device_types.gpu-a.memory.cache.bandwidth",
         "missing required field"),
        (_set("device_types.gpu-a.memory.cache", {"capacity": "1 MiB", "bandwidth": "1 GB/s"}),
         "device_types.gpu-a.memory.cache.bandwidth", "must be at least memory.bandwidth"),
        (_set("device_types.gpu-a.memory.cache", {"capacity": "1 TiB", "bandwidth": "100 TB/s"}),
         "device_types.gpu-a.memory.cache.capacity", "less than memory.capacity"),
        (_set("device_types.gpu-a.memory.cache", {"capacity": "0 MiB", "bandwidth": "100 TB/s"}),
         "device_types.gpu-a.memory.cache.capacity", "must be a positive quantity"),
        (_set("device_types.gpu-a.memory.cache", {"size": "1 MiB", "bandwidth": "100 TB/s"}),
         "device_types.gpu-a.memory.cache.size", "unknown key"),
        # names
        (_set("nodes.0.name", "big"), "nodes[0].name", "only a single node"),
        (_set("nodes.1.name", "node0"), "nodes[1].name", "duplicate node name 'node0'"),
    ],
)
def test_bad_specs_name_file_and_field(tmp_path: Path, mutate: Callable[[dict[str, Any]], None],
                                       field: str, fragment: str) -> None:
    data = copy.deepcopy(GOOD)
    mutate(data)
    with pytest.raises(ClusterSpecError) as caught:
        load_cluster(_write(tmp_path, data))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'bad.yaml'}: {field}: "), message
    assert fragment in message, message


def test_node_defaults_and_mapping_form(tmp_path: Path) -> None:
    data = copy.deepcopy(GOOD)
    data["node_defaults"] = {"device": "gpu-a", "devices": 4,
                             "intra_link": {"bandwidth": "1 GB/s", "latency": 0}}
    data["nodes"] = [{"count": 2}, {"devices": 1}]
    spec = load_cluster(_write(tmp_path, data))
    assert [n.devices for n in spec.nodes] == [4, 4, 1]
    data["node_defaults"]["device"] = "gpu-x"
    with pytest.raises(ClusterSpecError, match=r"bad.yaml: node_defaults.device: unknown device"):
        load_cluster(_write(tmp_path, data))
    data["node_defaults"]["device"] = "gpu-a"
    data["node_defaults"]["intra_link"]["bandwidth"] = "-1 GB/s"
    with pytest.raises(ClusterSpecError, match=r"node_defaults.intra_link.bandwidth: must be a positive"):
        load_cluster(_write(tmp_path, data))
    single = copy.deepcopy(GOOD)
    single["nodes"] = {"devices": 3, "device": "gpu-a", "intra_link": {"bandwidth": 1e9, "latency": 0}}
    del single["inter_node_link"]
    spec = load_cluster(_write(tmp_path, single))
    assert spec.num_devices == 3 and spec.inter_link == spec.nodes[0].intra_link
    single["nodes"]["devcies"] = 3
    with pytest.raises(ClusterSpecError, match=r"bad.yaml: nodes.devcies: unknown key; did you mean 'devices'"):
        load_cluster(_write(tmp_path, single))


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "file is empty"),
        ("# only a comment\n", "file is empty"),
        ("- a\n- b\n", "top level must be a mapping, got a list"),
        ("just text\n", "top level must be a mapping, got str"),
        ("name: x\nnodes: [1, 2\n", "line 3, column 1: YAML does not parse"),
        ("name: x\n  bad: indent\n", "line 2, column 6: YAML does not parse"),
        ("name: a\nname: b\n", "line 2, column 1: YAML does not parse: duplicate key 'name'"),
        ("name: a\ndevice_types: {7: {}}\nnodes: {}\n", "device_types: names must be strings"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ClusterSpecError) as caught:
        load_cluster(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert fragment in message, message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ClusterSpecError, match=r"nowhere.yaml: no such file"):
        load_cluster(tmp_path / "nowhere.yaml")


def test_parse_cluster_names_its_source() -> None:
    with pytest.raises(ClusterSpecError, match=r"^plan.json: cluster: top level must be a mapping"):
        parse_cluster([1], "plan.json: cluster")
    with pytest.raises(ClusterSpecError, match=r"^<cluster spec>: name: missing"):
        parse_cluster({"device_types": {}, "nodes": []})


def test_misspelled_nested_key_is_named_before_the_missing_one(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "cluster_specs" / "dgx-a100-8.yaml").read_text()
    bad = tmp_path / "typo.yaml"
    bad.write_text(text.replace("latency:", "latncy:", 1))
    with pytest.raises(ClusterSpecError, match=r"typo.yaml: .*latncy: unknown key; did you mean 'latency'"):
        load_cluster(bad)
