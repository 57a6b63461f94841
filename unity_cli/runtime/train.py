"""``unity run``: train with a plan on the ranks of an MPI job (rank ``r`` plays device ``r``).

Setup (plan, model, weights, data, the program) runs on every rank; its failures are
agreed on, so every rank stops and rank 0 alone reports the first one. A rank that fails
during a training step prints ``error: rank R: ...`` and aborts the job, which ends the
ranks waiting for it. ``UNITY_FAULT_RANK=R`` (with ``UNITY_FAULT_STEP=S``, default 0)
makes rank R fail in the middle of step S's forward pass, to test exactly that.
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import kernels
from ..cluster.units import format_bytes
from ..errors import PlanError, RunError, UnityError, UsageError
from ..files import check_output
from ..ir.schedule import planned_loss
from ..ir.training import Training
from ..plan.plan import Plan, load_plan
from .check import CheckResult, Reference
from .comm import Comm, mpi
from .data import Data, gather_tables, read_npz
from .device import array_module
from .executor import build_executor
from .footprint import planned_memory
from .ledger import Ledger
from .loss import LossKind, choose_loss
from .memory import reset_peak, resident
from .model_io import import_for_plan, resolve_model, save_trained, unfold, weight_values
from .optim import OptimizerConfig
from .phases import StepClock, measured_phases_ms, phase_table
from .weights import ParamStore

LOCAL_CPU = "local-cpu"   # a bundled cluster spec: --cluster takes its name anywhere


@dataclass(frozen=True)
class RunOptions:
    plan: str
    steps: int = 10
    data: str | None = None
    loss: str = "auto"
    optimizer: str | None = None       # None: the plan's config optimizer
    lr: float | None = None
    seed: int = 0
    model: str | None = None
    check: bool = False
    save: str | None = None
    backend: str = "auto"
    debug: bool = False
    verbose: bool = False              # rank 0 names every rank's pid at start (mpiexec names a dead rank by pid)
    # The cost model's prediction for (plan, loss): phases in ms and bytes sent per device.
    # The caller passes it (report.summary.run_prediction): the runtime does not read the cost model.
    predict: Callable[[Plan, str], tuple[dict[str, float], list[int]]] | None = None


@dataclass
class RunReport:
    """What rank 0 reports (``to_json`` is ``unity run --json``)."""

    plan: str
    strategy: str
    ranks: int
    backend: str
    loss_kind: str
    optimizer: str
    lr: float
    steps: int
    loss: list[float]
    step_times_ms: list[float]
    predicted_ms: float
    check: dict[str, Any] | None = None
    saved: str | None = None
    warnings: list[str] = field(default_factory=list)
    phases_ms: dict[str, float] = field(default_factory=dict)            # measured, mean over ranks
    predicted_phases_ms: dict[str, float] = field(default_factory=dict)  # the cost model's, mean over devices
    sent_bytes: list[int] = field(default_factory=list)            # per rank: bytes of tensor data sent per step
    predicted_sent_bytes: list[int] = field(default_factory=list)  # per device, from the plan (cost.moves)
    plan_sha256: str = ""          # the plan's content_sha256: report --measured checks the run is of its plan
    peak_rss_bytes: list[int] = field(default_factory=list)   # per rank: peak resident memory while training
    start_rss_bytes: list[int] = field(default_factory=list)  # per rank: resident before the plan and model were read
    memory: dict[str, Any] = field(default_factory=dict)   # per rank: held bytes, measured and predicted (ledger.py)
    sync: dict[str, int] = field(default_factory=dict)   # the gradient sync: bucket_bytes (0: flat),
                                                         # all_reduces (rank 0's per step), [zero], [micro_batches]

    @property
    def measured_ms(self) -> float:
        t = self.step_times_ms[1:] or self.step_times_ms
        return statistics.median(t) if t else 0.0

    @property
    def ratio(self) -> float | None:
        return self.measured_ms / self.predicted_ms if self.predicted_ms > 0 else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "plan": self.plan, "plan_sha256": self.plan_sha256,
            "strategy": self.strategy, "ranks": self.ranks, "backend": self.backend,
            "loss_kind": self.loss_kind, "optimizer": self.optimizer, "lr": self.lr, "steps": self.steps,
            "loss": self.loss, "step_times_ms": self.step_times_ms,
            "measured_step_time_ms": self.measured_ms, "predicted_step_time_ms": self.predicted_ms,
            "ratio": self.ratio, "warnings": self.warnings,
            "phases_ms": {"measured": self.phases_ms, "predicted": self.predicted_phases_ms},
            "comm_bytes": {"measured": self.sent_bytes, "predicted": self.predicted_sent_bytes},
            "peak_rss_bytes": self.peak_rss_bytes, "start_rss_bytes": self.start_rss_bytes,
            "memory_bytes": self.memory,
            "sync": self.sync,
        }
        if self.check is not None:
            out["check"] = self.check
        if self.saved:
            out["saved"] = self.saved
        return out

    def summary(self) -> str:
        losses = f"{self.loss[0]:.6g} -> {self.loss[-1]:.6g}" if self.loss else "-"
        after = "after one warm-up step" if self.steps > 1 else "one step, no warm-up"
        ratio = f" (measured / predicted = {self.ratio:.2f})" if self.ratio is not None else ""
        lines = [
            f"plan     {self.plan}  ({self.strategy}, {self.ranks} rank{'s' * (self.ranks != 1)}, {self.backend})",
            f"trained  {self.steps} step{'s' * (self.steps != 1)}, {self.optimizer} lr={self.lr:g}, "
            f"{self.loss_kind} loss {losses}",
            f"time     {self.measured_ms:.3f} ms per step measured (median, {after}), "
            f"{self.predicted_ms:.3f} ms predicted{ratio}",
        ]
        if self.phases_ms:
            lines += [f"{'phases' if k == 0 else '':<9}{row}"
                      for k, row in enumerate(phase_table(self.phases_ms, self.predicted_phases_ms))]
        if self.sent_bytes:
            lines += _bytes_lines(self.sent_bytes, self.predicted_sent_bytes)
        if self.sync.get("all_reduces"):
            n, size = self.sync["all_reduces"], self.sync.get("bucket_bytes", 0)
            how = (f"in buckets of at least {format_bytes(size)}, each started during backward" if size
                   else "after backward, one flat buffer per group")
            zero = self.sync.get("zero", 0)
            if self.sync.get("zero_by_weight"):
                lines.append(f"sync     {n} gradient all-reduces or reduce-scatters per step on rank 0, each "
                             f"bucket's by its weights' ZeRO stage: {Training.from_json(self.sync).zero_text}")
            elif zero >= 2:
                then = ("and an all-gather of the updated shards after the update" if zero == 2 else
                        "each weight gathered before each pass that reads it")
                lines.append(f"sync     {n} gradient reduce-scatter{'s' * (n != 1)} per micro-batch on rank 0, each "
                             f"weight's as soon as backward has made it; {then} (ZeRO-{zero})")
            else:
                what = "reduce-scatter" if zero else "all-reduce"
                then = ", each with an all-gather of the updated shards after the update (ZeRO-1)" if zero else ""
                lines.append(f"sync     {n} gradient {what}{'s' * (n != 1)} per step on rank 0, {how}{then}")
        micro = self.sync.get("micro_batches", 1)
        if micro > 1:
            lines.append(f"step     {micro} micro-batches per step, gradients accumulated before the sync")
        if self.memory:
            held, planned = self.memory["measured"], self.memory["predicted"]
            same = "equal on every rank" if held == planned else \
                f"they differ on {sum(a != b for a, b in zip(held, planned))} rank(s)"
            lines.append(f"memory   held {format_bytes(max(held))} measured, {format_bytes(max(planned))} predicted "
                         f"(the largest rank's peak between actions; {same})")
            if self.memory.get("plan"):
                other = self.memory.get("plan_optimizer", self.optimizer)
                lines.append(f"         the plan's own account {format_bytes(max(self.memory['plan']))} on its busiest "
                             f"device{'' if other == self.optimizer else f' (priced for {other})'}")
        if self.peak_rss_bytes:
            shown = " ".join(f"{b / 2**20:.0f}" for b in self.peak_rss_bytes[:8])
            base = f", {max(self.start_rss_bytes) / 2**20:.0f} MiB before the model was read" \
                if self.start_rss_bytes else ""
            lines.append(f"{'' if self.memory else 'memory':<9}peak resident while training {shown}"
                         f"{' ...' if len(self.peak_rss_bytes) > 8 else ''} MiB (by rank{base})")
        if self.check is not None:
            state = "passed" if self.check["passed"] else "FAILED"
            lines.append(f"check    {state}: max relative error {self.check['max_rel_err']:.2e} "
                         f"against one process running the original model")
        if self.saved:
            lines.append(f"saved    {self.saved}")
        lines += [f"warning  {w}" for w in self.warnings]
        return "\n".join(lines)


def _bytes_lines(measured: list[int], predicted: list[int]) -> list[str]:
    """Bytes of tensor data sent per step by each rank (the first 8, then the total), measured
    at the communicator and predicted from the plan."""
    shown = 8
    width = max(len(f"{b:,}") for b in measured + predicted)

    def row(values: list[int]) -> str:
        more = " ..." if len(values) > shown else ""
        return " ".join(f"{b:>{width},}" for b in values[:shown]) + more + f"  total {sum(values):,}"
    same = "equal" if measured == predicted else "they DIFFER"
    return [f"bytes    measured  {row(measured)}  (sent per step, by rank)",
            f"bytes    predicted {row(predicted)}  ({same})"]


@dataclass
class RunOutcome:
    """Every rank's result: rank 0 has the report; ``error`` is set (on every rank) when the
    job failed, and ``root`` says whether this rank should print it."""

    report: RunReport | None
    error: str | None
    root: bool


@dataclass
class _Job:
    plan: Plan
    model: Path
    comm: Comm
    xp: Any
    backend: str
    params: ParamStore
    executor: Any
    data: Data
    loss: LossKind
    optimizer: OptimizerConfig
    imported: Any
    weights: Any
    warnings: list[str]
    start_rss: int = 0      # resident bytes before the plan and model were read


def run_plan(opts: RunOptions) -> RunOutcome:
    """Train with a plan on this job's ranks (see the module docstring)."""
    world = mpi().COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    where = _name_ranks(world, opts.verbose)
    job, err = None, None
    try:
        job = setup_job(opts, world)
    except UnityError as e:
        err = _line(e)
        if opts.debug:
            traceback.print_exc()
    except Exception as e:  # a bug: still one line
        err = f"internal error: {type(e).__name__}: {_line(e)} (rerun with --debug for the traceback)"
        if opts.debug:
            traceback.print_exc()
    errors = world.allgather(err)
    failed = next(((r, e) for r, e in enumerate(errors) if e), None)
    if failed is not None:
        r, e = failed
        return RunOutcome(None, e if r == 0 else f"rank {r}: {e}", rank == 0)
    assert job is not None
    try:
        return _train(opts, job)
    except Exception as e:
        msg = _line(e) if isinstance(e, UnityError) else f"{type(e).__name__}: {_line(e)}"
        if isinstance(e, mpi().Exception):
            msg = f"an MPI call failed ({_line(e)})" + "".join(f"; {d}" for d in _gone(where, rank))
        if opts.debug:
            traceback.print_exc()
        if size == 1:
            return RunOutcome(None, msg, True)
        print(f"error: rank {rank}: {msg}", file=sys.stderr, flush=True)
        job.comm.abort(1)
        raise  # not reached: Abort ends the process


def _name_ranks(world: Any, verbose: bool) -> list[tuple[int, str]]:
    """Each rank's (pid, host); under ``--verbose`` rank 0 prints them before any work: a
    rank killed outright (``kill -9``, the OOM killer) cannot say so itself, and mpiexec then
    reports only the pid of the process that died."""
    where = world.allgather((os.getpid(), socket.gethostname()))
    if verbose and world.Get_rank() == 0:
        ranks = ", ".join(f"{r}: pid {pid} on {host}" for r, (pid, host) in enumerate(where))
        print(f"ranks    {ranks}", file=sys.stderr, flush=True)
    return where


def _gone(where: list[tuple[int, str]], me: int) -> list[str]:
    """The ranks on this host that are no longer running (a peer killed mid-step): each as
    ``rank R (pid P) is no longer running``. Ranks on other hosts cannot be seen from here."""
    host = where[me][1]
    out = []
    for r, (pid, h) in enumerate(where):
        if r != me and h == host and not _running(pid):
            out.append(f"rank {r} (pid {pid}) is no longer running")
    return out


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # killed but not yet reaped by its launcher: a zombie
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _line(e: BaseException) -> str:
    s = str(e)
    return s.splitlines()[0] if s else type(e).__name__


def setup_job(opts: RunOptions, world: Any) -> _Job:
    """Everything a rank needs to train with a plan (the profiler times real steps with it)."""
    if opts.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {opts.steps}")
    start_rss = resident()[0]
    plan = load_plan(opts.plan)
    size = world.Get_size()
    need = plan.cluster.num_devices
    if need != size:
        raise PlanError(
            f"{opts.plan} is a plan for {need} device{'s' * (need != 1)} (cluster {plan.cluster.name!r}) but this "
            f"job has {size} rank{'s' * (size != 1)}: run it with mpiexec -n {need}, or re-plan for this job "
            f"(for 2 ranks on this machine: unity optimize {plan.model.get('path', 'MODEL')} "
            f"--cluster {LOCAL_CPU})")
    backend, xp = array_module(opts.backend, world.Get_rank())
    model = resolve_model(plan, opts.model)
    if opts.save:   # before any training: a bad --save must not cost the run
        check_output("--save", opts.save, {"plan": opts.plan, "model": model, "data (--data)": opts.data})
    imported = import_for_plan(model, plan)
    warnings = []
    if plan.config.get("dtype", "float32") != "float32":
        warnings.append(f"the plan is for {plan.config['dtype']}; training runs in the model's own dtypes")
    values = weight_values(model, imported, [plan.pcg, imported.pcg], opts.seed)
    if values.missing:
        msg = (f"{model}: no data for {len(values.missing)} weight(s) (e.g. {values.missing[0]!r}; external data "
               f"missing?): initialized randomly (seed {opts.seed})")
        warnings.append(msg)
        if world.Get_rank() == 0:
            print(f"warning: {msg}", file=sys.stderr, flush=True)
    arrays = read_npz(opts.data) if opts.data else None
    loss = choose_loss(opts.loss, arrays.get("labels") if arrays else None, imported.pcg)
    if list(imported.outputs) != list(plan.model["outputs"]):
        raise PlanError(f"{opts.plan}: model.outputs {plan.model['outputs']} but {model} outputs "
                        f"{list(imported.outputs)}: the plan was made for another model")
    out_dims = imported.pcg.shape(imported.pcg.outputs[0]).sizes
    plan_out = plan.pcg.shape(plan.pcg.outputs[0]).sizes
    if plan_out != out_dims:
        raise PlanError(f"{opts.plan}: the plan's output is {list(plan_out)} but {model}'s is {list(out_dims)}")
    data = Data(imported.inputs, out_dims, loss, opts.seed, gather_tables(imported.pcg), arrays, opts.data or "")
    optimizer = OptimizerConfig.of(opts.optimizer or plan.config.get("optimizer", "adam"), opts.lr)
    class_axis = len(out_dims) - 1 if loss is LossKind.CROSS_ENTROPY else None

    for g, which in ((plan.pcg, "plan"), (imported.pcg, "model")):
        for _, n in g:
            if not (n.spec.is_source or n.spec.is_parallel_op or kernels.has_kernel(n.kind)):
                raise RunError(f"the {which}'s node {n.name!r} is a {n.kind}, which has no runtime kernel yet")

    _, comm, params, executor = build_executor(plan.pcg, plan.views, class_axis, backend, world, xp,
                                                     values.trainable, optimizer, loss, values.constants,
                                                     plan.sync_bucket_bytes, plan.training)
    return _Job(plan, model, comm, xp, backend, params, executor, data, loss, optimizer, imported, values, warnings,
                start_rss)


def _fault_rank(var: str, ranks: int) -> int | None:
    """The rank the environment variable ``var`` names (None: unset or empty); a value that
    is not a rank of this job is a one-line UsageError (a test that injects nothing would
    pass for the wrong reason)."""
    r = os.environ.get(var, "").strip()
    if not r:
        return None
    if not r.isdigit() or int(r) >= ranks:
        raise UsageError(f"{var}={r!r}: not a rank of this job (ranks 0 to {ranks - 1})")
    return int(r)


def _fault_step(rank: int, ranks: int, steps: int) -> int | None:
    """The step at which ``UNITY_FAULT_RANK`` names this rank to fail, if it does; a step
    it will not reach is a one-line UsageError too."""
    r = _fault_rank("UNITY_FAULT_RANK", ranks)
    if r is None:
        return None
    s = os.environ.get("UNITY_FAULT_STEP", "0").strip() or "0"
    if not s.isdigit() or int(s) >= steps:
        raise UsageError(f"UNITY_FAULT_STEP={s!r}: not a step of this run (steps 0 to {steps - 1})")
    return int(s) if r == rank else None


GRAD_FAULT = 1.01
"""``UNITY_FAULT_GRAD_RANK=r``: rank ``r`` scales its gradient pieces by this before the sync
(a 1 % error in one rank's share, which ``--check`` must catch)."""


def _holder(program: Any) -> Callable[[str, tuple[int, ...]], int | None]:
    """The first rank whose master region of a weight holds an element (for --check's message)."""
    plans = {p.name: p for p in program.params}

    def holder(name: str, at: tuple[int, ...]) -> int | None:
        p = plans.get(name)
        if p is None or not at:
            return None
        return next((r for r in sorted(p.master)
                     if all(s.start <= i < s.stop for s, i in zip(p.master[r], at, strict=True))), None)
    return holder


def _train(opts: RunOptions, job: _Job) -> RunOutcome:
    comm, xp = job.comm, job.xp
    rank = comm.rank
    micro = job.plan.training.micro_batches
    fault = _fault_step(rank, comm.size, opts.steps)
    if _fault_rank("UNITY_FAULT_GRAD_RANK", comm.size) == rank:
        job.params.fault_scale = GRAD_FAULT
    reference = None
    reference_batches = micro        # the one-process run's passes per step (1: the batch whole)
    check = None
    if opts.check:

        check = CheckResult()
        job.params.keep_synced = True
        if rank == 0:
            # k micro-batches of b must train as one batch of k*b: the one-process run takes them
            # whole, or, from an export whose shapes fix the batch at b, one at a time (averaged)
            whole, constants = job.imported, job.weights.constants
            if micro > 1:   # constants folded at import may have the batch in their shape
                try:
                    whole = import_for_plan(job.model, job.plan, micro)
                    constants = weight_values(job.model, whole, [whole.pcg], opts.seed).constants
                    reference_batches = 1
                except UnityError:
                    whole = job.imported
            reference = Reference(whole.pcg, job.backend, xp, job.weights.trainable, constants,
                                  job.loss, job.optimizer)
    if not opts.check:     # the masters hold this rank's part of each weight: the whole ones go
        job.weights.trainable.clear()
    reset_peak()           # the peak resident memory measured is the training's, not the loading's
    losses, times = [], []
    clock = job.executor.clock = StepClock(comm)
    ledger = Ledger(job.executor)      # the first step's (the warm-up, when there are more)
    job.executor.measure(ledger)
    for s in range(opts.steps):
        batches = [job.data.batch(s * micro + j) for j in range(micro)]
        # every rank takes part; rank 0 gets them, a folded weight as the model's weights it holds
        before = unfold(job.params.gather(0), job.plan.pcg) if opts.check else {}
        comm.barrier()
        t0 = time.perf_counter()
        why = f"injected fault in step {s} (UNITY_FAULT_RANK={rank})" if fault == s else None
        loss = job.executor.train_step([(b.inputs, xp.asarray(b.labels)) for b in batches], fault=why)
        comm.sync()
        job.executor.measure(None)
        times.append(time.perf_counter() - t0)
        clock.stop(times[-1])
        losses.append(loss)
        if opts.check:
            grads = unfold(job.params.gather(0, "grads"), job.plan.pcg)
            after = unfold(job.params.gather(0), job.plan.pcg)
            if reference is not None and check is not None:
                if reference_batches == 1:
                    inputs = {name: np.concatenate([b.inputs[name] for b in batches]) for name in batches[0].inputs}
                    target = xp.asarray(np.concatenate([b.labels for b in batches]))
                    ref_loss, ref_grads = reference.gradients(before, inputs, target)
                else:
                    each = [reference.gradients(before, b.inputs, xp.asarray(b.labels)) for b in batches]
                    ref_loss = sum(part for part, _ in each) / micro
                    ref_grads = {name: sum(g[name] for _, g in each) / micro for name in each[0][1]}
                check.compare(s, loss, ref_loss, grads, ref_grads, after, reference.updated(before, grads),
                              job.optimizer.lr, _holder(job.params.program))
    job.executor.clock = None
    all_times = comm.allgather_obj(times)
    phases = measured_phases_ms(comm.allgather_obj(clock.steps), comm.allgather_obj(clock.calls))
    sent = comm.allgather_obj(clock.sent)            # per rank, per step (exact fractions)
    rss = comm.allgather_obj((job.start_rss, resident()[1]))
    held = comm.allgather_obj((ledger.peak, ledger.parts))
    planned = comm.allgather_obj(planned_memory(job.executor.p, rank, job.plan.training, job.optimizer.kind.value,
                                                job.params.bucket_bytes, job.loss, job.params.optimizer.chunk))
    memory = {"measured": [b for b, _ in held], "predicted": [b for b, _ in planned],
              "parts": {"measured": [parts for _, parts in held], "predicted": [parts for _, parts in planned]},
              # the planner's account, which decided what fits (cost/memory.py; for the plan's optimizer)
              "plan": list(job.plan.predicted.get("memory_bytes", [])),
              "plan_optimizer": job.plan.config.get("optimizer", "adam"),
              "plan_loss": planned_loss(job.plan.pcg, job.plan.config.get("loss", "auto")).value}
    step_ms = [max(t[s] for t in all_times) * 1e3 for s in range(opts.steps)]
    final = unfold(job.params.gather(0), job.plan.pcg) if opts.save else {}
    failure = None
    if opts.check:
        failure = comm.bcast_obj(None if check is None or check.passed else
                                 (check.failure or "nothing to compare (no trainable weight matched by name)"))
    if rank != 0:
        return RunOutcome(None, "--check failed" if failure else None, False)
    saved = None
    if opts.save:
        save_trained(job.model, opts.save, final)
        saved = opts.save
    predicted_phases, predicted_sent = opts.predict(job.plan, job.loss.value) if opts.predict else ({}, [])
    warnings = list(job.warnings)
    if any(len(set(steps)) > 1 for steps in sent):
        warnings.append("the bytes sent differ from step to step (the last step's are shown)")
    report = RunReport(opts.plan, job.plan.strategy, comm.size, job.backend, job.loss.value,
                       job.optimizer.kind.value, job.optimizer.lr, opts.steps, losses, step_ms,
                       float(job.plan.predicted.get("step_time_ms", 0.0)),
                       check.to_json() if check is not None else None, saved, warnings,
                       phases, predicted_phases, [round(steps[-1]) for steps in sent], predicted_sent,
                       job.plan.sha256, [peak for _, peak in rss], [start for start, _ in rss], memory,
                       {"bucket_bytes": job.params.bucket_bytes, "all_reduces": len(job.params.buckets),
                        **job.plan.training.to_json()})
    return RunOutcome(report, f"--check failed: {failure}" if failure else None, True)
