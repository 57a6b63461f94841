"""Alpha-beta costs of collectives over the slowest link a group crosses.

``n`` is the size in bytes of the whole buffer each collective moves (the full tensor
for all-gather and all-reduce). Ring algorithms (or a tree, for a small all-reduce) for all-reduce, all-gather and
reduce-scatter; pipelined trees for broadcast and reduce. When several groups cross
the network at once, they share each node's interface.

:func:`~unity_cli.cluster.collectives.sent_bytes` is the one convention for how many bytes of
tensor data a rank sends in one call: the plan's prediction (``cost/moves.py``) and ``unity
run``'s count (at its communicator, ``runtime/phases.py``) both use it, so the two can be
compared exactly.

With a measured profile (:mod:`unity_cli.cost.profile`), two things replace the spec's
numbers: a collective measured at the same rank count over the same kind of link
(intra-node or inter-node) costs its fitted ``alpha + beta * n`` (when no other group
shares the network); otherwise the formulas above run over the profile's measured
point-to-point latency and bandwidth for that link kind, which replace those of every
link of that kind in the spec. Anything not measured keeps the spec's numbers.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..cluster.collectives import Collective
from ..cluster.spec import ClusterSpec, Link

if TYPE_CHECKING:  # profile.py imports this module
    from .profile import Profile

INTRA_NODE = "intra-node"
INTER_NODE = "inter-node"


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


def _route(cluster: ClusterSpec, groups: Sequence[Sequence[int]]) -> tuple[Link, str | None, int]:
    """The link one of several concurrent groups gets, its kind, and how many groups share
    each node's interface: intra-node if every group stays on one node; otherwise the
    network, shared by all the groups that leave each node."""
    return _routed(cluster, tuple(tuple(g) for g in groups))


@functools.lru_cache(maxsize=1 << 14)
def _routed(cluster: ClusterSpec, groups: tuple[tuple[int, ...], ...]) -> tuple[Link, str | None, int]:
    """:func:`_route`, cached: a search prices the same groups of devices over and over."""
    node = device_nodes(cluster)
    on = [np.unique(node[np.fromiter(g, dtype=np.intp, count=len(g))]) for g in groups]
    spanning = [k for k, nodes in enumerate(on) if len(nodes) > 1]
    if not spanning:
        multi = [g for g in groups if len(g) > 1]
        if not multi:
            return Link(math.inf, 0.0), None, 1
        return min((cluster.link_for(g) for g in multi), key=lambda link: link.bandwidth), INTRA_NODE, 1
    per_node = np.bincount(np.concatenate([on[k] for k in spanning]))
    return cluster.link_for(groups[spanning[0]]), INTER_NODE, int(per_node.max())


@functools.lru_cache(maxsize=8)
def device_nodes(cluster: ClusterSpec) -> np.ndarray:
    """Each device's node (``cluster.node_of``), as an array."""
    return np.repeat(np.arange(len(cluster.nodes)), [n.devices for n in cluster.nodes])


def _measured(link: Link, kind: str | None, profile: Profile | None) -> Link:
    fit = profile.link(kind) if profile is not None and kind is not None else None
    return Link(fit.bandwidth, fit.latency) if fit is not None else link


def group_link(cluster: ClusterSpec, groups: Sequence[Sequence[int]], profile: Profile | None = None) -> Link:
    """The link one of several concurrent groups gets (see :func:`_route`), with the
    profile's measured numbers for its kind where there are some."""
    link, kind, share = _route(cluster, groups)
    link = _measured(link, kind, profile)
    return Link(link.bandwidth / share, link.latency) if share > 1 else link


def link_for(cluster: ClusterSpec, devices: Iterable[int], profile: Profile | None = None) -> Link:
    """``cluster.link_for(devices)``, with the profile's measured numbers for its kind."""
    devs = set(devices)
    nodes = {cluster.node_of(d) for d in devs}
    kind = None if len(devs) <= 1 else INTER_NODE if len(nodes) > 1 else INTRA_NODE
    return _measured(cluster.link_for(devs), kind, profile)


def groups_time(kind: Collective, nbytes: float, cluster: ClusterSpec, groups: Sequence[Sequence[int]],
                profile: Profile | None = None) -> float:
    """Seconds for the same collective run at once in every group."""
    if not groups:
        return 0.0
    p = max(len(g) for g in groups)
    link, link_kind, share = _route(cluster, groups)
    if profile is not None and link_kind is not None and share == 1 and p > 1 and nbytes > 0:
        fit = profile.collective(kind.value, link_kind, p)
        if fit is not None:
            return fit.time(nbytes)
    link = _measured(link, link_kind, profile)
    if share > 1:
        link = Link(link.bandwidth / share, link.latency)
    return collective_time(kind, nbytes, p, link)
