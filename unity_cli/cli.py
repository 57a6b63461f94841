"""The ``unity`` command line: thin click commands over the library."""
from __future__ import annotations

import functools
import gc
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import ModelError, UnityError, UsageError
from .files import check_output


def _fail(e: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    click.echo(f"error: {msg}", err=True)
    sys.exit(1)


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UnityError (and any unexpected crash) into one line on stderr and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, debug: bool = False, **kwargs: Any) -> Any:
        debug = debug or click.get_current_context().find_root().params.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except UnityError as e:
            _fail(e, debug)
        except (KeyboardInterrupt, click.exceptions.Exit, click.ClickException):
            raise
        except BrokenPipeError:  # the reader went away (`unity zoo --list | head`): not an error
            _quiet_stdout()
            sys.exit(0)
        except Exception as e:  # a bug: still one line, with a hint to get the traceback
            if debug:
                _fail(e, True)
            click.echo(f"error: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
                       err=True)
            sys.exit(1)

    return click.option("--debug", is_flag=True, help="Show the traceback on errors.")(wrapper)


MAX_BATCH = 2**31 - 1
"""The largest batch accepted: arrays index with 64-bit integers, and a batch past 2**31
already needs more memory than any device has (2**70 overflowed later, deep inside)."""
MAX_COUNT = 2**31 - 1
YOUNG_COLLECTION = 100_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def check_number(option: str, value: float | int | None, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> None:
    """A one-line UsageError unless ``value`` (None: not given) is finite and within bounds:
    click's float lets NaN and infinity through, and every comparison with NaN is false."""
    if value is None:
        return
    below = low is not None and (value <= low if low_open else value < low)
    if not math.isfinite(value) or below or (high is not None and value > high):
        kind = "an integer" if isinstance(value, int) else "a finite number"
        bounds = [f"{'>' if low_open else '>='} {_plain(low)}" if low is not None else "",
                  f"<= {_plain(high)}" if high is not None else ""]
        where = " and ".join(b for b in bounds if b)
        raise UsageError(f"{option} must be {kind}{' ' + where if where else ''}, got {value}")


def _sync_bucket(text: str) -> int | None:
    """``--sync-bucket``: None for auto, 0 for flat, else a size in bytes (a one-line
    UsageError on anything else)."""
    word = text.strip().lower()
    if word == "auto":
        return None
    if word in ("flat", "0"):
        return 0
    from .cluster.units import parse_bytes

    try:
        size = parse_bytes(text)
    except ValueError as e:
        raise UsageError(f"--sync-bucket {text!r}: expected auto, flat or a size such as 4MiB ({e})") from None
    if not 1 <= size <= MAX_MEMORY:
        raise UsageError(f"--sync-bucket {text!r}: must be from 1 byte to {MAX_MEMORY >> 50} PiB")
    return size


def _memory_limit(text: str | None) -> int | None:
    """``--memory-limit`` in bytes: a size with its unit (``12GiB``, ``16 GB``) or a bare
    number of GB; a one-line UsageError on anything else, zero, NaN or infinity."""
    if text is None:
        return None
    from .cluster.units import parse_bytes

    try:
        gb = float(text)
    except ValueError:
        try:
            size = parse_bytes(text)
        except ValueError as e:
            raise UsageError(f"--memory-limit {text!r}: {e}") from None
    else:
        check_number("--memory-limit", gb, 0, low_open=True)
        size = round(gb * 1e9)
    if not 1 <= size <= MAX_MEMORY:
        raise UsageError(f"--memory-limit {text!r}: must be from 1 byte to {MAX_MEMORY >> 50} PiB")
    return size


MAX_MEMORY = 1 << 60


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="unity")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def cli(debug: bool) -> None:
    """unity: jointly optimize algebraic rewrites and parallelization of DNN training."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: click's own usage errors become one ``error:`` line too."""
    # A search builds many small graphs beside a large heap that lives as long as the process
    # (the rule cache, the price tables): collecting after every 700 allocations spent a tenth
    # of `optimize` on BERT-tiny walking that heap; the process is short-lived, cycles are few.
    gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])
    try:
        cli.main(args=argv, prog_name="unity", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(2)
    except click.UsageError as e:
        path = e.ctx.command_path.split(" ", 1) if e.ctx else []
        hint = f" (see 'unity {path[1]} --help')" if len(path) == 2 else ""
        click.echo(f"error: {e.format_message()}{hint}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(1)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


def _training(strategy: str, zero: str, micro_batches: str, recompute: str, devices: int
              ) -> tuple[int | None, int | None, Any, tuple[tuple[str, int], ...]]:
    """The ZeRO stage, micro-batches and recomputation the options fix (``ir/training.py``;
    None where the search chooses), and the stages named per weight: ``--strategy
    tp=..,dp=..`` names all (its zero=, zero[NAMES]=, mb= and recompute=, else the
    defaults); ``--zero``, ``--micro-batches`` and ``--recompute`` fix each on its own."""
    from .ir.recompute import parse_recompute
    from .search.baselines import is_hybrid, parse_strategy, whole_number

    k = None
    if micro_batches != "auto":
        if not whole_number(micro_batches) or int(micro_batches) < 1:
            raise UsageError(f"--micro-batches {micro_batches[:40]!r}: expected auto or a whole number >= 1")
        k = int(micro_batches)
    if is_hybrid(strategy):
        _, _, named = parse_strategy(strategy, devices)
        if zero != "auto" or k is not None or recompute != "auto":
            raise UsageError(f"--strategy {strategy[:200]}: give zero=, mb= and recompute= in it, not --zero, "
                             "--micro-batches or --recompute")
        return named.zero, named.micro_batches, (named.recompute, named.recompute_segments), named.zero_by_weight
    if recompute == "auto":
        return (None if zero == "auto" else int(zero)), k, None, ()
    try:
        mode = parse_recompute(recompute)
    except ValueError as e:
        raise UsageError(f"--recompute {recompute[:40]!r}: {e} or auto") from None
    return (None if zero == "auto" else int(zero)), k, mode, ()


def _parse_inputs(values: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for v in values:
        name, sep, dims = v.partition("=")
        if not sep or not name:
            raise UsageError(f"--input {v!r}: expected NAME=d0,d1,...")
        try:
            shape = tuple(int(x) for x in dims.replace("x", ",").split(",") if x.strip())
        except ValueError:
            raise UsageError(f"--input {v!r}: dims must be integers, e.g. {name}=8,128") from None
        if not shape or any(d < 1 for d in shape):
            raise UsageError(f"--input {v!r}: dims must be positive integers")
        out[name] = shape
    return out


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
              help="Cluster spec: a YAML file or a bundled spec's name (unity clusters; default: this machine).")
@click.option("--batch-size", type=int, help="Leading dim of every (non-weight) graph input.")
@click.option("--input", "inputs", multiple=True, metavar="NAME=DIMS", help="Concrete shape of one input.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]), default="adam", show_default=True,
              help="Optimizer whose state is counted in memory.")
@click.option("--strategy", default="best", show_default=True,
              help="best (the joint search, keeping the fastest plan found) | unity | parallel_only | "
                   "algebraic_then_parallel | data_parallel | tensor_parallel | hybrid (the fastest uniform "
                   "TP x DP hybrid) | tp=T,dp=D[,zero=Z][,zero[NAMES]=Z][,mb=K][,recompute=R[:S]] (tensor "
                   "parallel T ways on consecutive devices, data parallel D ways across the groups, T*D = the "
                   "cluster's device count, either left out is what the devices leave; ZeRO stage Z, and the "
                   "weights whose names match the pattern NAMES at their own; K micro-batches per step, "
                   "recomputation none, selective or full, of the first S segments only with :S)")
@click.option("--zero", type=click.Choice(["auto", "0", "1", "2", "3"]), default="auto", show_default=True,
              help="ZeRO stage of the data-parallel replicas: 0 (every replica keeps everything) | 1 (optimizer "
                   "state sharded: gradients reduce-scattered, weights all-gathered after the update) | 2 (the "
                   "gradients sharded too: reduce-scattered after every micro-batch) | 3 (the weights too: each "
                   "gathered before each pass that reads it) | auto (the searches try 1 where it prices faster, "
                   "and each stage where nothing fits without).")
@click.option("--micro-batches", "micro_batches", default="auto", show_default=True, metavar="auto|K",
              help="Micro-batches per optimizer step (gradient accumulation; --batch-size stays the global "
                   "batch): K | auto (1, more only where no plan fits in memory).")
@click.option("--recompute", default="auto", show_default=True, metavar="auto|none|selective|full[:S]",
              help="Activation recomputation: none (keep every activation for backward) | selective (keep what "
                   "the weighted products read, run the rest again in backward: norms, activations, the "
                   "attention scores) | full (keep each segment's input, e.g. a transformer's residual stream, "
                   "and run the segment's forward again in backward); :S recomputes only the first S segments "
                   "| auto (the search chooses, full of as few segments as fit).")
@click.option("--budget", type=float, metavar="SECONDS",
              help="A ceiling on the seconds the whole run may take (default: none); the best plan so far "
                   "is kept, and the plan records \"cut_by_budget\" when it cut the search.")
@click.option("--max-candidates", type=int,
              help="Stop the searches after this many candidates in all (default: 200). A count, unlike "
                   "seconds, gives the same plan on every machine; given, it wins over --budget.")
@click.option("--memory-limit", metavar="SIZE",
              help="Memory per device the plan may use: a size such as 12GiB or 16GB; a bare number is GB "
                   "(default: each device's capacity).")
@click.option("--sync-bucket", default="auto", show_default=True, metavar="auto|flat|SIZE",
              help="The gradient sync: auto (buckets, of the size that prices fastest, where the profile "
                   "measured an all-reduce hiding under compute; else flat) | flat (one all-reduce per group "
                   "after backward) | SIZE (buckets of at least SIZE, e.g. 4MiB, started during backward).")
@click.option("--alpha", type=float, default=1.05, show_default=True,
              help="The joint search expands candidates within this factor of the best.")
@click.option("--out", "out_path", default="plan.json", show_default=True, type=click.Path(dir_okay=False))
@click.option("--rules", "rules_path", type=click.Path(dir_okay=False),
              help="Verified rule cache (default: the one shipped with unity).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False),
              help="Measured times from 'unity profile' (default: $UNITY_PROFILE_DIR/<cluster name>.json, "
                   "~/.cache/unity/profiles, if it is there and fits the cluster).")
@click.option("--no-profile", is_flag=True, help="Plan with the roofline estimates only.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Also write the plan's HTML report (as 'unity report' does) to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@handles_errors
def optimize(model: str, cluster_path: str | None, batch_size: int | None, inputs: tuple[str, ...], dtype: str,
             optimizer: str, strategy: str, budget: float | None, max_candidates: int | None,
             memory_limit: str | None, alpha: float, out_path: str,
             rules_path: str | None, profile_path: str | None, no_profile: bool, as_json: bool,
             report_path: str | None = None, sync_bucket: str = "auto", zero: str = "auto",
             micro_batches: str = "auto", recompute: str = "auto") -> None:
    """Plan how to train MODEL (an ONNX file) on a cluster; write the plan."""
    started = time.monotonic()     # --budget counts from here: loading and importing are part of the run
    from .cluster import cluster_path as find_cluster
    from .cluster import load_cluster, local_cluster
    from .cost.model import CostConfig, Optimizer
    from .cost.profile import profile_for
    from .ir import DType
    from .onnx_import import DEFAULT_BATCH, ImportOptions, import_model
    from .plan.build import make_plan
    from .report.progress import Progress
    from .report.summary import summary
    from .search.optimize import DEFAULT_CANDIDATES
    from .search.step import optimize_step
    from .substitutions.cache import load_cache, prove_applied

    check_number("--batch-size", batch_size, 1, MAX_BATCH)
    check_number("--budget", budget, 0, low_open=True)
    check_number("--max-candidates", max_candidates, 1, MAX_COUNT)
    limit = _memory_limit(memory_limit)
    bucket = _sync_bucket(sync_bucket)
    check_number("--alpha", alpha, 1)
    spec = find_cluster(cluster_path) if cluster_path else None   # a path or a bundled name
    reads = {"model": model, "cluster spec": spec, "rule cache": rules_path, "profile": profile_path}
    check_output("--out", out_path, reads)
    if report_path:
        check_output("--report", report_path, {**reads, "plan (--out)": out_path})
    cluster = load_cluster(cluster_path) if spec else local_cluster()   # (SPEC:N sizes a spec)
    fixed_zero, fixed_micro, fixed_recompute, by_weight = _training(strategy, zero, micro_batches, recompute,
                                                                    cluster.num_devices)
    if bucket:      # buckets asked for: ZeRO's sync runs flat, so none
        if fixed_zero or any(z for _, z in by_weight):
            raise UsageError("--sync-bucket: ZeRO's sync runs flat after backward; give --zero 0 to bucket it")
        fixed_zero = 0
    rules = load_cache(rules_path)  # a stale or edited cache is an error, never used silently
    shapes = _parse_inputs(inputs)
    # --batch-size is the global batch; with mb=K given, the model is read at the micro-batch
    # size first (an export of a fixed batch reads at its own batch times K)
    first = fixed_micro if fixed_micro and batch_size and batch_size % fixed_micro == 0 else 1
    fixed_note = None
    try:
        micro = {first: import_model(model, ImportOptions(batch_size // first if batch_size else None, {
            name: (dims[0] // first, *dims[1:]) for name, dims in shapes.items()}))}
    except ModelError:
        # an export whose shapes fix its batch: a global batch of a multiple of it runs as
        # micro-batches of the exported one (what the search would choose among is fixed)
        exported = import_model(model, ImportOptions()) if batch_size and not fixed_micro and not shapes else None
        if exported is None or exported.batch_defaulted or batch_size % exported.batch_size or \
                batch_size == exported.batch_size:
            raise
        fixed_micro = first = batch_size // exported.batch_size
        micro = {first: exported}
        fixed_note = (f"{model}'s exported shapes fix its batch at {exported.batch_size}: --batch-size "
                      f"{batch_size} runs as {first} micro-batches of {exported.batch_size} (mb={first})")
    global_batch = micro[first].batch_size * first

    def graph_for(k: int):
        """The graph at the micro-batch size of k micro-batches (each input's batch dim / k)."""
        if k not in micro:
            micro[k] = import_model(model, ImportOptions(global_batch // k, {
                name: (dims[0] // k, *dims[1:]) for name, dims in shapes.items()}))
        return micro[k].pcg
    if profile_path and no_profile:
        raise UsageError("--profile and --no-profile: pick one")
    profile, profile_note = profile_for(cluster, profile_path, use_default=not no_profile)
    config = CostConfig(DType(dtype), Optimizer(optimizer), limit, profile, sync_bucket=bucket)
    progress = Progress("search", enabled=None if not as_json else False)

    work = max_candidates or DEFAULT_CANDIDATES
    costed = [0]

    def report(_stats, best: float, _left: float) -> None:  # called once per candidate, over all searches
        costed[0] += 1
        progress(min(costed[0], work), work, f"{costed[0]} candidates, best {best * 1e3:.3f} ms")

    try:
        result, k = optimize_step(graph_for, global_batch, cluster, config, strategy, fixed_zero,
                                  fixed_micro, fixed_recompute, by_weight, rules=rules.rules, budget=budget,
                                  alpha=alpha, progress=report, max_candidates=max_candidates, started=started)
    finally:
        progress.close()
    imported = micro[k]
    # Every rule the plan applies is proved again before the plan is written.
    proved = prove_applied(rules, [a.rule_id for a in result.rewrites], rules_path or "the shipped rule cache")
    plan = make_plan(imported, cluster, config, result,
                     {"rules_loaded": len(rules.rules), "rules_hash": rules.content_hash(),
                      "rules_proved": list(proved)})
    plan.save(out_path)
    if report_path:
        from .report.html import write_report
        write_report(plan, report_path)
    notes = [n for n in (fixed_note, profile_note) if n]
    if result.cut_by_budget:
        left_out = f"; left out: {', '.join(result.not_priced)}" if result.not_priced else ""
        notes.append(f"--budget {budget:g} s cut the search short{left_out}: the plan may differ on a faster "
                     "machine (--max-candidates gives the same plan on every machine)")
    if micro[first].batch_defaulted:
        notes.append(f"the model's batch dim is symbolic; planned for batch {DEFAULT_BATCH} (set --batch-size)")
    if as_json:
        doc = {"plan": out_path, "strategy": plan.strategy, "predicted": plan.predicted,
               "baselines": plan.baselines, "model": plan.model, "notes": notes}
        if report_path:
            doc["report"] = report_path
        click.echo(json.dumps(doc, sort_keys=True))
    else:
        click.echo(summary(plan, out_path, notes))
        if report_path:
            click.echo(f"wrote    {report_path}")



@cli.command("zoo")
@click.argument("name", required=False)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="ONNX file to write (default: NAME.onnx).")
@click.option("--scale", default="paper", show_default=True,
              help="paper (the real sizes; weights shape-only unless --weights) | small (the same architecture "
                   "shrunk to train on CPUs in seconds; random weights inline).")
@click.option("--batch-size", type=int, help="Fix the batch dim (default: symbolic, N).")
@click.option("--weights/--no-weights", default=None,
              help="Write seeded random weights (default: yes at small scale; at paper scale they go to "
                   "OUT.data, which is large).")
@click.option("--list", "list_models", is_flag=True, help="List the models: name, paper-scale parameters, "
              "description.")
@handles_errors
def zoo_command(name: str | None, out_path: str | None, scale: str, batch_size: int | None, weights: bool | None,
                list_models: bool) -> None:
    """Write one of the Unity paper's seven DNNs, or a decoder LLM, as an ONNX file (unity zoo --list)."""
    from . import zoo

    if list_models:
        for m in zoo.MODELS.values():
            click.echo(f"{m.name:<13} {zoo.paper_parameters(m.name) / 1e6:>7.1f}M  {m.description}")
        return
    if not name:
        raise UsageError("give a model NAME (see 'unity zoo --list')")
    model = zoo.lookup(name)
    zoo.check_scale(scale)
    check_number("--batch-size", batch_size, 1, MAX_BATCH)
    out = Path(out_path or f"{model.name}.onnx")
    built, data = zoo.write(model.name, out, scale, batch_size, weights)
    inputs = ", ".join(f"{i.name}[{','.join(d.dim_param or str(d.dim_value) for d in i.type.tensor_type.shape.dim)}]"
                       for i in built.model.graph.input)
    if data is not None:
        stored = f"weights in {data}"
    elif scale == "small" and weights is not False:
        stored = "weights inline"
    else:
        stored = f"weights shape-only (external data {out.name}.data not written; --weights writes it)"
    params = f"{built.params / 1e6:.2f}M" if built.params >= 1e6 else f"{built.params:,}"
    click.echo(f"wrote {out}: {built.doc} ({scale} scale); {params} parameters; "
               f"inputs {inputs}; {stored}")


@cli.command("clusters")
@handles_errors
def clusters_command() -> None:
    """List the bundled cluster specs: --cluster takes a name from this list or a path."""
    from .cluster import bundled_clusters, load_cluster
    from .report.summary import describe_cluster

    for name, path in bundled_clusters().items():
        c = load_cluster(path)
        shape = describe_cluster(c).split(": ", 1)[1]
        click.echo(f"{name:<18} {c.num_devices:>5} devices  ({shape})")


@cli.command("verify-rules")
@click.option("--max-ops", type=int, default=3, show_default=True, help="Largest graphs the generator enumerates.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Where to write the cache (default: the shipped substitutions/rules.json).")
@click.option("--timeout-ms", type=int, default=2000, show_default=True, help="z3 time limit per rule.")
@click.option("--jobs", type=int, default=0, help="Processes proving rules (default: all cores).")
@click.option("--check", "check_path", type=click.Path(dir_okay=False),
              help="Re-prove an existing rule file instead of generating; exit 1 if any rule fails.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@handles_errors
def verify_rules(max_ops: int, out_path: str | None, timeout_ms: int, jobs: int, check_path: str | None,
                 as_json: bool) -> None:
    """Generate substitutions, prove each with z3, and write the verified rule cache."""
    from .report.progress import Progress
    from .substitutions.workflow import check_file, regenerate

    check_number("--max-ops", max_ops, 1, 8)
    check_number("--timeout-ms", timeout_ms, 1, MAX_COUNT)
    check_number("--jobs", jobs, 0, 4096)
    jobs = jobs or (os.cpu_count() or 1)
    if out_path:
        check_output("--out", out_path, {"rule file (--check)": check_path})
    progress = Progress("verify", enabled=None if not as_json else False)
    try:
        if check_path:
            report = check_file(check_path, timeout_ms, jobs, progress)
        else:
            report = regenerate(max_ops, out_path, timeout_ms, jobs, progress)
    finally:
        progress.close()
    if as_json:
        click.echo(json.dumps(report.to_json(), sort_keys=True))
    else:
        click.echo(report.summary())
    if check_path and report.rejected:
        sys.exit(1)



def _share_cores_as_ranks(devices_per_node: int) -> None:
    """Give this process the BLAS threads one rank of ``unity run`` gets, before numpy starts
    them: under a launcher as its ranks share the node, alone as one of the node's devices
    (so a CPU device is timed with the cores it will have). The environment is where BLAS
    reads its thread count when it loads: this sets this process's own, once, at start."""
    from .runtime.threads import share_cores

    env = dict(os.environ)
    if share_cores(env) is None and not any(k.endswith("_NUM_THREADS") for k in env):
        env["MPI_LOCALNRANKS"] = str(devices_per_node)
        share_cores(env)
    os.environ.update({k: v for k, v in env.items() if k.endswith("_NUM_THREADS")})


@cli.command("profile")
@click.option("--cluster", "cluster_path", type=click.Path(dir_okay=False),
              help="Cluster spec (a YAML file or a bundled name, see unity clusters) whose device type this machine's "
                   "devices stand for (default: this machine).")
@click.option("--model", "models", multiple=True, type=click.Path(dir_okay=False),
              help="ONNX model whose plans' operator pieces to measure (repeatable).")
@click.option("--plan", "plans", multiple=True, type=click.Path(dir_okay=False),
              help="Also measure the pieces of a saved plan (repeatable).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Profile file (default: $UNITY_PROFILE_DIR/<cluster name>.json, ~/.cache/unity/profiles); "
                   "new measurements merge into it.")
@click.option("--batch-size", type=int, help="Leading dim of every (non-weight) graph input, as for optimize.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "float64"]), default="float32", show_default=True)
@click.option("--max-seconds", type=float, default=60.0, show_default=True,
              help="Time all operator measurements may take; pieces left keep their roofline estimate.")
@click.option("--device-type", help="The cluster's device type this machine has (default: the only one of its kind).")
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True,
              help="numpy on CPUs, or cupy timed with CUDA events (auto: cupy if it sees a GPU).")
@click.option("--replace", is_flag=True, help="Start the file afresh instead of merging into it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the summary.")
@handles_errors
def profile(cluster_path: str | None, models: tuple[str, ...], plans: tuple[str, ...], out_path: str | None,
            batch_size: int | None, dtype: str, max_seconds: float, device_type: str | None, backend: str,
            replace: bool, as_json: bool) -> None:
    """Measure operator pieces (and, under mpiexec -n 2+, links and collectives) for the cost model."""
    from .cluster import cluster_path as find_cluster
    from .cluster import load_cluster, local_cluster

    spec = find_cluster(cluster_path) if cluster_path else None   # a path or a bundled name
    cluster = load_cluster(cluster_path) if spec else local_cluster()   # (SPEC:N sizes a spec)
    _share_cores_as_ranks(max(n.devices for n in cluster.nodes))
    from .runtime.memory import keep_freed_memory

    keep_freed_memory()  # time pieces with the allocator unity run has
    from .cost.profile import default_profile_path, load_profile
    from .errors import ProfileError
    from .ir import DType
    from .profiling.profiler import TimingPolicy, run_profile
    from .report.progress import Progress

    check_number("--batch-size", batch_size, 1, MAX_BATCH)
    check_number("--max-seconds", max_seconds, 0, low_open=True)
    out = Path(out_path) if out_path else default_profile_path(cluster.name)
    reads = {"cluster spec": spec} | {f"model {m}": m for m in models} | {f"plan {p}": p for p in plans}
    if out_path or out.parent.is_dir():
        check_output("--out", out, reads)
    old = None
    if out.exists() and not replace:
        try:
            old = load_profile(out)
        except ProfileError as e:
            raise ProfileError(f"{e} (pass --replace to overwrite it)") from None
    progress = Progress("profile", enabled=None if not as_json else False)
    try:
        result = run_profile(list(models), cluster, batch_size=batch_size, dtype=DType(dtype),
                             policy=TimingPolicy(max_seconds=max_seconds), plans=list(plans),
                             device_type=device_type, backend=backend, merge_into=old, progress=progress)
    finally:
        progress.close()
    if result.profile is None:  # not rank 0
        return
    result.profile.save(out)
    click.echo(json.dumps(result.to_json(str(out)), sort_keys=True) if as_json else result.summary(str(out)))


@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--operators", type=int, default=12, show_default=True, help="How many of the costliest operators.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the text.")
@handles_errors
def explain(plan_path: str, operators: int, as_json: bool) -> None:
    """Explain a saved plan: its prediction, baselines, rewrites and costliest operators."""
    from .plan.config import plan_config, plan_profile
    from .plan.plan import load_plan
    from .report.explain import data_parallel_rows
    from .report.operators import operator_rows
    from .report.summary import placement, summary, sync_summary

    check_number("--operators", operators, 0, MAX_COUNT)
    plan = load_plan(plan_path)
    baseline, why = data_parallel_rows(plan)
    _, profile_why = plan_profile(plan)
    if as_json:
        rows = operator_rows(plan.pcg, plan.views, plan.cluster, plan_config(plan))
        top = sorted(rows, key=lambda r: (-r.total_ms, r.name))[:operators]
        doc = {"strategy": plan.strategy, "predicted": plan.predicted, "baselines": plan.baselines,
               "rewrites": list(plan.rewrites), "sync": sync_summary(plan), "branches": placement(plan),
               "operators": [{"name": r.name, "kind": r.kind, "parallel_shape": r.degrees, "devices": r.devices,
                              "compute_ms": r.compute_ms, "comm_ms": r.comm_ms,
                              "data_parallel_ms": baseline[r.name].total_ms if baseline and r.name in baseline
                              else None} for r in top]}
        click.echo(json.dumps(doc, sort_keys=True))
        return
    click.echo(summary(plan, None, [w for w in (profile_why, why) if w], baseline, operators))


@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_path", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="The HTML file to write (self-contained: open it in any browser, offline).")
@click.option("--measured", "measured_path", type=click.Path(dir_okay=False),
              help="The output of 'unity run --json' for this plan, shown beside the prediction.")
@handles_errors
def report(plan_path: str, out_path: str, measured_path: str | None) -> None:
    """Write an HTML view of PLAN: the graph, a predicted step per device, memory, strategies."""
    from .plan.plan import load_plan
    from .report.html import load_measured, write_report

    check_output("--out", out_path, {"plan": plan_path, "measured run": measured_path})
    plan = load_plan(plan_path)
    measured = load_measured(measured_path, plan) if measured_path else None
    size = write_report(plan, out_path, measured)
    click.echo(f"wrote {out_path} ({size / 1024:.0f} KiB)")


@cli.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--steps", type=int, default=10, show_default=True, help="Training steps.")
@click.option("--data", "data_path", type=click.Path(dir_okay=False),
              help=".npz with one array per graph input (by name) and 'labels' (default: synthetic, seeded).")
@click.option("--loss", type=click.Choice(["auto", "mse", "cross_entropy"]), default="auto", show_default=True,
              help="auto: cross entropy for integer labels or logits-like outputs, else mse.")
@click.option("--optimizer", type=click.Choice(["sgd", "momentum", "adam"]),
              help="Default: the optimizer the plan was made for.")
@click.option("--lr", type=float, help="Learning rate (default: 0.01 for sgd and momentum, 0.001 for adam).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic data (and of "
              "weights the model has no data for).")
@click.option("--model", "model_path", type=click.Path(dir_okay=False),
              help="The ONNX model (default: the path the plan names, relative to this directory).")
@click.option("--check", is_flag=True, help="Also train the original model on one process and fail if any "
              "step's loss or weight differs beyond tolerance.")
@click.option("--save", "save_path", type=click.Path(dir_okay=False),
              help="Write the model with the trained weights (rank 0).")
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True,
              help="Arrays and collectives: numpy + MPI, or cupy + NCCL on GPUs (auto: cupy if it sees a GPU).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (rank 0) instead of the summary.")
@click.option("--verbose", is_flag=True, help="Print each rank's pid and host at start (stderr, rank 0): if a "
              "rank is killed, mpiexec names it only by its pid.")
@handles_errors
def run(plan_path: str, steps: int, data_path: str | None, loss: str, optimizer: str | None, lr: float | None,
        seed: int, model_path: str | None, check: bool, save_path: str | None, backend: str, as_json: bool,
        verbose: bool) -> None:
    """Train with PLAN on the ranks of an MPI job: mpiexec -n P unity run plan.json."""
    from .runtime.memory import keep_freed_memory
    from .runtime.threads import share_cores

    check_number("--steps", steps, 1, MAX_COUNT)
    check_number("--lr", lr, 0)    # 0 is allowed: a step that changes nothing replays a batch
    check_number("--seed", seed, 0, 2**63 - 1)
    share_cores()  # before numpy starts its BLAS threads
    keep_freed_memory()
    from .errors import RunError
    from .runtime.train import RunOptions, run_plan

    debug = click.get_current_context().find_root().params.get("debug", False) or \
        click.get_current_context().params.get("debug", False)
    from .report.summary import run_prediction

    outcome = run_plan(RunOptions(plan_path, steps, data_path, loss, optimizer, lr, seed, model_path, check,
                                  save_path, backend, bool(debug), verbose, run_prediction))
    if outcome.report is not None:
        click.echo(json.dumps(outcome.report.to_json(), sort_keys=True) if as_json else outcome.report.summary())
    if outcome.error:
        if outcome.root:
            raise RunError(outcome.error)
        sys.exit(1)


if __name__ == "__main__":
    main()
