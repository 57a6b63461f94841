"""What each algebraic rule family buys, measured: `unity run` on 2 CPU ranks, data parallel,
of a model as it is and of the same model rewritten by the family (side by side, rounds
alternating), beside the gain the cost model predicts for the rewrite: with the cluster
spec's roofline (what `unity optimize` uses by default), and with a profile of this machine
(`mpiexec -n 2 unity profile --plan`, the plans' pieces timed inside training steps).

The measured gain is the median over the rounds of each round's gain (the two plans run
side by side in it), with the quartiles of those gains beside it: a machine whose load
moves shows there. A rewrite whose predicted gain the measurement does not show is a
cost-model error; the last two columns say whether each prediction (the spec's, the
profiled) and the measurement agree: both a gain, both a loss, or both within 5 % of even,
or the prediction inside the measured quartiles (the measurement cannot tell it apart).

    python benchmarks/rewrites.py [--rounds 5] [--steps 10] [--width 256] [--batch 256]
                                  [--only RULE ...] [--out benchmarks/results/rewrites.md]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from models.families import (  # noqa: E402
    bags,
    channels_last,
    embeddings,
    family_plans,
    ffn,
    linears,
    qkv,
    torch_mlp,
    towers,
)

from unity_cli.cost.model import CostConfig, Optimizer, estimate  # noqa: E402
from unity_cli.cost.profile import load_profile  # noqa: E402
from unity_cli.plan.plan import load_plan  # noqa: E402

BIN = Path(sys.executable).parent
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
CASES = [(qkv, "sibling-matmul-3"), (linears, "sibling-gemm-2"), (linears, "concat-gemm-2"),
         (linears, "gemm-trans-b-as-matmul-add"), (bags, "concat-linear-3"), (torch_mlp, "gemm-trans-b-relu-fused"),
         (towers, "sibling-conv1x1-2"), (ffn, "matmul-add-relu-fused-batched"), (embeddings, "embedding-merge-3"),
         (channels_last, "transpose-cancel-around-relu-120+transpose-cancel-around-relu-120")]
NOISE = 0.05


def measured_ms(plan: Path, steps: int) -> float:
    r = subprocess.run([str(BIN / "mpiexec"), "-n", "2", str(BIN / "unity"), "run", str(plan), "--steps", str(steps),
                        "--optimizer", "sgd", "--json"], env={**os.environ, **THREADS},
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"unity run {plan.name} failed: {r.stderr.strip()[-400:]}")
    return float(json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("{")))["measured_step_time_ms"])


def predicted_ms(plan: Path, config: CostConfig) -> float:
    p = load_plan(plan)
    return estimate(p.pcg, p.views, p.cluster, config).step_time * 1e3


def measured_gain(as_is: list[float], rewritten: list[float]) -> tuple[float, float, float]:
    """The median and quartiles of the rounds' gains, each as is / rewritten in one round."""
    q1, median, q3 = statistics.quantiles([a / b for a, b in zip(as_is, rewritten, strict=True)], n=4,
                                          method="inclusive")
    return median, q1, q3


def agrees(predicted: float, measured: tuple[float, float, float]) -> bool:
    median, q1, q3 = measured
    return verdict(predicted) == verdict(median) or q1 <= predicted <= q3


def verdict(gain: float) -> str:
    return "gain" if gain > 1 + NOISE else "loss" if gain < 1 - NOISE else "even"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--only", nargs="+", metavar="RULE", help="measure only these family instances")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "rewrites.md"))
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c[1] in args.only]
    if not cases:
        ap.error(f"--only {' '.join(args.only)}: no such family instance here (the rows: "
                 f"{', '.join(rule for _, rule in CASES)})")
    spec = REPO / "cluster_specs" / "local-cpu.yaml"
    sgd = CostConfig(optimizer=Optimizer.SGD)   # as the runs train
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pairs = [(make, rule, *family_plans(Path(tmp), make, rule, spec, 2, args.batch, args.width, sgd))
                 for make, rule in cases]
        plans = list(dict.fromkeys(p for _, _, a, b in pairs for p in (a, b)))
        times: dict[Path, list[float]] = {p: [] for p in plans}
        load = os.getloadavg()[0]
        for _ in range(args.rounds):
            for p in plans:
                times[p].append(measured_ms(p, args.steps))
        load = max(load, os.getloadavg()[0])
        profile = Path(tmp) / "profile.json"
        cmd = [str(BIN / "mpiexec"), "-n", "2", str(BIN / "unity"), "profile", "--cluster", str(spec), "--out",
               str(profile)] + [x for p in plans for x in ("--plan", str(p))]
        r = subprocess.run(cmd, env={**os.environ, **THREADS}, capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise RuntimeError(f"unity profile failed: {r.stderr.strip()[-400:]}")
        profiled = CostConfig(optimizer=Optimizer.SGD, profile=load_profile(profile))
        for make, rule, a, b in pairs:
            ma, mb = (statistics.median(times[p]) for p in (a, b))
            sa, sb = (predicted_ms(p, sgd) for p in (a, b))
            pa, pb = (predicted_ms(p, profiled) for p in (a, b))
            meas, by_spec, pred = measured_gain(times[a], times[b]), sa / sb, pa / pb
            agree = ("yes" if agrees(p, meas) else "no" for p in (by_spec, pred))
            rows.append(f"| {rule} | {make.__name__} | {ma:.2f} | {mb:.2f} | {meas[0]:.3f}x "
                        f"({meas[1]:.2f}-{meas[2]:.2f}) | {by_spec:.3f}x | {pa:.2f} | {pb:.2f} | {pred:.3f}x "
                        f"| {' | '.join(agree)} |")
    lines = [f"2 CPU ranks x 1 thread, data parallel, sgd; width {args.width}, batch {args.batch}; medians of "
             f"{args.rounds} alternating rounds of {args.steps} steps; load average up to {load:.1f} on "
             f"{os.cpu_count()} cores. Gain: time as is / time rewritten; measured: the median of the "
             f"rounds' gains (their quartiles).", "",
             "| family instance | model | measured as is (ms) | rewritten (ms) | measured gain "
             "| predicted gain (spec) | profiled as is (ms) | rewritten (ms) | predicted gain (profiled) "
             "| agree (spec) | agree (profiled) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|", *rows]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
