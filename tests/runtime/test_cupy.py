"""The GPU path: the same kernels on cupy agree with numpy, `unity run --backend cupy`
trains like one process, every NCCL call the executor makes works, and the profiler times
pieces with CUDA events. The GPU tests skip cleanly without cupy or a GPU; two-rank NCCL
runs need two GPUs."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from runtime.kernel_cases import CASES, Case
from runtime.mpirun import run_json

from unity_cli.kernels import backward, forward


def _gpus() -> int:
    try:
        import cupy  # noqa: PLC0415

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no cupy, no driver, no device
        return 0


GPUS = _gpus()
needs_gpu = pytest.mark.skipif(GPUS < 1, reason="needs cupy and an NVIDIA GPU")


@needs_gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cupy_kernels_agree_with_numpy(case: Case):
    import cupy  # noqa: PLC0415

    op, args = case.node()
    want, ctx = forward(op, args, np)
    got, gctx = forward(op, [cupy.asarray(a) for a in args], cupy)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(g), w, rtol=1e-4, atol=1e-5)
    if not case.grad:
        return
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    gs = [rng.standard_normal(o.shape).astype(o.dtype) if o.dtype.kind == "f" else None for o in want]
    want_in = backward(op, ctx, gs, np)
    got_in = backward(op, gctx, [None if g is None else cupy.asarray(g) for g in gs], cupy)
    for w, g in zip(want_in, got_in, strict=True):
        assert (w is None) == (g is None)
        if w is not None:
            np.testing.assert_allclose(cupy.asnumpy(g), w, rtol=1e-4, atol=1e-5)


@needs_gpu
def test_one_gpu_run_matches_one_process(plans):
    plan = plans.get("bert_tiny", "data_parallel", 1)
    doc = run_json(plan, "--check", "--steps", "2", "--backend", "cupy", ranks=1)
    assert doc["backend"] == "cupy" and doc["check"]["passed"], doc["check"]


@pytest.mark.skipif(GPUS < 2, reason="NCCL between two ranks needs two GPUs")
@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
@pytest.mark.parametrize("sync_bucket", ["flat", "1KiB"])
def test_two_gpu_nccl_run_matches_one_process(plans, strategy, sync_bucket):
    """Flat, and bucketed: each bucket's all-reduce on the side stream, after the gradients it
    sums, and the update after all of them."""
    plan = plans.get("bert_tiny", strategy, 2, sync_bucket=sync_bucket)
    doc = run_json(plan, "--check", "--steps", "2", "--backend", "cupy", ranks=2)
    assert doc["backend"] == "cupy" and doc["check"]["passed"], doc["check"]


@needs_gpu
def test_profiler_times_pieces_with_cuda_events():
    from unity_cli.profiling.profiler import pick_backend  # noqa: PLC0415

    bk = pick_backend("cupy")
    assert bk.name == "cupy"
    x = bk.xp.ones((256, 256), dtype=np.float32)
    _, seconds = bk.clock(lambda: x @ x)
    assert 0 < seconds < 1


def _exercise(comm, xp) -> None:
    """Every data-plane call of a Comm on a one-rank group, with the results it must give."""
    group = (comm.rank,)
    comm.setup_groups([group])
    x = xp.arange(6, dtype=xp.float32)
    for call in (lambda: comm.allreduce(group, x), lambda: comm.reduce(group, x, comm.rank),
                 lambda: comm.bcast(group, x, comm.rank)):
        call()
        comm.sync()
        np.testing.assert_array_equal(xp.asnumpy(x) if xp is not np else x, np.arange(6))
    gathered = xp.zeros((1, 6), dtype=xp.float32)
    comm.allgather(group, x, gathered)
    scattered = xp.zeros(6, dtype=xp.float32)
    comm.reduce_scatter(group, gathered, scattered)
    got = xp.zeros(6, dtype=xp.float32)
    comm.exchange([(comm.rank, scattered)], [(comm.rank, got)], tag=7)
    comm.sync()
    for y in (gathered[0], scattered, got):
        np.testing.assert_array_equal(xp.asnumpy(y) if xp is not np else y, np.arange(6))
    # a bucketed gradient sync's calls: started without waiting, tested, waited for
    buckets = [xp.arange(k, k + 4, dtype=xp.float32) for k in range(3)]
    comm.setup_sync_groups([group])
    requests = [comm.iallreduce(group, b) for b in buckets]
    comm.test_all(requests)
    comm.wait_all(requests)
    comm.sync()
    for k, b in enumerate(buckets):
        np.testing.assert_array_equal(xp.asnumpy(b) if xp is not np else b, np.arange(k, k + 4))


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=needs_gpu)])
def test_every_comm_call_on_one_rank(backend):
    """The calls and their argument order (counts, dtypes, roots, streams) against the real
    library: on the one GPU a machine may have, NCCL still runs each call on a one-rank
    communicator."""
    from unity_cli.runtime.comm import make_comm, mpi  # noqa: PLC0415

    xp = np
    if backend == "cupy":
        import cupy as xp  # noqa: PLC0415
    _exercise(make_comm(backend, mpi().COMM_SELF), xp)
