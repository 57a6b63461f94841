"""Measuring the links (``unity profile`` under an MPI launcher with two or more ranks).

Ping-pong between rank 0 and a rank on its node (intra-node) and one on another node
(inter-node) over message sizes from 8 B to 16 MiB, and all-reduce, all-gather,
reduce-scatter, broadcast and reduce over all ranks, through the runtime's
:class:`~unity_cli.runtime.comm.Comm` (MPI for numpy, NCCL for cupy), each fitted as
``alpha + beta * bytes``; and how much of a nonblocking all-reduce hides under compute
(``comm.sync_overlap``, see ``cost/profile.py``), which decides whether plans bucket their
gradient sync.
"""
from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cluster.collectives import Collective
from ..cost.comm import INTER_NODE, INTRA_NODE
from ..cost.profile import fit_alpha_beta
from ..runtime.comm import make_comm, mpi

if TYPE_CHECKING:
    from .profiler import Backend

MPI_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "HYDI_CONTROL_FD", "PMIX_RANK", "MPI_LOCALNRANKS")
MESSAGE_SIZES = tuple(8 * 8**k for k in range(8))  # 8 B .. 16 MiB, a factor of 8 apart


def launched_by_mpi(environ: dict[str, str] | None = None) -> bool:
    """Whether an MPI launcher started this process (checked before importing mpi4py,
    which would initialize MPI)."""
    env = os.environ if environ is None else environ
    return any(v in env for v in MPI_ENV)


def _reps(nbytes: int) -> int:
    return 50 if nbytes <= 65536 else 10 if nbytes <= 2**20 else 5


def measure_comm(comm: Any, backend: Backend, sizes: Sequence[int] = MESSAGE_SIZES) -> dict[str, Any]:
    """The ``links`` and ``collectives`` sections, measured over every rank of ``comm`` (a
    :class:`~unity_cli.runtime.comm.Comm`); every rank calls it, rank 0's answer counts."""
    xp, rank, size = backend.xp, comm.rank, comm.size
    hosts = comm.allgather_obj(socket.gethostname())
    everyone = tuple(range(size))
    comm.setup_groups([everyone])
    pairs = {INTRA_NODE: next((r for r in range(1, size) if hosts[r] == hosts[0]), None),
             INTER_NODE: next((r for r in range(1, size) if hosts[r] != hosts[0]), None)}
    links: dict[str, Any] = {}
    for kind, partner in pairs.items():
        if partner is None:
            continue
        samples = []
        for nbytes in sizes:
            buf = xp.zeros(max(1, nbytes // 4), dtype=np.float32)
            times = []
            comm.barrier()
            for i in range(_reps(nbytes) + 1):
                t0 = time.perf_counter()
                if rank == 0:
                    comm.exchange([(partner, buf)], [], tag=900)
                    comm.exchange([], [(partner, buf)], tag=901)
                elif rank == partner:
                    comm.exchange([], [(0, buf)], tag=900)
                    comm.exchange([(0, buf)], [], tag=901)
                comm.sync()
                if i:  # the first round trip warms the path up
                    times.append((time.perf_counter() - t0) / 2)
            samples.append((buf.nbytes, statistics.median(times)))
        a, b = fit_alpha_beta(samples)
        links[kind] = {"latency_s": a, "bandwidth_Bps": 1 / b, "samples": [list(s) for s in samples]}
    link_kind = INTER_NODE if len(set(hosts)) > 1 else INTRA_NODE
    collectives = {}
    for coll in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.BROADCAST,
                 Collective.REDUCE):
        samples = []
        for nbytes in sizes:
            count = max(size, nbytes // 4 // size * size)  # the whole buffer, in float32s, a multiple of P
            whole = xp.ones(count, dtype=np.float32)
            part = xp.ones(count // size, dtype=np.float32)
            gathered = xp.zeros((size, count // size), dtype=np.float32)
            times = []
            for i in range(_reps(nbytes) + 1):
                comm.barrier()
                t0 = time.perf_counter()
                match coll:
                    case Collective.ALL_REDUCE:
                        comm.allreduce(everyone, whole)
                    case Collective.ALL_GATHER:
                        comm.allgather(everyone, part, gathered)
                    case Collective.REDUCE_SCATTER:
                        comm.reduce_scatter(everyone, whole, part)
                    case Collective.BROADCAST:
                        comm.bcast(everyone, whole, 0)
                    case Collective.REDUCE:
                        comm.reduce(everyone, whole, 0)
                comm.sync()
                if i:
                    times.append(time.perf_counter() - t0)
            # A collective lasts until its slowest rank is done.
            slowest = [max(ts) for ts in zip(*comm.allgather_obj(times))]
            samples.append((whole.nbytes, statistics.median(slowest)))
        a, b = fit_alpha_beta(samples)
        collectives[coll.value] = {link_kind: {"ranks": size, "alpha_s": a, "beta_s_per_byte": b,
                                               "samples": [list(s) for s in samples]}}
    return {"hosts": len(set(hosts)), "links": links, "collectives": collectives,
            "sync_overlap": measure_overlap(comm, backend)}


OVERLAP_BYTES = 4 << 20
"""The all-reduce ``measure_overlap`` hides under compute: 4 MiB, a bucket of the sizes the
cost model tries (``cost.model.SYNC_BUCKETS``)."""


def measure_overlap(comm: Any, backend: Backend, nbytes: int = OVERLAP_BYTES, rounds: int = 7) -> dict[str, Any]:
    """``comm.sync_overlap`` (see ``cost/profile.py``): how much of a nonblocking all-reduce of
    ``nbytes`` over every rank runs beside a stretch of matrix products of about its length,
    started and tested as the runtime's bucketed gradient sync starts and tests it. Each
    round times the all-reduce alone, the products alone and both together; the slowest
    rank's times count, and the fraction is that of the medians."""
    xp, everyone = backend.xp, tuple(range(comm.size))
    comm.setup_sync_groups([everyone])
    buf = xp.ones(max(1, nbytes // 4), dtype=np.float32)
    a = xp.ones((128, 128), dtype=np.float32)
    out = xp.empty_like(a)

    def timed(fn: Callable[[], None]) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        comm.sync()
        return max(comm.allgather_obj(time.perf_counter() - t0))

    def reduce() -> None:
        comm.allreduce(everyone, buf)

    def product() -> None:
        xp.matmul(a, a, out=out)
        comm.sync()

    reduce()                                           # warm up the path and the kernel
    alone = statistics.median(timed(reduce) for _ in range(3))
    one = statistics.median(timed(product) for _ in range(3))
    chunks = comm.bcast_obj(max(1, min(10_000, round(alone / max(one, 1e-9)))))

    def compute() -> None:
        for _ in range(chunks):
            xp.matmul(a, a, out=out)

    def both() -> None:
        req = comm.iallreduce(everyone, buf)
        for _ in range(chunks):
            xp.matmul(a, a, out=out)
            comm.test_all([req])
        comm.wait_all([req])

    samples = [[timed(reduce), timed(compute), timed(both)] for _ in range(rounds)]
    r, c, b = (statistics.median(col) for col in zip(*samples, strict=True))
    fraction = min(1.0, max(0.0, (r + c - b) / min(r, c))) if min(r, c) > 0 else 0.0
    return {"fraction": fraction, "bytes": int(buf.nbytes), "samples": samples}


def world_comm(backend: Backend) -> Any | None:
    """The runtime's communicator over every rank, if an MPI launcher started two or more."""
    if not launched_by_mpi():
        return None
    if mpi().COMM_WORLD.Get_size() < 2:
        return None
    return make_comm(backend.name)
