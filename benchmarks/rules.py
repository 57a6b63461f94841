"""Full timing of `unity verify-rules`: generate, prove and count the rule cache.

    python benchmarks/rules.py [--max-ops 3] [--jobs 2]

Runs the real command into a temporary file (the shipped cache is not touched) and
prints the counts per rule size, the rejections by reason and the wall time, as a
Markdown table for the README.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-ops", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=0)
    args = ap.parse_args()
    unity = Path(sys.executable).parent / "unity"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "rules.json"
        t0 = time.perf_counter()
        proc = subprocess.run([str(unity), "verify-rules", "--max-ops", str(args.max_ops), "--out", str(out),
                               "--json"] + (["--jobs", str(args.jobs)] if args.jobs else []),
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"verify-rules failed: {proc.stderr.strip()}")
    r = json.loads(proc.stdout)
    print(f"`unity verify-rules --max-ops {args.max_ops}`: {wall:.0f} s wall on this machine\n")
    print("| stage | count |")
    print("|---|---:|")
    order = ["graphs", "classes", "classes_with_rules", "candidates", "after_renamings", "after_common_subgraph",
             "after_same_root", "after_trivial", "after_equivalent_subterms", "parametric_rules",
             "hand_written_parallel_rules", "candidates_verified"]
    for k in order + sorted(set(r["counts"]) - set(order) - {"rules"}):
        if k in r["counts"]:
            print(f"| {k.replace('_', ' ')} | {r['counts'][k]} |")
    print(f"| verified | {r['verified']} |")
    for reason, n in r["rejected_by_reason"].items():
        print(f"| rejected: {reason} | {n} |")
    print("\n| rule size (ops on the larger side) | verified rules |")
    print("|---|---:|")
    for size, n in r["by_size"].items():
        print(f"| {size} | {n} |")


if __name__ == "__main__":
    main()
