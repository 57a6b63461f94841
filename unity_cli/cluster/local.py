"""The machine unity runs on, as a cluster spec (``unity optimize`` without ``--cluster``).

If cupy is importable and sees GPUs, the cluster is one node of those GPUs; otherwise
it is one node whose devices are the CPU cores this process may use (one MPI rank per
core), with the same per-core numbers as ``cluster_specs/local-cpu.yaml``. Detection
never fails: whatever goes wrong with cupy or the driver, the answer is the CPU node.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unity_cli.cluster.spec import ClusterSpec, DeviceKind, DeviceType, Link, NodeSpec, default_launch_overhead

__all__ = ["CPU_CORE", "CPU_SHARED_MEMORY_LINK", "local_cluster"]

GiB = 2**30

# A modern x86 core as numpy sees it: sustained, not theoretical, rates. A rank per
# core shares the socket's memory bandwidth and talks to other ranks through shared
# memory.
CPU_CORE_FLOPS = (("float32", 50e9), ("float64", 25e9))
CPU_CORE_MEMORY_BANDWIDTH = 10e9
CPU_CORE_CACHE = (2**20, 30e9)   # a core's L2 (bytes) and what numpy's passes stream from it
CPU_SHARED_MEMORY_LINK = Link(bandwidth=5e9, latency=2e-6)
CPU_LAUNCH_OVERHEAD = default_launch_overhead(DeviceKind.CPU)   # the runtime's dispatch per op and pass
CPU_CORE = "cpu-core"
_FALLBACK_MEMORY_PER_CORE = 4 * GiB


_NVLINK_LATENCY = 2e-6
_PCIE_LINK = Link(bandwidth=25e9, latency=10e-6)


@dataclass(frozen=True, slots=True)
class _KnownGpu:
    """Datasheet numbers (dense FLOP/s; 0 = no such mode) for GPUs matched by name."""

    match: str  # substring of the CUDA device name
    fp32: float
    tf32: float
    bf16: float
    fp16: float
    memory_bandwidth: float
    link: Link  # GPU-to-GPU, per direction: NVLink for SXM parts, else PCIe


# Matched in order, so more specific names come first.
_KNOWN_GPUS = (
    _KnownGpu("H200", 67e12, 494.5e12, 989e12, 989e12, 4.8e12, Link(450e9, _NVLINK_LATENCY)),
    _KnownGpu("H100 PCIe", 51e12, 378e12, 756e12, 756e12, 2.0e12, Link(32e9, 10e-6)),
    _KnownGpu("H100", 67e12, 494.5e12, 989e12, 989e12, 3.35e12, Link(450e9, _NVLINK_LATENCY)),
    _KnownGpu("A100-PCIE", 19.5e12, 156e12, 312e12, 312e12, 1.555e12, _PCIE_LINK),
    _KnownGpu("A100-SXM4-80GB", 19.5e12, 156e12, 312e12, 312e12, 2.039e12,
              Link(300e9, _NVLINK_LATENCY)),
    _KnownGpu("A100", 19.5e12, 156e12, 312e12, 312e12, 1.555e12, Link(300e9, _NVLINK_LATENCY)),
    _KnownGpu("V100-PCIE", 14e12, 0.0, 0.0, 112e12, 900e9, Link(12e9, 10e-6)),
    _KnownGpu("V100", 15.7e12, 0.0, 0.0, 125e12, 900e9, Link(150e9, _NVLINK_LATENCY)),
)
# Conservative guesses for a GPU we cannot identify or measure.
_FALLBACK_GPU_FP32 = 10e12
_FALLBACK_GPU_MEMORY_BANDWIDTH = 500e9
# FP32 lanes per SM by compute capability major version (Volta/Ampere-A100: 64).
_FP32_LANES_PER_SM = {7: 64, 8: 64, 9: 128, 10: 128, 12: 128}


def local_cluster() -> ClusterSpec:
    """The machine this process runs on: its GPUs if cupy sees any, else its CPU cores."""
    try:
        gpu_node = _gpu_node()
    except Exception:  # any cupy/driver failure means: plan for the CPU
        gpu_node = None
    if gpu_node is not None:
        return ClusterSpec("local-gpu", (gpu_node,), gpu_node.intra_link)
    node = _cpu_node()
    return ClusterSpec("local-cpu", (node,), node.intra_link)


def _cpu_node() -> NodeSpec:
    cores = _core_count()
    total = _total_memory()
    per_core = total // cores if total else _FALLBACK_MEMORY_PER_CORE
    device = DeviceType(CPU_CORE, DeviceKind.CPU, CPU_CORE_FLOPS, CPU_CORE_MEMORY_BANDWIDTH,
                        per_core, CPU_LAUNCH_OVERHEAD, *CPU_CORE_CACHE)
    return NodeSpec("node0", device, cores, CPU_SHARED_MEMORY_LINK)


def _core_count() -> int:
    """Cores this process may run on (the affinity mask, which containers narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _total_memory() -> int | None:
    """Total RAM in bytes from /proc/meminfo, else sysconf, else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # reported in kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _gpu_node() -> NodeSpec | None:
    """One node of the GPUs cupy sees, or None when it sees none (or is missing)."""
    try:
        import cupy  # optional: only GPU machines have it
    except Exception:  # a broken CUDA install can fail in many ways
        return None
    count = int(cupy.cuda.runtime.getDeviceCount())
    if count < 1:
        return None
    props = [cupy.cuda.runtime.getDeviceProperties(i) for i in range(count)]
    types = [_gpu_type(p) for p in props]
    # Mixed GPUs in one box: plan for the slowest, since a node has one device type.
    device = min(types, key=lambda t: (t.flops("float32"), t.memory_capacity))
    known = _known(_device_name(props[0]))
    return NodeSpec("node0", device, count, known.link if known else _PCIE_LINK)


def _device_name(props: Mapping[str, Any]) -> str:
    name = props.get("name", b"gpu")
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def _known(name: str) -> _KnownGpu | None:
    return next((gpu for gpu in _KNOWN_GPUS if gpu.match in name), None)


def _gpu_type(props: Mapping[str, Any]) -> DeviceType:
    """A device type from CUDA device properties, the datasheet table, or guesses."""
    name = _device_name(props)
    known = _known(name)
    if known is not None:
        table_bandwidth = known.memory_bandwidth
        flops = (("float32", known.fp32), ("tfloat32", known.tf32),
                 ("bfloat16", known.bf16), ("float16", known.fp16))
        peak = tuple((dtype, value) for dtype, value in flops if value > 0)
    else:
        table_bandwidth = _FALLBACK_GPU_MEMORY_BANDWIDTH
        peak = (("float32", _estimate_fp32(props)),)
    bandwidth = _measured_bandwidth(props) or table_bandwidth
    capacity = int(props.get("totalGlobalMem", 0)) or 16 * GiB
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"
    return DeviceType(slug, DeviceKind.GPU, peak, bandwidth, capacity, 5e-6)


def _estimate_fp32(props: Mapping[str, Any]) -> float:
    """FP32 peak as SMs x lanes x 2 (FMA) x clock; conservative when fields are missing."""
    sms = int(props.get("multiProcessorCount", 0))
    clock_khz = int(props.get("clockRate", 0))
    lanes = _FP32_LANES_PER_SM.get(int(props.get("major", 0)), 64)
    estimate = sms * lanes * 2 * clock_khz * 1e3
    return estimate if estimate > 0 else _FALLBACK_GPU_FP32


def _measured_bandwidth(props: Mapping[str, Any]) -> float | None:
    """DRAM bandwidth from the memory clock and bus width (double data rate)."""
    clock_khz = int(props.get("memoryClockRate", 0))
    bus_bits = int(props.get("memoryBusWidth", 0))
    bandwidth = 2 * clock_khz * 1e3 * bus_bits / 8
    return bandwidth if bandwidth > 0 else None

