"""Detection of the local machine: CPU here, and GPUs through a fake cupy."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from unity_cli.cluster import DeviceKind, load_cluster, local_cluster, parse_cluster

REPO = Path(__file__).resolve().parents[2]


def _no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import cupy` raise ImportError.
    monkeypatch.setitem(sys.modules, "cupy", None)


def test_cpu_machine_gives_one_node_of_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cupy(monkeypatch)
    spec = local_cluster()
    assert len(spec.nodes) == 1
    node = spec.nodes[0]
    assert node.device.kind is DeviceKind.CPU
    assert spec.num_devices >= 1
    assert node.device.memory_capacity > 0
    assert node.device.flops("float32") > 0
    assert parse_cluster(spec.to_dict()) == spec


def test_cpu_numbers_match_local_cpu_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cupy(monkeypatch)
    detected = local_cluster().nodes[0]
    shipped = load_cluster(REPO / "cluster_specs" / "local-cpu.yaml").nodes[0]
    assert detected.device.peak_flops == shipped.device.peak_flops
    assert detected.device.memory_bandwidth == shipped.device.memory_bandwidth
    assert detected.device.launch_overhead == shipped.device.launch_overhead
    assert detected.intra_link == shipped.intra_link


def test_core_count_follows_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_cupy(monkeypatch)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert local_cluster().num_devices == 3


def _fake_cupy(count: int, props: dict[str, object] | None = None,
               fail: bool = False) -> types.ModuleType:
    def device_count() -> int:
        if fail:
            raise RuntimeError("cudaErrorInsufficientDriver")
        return count

    runtime = types.SimpleNamespace(
        getDeviceCount=device_count,
        getDeviceProperties=lambda i: dict(props or {}),
    )
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return module


H200_PROPS = {
    "name": b"NVIDIA H200",
    "totalGlobalMem": 150_754_820_096,
    "multiProcessorCount": 132,
    "clockRate": 1_980_000,
    "memoryClockRate": 3_201_000,
    "memoryBusWidth": 6144,
    "major": 9,
}


def test_known_gpus_use_datasheet_flops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(8, H200_PROPS))
    spec = local_cluster()
    assert spec.num_devices == 8
    device = spec.nodes[0].device
    assert device.kind is DeviceKind.GPU
    assert device.name == "nvidia-h200"
    assert device.flops("bfloat16") == 989e12
    assert device.memory_capacity == H200_PROPS["totalGlobalMem"]
    assert device.memory_bandwidth == pytest.approx(4.9e12, rel=0.05)
    assert spec.nodes[0].intra_link.bandwidth == 450e9
    assert parse_cluster(spec.to_dict()) == spec


def test_unknown_gpu_is_estimated(monkeypatch: pytest.MonkeyPatch) -> None:
    props = {"name": "Mystery GPU", "totalGlobalMem": 8 * 2**30,
             "multiProcessorCount": 10, "clockRate": 1_000_000, "major": 8}
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(2, props))
    device = local_cluster().nodes[0].device
    assert device.flops("float32") == 10 * 64 * 2 * 1e9
    assert device.flops("bfloat16") == device.flops("float32")  # conservative fallback
    assert device.memory_bandwidth > 0


@pytest.mark.parametrize("cupy", [_fake_cupy(0), _fake_cupy(4, fail=True)])
def test_no_usable_gpu_falls_back_to_cpu(monkeypatch: pytest.MonkeyPatch,
                                         cupy: types.ModuleType) -> None:
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert local_cluster().nodes[0].device.kind is DeviceKind.CPU
