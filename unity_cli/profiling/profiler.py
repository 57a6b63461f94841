"""Measuring the profile DB (``unity profile``): operator pieces and communication.

Compute: the distinct operator pieces that plans for the given models use (the plain
graph and every baseline of :data:`unity_cli.search.baselines.STRATEGIES` on the cluster,
plus any saved plans) are run through the runtime's own kernels
(:mod:`unity_cli.kernels`) on realistic random inputs, forward then backward: one
warm-up, then repeats until both ``min_repeats`` and ``min_seconds`` are reached (at most
``max_repeats``); the median of each is kept. numpy is timed with ``perf_counter``; cupy
with CUDA events around each call. ``max_seconds`` caps all of it: pieces left when it
runs out stay unmeasured and the cost model gives them the roofline.

Communication, under an MPI launcher with two or more ranks, is measured by
``links.py``: the links, the collectives and how much of an all-reduce hides under
compute. Every rank measures compute too (as under ``unity run``, where every rank
computes at once); rank 0 alone writes the file.

This package sits on top of the stack, like the CLI: it builds plans' graphs (importer,
baselines) to know what to measure. The cost model reads only the DB (``cost/profile.py``).
"""
from __future__ import annotations

import math
import os
import platform
import socket
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import __version__
from ..cluster.collectives import Collective
from ..cluster.spec import ClusterSpec, DeviceKind, DeviceType
from ..cost.compute import as_compute_dtype, roofline
from ..cost.model import CostConfig, Optimizer, estimate, updates_per_device
from ..cost.moves import Move, phase_seconds
from ..cost.profile import FORMAT, Profile, piece_key
from ..errors import ProfileError, UnityError, UsageError
from ..ir.dtypes import DType
from ..ir.ops.elementwise import BinaryAttrs, UnaryAttrs
from ..ir.ops.gather_reduce import GatherAttrs, GatherNDAttrs, GroupedGatherAttrs
from ..ir.ops.norm import BatchNormAttrs
from ..ir.opspec import backward_mask, spec_of
from ..ir.pcg import PCG, TensorRef
from ..ir.pieces import piece_op
from ..ir.schedule import needs_grad
from ..ir.shapes import TensorShape
from ..kernels import backward, forward
from ..onnx_import import ImportOptions, import_model
from ..plan.plan import Plan, load_plan
from ..runtime.calibrate import dispatch_seconds, update_and_loss_seconds
from ..runtime.comm import mpi
from ..runtime.device import array_module
from ..runtime.phases import CallMove, StepClock
from ..runtime.threads import THREAD_VARS
from ..runtime.train import RunOptions, setup_job
from ..search.baselines import STRATEGIES
from .links import measure_comm, world_comm

"""Variables an MPI launcher (MPICH's hydra, Open MPI, PMIx) sets in every rank."""



@dataclass(frozen=True, slots=True)
class TimingPolicy:
    """How long to time each piece, and all of them together (see the module docstring)."""

    warmup: int = 1
    min_repeats: int = 5
    min_seconds: float = 0.02
    max_repeats: int = 50
    max_seconds: float = 60.0


@dataclass(frozen=True, slots=True)
class Piece:
    """One distinct operator piece: the attrs it runs with and its piece shapes."""

    op: Any
    kind: str
    inputs: tuple[TensorShape, ...]
    outputs: tuple[TensorShape, ...]
    mask: tuple[bool, ...] | None = None    # the input gradients its backward makes (None: all)

    @property
    def key(self) -> str:
        return piece_key(self.op, self.inputs, self.outputs, self.mask)

    @property
    def runs_backward(self) -> bool:
        return self.mask is None or any(self.mask)

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(map(str, self.inputs))}) -> {', '.join(map(str, self.outputs))}"


@dataclass(frozen=True)
class ProfileRun:
    """What a profiling run measured; ``profile`` is None on ranks other than 0."""

    profile: Profile | None
    pieces: int                    # distinct pieces the plans use
    measured: int
    skipped: int                   # left unmeasured when max_seconds ran out
    failed: tuple[str, ...]        # "piece: why" for pieces whose kernels failed
    seconds: float
    ranks: int
    rank: int
    kept: int = 0                  # entries kept from the file it merged into

    def summary(self, path: str) -> str:
        """The few lines ``unity profile`` prints."""
        assert self.profile is not None
        settings = self.profile.to_json()["settings"]
        machine = self.profile.to_json()["machine"]
        line = (f"profiled {settings['device_type']} ({settings['dtype']}, {machine['backend']}) in "
                f"{self.seconds:.1f} s: " + (f"{self.measured} of {self.pieces} op pieces" if self.pieces else
                                             "no op pieces (give --model or --plan)"))
        if self.skipped:
            line += f"; {self.skipped} left on the roofline (--max-seconds ran out)"
        lines = [line]
        lines += [f"failed   {f}" for f in self.failed[:5]]
        if len(self.failed) > 5:
            lines.append(f"failed   ... and {len(self.failed) - 5} more")
        comm = self.profile.to_json()["comm"]
        if self.ranks > 1:
            parts = [f"{k} link {v['latency_s'] * 1e6:.2f} us + {v['bandwidth_Bps'] / 1e9:.2f} GB/s"
                     for k, v in sorted(comm["links"].items())]
            parts += [f"{name} {fit['alpha_s'] * 1e6:.1f} us + {1e-9 / fit['beta_s_per_byte']:.2f} GB/s"
                      for name, per in sorted(comm["collectives"].items()) for fit in per.values()
                      if fit["beta_s_per_byte"] > 0]
            lines.append(f"comm     {self.ranks} ranks: " + "; ".join(parts))
        else:
            lines.append("comm     not measured (run under mpiexec -n 2 or more to measure links and collectives)")
        dev = self.profile.to_json()["compute"].get(settings["device_type"], {})
        if settings.get("plans"):
            update = sorted(dev.get("update_s", {}).items())
            parts = [f"optimizer {opt} {t * 1e6:.1f} us per weight piece" for opt, t in update]
            parts.append(f"loss {dev.get('loss_s', 0.0) * 1e6:.1f} us")
            if "parallel_task_s" in dev:
                parts.append(f"parallel op {dev['parallel_task_s'] * 1e6:.1f} us per pass")
            if "call_overhead_s" in comm:
                over = ", ".join(f"{t * 1e6:.1f} in {ph}" for ph, t in sorted(comm["call_overhead_s"].items()))
                parts.append(f"per call beyond its fit (us) {over}")
            lines.append("in steps " + "; ".join(parts))
        kept = f" (kept {self.kept} earlier entries)" if self.kept else ""
        lines.append(f"wrote    {path}{kept}")
        return "\n".join(lines)

    def to_json(self, path: str) -> dict[str, Any]:
        assert self.profile is not None
        return {"profile": path, "sha256": self.profile.sha256, "pieces": self.pieces, "measured": self.measured,
                "skipped": self.skipped, "failed": list(self.failed), "kept": self.kept, "ranks": self.ranks,
                "seconds": round(self.seconds, 3), "comm": self.profile.to_json()["comm"]}


# ---------------------------------------------------------------------------
# What to measure.


def pieces_of(pcg: PCG, dtype: DType) -> Iterable[Piece]:
    """The compute pieces of a graph (parallel ops and sources have none), float tensors
    in ``dtype`` as the cost model computes them, each backward making the gradients
    training needs (the loss reads the first output)."""
    grads = needs_grad(pcg, pcg.outputs[0])
    for i, n in pcg:
        if not (n.spec.is_source or n.spec.is_parallel_op):
            yield piece_of(pcg, i, dtype, grads)


def piece_of(pcg: PCG, i: int, dtype: DType, grads: frozenset[TensorRef]) -> Piece:
    """The piece compute node ``i`` runs on each of its devices; ``grads``: the tensors
    whose gradient flows."""
    n = pcg.nodes[i]
    ins = tuple(as_compute_dtype(pcg.shape(r).piece, dtype) for r in n.inputs)
    outs = tuple(as_compute_dtype(s.piece, dtype) for s in n.outputs)
    mask = backward_mask(n.spec, tuple(pcg.shape(r) for r in n.inputs), [r in grads for r in n.inputs])
    return Piece(piece_op(n.op, n.outputs[0]), n.kind, ins, outs, mask)


def distinct_pieces(pcgs: Iterable[PCG], dtype: DType) -> list[Piece]:
    """Every distinct piece of the graphs, in first-seen order."""
    seen: dict[str, Piece] = {}
    for pcg in pcgs:
        for p in pieces_of(pcg, dtype):
            seen.setdefault(p.key, p)
    return list(seen.values())


def plan_graphs(models: Sequence[str], cluster: ClusterSpec, batch_size: int | None = None,
                plans: Sequence[str] = ()) -> list[PCG]:
    """The graphs whose pieces to measure: each model's plain graph and its baselines on
    ``cluster`` (a baseline that does not apply to a model is left out), and saved plans."""
    out: list[PCG] = []
    for m in models:
        pcg = import_model(m, ImportOptions(batch_size, {})).pcg
        out.append(pcg)
        for build in STRATEGIES.values():
            try:
                out.append(build(pcg, cluster).pcg)
            except UnityError:
                continue
    out.extend(load_plan(p).pcg for p in plans)
    return out


def pick_device_type(cluster: ClusterSpec, kind: DeviceKind, name: str | None = None) -> DeviceType:
    """The cluster's device type this machine's devices stand for: ``name``, or the only
    one of this machine's kind."""
    types = {n.device.name: n.device for n in cluster.nodes}
    if name is not None:
        if name not in types:
            raise UsageError(f"--device-type {name!r}: cluster {cluster.name!r} has {', '.join(sorted(types))}")
        if types[name].kind is not kind:
            raise UsageError(f"--device-type {name!r} is a {types[name].kind.value} type, but this machine "
                             f"profiles its {kind.value}s")
        return types[name]
    fits = sorted(t for t, d in types.items() if d.kind is kind)
    if len(fits) == 1:
        return types[fits[0]]
    if not fits:
        raise UsageError(f"cluster {cluster.name!r} has no {kind.value} device type ({', '.join(sorted(types))}); "
                         f"profile on a machine with those devices, or profile a cluster spec of this one")
    raise UsageError(f"cluster {cluster.name!r} has several {kind.value} device types ({', '.join(fits)}); "
                     f"pick the one this machine has with --device-type")


# ---------------------------------------------------------------------------
# The array backend and its clock.


@dataclass(frozen=True)
class Backend:
    """An array module and a clock that times one call on it."""

    name: str                     # "numpy" | "cupy"
    xp: Any
    kind: DeviceKind
    clock: Callable[[Callable[[], Any]], tuple[Any, float]]
    sync: Callable[[], None]


def _cpu_clock(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def numpy_backend() -> Backend:
    return Backend("numpy", np, DeviceKind.CPU, _cpu_clock, lambda: None)


def cupy_backend(rank: int = 0) -> Backend:
    """cupy on this rank's GPU (``rank`` modulo the GPUs), timed with CUDA events.

    A piece costs the longer of its GPU time (the events) and the host's time to issue
    its kernels: a step issues one piece after another, so on small pieces the GPU waits
    for Python and cupy's launches, and the events alone would miss most of the step."""
    import cupy  # noqa: PLC0415  (only on GPUs)

    cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()

    def clock(fn: Callable[[], Any]) -> tuple[Any, float]:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        t0 = time.perf_counter()
        out = fn()
        host = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return out, max(host, cupy.cuda.get_elapsed_time(start, end) / 1e3)

    return Backend("cupy", cupy, DeviceKind.GPU, clock, lambda: cupy.cuda.get_current_stream().synchronize())


def pick_backend(name: str = "auto", rank: int = 0) -> Backend:
    """``numpy``, ``cupy``, or ``auto`` (cupy if it imports and sees a GPU), as ``unity run`` picks."""
    return cupy_backend(rank) if array_module(name, rank)[0] == "cupy" else numpy_backend()


def machine_info(backend: Backend) -> dict[str, Any]:
    """Where the profile was measured, for the person reading it."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "backend": backend.name,
        "blas_threads": next((os.environ[v] for v in THREAD_VARS if v in os.environ), "default"),
        "unity": __version__,
    }
    if backend.name == "cupy":
        cupy = backend.xp
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props.get("name", b"gpu")
        info["gpu"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        info["cupy"] = cupy.__version__
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------------
# Timing one piece.


def _positive_inputs(op: Any) -> frozenset[int]:
    """Inputs that must be positive for the op to stay finite (roots, logs, divisors, variances)."""
    match op:
        case UnaryAttrs(fn=fn) if fn in ("Sqrt", "Log", "Reciprocal"):
            return frozenset({0})
        case BinaryAttrs(fn="Pow"):
            return frozenset({0})
        case BinaryAttrs(fn="Div" | "Mod"):
            return frozenset({1})
        case BatchNormAttrs():
            return frozenset({4})
    return frozenset()


def make_inputs(piece: Piece, xp: Any, rng: np.random.Generator) -> list[Any]:
    """Random inputs a real step would feed the piece: normal floats (uniform in [0.5, 1.5)
    where the op needs positive values), valid indices for Gather/GatherND/GroupedGather, small
    positive integers otherwise, random booleans."""
    positive = _positive_inputs(piece.op)
    out = []
    for k, s in enumerate(piece.inputs):
        dt = s.dtype.numpy
        if s.dtype.is_float:
            a = rng.uniform(0.5, 1.5, s.dims) if k in positive else rng.standard_normal(s.dims)
        elif s.dtype is DType.BOOL:
            a = rng.random(s.dims) < 0.5
        elif k == 1 and isinstance(piece.op, GatherAttrs):
            a = rng.integers(0, max(1, piece.inputs[0].dims[piece.op.axis]), s.dims)
        elif k >= 1 and isinstance(piece.op, GroupedGatherAttrs):
            a = rng.integers(0, piece.op.rows[k - 1], s.dims)
        elif k == 1 and isinstance(piece.op, GatherNDAttrs):
            data = piece.inputs[0].dims[piece.op.batch_dims:]
            a = np.stack([rng.integers(0, max(1, data[j]), s.dims[:-1]) for j in range(s.dims[-1])], axis=-1) \
                if s.dims[-1] else np.zeros(s.dims)
        else:
            a = rng.integers(1, 8, s.dims)
        out.append(xp.asarray(np.asarray(a).astype(dt)))
    return out


def time_piece(piece: Piece, backend: Backend, policy: TimingPolicy, rng: np.random.Generator,
               deadline: float) -> tuple[float, float, int]:
    """Median forward and backward seconds of a piece, and the repeats they come from."""
    xp = backend.xp
    xs = make_inputs(piece, xp, rng)
    grads = [xp.asarray(rng.standard_normal(s.dims).astype(s.dtype.numpy)) if s.dtype.is_float else None
             for s in piece.outputs]

    def back(ctx) -> None:
        if piece.runs_backward:   # else the runtime does not call it: it takes no time
            backward(piece.op, ctx, grads, xp, piece.mask)

    for _ in range(policy.warmup):
        _, ctx = forward(piece.op, xs, xp)
        back(ctx)
    backend.sync()
    fwd: list[float] = []
    bwd: list[float] = []
    start = time.perf_counter()
    while True:
        (_, ctx), tf = backend.clock(lambda: forward(piece.op, xs, xp))
        _, tb = backend.clock(lambda c=ctx: back(c))
        tb = tb if piece.runs_backward else 0.0
        fwd.append(tf)
        bwd.append(tb)
        now = time.perf_counter()
        n = len(fwd)
        if (n >= policy.max_repeats or (n >= policy.min_repeats and now - start >= policy.min_seconds)
                or now >= deadline):
            return statistics.median(fwd), statistics.median(bwd), n


def roofline_entry(piece: Piece, device: DeviceType, dtype: DType) -> dict[str, float]:
    """The spec's roofline for a piece, recorded beside its measurement (``profile.py``)."""
    spec, ins, outs = spec_of(piece.op), list(piece.inputs), list(piece.outputs)
    t = roofline(spec.cost(piece.op, ins, outs) if piece.mask is None else
                 spec.cost_of_grads(piece.op, ins, outs, piece.mask), device, dtype)
    return {"roof_fwd_s": t.fwd, "roof_bwd_s": t.bwd if piece.runs_backward else 0.0}


def measure_compute(pieces: Sequence[Piece], backend: Backend, policy: TimingPolicy,
                    progress: Callable[[int, int, str], None] | None = None, device: DeviceType | None = None,
                    dtype: DType = DType.FLOAT32) -> tuple[dict[str, dict[str, Any]], int, list[str]]:
    """DB entries of the pieces measured within ``policy.max_seconds`` (with their roofline
    on ``device`` when given), how many were left when it ran out, and the pieces whose
    kernels failed (with why)."""
    rng = np.random.default_rng(0)
    deadline = time.perf_counter() + policy.max_seconds
    entries: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for k, p in enumerate(pieces):
        if time.perf_counter() >= deadline:
            return entries, len(pieces) - k, failed
        if progress:
            progress(k, len(pieces), p.kind)
        try:
            f, b, n = time_piece(p, backend, policy, rng, deadline)
        except Exception as e:  # noqa: BLE001  (one bad piece must not end the run; it keeps the roofline)
            failed.append(f"{p}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        entries[p.key] = {"op": p.kind, "fwd_s": f, "bwd_s": b, "repeats": n,
                          **(roofline_entry(p, device, dtype) if device is not None else {})}
    if progress:
        progress(len(pieces), len(pieces), "")
    return entries, 0, failed


@dataclass(frozen=True)
class InSitu:
    """What ``unity profile --plan`` times inside the saved plans' training steps."""

    entries: dict[str, dict[str, Any]]          # the plans' compute pieces, as DB entries
    parallel_task: float | None                 # a parallel op's pass, outside the communicator
    update: dict[str, float]                    # optimizer -> per weight piece, less the bandwidth terms
    loss: float | None                          # a step's loss, less its bandwidth term
    calls: tuple[tuple[ClusterSpec, str, tuple[CallMove, ...], float], ...] = ()
    """Each data-plane call of a step: its plan's cluster, the phase of the step it is made
    in (as ``cost.moves.Move`` names it), the moves of every rank taking part, and the least
    seconds any of them spent in it (the median over the steps)."""

    def call_overhead(self, profile: Profile) -> dict[str, float]:
        """Per phase of the step, the mean excess of its calls over what ``profile``'s fits
        price them at (the mean, so that a phase's calls add up to what they took)."""
        excess: dict[str, list[float]] = {}
        for cluster, phase, moves, least in self.calls:
            priced = phase_seconds([Move(k, phase, g if k is Collective.P2P else tuple(sorted(g)), n, r)
                                    for k, g, n, r in moves], cluster, profile)
            excess.setdefault(phase, []).append(least - priced.get(phase, 0.0))
        return {phase: max(0.0, statistics.fmean(v)) for phase, v in sorted(excess.items())}


def measure_in_situ(plans: Sequence[str], dtype: DType, dispatch: float, steps: int = 12,
                    device: DeviceType | None = None) -> InSitu:
    """Time saved plans inside real training steps (``unity run``'s executor on this job's
    ranks, synthetic data) rather than alone: a kernel runs slower among its neighbours
    than in a loop on warm inputs, and a step pays for more than its kernels and links.
    Kept: the compute pieces (less the dispatch the cost model adds back), the parallel
    ops' own work per pass, each call's time, and the optimizer's and the loss's phases
    less what the cost model prices them at without a profile (their bandwidth terms).
    Plans for another rank count are skipped; every rank returns the same, from every
    rank's times (the median where ranks measured the same thing)."""
    world = mpi().COMM_WORLD
    samples: dict[str, tuple[str, list[float], list[float]]] = {}
    roofs: dict[str, dict[str, float]] = {}
    own: list[float] = []
    measured: list[dict[str, Any]] = []     # per plan, this rank's calls and phases
    jobs = []
    for path in plans:
        job = setup_job(RunOptions(plan=str(path), backend="auto"), world)
        if job.plan.cluster.num_devices != world.Get_size():
            continue
        pcg, ex, comm = job.plan.pcg, job.executor, job.comm
        keys = {}
        for i, n in pcg:
            if not (n.spec.is_source or n.spec.is_parallel_op):
                piece = piece_of(pcg, i, dtype, ex.p.has_grad)
                keys[i] = (piece.key, piece.kind)
                if device is not None:
                    roofs[piece.key] = roofline_entry(piece, device, dtype)
        ex.timings, ex.own_work, ex.pass_seconds = {}, {}, {}
        clock = ex.clock = StepClock(comm)
        comm.moves = []
        made: list[list[tuple[tuple, float, tuple[CallMove, ...]]]] = []
        for s in range(steps):
            batch = job.data.batch(s)
            t0 = time.perf_counter()
            ex.step(batch.inputs, job.xp.asarray(batch.labels))
            comm.sync()
            clock.stop(time.perf_counter() - t0)
            made.append([(key, _CALL_PHASE[lap], sec, mv)
                         for (key, sec), mv, lap in zip(comm.calls or (), comm.moves, clock.laps[-1], strict=True)])
            if s == 1:  # the first steps warm up
                ex.timings, ex.own_work, ex.pass_seconds = {}, {}, {}
        kept = clock.steps[2:] or clock.steps
        tasks = {k: statistics.median(t) for k, t in ex.timings.items()}
        parallel = {k: (statistics.median(a for a, _ in t), statistics.median(a - b for a, b in t))
                    for k, t in ex.own_work.items()}
        between = _shares(tasks, parallel, ex.pass_seconds)
        for (node, phase), t in tasks.items():
            key, kind = keys[node]
            entry = samples.setdefault(key, (kind, [], []))
            entry[2 if phase == "bwd" else 1].append(t + between.get(_PASS[phase], 0.0))
        own += [t + between.get(_PASS[phase], 0.0) for (_, phase), (_, t) in parallel.items()]
        measured.append({"calls": made[2:] or made,
                         **{ph: statistics.median(p.get(ph, 0.0) for p in kept) for ph in ("optimizer", "loss")}})
        jobs.append(job)
        ex.timings = ex.clock = comm.moves = None
    gathered = world.allgather((samples, own, measured))
    merged: dict[str, tuple[str, list[float], list[float]]] = {}
    for part, _, _ in gathered:
        for key, (kind, f, b) in part.items():
            m = merged.setdefault(key, (kind, [], []))
            m[1].extend(f)
            m[2].extend(b)
    half = dispatch / 2
    entries = {key: {"op": kind, "fwd_s": max(0.0, statistics.median(f) - half) if f else 0.0,
                     "bwd_s": max(0.0, statistics.median(b) - half) if b else 0.0, "repeats": steps - 2,
                     "in_situ": True, **roofs.get(key, {})}
               for key, (kind, f, b) in sorted(merged.items()) if f}
    owns = [t for _, o, _ in gathered for t in o]
    update: dict[str, list[float]] = {}
    losses: list[float] = []
    calls = []
    for k, job in enumerate(jobs):
        ranks = [g[2][k] for g in gathered]
        upd, loss = _fixed_costs(job.plan, job.optimizer.kind.value, ranks)
        update.setdefault(job.optimizer.kind.value, []).extend(upd)
        losses += loss
        calls += _least_calls(job.plan.cluster, [r["calls"] for r in ranks])
    return InSitu(entries, statistics.fmean(owns) if owns else None,
                  {opt: max(0.0, float(statistics.median(v))) for opt, v in sorted(update.items()) if v},
                  max(0.0, float(statistics.median(losses))) if losses else None, tuple(calls))


def _fixed_costs(plan: Plan, optimizer: str, ranks: Sequence[Mapping[str, float]]) -> tuple[list[float], list[float]]:
    """What the optimizer's and the loss's phases measured on each rank (``ranks``: rank by
    rank, seconds per step) cost beyond the bandwidth terms the cost model prices them at:
    per weight piece updated on that rank, and per step on a rank that computes the loss."""
    bare = CostConfig(DType(plan.config["dtype"]), Optimizer(optimizer), sync_bucket=plan.sync_bucket_bytes)
    report = estimate(plan.pcg, plan.views, plan.cluster, bare)
    counts = updates_per_device(plan.pcg, plan.views, plan.cluster, bare)
    upd, loss = np.zeros(plan.cluster.num_devices), np.zeros(plan.cluster.num_devices)
    loss_devs = set()
    for e in report.events:
        if e.phase == "update":
            np.add.at(upd, list(e.devices), e.end - e.start)
        elif e.phase == "loss" and not e.comm:
            np.add.at(loss, list(e.devices), (e.end - e.start) * e.times)
            loss_devs.update(e.devices)
    return ([(r["optimizer"] - upd[d]) / counts[d] for d, r in enumerate(ranks) if counts[d]],
            [r["loss"] - loss[d] for d, r in enumerate(ranks) if d in loss_devs])


_PASS = {"fwd": "fwd", "bwd": "bwd", "again": "bwd"}
"""The pass each kind of timed task runs in (``Executor.timings``)."""


def _shares(tasks: Mapping[tuple[int, str], float], parallel: Mapping[tuple[int, str], tuple[float, float]],
            pass_seconds: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Per pass, each of its tasks' share of its time outside them (:func:`_between`): the
    pass's median seconds less its compute tasks' and its parallel ops' (``tasks`` and
    ``parallel`` by (node, kind), ``Executor.timings``). A recompute ("again") runs in the
    backward pass: it is one of that pass's tasks, not its leftover (shared out among the
    backward tasks, it was priced twice: as the recompute, and in every backward piece)."""
    return {phase: _between(statistics.median(t), [v for (_, p), v in tasks.items() if _PASS[p] == phase]
                            + [a for (_, p), (a, _) in parallel.items() if _PASS[p] == phase])
            for phase, t in pass_seconds.items()}


def _between(pass_seconds: float, tasks: Sequence[float]) -> float:
    """A pass's time outside the tasks it prices (the executor's loop, freeing values, the
    passes of parallel ops that make no call), shared by those tasks: each task's share."""
    return max(0.0, pass_seconds - sum(tasks)) / len(tasks) if tasks else 0.0


_CALL_PHASE = {"fwd_compute": "fwd", "loss": "loss", "bwd_compute": "bwd", "optimizer": "sync"}
"""The step clock's laps (``runtime/phases.py``, by their compute phase) as the phases of the
cost model's moves: the loss's lap makes the loss's gathering and sum, the optimizer's the
gradient all-reduces."""


def _least_calls(cluster: ClusterSpec, per_rank: Sequence[Sequence[Sequence[tuple[tuple, str, float, tuple]]]]
                 ) -> list[tuple[ClusterSpec, str, tuple[CallMove, ...], float]]:
    """Each call of a plan's steps (``per_rank``: rank by rank, step by step, its calls as
    (key, phase, seconds, moves)): its phase, the moves of every rank taking part (a message
    once, though its sender and its receiver both list it), and the median over the steps
    of the least time a rank spent in it (a rank that came early waited for the others)."""
    least: dict[tuple, list[float]] = {}
    moves: dict[tuple, Counter] = {}
    phases: dict[tuple, str] = {}
    for steps in per_rank:
        for s, made in enumerate(steps):
            for key, phase, seconds, mv in made:
                times = least.setdefault(key, [])
                times += [math.inf] * (s + 1 - len(times))
                times[s] = min(times[s], seconds)
                if s == 0:
                    moves[key] = moves.get(key, Counter()) | Counter(mv)
                    phases[key] = phase
    return [(cluster, phases[key], tuple(sorted(moves[key].elements(), key=repr)),
             statistics.median(t for t in times if t < math.inf))
            for key, times in sorted(least.items(), key=lambda kv: repr(kv[0])) if key in moves]


# ---------------------------------------------------------------------------
# The whole run.


def measure_overheads(backend: Backend) -> tuple[float, dict[str, float], float] | None:
    """The runtime's dispatch per task, fixed cost per optimizer update and per loss (see
    ``runtime/calibrate.py``); None where the runtime cannot run here."""
    try:
        return (dispatch_seconds(backend.name, backend.xp), *update_and_loss_seconds(backend.name, backend.xp))
    except UnityError:
        return None


def run_profile(models: Sequence[str], cluster: ClusterSpec, *, batch_size: int | None = None,
                dtype: DType = DType.FLOAT32, policy: TimingPolicy = TimingPolicy(), plans: Sequence[str] = (),
                device_type: str | None = None, backend: str = "numpy", merge_into: Profile | None = None,
                progress: Callable[[int, int, str], None] | None = None) -> ProfileRun:
    """Measure the pieces plans for ``models`` use on ``cluster``, and communication when
    run under MPI with two or more ranks; the profile (on rank 0) merges into
    ``merge_into``'s entries, replacing those measured again."""
    t0 = time.perf_counter()
    rank_hint = int(next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
                          if v in os.environ), "0") or 0)
    bk = pick_backend(backend, rank_hint)
    device = pick_device_type(cluster, bk.kind, device_type)
    comm = world_comm(bk)
    rank, ranks = (comm.rank, comm.size) if comm is not None else (0, 1)
    pieces = distinct_pieces(plan_graphs(models, cluster, batch_size, plans), dtype)
    entries, skipped, failed = measure_compute(pieces, bk, policy, progress if rank == 0 else None, device, dtype)
    overheads = measure_overheads(bk)
    situ = None
    if plans:  # the plans' own pieces, timed inside training steps, replace their isolated times
        situ = measure_in_situ(plans, dtype, overheads[0] if overheads else 0.0, device=device)
        for key, e in situ.entries.items():
            alone = entries.get(key)
            if alone is not None:
                e["alone_fwd_s"], e["alone_bwd_s"] = alone["fwd_s"], alone["bwd_s"]
        entries.update(situ.entries)
    comm_doc: dict[str, Any] = {"hosts": 1, "links": {}, "collectives": {}}
    if comm is not None:
        comm.barrier()
        comm_doc = measure_comm(comm, bk)
    seconds = time.perf_counter() - t0
    if rank != 0:
        return ProfileRun(None, len(pieces), len(entries), skipped, tuple(failed), seconds, ranks, rank)
    doc = merge_into.to_json() if merge_into is not None else _empty()
    kept = sum(len(t) for dev in doc["compute"].values() for t in dev["dtypes"].values())
    dev = doc["compute"].setdefault(device.name, {"kind": device.kind.value, "dtypes": {}})
    if dev["kind"] != device.kind.value:
        raise ProfileError(f"compute.{device.name}.kind: the profile holds a {dev['kind']} device of this name, "
                           f"this one is a {device.kind.value}")
    if overheads is not None:
        dev["dispatch_s"], dev["update_s"], dev["loss_s"] = overheads
    if situ is not None:   # what the plans' steps paid replaces the probes' figures
        dev["update_s"] = {**dev.get("update_s", {}), **situ.update}
        if situ.loss is not None:
            dev["loss_s"] = situ.loss
        if situ.parallel_task is not None:
            dev["parallel_task_s"] = situ.parallel_task
    table = dev["dtypes"].setdefault(dtype.value, {})
    kept -= sum(1 for k in entries if k in table)
    table.update(entries)
    if comm is not None:   # a call's overhead is over the fits: measured again with them, or dropped
        doc["comm"] = {"device_type": device.name, "device_kind": device.kind.value, "ranks": ranks, **comm_doc}
        over = situ.call_overhead(Profile.from_json(doc)) if situ is not None else {}
        if over:
            doc["comm"]["call_overhead_s"] = over
    doc["machine"] = machine_info(bk)
    doc["settings"] = {"cluster": cluster.name, "device_type": device.name, "dtype": dtype.value,
                       "models": list(models), "plans": list(plans), "batch_size": batch_size,
                       "ranks": ranks, "timing": asdict(policy)}
    return ProfileRun(Profile.from_json(doc), len(pieces), len(entries), skipped, tuple(failed), seconds, ranks,
                      rank, kept)


def _empty() -> dict[str, Any]:
    return {"format": FORMAT, "machine": {}, "settings": {}, "compute": {},
            "comm": {"device_type": None, "device_kind": None, "ranks": 1, "hosts": 1, "links": {},
                     "collectives": {}}}
