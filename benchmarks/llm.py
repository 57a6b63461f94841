"""Decoder LLMs at the sizes people train them: unity's plan beside the configurations
practitioners write, each priced by the same cost model in one run.

    python benchmarks/llm.py [--points 7b-8,7b-64,...] [--max-candidates N]
                             [--out benchmarks/results/llm.md]

Each point is a zoo model at paper scale (``unity zoo``: weights shape-only), sequence 2048,
``--dtype bfloat16``, Adam, on DGX A100-80GB nodes (``--cluster dgx-a100-80:N``), at a global
batch of sequences per optimizer step. Beside unity's plan (``--strategy best``) it prices,
with ``--strategy``:

* Megatron-style tensor parallelism inside each node and data parallelism across nodes
  (``tp=8,dp=N/8``), the same with a distributed optimizer (``...,zero=1``, Megatron-LM's
  ``--use-distributed-optimizer``), and with it full activation recomputation
  (``...,recompute=full``, as NeMo trains Llama-2-70B);
* each with one sequence per data-parallel replica per micro-batch (``mb = batch / (N/8)``),
  as practitioners run it;
* sharded data parallelism alone: every GPU a replica, weights, gradients and optimizer
  state sharded, full recomputation (``tp=1,dp=N,zero=3,...,recompute=full``: PyTorch FSDP's
  ``FULL_SHARD`` with activation checkpointing), one sequence per GPU per micro-batch.

Every row is priced with the memory-efficient attention where the model holds the chain
(``--strategy`` prices a configuration as people train it, with FlashAttention).

On one node ``tp=8,dp=1`` is pure tensor parallelism; across nodes pure tensor parallelism
(``tp=N``) has more ways than the models have heads, so it is not a row.

unity's search (``--strategy best``) chooses everything: the parallelization, the ZeRO stage,
the micro-batches and recomputation (``search/step.py``: the best uniform configuration,
then one search from it). Every configuration is priced
at its best placement (tensor-parallel groups inside nodes, or across them). Columns: the
step time, the memory of the busiest device, and MFU = 6 x parameters x tokens per step /
(step time x GPUs x the GPU's bfloat16 peak). Step times and memory are predictions.
What does not fit in 80 GiB is said so, with the memory it needs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from unity_cli import zoo  # noqa: E402
from unity_cli.cluster import load_cluster  # noqa: E402
from unity_cli.ir.training import weight_names  # noqa: E402
from unity_cli.plan.plan import load_plan  # noqa: E402

SEQ = 2048


@dataclass(frozen=True, slots=True)
class Point:
    key: str
    model: str
    gpus: int
    batch: int              # sequences per optimizer step


POINTS = {p.key: p for p in (
    Point("7b-8", "llama2-7b", 8, 256),
    Point("7b-64", "llama2-7b", 64, 1024),
    Point("70b-64", "llama2-70b", 64, 1024),
    Point("70b-512", "llama2-70b", 512, 1024),
    Point("175b-512", "gpt3-175b", 512, 1536),
)}


@dataclass(frozen=True, slots=True)
class Row:
    point: str
    model: str
    gpus: int
    batch: int
    config: str             # unity's plan, or the --strategy string
    step_s: float | None
    memory_bytes: int | None
    fits: bool
    mfu: float | None
    seconds: float
    note: str = ""


def _stages(path: Path) -> str:
    """The plan's ZeRO stages: ``ZeRO-2``, or where weights differ ``ZeRO-0/2/3 (161/242/320
    weights)``; '' without ZeRO."""
    plan = load_plan(path)
    count = Counter(plan.training.stages(plan.pcg)[i] for i in weight_names(plan.pcg))
    if len(count) == 1:
        (z,) = count
        return f"ZeRO-{z}" if z else ""
    order = sorted(count)
    return f"ZeRO-{'/'.join(map(str, order))} ({'/'.join(str(count[z]) for z in order)} weights)"


def price(model: Path, p: Point, strategy: str, max_candidates: int | None) -> Row:
    """One ``unity optimize`` of ``p`` with ``strategy``."""
    cluster = f"dgx-a100-80:{p.gpus}"
    with tempfile.TemporaryDirectory() as tmp:
        args = ["optimize", str(model), "--cluster", cluster, "--batch-size", str(p.batch), "--dtype", "bfloat16",
                "--out", str(Path(tmp) / "plan.json"), "--json", "--strategy", strategy]
        if max_candidates:
            args += ["--max-candidates", str(max_candidates)]
        t0 = time.monotonic()      # one process per pricing, as a user runs it (and no run warms the next)
        r = subprocess.run([sys.executable, "-m", "unity_cli.cli", *args], capture_output=True, text=True,
                           cwd=REPO)
        seconds = time.monotonic() - t0
        stages = _stages(Path(tmp) / "plan.json") if r.returncode == 0 else ""
    name = "unity" if strategy == "best" else strategy
    if r.returncode != 0:
        said = (r.stdout + r.stderr).strip()
        return Row(p.key, p.model, p.gpus, p.batch, name, None, None, False, None, seconds,
                   said.splitlines()[-1] if said else "failed")
    doc = json.loads(r.stdout)
    pred = doc["predicted"]
    step = pred["step_time_ms"] / 1e3
    c = load_cluster(cluster)
    peak = c.device_type(0).flops("bfloat16")
    params = zoo.paper_parameters(p.model)
    mfu = 6 * params * p.batch * SEQ / (step * p.gpus * peak)
    fits = bool(pred["feasible"])
    if strategy == "best":
        chosen = doc["strategy"]
        rows = doc["baselines"]
        extra = rows[chosen]
        shape = [f"mb={extra.get('micro_batches', 1)}"] + ([stages] if stages else [])
        shape += [f"{extra['recompute']} recompute"] if extra.get("recompute") else []
        name = f"unity ({', '.join([chosen, *shape])})"
    return Row(p.key, p.model, p.gpus, p.batch, name, step, max(pred["memory_bytes"]), fits, mfu, seconds,
               "" if fits else pred.get("infeasible", ""))


def run(p: Point, max_candidates: int | None) -> list[Row]:
    dp = max(1, p.gpus // 8)
    micro = p.batch // dp
    hand = [f"tp=8,dp={dp},mb={micro}", f"tp=8,dp={dp},zero=1,mb={micro}",
            f"tp=8,dp={dp},zero=1,mb={micro},recompute=full",
            f"tp=1,dp={p.gpus},zero=3,mb={p.batch // p.gpus},recompute=full"]
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / f"{p.model}.onnx"
        zoo.write(p.model, model, "paper", weights=False)
        rows = [price(model, p, s, max_candidates) for s in hand]
        rows.append(price(model, p, "best", max_candidates))
    return rows


def gib(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**30:.1f}"


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "",
             "| model | GPUs | batch | configuration | step (s) | memory/GPU (GiB) | fits 80 GiB | MFU | search (s) |",
             "|---|---:|---:|---|---:|---:|---|---:|---:|"]
    for r in rows:
        step = "—" if r.step_s is None else f"{r.step_s:.2f}"
        mfu = "—" if r.mfu is None or not r.fits else f"{100 * r.mfu:.1f} %"
        fits = "yes" if r.fits else ("no: " + r.note if r.note else "no")
        lines.append(f"| {r.model} | {r.gpus} | {r.batch} | {r.config} | {step} | {gib(r.memory_bytes)} | {fits} | "
                     f"{mfu} | {r.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, of {', '.join(POINTS)}")
    ap.add_argument("--max-candidates", type=int, help="the searches' work count (default: the optimizer's)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "llm.md"),
                    help="where the table goes (and its rows, as .json beside it); '' for stdout only")
    args = ap.parse_args()
    keys = [k.strip() for k in args.points.split(",") if k.strip()]
    bad = [k for k in keys if k not in POINTS]
    if bad:
        ap.error(f"--points: unknown {', '.join(bad)} (choose from {', '.join(POINTS)})")
    header = ("paper-scale zoo models, shape-only; sequence 2048, bfloat16, Adam; dgx-a100-80:N (8 A100-80GB per "
              "node, NVLink3 inside, 8 x 200 Gb/s InfiniBand across); predicted step times; MFU against 312 "
              f"TFLOP/s; unity chooses the micro-batches, ZeRO stage and recomputation too ("
              f"{args.max_candidates or 'default'} candidates)")
    load0 = os.getloadavg()
    started = time.monotonic()
    rows: list[Row] = []
    for k in keys:
        for r in run(POINTS[k], args.max_candidates):
            rows.append(r)
            print(f"  {r.model} on {r.gpus}: {r.config}: "
                  f"{'—' if r.step_s is None else f'{r.step_s:.2f} s'}, {gib(r.memory_bytes)} GiB, "
                  f"{'fits' if r.fits else 'does not fit'}, {r.seconds:.0f} s", flush=True)
    total = time.monotonic() - started
    load1 = os.getloadavg()
    table = markdown(rows, header)
    took = (f"took {total:.0f} s on {os.cpu_count()} cores; load average (1, 5, 15 min) {load0[0]:.2f}, "
            f"{load0[1]:.2f}, {load0[2]:.2f} at the start, {load1[0]:.2f}, {load1[1]:.2f}, {load1[2]:.2f} at the end; "
            f"{time.strftime('%Y-%m-%d')}")
    print("\n" + table + "\n" + took)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n" + took + "\n")
        out.with_suffix(".json").write_text(json.dumps({"header": header, "took": took,
                                                        "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
