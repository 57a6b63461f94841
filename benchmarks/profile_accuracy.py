"""How much a measured profile improves the cost model: predicted step time with the
roofline, with the profile, and measured by ``unity run``, on ``cluster_specs/local-cpu.yaml``
(2 CPU ranks).

    python benchmarks/profile_accuracy.py [--steps 5] [--max-seconds 60] [--models bert_tiny,...]

For the shared models (``../shared/models``): one ``mpiexec -n 2 unity profile`` measures
every model's pieces and the links and collectives between the 2 ranks; then per model and
strategy (data_parallel, tensor_parallel) ``unity optimize`` plans without and with the
profile, and ``mpiexec -n 2 unity run plan.json --steps N --json`` measures the profiled
plan (median step after a warm-up). Prints a markdown table; ratio = measured / predicted.
All commands run as the installed ``unity``, with ``UNITY_PROFILE_DIR`` set to a temporary
folder so no profile in your home is read or written.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO.parent / "shared" / "models"
CLUSTER = REPO / "cluster_specs" / "local-cpu.yaml"
BIN = Path(sys.executable).parent
UNITY = str(BIN / "unity")
MPIEXEC = str(BIN / "mpiexec")
DEFAULT_MODELS = ("bert_tiny", "bert_tiny_dynamo", "convnet_tiny", "convnet_tiny_dynamo")
STRATEGIES = ("data_parallel", "tensor_parallel")
BATCH = 4  # the batch the shared models were exported with (dynamo files are static at it)


def sh(cmd: list[str], env: dict[str, str], timeout: float = 600) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def last_json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def has_run(env: dict[str, str]) -> bool:
    return subprocess.run([UNITY, "run", "--help"], capture_output=True, env=env).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=60.0, help="unity profile's cap on operator timing")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if (MODELS / f"{m}.onnx").exists()]
    if not models:
        sys.exit(f"none of {args.models} is in {MODELS}")
    tmp = Path(tempfile.mkdtemp(prefix="unity-profile-accuracy-"))
    env = {**os.environ, "UNITY_PROFILE_DIR": str(tmp / "profiles")}
    profile = tmp / "local-cpu.json"
    cmd = [MPIEXEC, "-n", "2", UNITY, "profile", "--cluster", str(CLUSTER), "--out", str(profile),
           "--batch-size", str(BATCH), "--max-seconds", str(args.max_seconds)]
    for m in models:
        cmd += ["--model", str(MODELS / f"{m}.onnx")]
    print(sh(cmd, env).strip(), file=sys.stderr)
    run = has_run(env)
    rows = []
    for m in models:
        for strategy in STRATEGIES:
            pred = {}
            plans = {}
            for mode, flag in (("roofline", ["--no-profile"]), ("profiled", ["--profile", str(profile)])):
                plans[mode] = tmp / f"{m}-{strategy}-{mode}.json"
                out = sh([UNITY, "optimize", str(MODELS / f"{m}.onnx"), "--cluster", str(CLUSTER), "--batch-size",
                          str(BATCH), "--strategy", strategy, "--out", str(plans[mode]), "--json", *flag], env)
                pred[mode] = last_json(out)["predicted"]["step_time_ms"]
            measured = None
            if run:
                out = sh([MPIEXEC, "-n", "2", UNITY, "run", str(plans["profiled"]), "--steps", str(args.steps),
                          "--json"], env)
                measured = last_json(out)["measured_step_time_ms"]
            rows.append((m, strategy, pred["roofline"], pred["profiled"], measured))
    print("| model | strategy | predicted ms (roofline) | predicted ms (profiled) | measured ms "
          "| measured/predicted (roofline) | measured/predicted (profiled) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for m, s, roof, prof, meas in rows:
        if meas is None:
            print(f"| {m} | {s} | {roof:.3f} | {prof:.3f} | - | - | - |")
        else:
            print(f"| {m} | {s} | {roof:.3f} | {prof:.3f} | {meas:.3f} | {meas / roof:.2f} | {meas / prof:.2f} |")
    if not run:
        print("\n`unity run` is not available here: no measured column.")


if __name__ == "__main__":
    main()
