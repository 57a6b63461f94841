"""The joint search (``--strategy best``, the default) against the baselines: model x
devices -> search seconds, speedup over data parallelism, candidates explored, and whether
the joint search's plan is at least as fast as the baselines it starts from, with the whole
run inside its budget.

    python benchmarks/search.py [--budget S] [--devices 8,32,192] [--models shared|all]

Clusters are the first N devices of summit-192 (6 V100 per node) for 192 and of
dgx-a100-32 for 8 and 32. Step times are the cost model's predictions. All rows are
measured in one run of this script.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from foundation import models  # noqa: E402

from unity_cli.cluster import load_cluster  # noqa: E402
from unity_cli.cost.model import CostConfig  # noqa: E402
from unity_cli.onnx_import import ImportOptions, import_model  # noqa: E402
from unity_cli.report.summary import rewrite_counts  # noqa: E402
from unity_cli.search.optimize import optimize  # noqa: E402
from unity_cli.substitutions.cache import load_cache  # noqa: E402


def cluster_for(devices: int):
    name = "summit-192" if devices > 32 else "dgx-a100-32"
    return load_cluster(REPO / "cluster_specs" / f"{name}.yaml").first(devices)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=None, help="a time ceiling per run (default: none, "
                    "as unity optimize: the search stops by its work count)")
    ap.add_argument("--devices", default="8,32,192")
    ap.add_argument("--models", choices=["shared", "all"], default="shared")
    ap.add_argument("--only", nargs="+", metavar="TEXT", help="only the models whose label contains one of these")
    args = ap.parse_args()
    rules = load_cache().rules
    config = CostConfig()
    bound = f"a ceiling of {args.budget:g} s per run" if args.budget else "the default work count, no time ceiling"
    print(f"{bound}; float32, adam; predicted step times\n")
    print("| model | devices | DP (ms) | TP (ms) | parallel_only (ms) | alg. then par. (ms) | unity (ms) "
          "| best over DP | search s | candidates | unity ≤ DP, TP; within budget | rewrites applied |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---|")
    with tempfile.TemporaryDirectory() as d:
        groups = dict(shared=64, exported=64, zoo=192) if args.models == "all" else dict(exported=None, zoo=None)
        for label, path, batch in models(Path(d), **({"shared": 64} | groups)):
            if args.only and not any(t in label for t in args.only):
                continue
            for n in (int(x) for x in args.devices.split(",")):
                cluster = cluster_for(n)
                pcg = import_model(path, ImportOptions(batch)).pcg
                t0 = time.monotonic()
                res = optimize(pcg, cluster, config, "best", rules, budget=args.budget)
                seconds = time.monotonic() - t0
                t = {k: c.report.step_time for k, c in res.candidates.items()}
                u = res.chosen.report.step_time
                # The joint search starts from the baselines, so it must be at least as fast as
                # each of them; and the whole run, baselines included, must fit in the budget.
                ok = all(t["unity"] <= t[b] * (1 + 1e-9) for b in ("data_parallel", "tensor_parallel")) \
                    and (args.budget is None or seconds <= args.budget * 1.1)
                print(f"| {label} | {n} | {t['data_parallel'] * 1e3:.3f} | {t['tensor_parallel'] * 1e3:.3f} | "
                      f"{t['parallel_only'] * 1e3:.3f} | {t['algebraic_then_parallel'] * 1e3:.3f} | "
                      f"{t['unity'] * 1e3:.3f} | "
                      f"{t['data_parallel'] / u:.2f}x | {seconds:.1f} | {res.stats.candidates} | "
                      f"{'yes' if ok else 'NO'} | {rewrite_counts([a.rule_name for a in res.rewrites])} |", flush=True)

if __name__ == "__main__":
    main()
