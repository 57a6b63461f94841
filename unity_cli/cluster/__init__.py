"""The cluster layer: what hardware a plan targets.

``ClusterSpec`` (nodes of typed devices, intra- and inter-node links) is read from the
YAML format documented in ``cluster_specs/README.md`` by ``load_cluster``, or detected
for the current machine by ``local_cluster``. Quantities are SI base units throughout.
"""
from __future__ import annotations

from unity_cli.cluster.local import local_cluster
from unity_cli.cluster.parse import bundled_clusters, cluster_path, load_cluster, parse_cluster
from unity_cli.cluster.spec import (
    DTYPES,
    ClusterSpec,
    DeviceKind,
    DeviceType,
    Link,
    NodeSpec,
    default_launch_overhead,
)
from unity_cli.cluster.units import (
    Dimension,
    format_quantity,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
    parse_quantity,
)

__all__ = [
    "DTYPES",
    "ClusterSpec",
    "DeviceKind",
    "DeviceType",
    "Dimension",
    "Link",
    "NodeSpec",
    "default_launch_overhead",
    "format_quantity",
    "bundled_clusters",
    "cluster_path",
    "load_cluster",
    "local_cluster",
    "parse_bandwidth",
    "parse_bytes",
    "parse_cluster",
    "parse_duration",
    "parse_flops",
    "parse_quantity",
]
