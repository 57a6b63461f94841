"""How `unity optimize` time grows with the cluster: one model, DGX-A100 nodes x 1..N.

    python benchmarks/cluster_size.py [--nodes 1,4,16,128] [--repeat 3] [--model mlp]

Each run is the whole CLI command in a fresh process (import, search, mapping, pricing,
writing the plan), on the paper zoo's model at small scale, batch 1024; the cluster is
``dgx-a100-32.yaml`` with ``nodes.count`` set. Prints a Markdown table of medians and the
time per device relative to the smallest cluster (sub-linear growth: the ratio falls), and
writes it to benchmarks/results/cluster_size.md. Quote the load average it prints.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "cluster_specs" / "dgx-a100-32.yaml"


def spec_with_nodes(nodes: int, folder: Path) -> Path:
    doc = yaml.safe_load(SPEC.read_text())
    doc["name"] = f"dgx-a100-x{nodes}"
    doc["nodes"]["count"] = nodes
    path = folder / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,4,16,128")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default="mlp")
    args = ap.parse_args()
    unity = [sys.executable, "-m", "unity_cli.cli"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = folder / f"{args.model}.onnx"
        subprocess.run(unity + ["zoo", args.model, "--scale", "small", "--batch-size", "1024", "--out", str(model)],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        for nodes in (int(n) for n in args.nodes.split(",")):
            spec = spec_with_nodes(nodes, folder)
            cmd = unity + ["optimize", str(model), "--cluster", str(spec), "--out", str(folder / "plan.json")]
            times = [timed(cmd) for _ in range(args.repeat)]
            rows.append((nodes * 8, statistics.median(times)))
            print(f"{nodes * 8:6d} devices: {rows[-1][1]:.1f} s", file=sys.stderr)
    base_devices, base = rows[0]
    lines = [f"`unity optimize` of the zoo's `{args.model}` (small scale, batch 1024) on DGX-A100 nodes; "
             f"medians of {args.repeat} runs, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores.",
             "", "| devices | seconds | x the time | x the devices |", "|---:|---:|---:|---:|"]
    for devices, t in rows:
        lines.append(f"| {devices} | {t:.1f} | {t / base:.1f} | {devices / base_devices:.0f} |")
    text = "\n".join(lines) + "\n"
    (REPO / "benchmarks" / "results" / "cluster_size.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
