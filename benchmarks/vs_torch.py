"""unity run against PyTorch DDP on the same models, data parallel on 2 ranks x 1 thread.

The models: an MLP 512-1024x4-100 written as torch exports it (Gemm with transB, bias,
Relu), torch given the same weights; and a BERT-like and a ResNet-like torch module
(``torch_models.py``), exported to ONNX by ``torch.onnx.export`` for unity and trained as
they are by torch. All train with SGD and cross entropy on random data. Each round runs
every configuration once, alternating unity and torch, and the table gives medians over
rounds of each run's median step time (after a warm-up step), and their ratio: absolute
times depend on the machine and its load, ratios measured side by side much less. The
compute floor is the step's FLOPs per rank (torch's FLOP counter, forward and backward)
over this machine's single-core sgemm rate.

    python benchmarks/vs_torch.py [--rounds 4] [--steps 12] [--models mlp,bert-like,resnet-like]
                                  [--out benchmarks/results/vs_torch.md]

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
BATCHES = {"mlp": (64, 256), "bert-like": (32,), "resnet-like": (32,)}
"""Each model's global batch sizes."""
LABELS = {"mlp": f"MLP {'-'.join(map(str, DIMS))}", "bert-like": "BERT-like (2 layers, width 128, seq 32)",
          "resnet-like": "ResNet-like (3 residual blocks, 32x32 images)"}
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
rank, world, batch, steps, what = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", rank=rank, world_size=world)
g = torch.Generator().manual_seed(rank)
if what.endswith(".npz"):     # the MLP, with unity's weights
    layers = np.load(what)
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
    net, classes = torch.nn.Sequential(*mods), layers[f"w{n-1}"].shape[0]
    inputs = lambda k, gen: torch.randn(k, layers["w0"].shape[1], generator=gen)
else:                         # a module of torch_models.py, as the benchmark exported it
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[6])))
    from torch_models import MODELS
    make, inputs, classes = MODELS[what]
    torch.manual_seed(0)
    net = make()
model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
local = batch // world
times = []
for s in range(steps):
    x = inputs(local, g)
    y = torch.randint(0, classes, (local,), generator=g)
    dist.barrier()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    loss_fn(model(x), y).backward()
    opt.step()
    dist.barrier()
    times.append(time.perf_counter() - t)
import resource
print(statistics.median(times[1:]) * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
dist.destroy_process_group()
'''


def torch_ms(what: str, batch: int, steps: int, ranks: int = 2) -> tuple[float, int]:
    """Median step of torch DDP on ``what`` (the MLP's weights, .npz, or a torch_models
    name), and the largest peak resident memory of its ranks (bytes)."""
    env = {**os.environ, **THREADS, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 1000)}
    procs = [subprocess.Popen([sys.executable, "-c", TORCH_WORKER, str(r), str(ranks), str(batch), str(steps),
                               what, __file__], env=env, stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("torch DDP run failed")
    last = [out.strip().splitlines()[-1].split() for out in outs]
    return float(last[0][0]), max(int(words[1]) for words in last)


def unity_ms(plan: Path, steps: int, ranks: int = 2) -> tuple[float, int]:
    """Median step of ``unity run`` and the largest peak resident memory of its ranks (bytes)."""
    r = subprocess.run([str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "unity"), "run", str(plan), "--steps",
                        str(steps), "--optimizer", "sgd", "--lr", "0.01", "--json"],
                       env={**os.environ, **THREADS}, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"unity run failed: {r.stderr.strip()[-500:]}")
    doc = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    return float(doc["measured_step_time_ms"]), max(doc["peak_rss_bytes"])


def export(name: str, path: Path) -> None:
    """A torch_models module (seed 0, as the torch runs build it) exported to ONNX, batch dim symbolic."""
    import warnings

    import torch
    from torch_models import MODELS

    make, inputs, _ = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(make(), (inputs(2, torch.Generator().manual_seed(0)),), str(path), dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}},
                          opset_version=17)


def flops_per_rank(name: str, local: int) -> float:
    """Forward + backward FLOPs of one rank's step, by torch's FLOP counter."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if name == "mlp":
        return float(sum(6 * local * i * o for i, o in zip(DIMS, DIMS[1:])))
    from torch_models import MODELS

    make, inputs, classes = MODELS[name]
    net = make()
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(inputs(local, torch.Generator().manual_seed(0))),
                                          torch.zeros(local, dtype=torch.long)).backward()
    return float(counter.get_total_flops())


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
    ap.add_argument("--models", default=",".join(BATCHES))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vs_torch.md"))
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("vs_torch: torch is not installed (pip install torch==2.13.0, a CPU build): nothing measured")
        return 0
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in BATCHES]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)} (choose from {', '.join(BATCHES)})")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    load0 = os.getloadavg()
    t0 = time.monotonic()
    configs = [(m, b) for m in names for b in BATCHES[m]]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        torch_input = {}
        for m in names:
            if m == "mlp":
                layers = write_mlp(tmp / "mlp.onnx")
                np.savez(tmp / "w.npz", **{f"w{i}": w for i, (w, _) in enumerate(layers)},
                         **{f"b{i}": b for i, (_, b) in enumerate(layers)})
                torch_input[m] = str(tmp / "w.npz")
            else:
                export(m, tmp / f"{m}.onnx")
                torch_input[m] = m
        plans = {}
        for m, b in configs:
            plans[m, b] = tmp / f"{m}-{b}.json"
            subprocess.run([str(BIN / "unity"), "optimize", str(tmp / f"{m}.onnx"), "--cluster", "local-cpu",
                            "--batch-size", str(b), "--strategy", "data_parallel", "--optimizer", "sgd", "--out",
                            str(plans[m, b])], check=True, capture_output=True)
        runs: dict[tuple[str, str, int], list[tuple[float, int]]] = {}
        for _ in range(args.rounds):
            for m, b in configs:
                runs.setdefault(("unity", m, b), []).append(unity_ms(plans[m, b], args.steps))
                runs.setdefault(("torch", m, b), []).append(torch_ms(torch_input[m], b, args.steps))
    rate = sgemm_rate()
    load1 = os.getloadavg()
    rows = ["| model | global batch | torch DDP (ms) | unity (ms) | unity / torch | compute floor (ms) "
            "| peak RSS per rank, torch / unity (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for m, b in configs:
        tm, um = (statistics.median(t for t, _ in runs[(who, m, b)]) for who in ("torch", "unity"))
        tr, ur = (max(r for _, r in runs[(who, m, b)]) / 2**20 for who in ("torch", "unity"))
        rows.append(f"| {LABELS[m]} | {b} | {tm:.1f} | {um:.1f} | {um / tm:.2f} | "
                    f"{flops_per_rank(m, b // 2) / rate * 1e3:.1f} | {tr:.0f} / {ur:.0f} |")
    text = "\n".join([
        f"SGD, data parallel on 2 ranks x 1 thread (torch {torch.__version__} DDP over gloo; unity run over MPICH); "
        f"medians of {args.rounds} alternated rounds of {args.steps} steps (each run's median after a warm-up "
        f"step); compute floor at {rate / 1e9:.1f} GFLOP/s single-core sgemm",
        "", *rows, "",
        f"{(time.monotonic() - t0) / 60:.1f} min; load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load0)} "
        f"at the start, {', '.join(f'{x:.2f}' for x in load1)} at the end, on {os.cpu_count()} cores", ""])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
