"""Every uniform ``tp=T,dp=D`` hybrid beside unity's plan, priced by one cost model in one run.

    python benchmarks/hybrids.py [--models all|NAME,...] [--clusters summit-8,summit-48,summit-192,dgx-a100-32]
                                 [--budget S] [--max-candidates N] [--scale paper|small] [--optimizer adam]
                                 [--out benchmarks/results/hybrids.md]

For each of the paper's seven DNNs (``unity_cli.zoo``, weights shape-only, the per-device
batch of ``benchmarks/paper.py`` times the device count) and each cluster (the first 8, 48
or 192 V100s of summit-192, nodes of 6; dgx-a100-32, nodes of 8), it runs
``optimize(..., "best")`` with the default options. That run prices every factorization
``T*D`` of the device count (``D`` dividing the batch) as a Megatron-style hybrid, tensor
parallel inside groups of ``T`` consecutive devices and data parallel across them, and
``best`` is never slower than any of them. The table shows each hybrid's predicted step
time (ms; "OOM" when it does not fit in device memory: such hybrids are counted out by
their memory alone and not simulated), the fastest hybrid, unity's plan and its speedup
over that hybrid. Step times are predictions, not measurements.

The search stops by the optimizer's default work count; ``--max-candidates`` and
``--models``/``--clusters`` cut the run down, ``--budget`` sets a time ceiling per point.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.paper import PER_DEVICE_BATCH, SMALL_BATCH, _work  # noqa: E402
from unity_cli import zoo  # noqa: E402
from unity_cli.cluster import load_cluster  # noqa: E402
from unity_cli.cost.model import CostConfig, Optimizer  # noqa: E402
from unity_cli.errors import InfeasibleError  # noqa: E402
from unity_cli.onnx_import import ImportOptions, import_model  # noqa: E402
from unity_cli.search.baselines import hybrid_degrees  # noqa: E402
from unity_cli.search.optimize import HYBRID, optimize  # noqa: E402
from unity_cli.substitutions.cache import load_cache  # noqa: E402

CLUSTERS = ("summit-8", "summit-48", "summit-192", "dgx-a100-32")


@dataclass(frozen=True, slots=True)
class Point:
    model: str
    cluster: str
    devices: int
    batch: int
    hybrids: dict[int, tuple[float, bool]]   # tp -> (predicted step time s, fits); nan: counted out by memory
    best_hybrid: str                          # e.g. "tp=2,dp=24"
    best_hybrid_s: float
    unity_s: float
    chosen: str                               # which row best kept
    seconds: float
    error: str = ""


def load(name: str):
    """A cluster by this script's name for it: summit-N is the first N devices of summit-192."""
    if name.startswith("summit-"):
        return load_cluster(REPO / "cluster_specs" / "summit-192.yaml").first(int(name.split("-")[1]))
    return load_cluster(REPO / "cluster_specs" / f"{name}.yaml")


def run_point(path: Path, model: str, cluster_name: str, per_device: int, config: CostConfig, rules,
              budget: float | None, max_candidates: int | None) -> Point:
    cluster = load(cluster_name)
    n = cluster.num_devices
    batch = per_device * n
    pcg = import_model(path, ImportOptions(batch)).pcg
    t0 = time.monotonic()
    try:
        res = optimize(pcg, cluster, config, "best", rules, budget=budget, max_candidates=max_candidates)
    except InfeasibleError as e:
        return Point(model, cluster_name, n, batch, {}, "", math.nan, math.nan, "", time.monotonic() - t0, str(e))
    seconds = time.monotonic() - t0
    # Factorizations the run did not simulate were counted out by memory alone (best_hybrid).
    hybrids = {tp: (math.nan, False) for tp, _ in hybrid_degrees(n, batch)}
    hybrids.update({_tp(c.baseline.name): (c.report.step_time, c.report.feasible) for c in res.hybrids})
    row = res.candidates[HYBRID]
    won = row.baseline.description.split(":", 1)[0]
    return Point(model, cluster_name, n, batch, hybrids, won, row.report.step_time, res.chosen.report.step_time,
                 res.chosen.baseline.name, seconds)


def _tp(name: str) -> int:
    """T of a hybrid named ``tp=T,dp=D``."""
    return int(name.split(",")[0].removeprefix("tp="))


def _cell(v: tuple[float, bool] | None) -> str:
    if v is None:
        return ""
    t, fits = v
    return _ms(t) if fits else "OOM" if math.isnan(t) else f"OOM ({_ms(t)})"


def _ms(t: float) -> str:
    ms = t * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.3f}"


def markdown(points: list[Point], header: str) -> str:
    tps = sorted({tp for p in points for tp in p.hybrids})
    cols = " | ".join(f"tp={tp}" for tp in tps)
    lines = [header, "",
             f"| model | cluster | GPUs | batch | {cols} | best hybrid | best hybrid (ms) | unity (ms) | "
             "chosen | unity over best hybrid | s |",
             "|---|---|---:|---:|" + "---:|" * len(tps) + "---|---:|---:|---|---:|---:|"]
    for p in points:
        cells = " | ".join(_cell(p.hybrids.get(tp)) for tp in tps)
        if p.error:
            lines.append(f"| {p.model} | {p.cluster} | {p.devices} | {p.batch} | {cells} | none fits | — | — | — "
                         f"| — | {p.seconds:.0f} |")
            continue
        fits = p.hybrids and any(f for _, f in p.hybrids.values())
        speed = f"{p.best_hybrid_s / p.unity_s:.2f}x" if fits and p.unity_s > 0 else "—"
        lines.append(f"| {p.model} | {p.cluster} | {p.devices} | {p.batch} | {cells} | {p.best_hybrid} | "
                     f"{_ms(p.best_hybrid_s)} | {_ms(p.unity_s)} | {p.chosen} | {speed} | {p.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all", help="all, or a comma-separated list of zoo names")
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help=f"comma-separated, of {', '.join(CLUSTERS)}")
    ap.add_argument("--budget", type=float, help="a ceiling in seconds per point (default: none; the search "
                    "stops by its work count, as the optimizer does)")
    ap.add_argument("--max-candidates", type=int, help="a work budget for the search instead (machine-independent)")
    ap.add_argument("--scale", choices=zoo.SCALES, default="paper")
    ap.add_argument("--optimizer", choices=[o.value for o in Optimizer], default="adam")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "hybrids.md"),
                    help="where the table goes ('' for stdout only)")
    args = ap.parse_args()
    names = list(zoo.PAPER_MODELS) if args.models == "all" else [zoo.lookup(m).name for m in args.models.split(",")]
    clusters = [c.strip() for c in args.clusters.split(",")]
    bad = [c for c in clusters if c not in CLUSTERS]
    if bad:
        ap.error(f"--clusters: unknown {', '.join(bad)} (choose from {', '.join(CLUSTERS)})")
    config = CostConfig(optimizer=Optimizer(args.optimizer))
    rules = load_cache().rules
    work = _work(args)
    header = (f"{args.scale} scale; float32, {args.optimizer}; {work} per point; predicted step times in ms "
              "(weak scaling: batch = per-device batch x GPUs); tp=T means tp=T,dp=GPUs/T; summit-N = the "
              "first N V100s of summit-192 (6 per node); dgx-a100-32 = 4 nodes x 8 A100")
    load0 = os.getloadavg()
    print(header + "\n", flush=True)
    started = time.monotonic()
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = Path(tmp) / f"{name}.onnx"
            zoo.write(name, path, args.scale, weights=False)
            per = PER_DEVICE_BATCH[name] if args.scale == "paper" else SMALL_BATCH
            for c in clusters:
                p = run_point(path, name, c, per, config, rules, args.budget, args.max_candidates)
                points.append(p)
                print(f"  {name} on {c}: best hybrid {p.best_hybrid} {_ms(p.best_hybrid_s)} ms, "
                      f"unity {_ms(p.unity_s)} ms ({p.chosen}), {p.seconds:.0f} s", flush=True)
    total = time.monotonic() - started
    table = markdown(points, header)
    print("\n" + table)
    load1 = os.getloadavg()
    took = (f"took {total:.0f} s ({total / 60:.1f} min) on {os.cpu_count()} cores; load average (1, 5, 15 min) "
            f"{load0[0]:.2f}, {load0[1]:.2f}, {load0[2]:.2f} at the start, "
            f"{load1[0]:.2f}, {load1[1]:.2f}, {load1[2]:.2f} at the end")
    print(took)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table + "\n" + took + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
