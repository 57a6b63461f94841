"""What keeping freed memory buys (``unity_cli/runtime/memory.py``): data-parallel step
time on 2 CPU ranks with glibc's default allocator thresholds (``UNITY_KEEP_FREED_MEMORY=0``)
and with unity's (the default), run alternately, side by side.

    python benchmarks/memory.py [--steps 20] [--repeats 5]

Models: an MLP of 8 Linear layers of 1024 x 1024 without biases (32 MiB of weights, batch
64), whose step allocates megabyte temporaries, and the shared bert_tiny and convnet_tiny
(``tests/models/tiny``, batch 4), whose temporaries are small. Prints a Markdown table of
median step times (``mpiexec -n 2 unity run --steps N --json``), their ratio, and the peak
resident memory of the larger rank (``peak_rss_bytes``, the median over the runs) with each
setting: what keeping freed memory costs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from profile_accuracy import last_json, sh  # the benchmarks' folder is on sys.path when run as a script

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
UNITY, MPIEXEC = str(BIN / "unity"), str(BIN / "mpiexec")
CLUSTER = REPO / "cluster_specs" / "local-cpu.yaml"
SHARED = REPO / "tests" / "models" / "tiny"   # the vendored exports


def deep_mlp(path: Path, width: int = 1024, layers: int = 8) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) * 0.03).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "deep_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", width])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def run_json(cmd: list[str], env: dict[str, str]) -> dict:
    return last_json(sh(cmd, env, timeout=900))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="unity-memory-"))
    env = {**os.environ, "UNITY_PROFILE_DIR": str(tmp / "profiles")}
    models = [("mlp 8 x 1024²", deep_mlp(tmp / "deep_mlp.onnx"), 64)]
    models += [(m, SHARED / f"{m}.onnx", 4) for m in ("bert_tiny", "convnet_tiny")]   # vendored: always there
    print("| model (data parallel, 2 ranks) | batch | glibc defaults (ms) | freed memory kept (ms) | kept / defaults "
          "| peak RSS per rank, defaults / kept (MiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, path, batch in models:
        plan = tmp / f"{path.stem}.json"
        predicted = run_json([UNITY, "optimize", str(path), "--cluster", str(CLUSTER), "--batch-size", str(batch),
                              "--strategy", "data_parallel", "--out", str(plan), "--no-profile", "--json"], env)
        assert predicted["strategy"] == "data_parallel"
        times: dict[str, list[float]] = {"0": [], "1": []}
        rss: dict[str, list[int]] = {"0": [], "1": []}
        for _ in range(args.repeats):
            for keep in times:  # alternate, so drift on a shared machine hits both alike
                doc = run_json([MPIEXEC, "-n", "2", UNITY, "run", str(plan), "--steps", str(args.steps), "--json"],
                               {**env, "UNITY_KEEP_FREED_MEMORY": keep})
                times[keep].append(doc["measured_step_time_ms"])
                rss[keep].append(max(doc["peak_rss_bytes"]))
        default, kept = statistics.median(times["0"]), statistics.median(times["1"])
        mib = {k: statistics.median(v) / 2**20 for k, v in rss.items()}
        print(f"| {name} | {batch} | {default:.2f} | {kept:.2f} | {kept / default:.3f} "
              f"| {mib['0']:.0f} / {mib['1']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
