"""How much a measured profile improves the cost model: predicted step time with the
roofline, with the profile, and measured by ``unity run``, by default on
``cluster_specs/local-cpu.yaml`` (2 CPU ranks).

    python benchmarks/profile_accuracy.py [--steps 5] [--max-seconds 60] [--models bert_tiny,...]
        [--cluster SPEC --ranks P --backend numpy|cupy --batch B --strategies data_parallel,...]

For the shared models (``tests/models/tiny``): one ``mpiexec -n P unity profile`` measures
every model's pieces alone and the links and collectives between the P ranks; per model
and strategy (data_parallel, tensor_parallel) ``unity optimize`` plans without and with
the profile; ``mpiexec -n P unity profile --plan ...`` then times those plans' pieces
inside training steps; the plans made with that profile are run with
``mpiexec -n P unity run plan.json --steps N --json`` (median step after a warm-up).
On a GPU machine, ``--backend cupy`` with a cluster spec of that machine's GPUs measures
the cupy + NCCL path the same way.
Prints a markdown table; ratio = measured / predicted.
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
MODELS = REPO / "tests" / "models" / "tiny"   # the vendored exports
CLUSTER = REPO / "cluster_specs" / "local-cpu.yaml"
BIN = Path(sys.executable).parent
UNITY = str(BIN / "unity")
MPIEXEC = str(BIN / "mpiexec")
DEFAULT_MODELS = ("bert_tiny", "bert_tiny_dynamo", "convnet_tiny", "convnet_tiny_dynamo")
STRATEGIES = ("data_parallel", "tensor_parallel")
BATCH = 4  # the batch the shared models were exported with (dynamo files are static at it)
DYNAMO_STATIC = "_dynamo"  # such files are static at BATCH: other batches skip them


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
    ap.add_argument("--cluster", type=Path, default=CLUSTER, help="cluster spec of this machine")
    ap.add_argument("--ranks", type=int, default=2, help="MPI ranks (the spec's device count)")
    ap.add_argument("--backend", choices=("numpy", "cupy"), default="numpy")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if (MODELS / f"{m}.onnx").exists()
              and (args.batch == BATCH or DYNAMO_STATIC not in m)]
    if not models:
        sys.exit(f"none of {args.models} is in {MODELS} (at batch {args.batch})")
    cluster, batch, backend = str(args.cluster), str(args.batch), ["--backend", args.backend]
    tmp = Path(tempfile.mkdtemp(prefix="unity-profile-accuracy-"))
    env = {**os.environ, "UNITY_PROFILE_DIR": str(tmp / "profiles")}
    profile = tmp / "profile.json"
    launch = [MPIEXEC, "-n", str(args.ranks)]
    cmd = [*launch, UNITY, "profile", "--cluster", cluster, "--out", str(profile),
           "--batch-size", batch, "--max-seconds", str(args.max_seconds), *backend]
    for m in models:
        cmd += ["--model", str(MODELS / f"{m}.onnx")]
    print(sh(cmd, env).strip(), file=sys.stderr)
    run = has_run(env)

    def plan(m: str, strategy: str, mode: str, flag: list[str]) -> tuple[Path, float]:
        path = tmp / f"{m}-{strategy}-{mode}.json"
        out = sh([UNITY, "optimize", str(MODELS / f"{m}.onnx"), "--cluster", cluster, "--batch-size",
                  batch, "--strategy", strategy, "--out", str(path), "--json", *flag], env)
        return path, last_json(out)["predicted"]["step_time_ms"]

    cases = [(m, s) for m in models for s in args.strategies.split(",")]
    roof = {c: plan(*c, "roofline", ["--no-profile"]) for c in cases}
    alone = {c: plan(*c, "profiled", ["--profile", str(profile)]) for c in cases}
    if run:  # second pass: the plans' pieces timed inside training steps (unity profile --plan)
        cmd = [*launch, UNITY, "profile", "--cluster", cluster, "--out", str(profile),
               "--batch-size", batch, "--max-seconds", str(args.max_seconds), *backend]
        for c in cases:
            cmd += ["--plan", str(alone[c][0])]
        print(sh(cmd, env).strip(), file=sys.stderr)
    situ = {c: plan(*c, "in-situ", ["--profile", str(profile)]) for c in cases} if run else alone
    rows = []
    for c in cases:
        measured = None
        if run:
            out = sh([*launch, UNITY, "run", str(situ[c][0]), "--steps", str(args.steps), "--json", *backend], env)
            measured = last_json(out)["measured_step_time_ms"]
        rows.append((*c, roof[c][1], alone[c][1], situ[c][1], measured))
    print("| model | strategy | predicted ms (roofline) | (pieces timed alone) | (pieces timed in steps) "
          "| measured ms | measured/predicted: roofline | alone | in steps |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for m, s, r, a, t, meas in rows:
        if meas is None:
            print(f"| {m} | {s} | {r:.3f} | {a:.3f} | - | - | - | - | - |")
        else:
            print(f"| {m} | {s} | {r:.3f} | {a:.3f} | {t:.3f} | {meas:.3f} | {meas / r:.2f} | {meas / a:.2f} "
                  f"| {meas / t:.2f} |")
    if not run:
        print("\n`unity run` is not available here: no measured column.")

if __name__ == "__main__":
    main()
