"""CPU threads per rank: ranks that share a node share its cores.

A plan for CPUs gives each rank one device (``local-cpu``: one core per rank). numpy's
BLAS starts a thread per core in every rank by default, so P ranks on a node run P times
too many threads, which spin against each other (a 50-100x slower step on two cores).
This must run before numpy is imported; a thread count the user set is kept.
"""
from __future__ import annotations

import os

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE")


def share_cores(environ: dict[str, str] | None = None) -> int | None:
    """Give each of the node's ranks ``cores // ranks`` BLAS threads (at least 1); returns
    the count set, or None when there is one rank or the user chose."""
    env = os.environ if environ is None else environ
    local = next((int(env[k]) for k in _LOCAL_SIZE if env.get(k, "").isdigit()), 1)
    if local <= 1 or any(v in env for v in THREAD_VARS):
        return None
    threads = max(1, (os.cpu_count() or 1) // local)
    for v in THREAD_VARS:
        env[v] = str(threads)
    return threads
