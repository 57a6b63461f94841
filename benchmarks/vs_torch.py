"""unity run against PyTorch DDP on the same MLP, data parallel on 2 ranks x 1 thread.

The model is an MLP 512-1024x4-100 written as torch exports it (Gemm with transB, bias,
Relu), trained with SGD on random data; torch gets the same weights. Each round runs
every configuration once, alternating unity and torch, and the table gives medians over
rounds of each run's median step time (after a warm-up step), and their ratio: absolute
times depend on the machine and its load, ratios measured side by side much less. The
compute floor is the step's FLOPs per rank over this machine's single-core sgemm rate.

    python benchmarks/vs_torch.py [--rounds 4] [--steps 12] [--out benchmarks/results/vs_torch.md]

torch is optional (``pip install torch==2.13.0``); without it the script says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DIMS = (512, 1024, 1024, 1024, 1024, 100)
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def write_mlp(path: Path, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP as torch.onnx exports nn.Linear layers (Gemm, transB=1), and its weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, layers, prev = [], [], [], "x"
    for i, (d_in, d_out) in enumerate(zip(DIMS, DIMS[1:])):
        w = (rng.standard_normal((d_out, d_in)) / np.sqrt(d_in)).astype(np.float32)
        b = np.zeros(d_out, np.float32)
        layers.append((w, b))
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"h{i}"], transB=1))
        prev = f"h{i}"
        if i < len(DIMS) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", DIMS[0]])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", DIMS[-1]])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return layers


TORCH_WORKER = r'''
import os, sys, time, statistics
import numpy as np
import torch, torch.distributed as dist
torch.set_num_threads(1)
rank, world, batch, steps, weights = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", rank=rank, world_size=world)
layers = np.load(weights)
mods = []
n = len(layers.files) // 2
for i in range(n):
    w, b = layers[f"w{i}"], layers[f"b{i}"]
    lin = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w)); lin.bias.copy_(torch.from_numpy(b))
    mods.append(lin)
    if i < n - 1:
        mods.append(torch.nn.ReLU())
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*mods))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
g = torch.Generator().manual_seed(rank)
local = batch // world
times = []
for s in range(steps):
    x = torch.randn(local, layers["w0"].shape[1], generator=g)
    y = torch.randint(0, layers[f"w{n-1}"].shape[0], (local,), generator=g)
    dist.barrier()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    loss_fn(model(x), y).backward()
    opt.step()
    dist.barrier()
    times.append(time.perf_counter() - t)
if rank == 0:
    print(statistics.median(times[1:]) * 1e3)
dist.destroy_process_group()
'''


def torch_ms(weights: Path, batch: int, steps: int, ranks: int = 2) -> float:
    env = {**os.environ, **THREADS, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000)}
    procs = [subprocess.Popen([sys.executable, "-c", TORCH_WORKER, str(r), str(ranks), str(batch), str(steps),
                               str(weights)], env=env, stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("torch DDP run failed")
    return float(outs[0].strip().splitlines()[-1])


def unity_ms(plan: Path, steps: int, ranks: int = 2) -> float:
    r = subprocess.run([str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "unity"), "run", str(plan), "--steps",
                        str(steps), "--optimizer", "sgd", "--lr", "0.01", "--json"],
                       env={**os.environ, **THREADS}, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"unity run failed: {r.stderr.strip()[-500:]}")
    doc = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    return float(doc["measured_step_time_ms"])


def sgemm_rate() -> float:
    """FLOP/s of one core on a 1024-cube float32 matmul (a separate process, 1 thread)."""
    code = ("import numpy as np, time\na = np.random.rand(1024, 1024).astype(np.float32)\nb = a.copy()\n"
            "a @ b\nts = []\nfor _ in range(7):\n"
            "    t = time.perf_counter(); a @ b; ts.append(time.perf_counter() - t)\n"
            "print(2 * 1024**3 / sorted(ts)[3])")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **THREADS}, capture_output=True, text=True,
                       check=True)
    return float(r.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vs_torch.md"))
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("vs_torch: torch is not installed (pip install torch==2.13.0, a CPU build): nothing measured")
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        layers = write_mlp(tmp / "mlp.onnx")
        np.savez(tmp / "w.npz", **{f"w{i}": w for i, (w, _) in enumerate(layers)},
                 **{f"b{i}": b for i, (_, b) in enumerate(layers)})
        plans = {}
        for b in batches:
            plans[b] = tmp / f"plan{b}.json"
            subprocess.run([str(BIN / "unity"), "optimize", str(tmp / "mlp.onnx"), "--cluster", "local-cpu",
                            "--batch-size", str(b), "--strategy", "data_parallel", "--optimizer", "sgd", "--out",
                            str(plans[b])], check=True, capture_output=True)
        runs: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for b in batches:
                runs.setdefault(("unity", b), []).append(unity_ms(plans[b], args.steps))
                runs.setdefault(("torch", b), []).append(torch_ms(tmp / "w.npz", b, args.steps))
    rate = sgemm_rate()
    load1 = os.getloadavg()
    rows = ["| global batch | torch DDP (ms) | unity (ms) | unity / torch | compute floor (ms) |",
            "|---:|---:|---:|---:|---:|"]
    for b in batches:
        tm, um = statistics.median(runs[("torch", b)]), statistics.median(runs[("unity", b)])
        flops = sum(6 * (b // 2) * i * o for i, o in zip(DIMS, DIMS[1:]))   # fwd 2 + bwd 4, per rank
        rows.append(f"| {b} | {tm:.1f} | {um:.1f} | {um / tm:.2f} | {flops / rate * 1e3:.1f} |")
    text = "\n".join([
        f"MLP {'-'.join(map(str, DIMS))}, SGD, data parallel on 2 ranks x 1 thread (torch {torch.__version__} DDP "
        f"over gloo; unity run over MPICH); medians of {args.rounds} alternated rounds of {args.steps} steps "
        f"(each run's median after a warm-up step); compute floor at {rate / 1e9:.1f} GFLOP/s single-core sgemm",
        "", *rows, "",
        f"{(time.monotonic() - t0) / 60:.1f} min; load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load0)} "
        f"at the start, {', '.join(f'{x:.2f}' for x in load1)} at the end, on {os.cpu_count()} cores", ""])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
