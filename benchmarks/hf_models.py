"""The models people train today (``tests/models/hf/``) and onnx's light model zoo: what
each needs, whether unity matches onnxruntime on it, and the plan it gets.

    python benchmarks/hf_models.py [--batch 64] [--budget 30] [--clusters dgx-a100-8,summit-192]

For each file: its family and exporter, the ops it needs that unity imported only from
this round on (issue 17), the PCG size, whether the forward pass through unity's
importer and kernels matches onnxruntime (rtol 2e-4), and per cluster the strategy
``unity optimize`` chooses with default options and its predicted step time.
TorchScript exports are planned at ``--batch``; dynamo exports are static and keep the
batch they were exported with. Prints a Markdown table for the README.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from models.hf_corpus import REFUSED, hf_models  # noqa: E402

from unity_cli.cluster import load_cluster  # noqa: E402
from unity_cli.cost.model import CostConfig  # noqa: E402
from unity_cli.errors import UnityError  # noqa: E402
from unity_cli.onnx_import import ImportOptions, import_model  # noqa: E402
from unity_cli.runtime.backend import UnityBackend  # noqa: E402
from unity_cli.search.optimize import optimize  # noqa: E402
from unity_cli.substitutions.cache import load_cache  # noqa: E402

NEW_OPS = {"IsNaN", "IsInf", "Pad", "Tile", "TopK", "OneHot", "ScatterElements", "GatherElements", "Trilu",
           "CumSum", "Einsum", "Hardmax"}
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _matches(path: Path, feed: dict[str, np.ndarray]) -> str:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feed)
    got = UnityBackend.prepare(onnx.load(str(path))).run(feed)
    ok = all(np.allclose(g, w, rtol=2e-4, atol=2e-5) for g, w in zip(got, want))
    return "yes" if ok else "NO"


def _needs(model: onnx.ModelProto) -> str:
    ops = sorted({n.op_type for n in model.graph.node} & NEW_OPS)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < 13:
        # Before opset 13 Softmax flattens [axis:]: new only where that is not the last dim.
        inferred = onnx.shape_inference.infer_shapes(model)
        ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
                 list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
        for n in model.graph.node:
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
            rank = ranks.get(n.input[0], 0)
            if n.op_type in ("Softmax", "LogSoftmax") and rank > axis % max(rank, 1) + 1:
                ops.append(f"{n.op_type} over dims {axis}.. (opset {opset})")
                break
    fills = {o for n in model.graph.node if n.op_type == "ConstantOfShape" for o in n.output}
    if any(i in fills for n in model.graph.node if n.op_type in ("Conv", "Gemm") for i in n.input[1:]):
        ops.append("weights made by ConstantOfShape")
    return ", ".join(ops) or "–"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--clusters", default="dgx-a100-8,summit-192")
    args = ap.parse_args()
    clusters = [load_cluster(REPO / "cluster_specs" / f"{c}.yaml") for c in args.clusters.split(",")]
    rules = load_cache().rules
    config = CostConfig()
    rows = []
    entries = [(m.file, m.path, m.family, m.exporter, m.feed(), m.exporter == "torchscript") for m in hf_models()]
    light = sorted(LIGHT.glob("light_*.onnx")) if LIGHT.is_dir() else []
    for p in light:
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        model = onnx.load(str(p), load_external_data=False)
        inits = {t.name for t in model.graph.initializer}
        name = next(i.name for i in model.graph.input if i.name not in inits)
        entries.append((p.name, p, p.stem.removeprefix("light_"), "onnx zoo (light)", {name: x}, False))
    t_all = time.perf_counter()
    for file, path, family, exporter, feed, dynamic in entries:
        model = onnx.load(str(path))
        if file in REFUSED:
            try:
                import_model(path, ImportOptions(input_shapes={k: v.shape for k, v in feed.items()}))
                why = "imported?!"
            except UnityError as e:
                why = str(e).split("): ", 1)[-1].split(";")[0]
            rows.append((file, family, exporter, _needs(model), "–", "refused: " + why, []))
            print(f"{file}: refused", file=sys.stderr)
            continue
        matches = _matches(path, feed) if path.stat().st_size < 50_000_000 and "vgg" not in file else "–"
        shapes = {k: ((args.batch,) + v.shape[1:]) if dynamic else v.shape for k, v in feed.items()}
        pcg = import_model(path, ImportOptions(input_shapes=shapes)).pcg
        plans = []
        for cluster in clusters:
            t0 = time.perf_counter()
            res = optimize(pcg, cluster, config, "best", rules, budget=args.budget)
            r = res.chosen.report
            plans.append((res.chosen.baseline.name, res.chosen.baseline.devices, r.step_time * 1e3,
                          time.perf_counter() - t0))
        batch = next(iter(shapes.values()))[0]
        rows.append((file, family, exporter, _needs(model), f"{len(pcg)} @ batch {batch}", matches, plans))
        print(f"{file}: done", file=sys.stderr)
    names = [c.name for c in clusters]
    print(f"TorchScript exports at batch {args.batch}, dynamo exports at their exported batch; "
          f"default options (budget {args.budget:g} s); {time.perf_counter() - t_all:.0f} s in all\n")
    print("| file | family | exporter | needs (new this round) | PCG nodes | matches onnxruntime | "
          + " | ".join(f"{n}: chosen (devices, ms/step, search s)" for n in names) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(names))
    for file, family, exporter, needs, nodes, matches, plans in rows:
        cells = [f"{s} ({d}, {ms:.3f}, {t:.1f})" for s, d, ms, t in plans] or ["–"] * len(names)
        print(f"| {file} | {family} | {exporter} | {needs} | {nodes} | {matches} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
