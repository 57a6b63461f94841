"""Import + plan time and predicted step time of each baseline, for every model we can import.

    python benchmarks/foundation.py [--cluster cluster_specs/dgx-a100-8.yaml] [--repeat 5] [--markdown]

Times are medians of --repeat runs in this one process; the step times are the cost
model's predictions (not measurements). Prints a Markdown table for the README.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from models.catalog import EXPORTED_DIR, TINY_MODELS_DIR, ZOO9_NAMES, zoo9_model  # noqa: E402

from unity_cli.cluster import load_cluster  # noqa: E402
from unity_cli.cost.model import CostConfig  # noqa: E402
from unity_cli.onnx_import import ImportOptions, import_model  # noqa: E402
from unity_cli.search.optimize import optimize  # noqa: E402


def models(tmp: Path, shared: int | None = 4, exported: int | None = 2, zoo: int | None = 64
           ) -> list[tuple[str, Path, int | None]]:
    """(label, file, batch) for the corpus; a group whose batch is None is left out, and a
    dynamo export (static shapes) gets batch None: it keeps the batch it was exported with."""
    out: list[tuple[str, Path, int | None]] = []
    if shared is not None:
        out += [(f"shared/{p.name}", p, shared) for p in sorted(TINY_MODELS_DIR.glob("*.onnx"))]
    if exported is not None:
        out += [(f"exported/{p.name}", p, exported) for p in sorted(EXPORTED_DIR.glob("*.onnx"))]
    if zoo is not None:
        for name in ZOO9_NAMES:
            p = tmp / f"{name}.onnx"
            onnx.save(zoo9_model(name), p)
            out.append((f"zoo9/{name}", p, zoo))
    return [(label, p, None if "_dynamo" in p.name else b) for label, p, b in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default=str(REPO / "cluster_specs" / "dgx-a100-8.yaml"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cluster = load_cluster(args.cluster)
    config = CostConfig()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for label, path, batch in models(Path(d)):
            opts = ImportOptions(batch)
            t_import, t_plan = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                m = import_model(path, opts)
                t1 = time.perf_counter()
                res = optimize(m.pcg, cluster, config)
                t2 = time.perf_counter()
                t_import.append(t1 - t0)
                t_plan.append(t2 - t1)
            c = res.candidates
            dp = c["data_parallel"].report.step_time
            tp = c["tensor_parallel"].report.step_time
            rows.append((label, m.batch_size, len(m.pcg), dp * 1e3, tp * 1e3, res.chosen.baseline.name,
                         statistics.median(t_import) * 1e3, statistics.median(t_plan) * 1e3))
    print(f"cluster: {cluster.name} ({cluster.num_devices} devices), float32, adam; "
          f"times are medians of {args.repeat} runs\n")
    print("| model | batch | PCG nodes | data_parallel (ms) | tensor_parallel (ms) | chosen "
          "| import (ms) | plan (ms) |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]} | {r[6]:.0f} | {r[7]:.0f} |")


if __name__ == "__main__":
    main()
