"""How right is the cost model? Plan small models for 2 CPU ranks, train each plan for a few
steps with MPI, and compare the measured step time with the predicted one.

    python benchmarks/accuracy.py [--steps 10] [--budget 5] [--strategies "data_parallel;tensor_parallel;best"]
                                  [--models all|NAME,...] [--out benchmarks/results]

Models: the seven zoo models at small scale (``unity zoo NAME --scale small``, batch 8), the
shared exports in ``tests/models/tiny`` (TorchScript ones at batch 4; dynamo ones keep the
batch they were exported with), and the zoo's decoder LLMs at small scale (batch 4), which
are also planned at the step shapes a team training them writes (:data:`LLM_SHAPES`: ZeRO-3
with recomputation and micro-batches, tensor parallelism with selective recomputation).
First ``mpiexec -n 2 unity profile`` measures their operator pieces and the link on
cluster_specs/local-cpu.yaml, then for each model and strategy ``unity optimize --profile``
plans, ``mpiexec -n 2 unity profile --plan`` times that plan's pieces inside training steps,
``unity optimize`` plans again with that profile and ``mpiexec -n 2 unity run --steps N
--json`` trains, reporting the median step time after a
warm-up step. Writes a Markdown table
(stdout and ``<out>/accuracy.md``) and a CSV (``<out>/accuracy.csv``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from unity_cli import zoo  # noqa: E402
from unity_cli.runtime.phases import PHASES  # noqa: E402

BIN = Path(sys.executable).parent
UNITY, MPIEXEC = str(BIN / "unity"), str(BIN / "mpiexec")
CLUSTER = REPO / "cluster_specs" / "local-cpu.yaml"
SHARED = REPO / "tests" / "models" / "tiny"   # the vendored exports (bert_tiny, convnet_tiny, both exporters)
ZOO_BATCH, SHARED_BATCH, LLM_BATCH = 8, 4, 4
STRATEGIES = "data_parallel;tensor_parallel;best"
LLM_SHAPES = ("tp=1,dp=2,zero=3,mb=2,recompute=full", "tp=2,dp=1,mb=2,recompute=selective")
"""Hand-written step shapes each decoder is also planned at (``--strategy``, 2 ranks): FSDP with
recomputation, and tensor parallelism with selective recomputation."""


@dataclass(frozen=True, slots=True)
class Result:
    model: str
    asked: str                 # the --strategy given
    strategy: str = ""         # the plan's strategy (best names the one it chose)
    predicted_ms: float = 0.0
    measured_ms: float = 0.0
    error: str = ""
    phases: dict = field(default_factory=dict)   # unity run's phases_ms: {"measured": {...}, "predicted": {...}}

    @property
    def ratio(self) -> float:
        return self.measured_ms / self.predicted_ms


def _run(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def _first_error(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith("error")), lines[-1] if lines else f"exit {p.returncode}")


def models(tmp: Path, which: list[str] | None) -> list[tuple[str, Path, int | None]]:
    """(label, file, batch or None to keep the file's) for the zoo at small scale and the shared exports."""
    out: list[tuple[str, Path, int | None]] = []
    for name in zoo.PAPER_MODELS:
        path = tmp / f"{name}.onnx"
        zoo.write(name, path, "small")
        out.append((f"zoo/{name}", path, ZOO_BATCH))
    shared = sorted(SHARED.glob("*.onnx"))
    if not shared:     # the folder moved once and the rows vanished without a word
        raise SystemExit(f"accuracy: no ONNX models in {SHARED}")
    for p in shared:
        out.append((f"shared/{p.stem}", p, None if "_dynamo" in p.name else SHARED_BATCH))
    for name in zoo.LLMS:
        path = tmp / f"{name}.onnx"
        zoo.write(name, path, "small")
        out.append((f"zoo/{name}", path, LLM_BATCH))
    return [m for m in out if which is None or m[0].split("/")[1] in which]


def ordering(results: list[Result]) -> str:
    """Does the plan predicted fastest also run fastest? Counted over models with 2+ distinct plans."""
    agree, total = 0, 0
    for model in dict.fromkeys(r.model for r in results):
        mine = [r for r in results if r.model == model]
        if len({r.predicted_ms for r in mine}) < 2:
            continue
        total += 1
        agree += min(mine, key=lambda r: r.predicted_ms).measured_ms == min(r.measured_ms for r in mine)
    return f"the plan predicted fastest also ran fastest for {agree} of {total} models"


def _phase(r: Result, kind: str, phase: str) -> str:
    v = r.phases.get(kind, {}).get(phase)
    return "" if v is None else f"{v:.4f}"


def phase_lines(results: list[Result]) -> list[str]:
    """Where the prediction misses: per phase, ms summed over all runs, measured and predicted."""
    runs = [r for r in results if r.phases.get("measured")]
    if not runs:
        return []
    lines = [f"Per phase, summed over the {len(runs)} runs (unity run's `phases_ms`; busy time, so the predicted "
             "phases add up to more than the predicted steps where they overlap):", "",
             "| phase | measured (ms) | predicted (ms) | measured / predicted |", "|---|---:|---:|---:|"]
    for p in PHASES:
        m = sum(r.phases["measured"].get(p, 0.0) for r in runs)
        has = any(p in r.phases.get("predicted", {}) for r in runs)
        q = sum(r.phases.get("predicted", {}).get(p, 0.0) for r in runs)
        ratio = f"{m / q:.2f}" if has and q > 0 else "-"
        lines.append(f"| {p} | {m:.3f} | {f'{q:.3f}' if has else 'not modeled'} | {ratio} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--budget", type=float, default=5.0, help="search seconds for best")
    ap.add_argument("--strategies", default=STRATEGIES,
                    help="';'-separated --strategy values for every model (a configuration holds commas); "
                         f"the decoders are also planned at {'; '.join(LLM_SHAPES)}")
    ap.add_argument("--models", default="all", help="all, or comma-separated names (zoo names, shared file stems)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    started = time.monotonic()
    # ';' between configurations, which hold commas; a list of plain names may use ','
    sep = ";" if ";" in args.strategies or "=" in args.strategies else ","
    asked = [x.strip() for x in args.strategies.split(sep) if x.strip()]
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**os.environ, "UNITY_PROFILE_DIR": str(tmp)}
        corpus = models(tmp, None if args.models == "all" else args.models.split(","))
        profile = tmp / "profile.json"
        for batch in sorted({b for _, _, b in corpus}, key=lambda b: b or 0):
            group = [str(p) for _, p, b in corpus if b == batch]
            cmd = [MPIEXEC, "-n", "2", UNITY, "profile", "--cluster", str(CLUSTER), "--out", str(profile)]
            cmd += [x for p in group for x in ("--model", p)] + (["--batch-size", str(batch)] if batch else [])
            p = _run(cmd, env)
            if p.returncode:
                sys.exit(f"unity profile failed: {_first_error(p)}")
        print(f"profiled {len(corpus)} models on {CLUSTER.name} in {time.monotonic() - started:.0f} s", flush=True)
        for label, path, batch in corpus:
            shapes = LLM_SHAPES if label.split("/")[1] in zoo.LLMS else ()
            for strategy in [*asked, *shapes]:
                plan = tmp / "plan.json"
                cmd = [UNITY, "optimize", str(path), "--cluster", str(CLUSTER), "--profile", str(profile),
                       "--strategy", strategy, "--budget", str(args.budget), "--out", str(plan), "--json"]
                cmd += ["--batch-size", str(batch)] if batch else []
                p = _run(cmd, env)
                if p.returncode:
                    results.append(Result(label, strategy, error=f"optimize: {_first_error(p)}"))
                    continue
                # Time the plan's own pieces inside training steps, then plan again with that.
                p = _run([MPIEXEC, "-n", "2", UNITY, "profile", "--cluster", str(CLUSTER), "--out", str(profile),
                          "--plan", str(plan)], env)
                if p.returncode == 0:
                    p = _run(cmd, env)
                if p.returncode:
                    results.append(Result(label, strategy, error=f"profile --plan: {_first_error(p)}"))
                    continue
                p = _run([MPIEXEC, "-n", "2", UNITY, "run", str(plan), "--steps", str(args.steps), "--json"], env)
                if p.returncode:
                    results.append(Result(label, strategy, error=f"run: {_first_error(p)}"))
                    continue
                doc = json.loads(p.stdout.strip().splitlines()[-1])
                results.append(Result(label, strategy, doc["strategy"], doc["predicted_step_time_ms"],
                                      doc["measured_step_time_ms"], phases=doc.get("phases_ms", {})))
                r = results[-1]
                print(f"{label:32s} {strategy:36s} {r.strategy:24s} predicted {r.predicted_ms:8.3f} ms  "
                      f"measured {r.measured_ms:8.3f} ms  ratio {r.ratio:5.2f}", flush=True)
    total = time.monotonic() - started
    ok = [r for r in results if not r.error]
    errors = sorted(abs(r.ratio - 1) for r in ok)
    lines = [f"2 CPU ranks (cluster_specs/local-cpu.yaml, profiled); {args.steps} steps, median after a warm-up "
             "step; float32, adam", "",
             "| model | strategy | plan | predicted (ms) | measured (ms) | measured / predicted |",
             "|---|---|---|---:|---:|---:|"]
    for r in results:
        if r.error:
            lines.append(f"| {r.model} | {r.asked} | failed: {r.error} | | | |")
        else:
            lines.append(f"| {r.model} | {r.asked} | {r.strategy} | {r.predicted_ms:.3f} | {r.measured_ms:.3f} "
                         f"| {r.ratio:.2f} |")
    if ok:
        lines += ["", f"{len(ok)} runs; median absolute error |measured / predicted - 1| = "
                      f"{statistics.median(errors):.0%}; median ratio {statistics.median(r.ratio for r in ok):.2f}; "
                      f"{len(results) - len(ok)} failed; total {total / 60:.1f} min", "",
                  ordering(ok), "", *phase_lines(ok)]
    table = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accuracy.md").write_text(table)
    with open(out / "accuracy.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", "strategy", "plan_strategy", "predicted_ms", "measured_ms", "ratio", "error",
                    *(f"{kind}_{p}_ms" for p in PHASES for kind in ("measured", "predicted"))])
        for r in results:
            w.writerow([r.model, r.asked, r.strategy, f"{r.predicted_ms:.4f}", f"{r.measured_ms:.4f}",
                        "" if r.error else f"{r.ratio:.4f}", r.error,
                        *(_phase(r, kind, p) for p in PHASES for kind in ("measured", "predicted"))])
    print("\n" + table + f"\nwrote {out / 'accuracy.md'} and {out / 'accuracy.csv'}")


if __name__ == "__main__":
    main()
