"""The Unity paper's benchmark (OSDI'22, section 8): its seven DNNs x {8, 48, 192} GPUs of
Summit x the five strategies, each priced by our cost model in one search per point.

    python benchmarks/paper.py [--budget S] [--max-candidates N] [--devices 8,48,192] [--models all|NAME,...]
                               [--scale paper|small] [--optimizer adam] [--out benchmarks/results]
                               [--plot docs/paper_speedup.png]

For each model (built by ``unity_cli.zoo``, weights shape-only) and device count N (the
first N devices of summit-192: nodes of 6 V100s) it runs ``optimize(..., "best")``, which
returns data_parallel, tensor_parallel, parallel_only (FlexFlow-like),
algebraic_then_parallel (TASO then FlexFlow) and unity (the joint search), and reports
each one's predicted step time, the chosen plan's speedup over data parallelism and over
the best of the four others, the search's seconds and candidates. Scaling is weak: the
global batch is a per-device batch (below) times N, as in FlexFlow's Summit runs.

Writes a Markdown table (stdout and ``<out>/paper.md``), a CSV (``<out>/paper.csv``) and,
when matplotlib is installed (``pip install -e '.[bench]'``), a plot of the speedup over
data parallelism against the device count. Step times are predictions, not measurements.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from unity_cli import zoo  # noqa: E402
from unity_cli.cluster import load_cluster  # noqa: E402
from unity_cli.cost.model import CostConfig, Optimizer  # noqa: E402
from unity_cli.errors import InfeasibleError  # noqa: E402
from unity_cli.onnx_import import ImportOptions, import_model  # noqa: E402
from unity_cli.report.summary import rewrite_counts  # noqa: E402
from unity_cli.search.optimize import DEFAULT_CANDIDATES, optimize  # noqa: E402
from unity_cli.substitutions.cache import load_cache  # noqa: E402

STRATEGIES = ("data_parallel", "tensor_parallel", "parallel_only", "algebraic_then_parallel", "unity")
OTHERS = STRATEGIES[:-1]
SHORT = {"data_parallel": "DP", "tensor_parallel": "TP", "parallel_only": "par. only",
         "algebraic_then_parallel": "alg. then par.", "unity": "unity"}

# Samples per device (weak scaling). CNNs: the usual 32 per GPU of ImageNet recipes;
# BERT-large at sequence 512 fits a handful per 16 GB V100; DLRM and XDL: FlexFlow's
# 512 per GPU on Summit; CANDLE Uno and the MLP: FlexFlow's default batch of 64 per GPU.
PER_DEVICE_BATCH = {"resnext-50": 32, "bert-large": 4, "dlrm": 512, "candle-uno": 64, "inception-v3": 32,
                    "mlp": 64, "xdl": 512}
SMALL_BATCH = 8


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    devices: int
    batch: int
    times: dict[str, float]          # strategy -> predicted step time (s)
    feasible: dict[str, bool]        # strategy -> fits in device memory
    chosen: str
    search_s: float
    candidates: int
    error: str = ""
    rewrites: str = "—"              # the chosen plan's algebraic rewrites, by rule

    @property
    def chosen_time(self) -> float:
        return self.times.get(self.chosen, math.nan)

    @property
    def over_dp(self) -> float:
        """Speedup of the chosen plan over data parallelism (nan when DP does not fit)."""
        if self.error or not self.feasible["data_parallel"]:
            return math.nan
        return self.times["data_parallel"] / self.chosen_time

    @property
    def unity_over_best_other(self) -> float:
        """The joint search's plan against the fastest of the four other strategies that fits
        (below 1 where another search found the better plan; nan if none fits)."""
        fits = [self.times[s] for s in OTHERS if self.feasible.get(s)]
        if not fits or self.error or not self.feasible["unity"]:
            return math.nan
        return min(fits) / self.times["unity"]


def _work(args) -> str:
    """How the search was bounded, for the table's header."""
    if args.max_candidates:
        return f"max {args.max_candidates} candidates"
    cap = f", a ceiling of {args.budget:g} s" if args.budget else ""
    return f"the default work ({DEFAULT_CANDIDATES} candidates{cap})"


def run_point(path: Path, model: str, n: int, batch: int, cluster, config: CostConfig, rules,
              budget: float | None, max_candidates: int | None = None) -> Row:
    pcg = import_model(path, ImportOptions(batch)).pcg
    t0 = time.monotonic()
    try:
        res = optimize(pcg, cluster, config, "best", rules, budget=budget, max_candidates=max_candidates)
    except InfeasibleError as e:
        return Row(model, n, batch, {}, {}, "", time.monotonic() - t0, 0, str(e))
    seconds = time.monotonic() - t0
    times = {k: c.report.step_time for k, c in res.candidates.items()}
    feasible = {k: c.report.feasible for k, c in res.candidates.items()}
    return Row(model, n, batch, times, feasible, res.chosen.baseline.name, seconds,
               res.stats.candidates if res.stats else 0,
               rewrites=rewrite_counts([a.rule_name for a in res.rewrites]))


def _ms(row: Row, s: str) -> str:
    if s not in row.times:
        return "—"
    return f"{row.times[s] * 1e3:.2f}" + ("" if row.feasible[s] else " (OOM)")


def _x(v: float, why: str = "—") -> str:
    return why if math.isnan(v) else f"{v:.2f}x"


def markdown(rows: list[Row], header: str) -> str:
    lines = [header, "",
             "| model | GPUs | batch | " + " | ".join(f"{SHORT[s]} (ms)" for s in STRATEGIES) +
             " | chosen | chosen over DP | unity over best other | search s | candidates | rewrites applied |",
             "|---|---:|---:|" + "---:|" * len(STRATEGIES) + "---|---:|---:|---:|---:|---|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.model} | {r.devices} | {r.batch} | " + " | ".join("—" for _ in STRATEGIES) +
                         f" | none fits | — | — | {r.search_s:.1f} | — | — |")
            continue
        lines.append(f"| {r.model} | {r.devices} | {r.batch} | " + " | ".join(_ms(r, s) for s in STRATEGIES) +
                     f" | {SHORT[r.chosen]} | {_x(r.over_dp, 'DP OOM')} | {_x(r.unity_over_best_other)} "
                     f"| {r.search_s:.1f} | {r.candidates} | {r.rewrites} |")
    return "\n".join(lines) + "\n"


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", "devices", "batch"] + [f"{s}_ms" for s in STRATEGIES] +
                   [f"{s}_fits" for s in STRATEGIES] +
                   ["chosen", "chosen_over_dp", "unity_over_best_other", "search_s", "candidates", "error"])
        for r in rows:
            w.writerow([r.model, r.devices, r.batch] +
                       [f"{r.times[s] * 1e3:.4f}" if s in r.times else "" for s in STRATEGIES] +
                       [int(r.feasible[s]) if s in r.feasible else "" for s in STRATEGIES] +
                       [r.chosen, "" if math.isnan(r.over_dp) else f"{r.over_dp:.4f}",
                        "" if math.isnan(r.unity_over_best_other) else f"{r.unity_over_best_other:.4f}",
                        f"{r.search_s:.2f}", r.candidates, r.error])


def plot(rows: list[Row], path: Path, title: str) -> str:
    """Speedup over DP against devices, one line per model; returns a note for the log."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install -e '.[bench]')"
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    devices = sorted({r.devices for r in rows})
    for model in dict.fromkeys(r.model for r in rows):
        pts = [(r.devices, r.over_dp) for r in rows if r.model == model and not math.isnan(r.over_dp)]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=model)
        else:
            ax.plot([], [], marker="x", linestyle="none", label=f"{model} (DP does not fit)")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(devices, [str(d) for d in devices])
    top = max([r.over_dp for r in rows if not math.isnan(r.over_dp)] + [2.0])
    ticks = [t for t in (1, 1.5, 2, 3, 5, 10, 20, 50, 100) if t <= top * 1.5]
    ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs (V100, summit-192)")
    ax.set_ylabel("predicted speedup over data parallelism")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, help="a ceiling in seconds per point (default: none; the search "
                    "stops by its work count, as the optimizer does)")
    ap.add_argument("--max-candidates", type=int, help="the search's work count (default: the optimizer's)")
    ap.add_argument("--devices", default="8,48,192")
    ap.add_argument("--models", default="all", help="all, or a comma-separated list of zoo names")
    ap.add_argument("--scale", choices=zoo.SCALES, default="paper")
    ap.add_argument("--optimizer", choices=[o.value for o in Optimizer], default="adam")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="folder for paper.md and paper.csv")
    ap.add_argument("--plot", default=str(REPO / "docs" / "paper_speedup.png"), help="'' to skip the plot")
    args = ap.parse_args()
    names = list(zoo.PAPER_MODELS) if args.models == "all" else [zoo.lookup(m).name for m in args.models.split(",")]
    devices = [int(x) for x in args.devices.split(",")]
    summit = load_cluster(REPO / "cluster_specs" / "summit-192.yaml")
    config = CostConfig(optimizer=Optimizer(args.optimizer))
    rules = load_cache().rules
    header = (f"{args.scale} scale; summit-192 (first N V100s); float32, {args.optimizer}; {_work(args)} "
              "per point; predicted step times (weak scaling: batch = per-device batch x GPUs)")
    print(header + "\n", flush=True)
    rows: list[Row] = []
    started = time.monotonic()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = Path(tmp) / f"{name}.onnx"
            zoo.write(name, path, args.scale, weights=False)
            per = PER_DEVICE_BATCH[name] if args.scale == "paper" else SMALL_BATCH
            for n in devices:
                row = run_point(path, name, n, per * n, summit.first(n), config, rules, args.budget,
                                args.max_candidates)
                rows.append(row)
                print(markdown([row], "").splitlines()[-1], flush=True)
    total = time.monotonic() - started
    table = markdown(rows, header)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load1 = os.getloadavg()
    load = (f"load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load0)} at the start, "
            f"{', '.join(f'{x:.2f}' for x in load1)} at the end, on {os.cpu_count()} cores")
    (out / "paper.md").write_text(table + f"\ntotal {total / 60:.1f} min on this machine; {load}\n")
    write_csv(rows, out / "paper.csv")
    print("\n" + table)
    if args.plot:
        print(plot(rows, Path(args.plot), f"The Unity paper's seven DNNs on Summit ({args.scale} scale, "
                                          f"{args.optimizer}, {_work(args)} per point)"))
    print(f"wrote {out / 'paper.md'} and {out / 'paper.csv'}; total {total / 60:.1f} min")


if __name__ == "__main__":
    main()
