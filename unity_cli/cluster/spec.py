"""Cluster specifications: the hardware a plan is made for, and its YAML format.

A cluster is a list of nodes; each node holds ``devices`` identical devices joined by
an intra-node link, and nodes talk through one network interface each (the inter-node
link). Devices are numbered globally, node-major: node 0's devices come first. All
quantities are SI base units (FLOP/s, bytes/s, bytes, seconds). The YAML format is
documented in ``cluster_specs/README.md`` and read by ``parse.py``; ``to_dict``
writes the same format with plain numbers, so ``parse_cluster(spec.to_dict())
== spec``.
"""
from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from unity_cli.errors import ClusterSpecError

__all__ = [
    "DTYPES",
    "ClusterSpec",
    "DeviceKind",
    "DeviceType",
    "Link",
    "NodeSpec",
    "default_launch_overhead",
]

# Dtypes a device may list a peak for; "tfloat32" is NVIDIA's TF32 tensor-core mode.
DTYPES = ("bfloat16", "float16", "float32", "float64", "tfloat32")


class DeviceKind(Enum):
    """Which runtime backend drives a device (cupy + NCCL, or numpy + MPI)."""

    GPU = "gpu"
    CPU = "cpu"


def default_launch_overhead(kind: DeviceKind) -> float:
    """Seconds per kernel launch when a spec does not say. On CPUs it is the runtime's
    Python and numpy dispatch of each operator, about 17 us forward and backward together
    (three launches in :mod:`cost.compute`), measured on a chain of 200 Relus under
    ``unity run``."""
    return 5e-6 if kind is DeviceKind.GPU else 6e-6


@dataclass(frozen=True, slots=True)
class DeviceType:
    """One model of accelerator: the roofline numbers the cost model needs."""

    name: str
    kind: DeviceKind
    peak_flops: tuple[tuple[str, float], ...]  # (dtype, FLOP/s), sorted by dtype
    memory_bandwidth: float  # bytes/s
    memory_capacity: int  # bytes
    launch_overhead: float  # seconds per kernel launch
    cache_capacity: int = 0  # bytes a pass may stream from a cache instead (0: none given)
    cache_bandwidth: float = 0.0  # bytes/s from that cache

    def __post_init__(self) -> None:
        # Canonical order, so equal devices compare and serialize equal.
        object.__setattr__(self, "peak_flops", tuple(sorted(self.peak_flops)))

    def bandwidth(self, nbytes: float) -> float:
        """Bytes/s of one pass over ``nbytes``: the cache's where they fit in it (a CPU
        core's L2: the small pieces of a step stay there between passes), else memory's."""
        return self.cache_bandwidth if 0 < nbytes <= self.cache_capacity else self.memory_bandwidth

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; a dtype not listed runs at the float32 peak."""
        table = dict(self.peak_flops)
        if dtype in table:
            return table[dtype]
        if "float32" in table:
            return table["float32"]
        raise ClusterSpecError(
            f"device type {self.name!r}: no peak FLOP/s for {dtype} and none for float32 "
            f"to fall back on (listed: {', '.join(table)})"
        )


@dataclass(frozen=True, slots=True)
class Link:
    """An alpha-beta link: moving n bytes takes ``latency + n / bandwidth`` seconds."""

    bandwidth: float  # bytes/s, per direction
    latency: float  # seconds

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over this link point to point."""
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One machine: ``devices`` devices of one type joined by ``intra_link``."""

    name: str
    device: DeviceType
    devices: int
    intra_link: Link


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The whole cluster; ``inter_link`` is each node's network interface."""

    name: str
    nodes: tuple[NodeSpec, ...]
    inter_link: Link
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        # Cached: the cost model keys its caches by cluster, and hashing 32 nodes' specs on
        # every lookup was most of the time of pricing a move on 192 devices.
        return self._hash

    def __post_init__(self) -> None:
        nodes = tuple(self.nodes)
        object.__setattr__(self, "nodes", nodes)
        where = f"cluster {self.name!r}"
        if not nodes:
            raise ClusterSpecError(f"{where}: has no nodes")
        types: dict[str, DeviceType] = {}
        offsets, total = [], 0
        for node in nodes:
            if node.devices < 1:
                raise ClusterSpecError(f"{where}: node {node.name!r} has no devices")
            if types.setdefault(node.device.name, node.device) != node.device:
                raise ClusterSpecError(
                    f"{where}: two different device types are named {node.device.name!r}"
                )
            offsets.append(total)
            total += node.devices
        duplicates = [n for n, c in Counter(n.name for n in nodes).items() if c > 1]
        if duplicates:
            raise ClusterSpecError(f"{where}: duplicate node name {duplicates[0]!r}")
        object.__setattr__(self, "_offsets", tuple(offsets))
        object.__setattr__(self, "_hash", hash((self.name, nodes, self.inter_link)))

    @property
    def num_devices(self) -> int:
        """Devices in the whole cluster."""
        return self._offsets[-1] + self.nodes[-1].devices

    @property
    def device_offsets(self) -> tuple[int, ...]:
        """Global index of each node's first device."""
        return self._offsets

    def node_of(self, device: int) -> int:
        """Index of the node that holds global device ``device``."""
        if not 0 <= device < self.num_devices:
            raise IndexError(
                f"device {device} out of range: cluster {self.name!r} has "
                f"{self.num_devices} devices"
            )
        return bisect.bisect_right(self._offsets, device) - 1

    def local_index(self, device: int) -> int:
        """Position of global device ``device`` within its node."""
        return device - self._offsets[self.node_of(device)]

    def device_type(self, device: int) -> DeviceType:
        """The type of global device ``device``."""
        return self.nodes[self.node_of(device)].device

    def link_for(self, devices: Iterable[int]) -> Link:
        """The slowest link a collective among ``devices`` crosses.

        Within one node that is the node's intra link; across nodes it is the slowest
        of the inter link and the intra links of nodes holding two or more members
        (usually the inter link). One device crosses no link: ``Link(inf, 0)``.
        """
        per_node = Counter(self.node_of(d) for d in set(devices))
        if sum(per_node.values()) <= 1:
            return Link(math.inf, 0.0)
        crossed = [self.nodes[n].intra_link for n, c in sorted(per_node.items()) if c > 1]
        if len(per_node) > 1:
            crossed.append(self.inter_link)
        return min(crossed, key=lambda link: (link.bandwidth, -link.latency))

    def first(self, n: int) -> ClusterSpec:
        """The sub-cluster of the first ``n`` devices, node-major (last node may be partial)."""
        if not 1 <= n <= self.num_devices:
            raise ClusterSpecError(
                f"cluster {self.name!r} has {self.num_devices} devices; cannot take the "
                f"first {n}"
            )
        if n == self.num_devices:
            return self
        nodes, left = [], n
        for node in self.nodes:
            if left == 0:
                break
            take = min(left, node.devices)
            nodes.append(NodeSpec(node.name, node.device, take, node.intra_link))
            left -= take
        return ClusterSpec(f"{self.name}[:{n}]", tuple(nodes), self.inter_link)

    def to_dict(self) -> dict[str, Any]:
        """The canonical YAML/JSON form: plain SI numbers, runs of like nodes grouped."""
        types = {node.device.name: _device_type_dict(node.device) for node in self.nodes}
        groups: list[dict[str, Any]] = []
        for index, node in enumerate(self.nodes):
            entry = {
                "count": 1,
                "device": node.device.name,
                "devices": node.devices,
                "intra_link": _link_dict(node.intra_link),
            }
            if node.name != f"node{index}":
                groups.append({"name": node.name, **entry})
            elif groups and "name" not in groups[-1] and _same_group(groups[-1], entry):
                groups[-1]["count"] += 1
            else:
                groups.append(entry)
        return {
            "name": self.name,
            "device_types": dict(sorted(types.items())),
            "nodes": groups,
            "inter_node_link": _link_dict(self.inter_link),
        }


def _device_type_dict(device: DeviceType) -> dict[str, Any]:
    return {
        "kind": device.kind.value,
        "peak_flops": {dtype: float(flops) for dtype, flops in device.peak_flops},
        "memory": {
            "bandwidth": float(device.memory_bandwidth),
            "capacity": int(device.memory_capacity),
            **({"cache": {"capacity": int(device.cache_capacity), "bandwidth": float(device.cache_bandwidth)}}
               if device.cache_capacity else {}),
        },
        "launch_overhead": float(device.launch_overhead),
    }


def _link_dict(link: Link) -> dict[str, float]:
    return {"bandwidth": float(link.bandwidth), "latency": float(link.latency)}


def _same_group(group: dict[str, Any], entry: dict[str, Any]) -> bool:
    return all(group[key] == entry[key] for key in ("device", "devices", "intra_link"))
