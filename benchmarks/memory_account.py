"""How right is the planner's memory account? For plans of small models on CPU ranks and of
Llama-2-7B at paper scale, the bytes the planner counts on a device (``cost/memory.py``, what
decided that the plan fits) beside the bytes the rank holds at its peak, as ``unity run``
predicts them by walking the plan's step (``runtime/footprint.py``), which every training
test holds equal to the bytes measured, part by part. Nothing is trained here: the walk is the
measurement's exact stand-in. (Every ``unity run`` in the tests also holds the planner's
bytes between the measured and 1.25 times them: ``tests/runtime/mpirun.planned_memory_holds``.)

    python benchmarks/memory_account.py [--paper/--no-paper] [--out benchmarks/results/memory_account.md]

Small models: the zoo's MLP, BERT-large, Llama-2-7B and GPT-3 at small scale on 2 and 4 ranks
of cluster_specs/local-cpu.yaml (batch 8), at data and tensor parallelism, ZeRO-1 to 3,
micro-batches, full (all segments or the first 2) and selective recomputation.
Paper scale (``--paper``): Llama-2-7B (shapes only) on ``dgx-a100-80:8`` at batch 64 in
float32 (the runtime trains in float32; a bfloat16 plan's account is for GPUs), unity's plan,
rank 0 walked (its ranks are alike).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from unity_cli.cluster.units import format_bytes  # noqa: E402
from unity_cli.plan.plan import load_plan  # noqa: E402
from unity_cli.runtime.footprint import planned_memory  # noqa: E402
from unity_cli.runtime.loss import choose_loss  # noqa: E402
from unity_cli.runtime.program import build_program  # noqa: E402

UNITY = str(Path(sys.executable).parent / "unity")
CLUSTER = REPO / "cluster_specs" / "local-cpu.yaml"
MODELS = ("mlp", "bert-large", "llama2-7b", "gpt3-175b")
STRATEGIES = (("tp=1,dp=2", 2), ("tp=2,dp=1", 2), ("tp=1,dp=2,zero=1", 2), ("tp=1,dp=2,zero=2,mb=2", 2),
              ("tp=1,dp=2,zero=3,mb=2,recompute=full", 2), ("tp=2,dp=1,mb=2,recompute=selective", 2),
              ("tp=2,dp=1,zero=1,recompute=full:2", 2), ("tp=2,dp=2,zero=1,mb=2", 4),
              ("tp=2,dp=2,zero=3,recompute=selective", 4))


def sh(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")


def compare(plan_path: Path, ranks: list[int]) -> tuple[int, int, dict[str, int]]:
    """The planner's bytes on the rank of ``ranks`` where they are furthest from the walk's
    (relatively), the walk's there, and the walk's parts."""
    plan = load_plan(plan_path)
    out = plan.pcg.shape(plan.pcg.outputs[0]).sizes
    program = build_program(plan.pcg, plan.views, len(out) - 1)
    loss = choose_loss(plan.config.get("loss", "auto"), None, plan.pcg)
    walked = {r: planned_memory(program, r, plan.training, plan.config.get("optimizer", "adam"),
                                plan.sync_bucket_bytes, loss) for r in ranks}
    planned = {r: int(plan.predicted["memory_bytes"][r]) for r in ranks}
    r = max(ranks, key=lambda q: abs(planned[q] / walked[q][0] - 1))
    return planned[r], walked[r][0], walked[r][1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "memory_account.md")
    args = ap.parse_args()
    t0, load = time.perf_counter(), os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name in MODELS:
            model = d / f"{name}.onnx"
            sh(UNITY, "zoo", name, "--scale", "small", "--out", str(model))
            for strategy, ranks in STRATEGIES:
                plan, spec = d / "plan.json", d / f"cpu-{ranks}.yaml"
                spec.write_text(CLUSTER.read_text().replace("devices: 2", f"devices: {ranks}"))
                sh(UNITY, "optimize", str(model), "--cluster", str(spec), "--batch-size", "8",
                   "--strategy", strategy, "--out", str(plan))
                rows.append((f"zoo/{name} (small)", f"{ranks} CPU ranks", strategy,
                             *compare(plan, list(range(ranks)))))
                print(*rows[-1][:5], flush=True)
        if args.paper:
            model = d / "llama2-7b.onnx"
            sh(UNITY, "zoo", "llama2-7b", "--out", str(model), "--no-weights")
            plan = d / "plan.json"
            sh(UNITY, "optimize", str(model), "--cluster", "dgx-a100-80:8", "--batch-size", "64", "--out", str(plan))
            step = load_plan(plan).training
            shape = f"zero={step.zero},mb={step.micro_batches},recompute={step.recompute_name}"
            rows.append(("zoo/llama2-7b (paper, float32)", "dgx-a100-80:8", f"unity ({shape})",
                         *compare(plan, [0])))
            print(*rows[-1][:5], flush=True)
    load = max(load, os.getloadavg()[0])
    lines = ["| model | cluster | configuration | planner (bytes) | walk (bytes) | planner / walk | walk's parts |",
             "|---|---|---|---:|---:|---:|---|"]
    for model, cluster, strategy, planned, walked, parts in rows:
        shown = ", ".join(f"{p} {format_bytes(b)}" for p, b in parts.items() if b)
        lines.append(f"| {model} | {cluster} | {strategy} | {planned:,} | {walked:,} | {planned / walked:.3f} "
                     f"| {shown} |")
    ratios = sorted(p / w for _, _, _, p, w, _ in rows)
    lines += ["", f"{len(rows)} plans; planner / walk from {ratios[0]:.3f} to {ratios[-1]:.3f}; "
              f"took {time.perf_counter() - t0:.0f} s on {os.cpu_count()} cores, load average up to {load:.1f}"]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
