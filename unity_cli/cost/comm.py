"""Alpha-beta costs of collectives over the slowest link a group crosses.

``n`` is the size in bytes of the whole buffer each collective moves (the full tensor
for all-gather and all-reduce). Ring algorithms (or a tree, for a small all-reduce) for all-reduce, all-gather and
reduce-scatter; pipelined trees for broadcast and reduce. When several groups cross
the network at once, they share each node's interface.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from enum import Enum

from ..cluster.spec import ClusterSpec, Link


class Collective(Enum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all-to-all"
    P2P = "point-to-point"


def collective_time(kind: Collective, nbytes: float, p: int, link: Link) -> float:
    """Seconds for one collective of ``p`` ranks over ``link``."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    a, b = link.latency, link.bandwidth
    match kind:
        case Collective.ALL_REDUCE:
            # NCCL picks a ring for large buffers and a tree (reduce + broadcast) for small ones.
            ring = 2 * (p - 1) * a + 2 * (p - 1) / p * nbytes / b
            tree = 2 * math.ceil(math.log2(p)) * a + 2 * nbytes / b
            return min(ring, tree)
        case Collective.ALL_GATHER | Collective.REDUCE_SCATTER:
            return (p - 1) * a + (p - 1) / p * nbytes / b
        case Collective.BROADCAST | Collective.REDUCE:
            return math.ceil(math.log2(p)) * a + nbytes / b
        case Collective.ALL_TO_ALL:
            return (p - 1) * a + (p - 1) / p * nbytes / b
        case Collective.P2P:
            return a + nbytes / b
    raise AssertionError(kind)


def group_link(cluster: ClusterSpec, groups: Sequence[Sequence[int]]) -> Link:
    """The link one of several concurrent groups gets: intra-node if it stays on one node;
    otherwise the network, shared by all the groups that leave each node."""
    spanning = [g for g in groups if len({cluster.node_of(d) for d in g}) > 1]
    if not spanning:
        return min((cluster.link_for(g) for g in groups if len(g) > 1),
                   key=lambda link: link.bandwidth, default=Link(math.inf, 0.0))
    per_node: Counter[int] = Counter()
    for g in spanning:
        for node in {cluster.node_of(d) for d in g}:
            per_node[node] += 1
    share = max(per_node.values())
    net = cluster.link_for(spanning[0])
    return Link(net.bandwidth / share, net.latency)


def groups_time(kind: Collective, nbytes: float, cluster: ClusterSpec, groups: Sequence[Sequence[int]]) -> float:
    """Seconds for the same collective run at once in every group."""
    if not groups:
        return 0.0
    p = max(len(g) for g in groups)
    return collective_time(kind, nbytes, p, group_link(cluster, groups))
