"""Steps of several micro-batches, and ZeRO 1-3 (optimizer state, gradients and weights sharded
over the replicas), on real MPI ranks: each trains like one process (``--check``: k micro-batches of b against one
batch of k*b), sends exactly the bytes its plan predicts, and a wrong gradient is caught."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from models.catalog import mlp_model
from runtime.mpirun import SPECS, run_json, unity_run

from unity_cli.cli import cli
from unity_cli.ir.training import Training
from unity_cli.plan.plan import load_plan


def cpu_spec(root, devices: int):
    """local-cpu with ``devices`` ranks."""
    path = root / f"local-cpu-{devices}.yaml"
    path.write_text((SPECS / "local-cpu.yaml").read_text().replace("devices: 2", f"devices: {devices}")
                    .replace("name: local-cpu", f"name: local-cpu-{devices}"))
    return path


def optimize(model, spec, out, batch: int, *args: str) -> dict:
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(spec), "--batch-size", str(batch),
                                 "--out", str(out), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# (model, strategy, ranks, global batch): data and tensor parallel, 2-4 ranks, 1-4 micro-batches
CASES = [("bert_tiny", "tp=1,dp=2,zero=1", 2, 4),
         ("bert_tiny", "tp=2,dp=2,zero=1,mb=2", 4, 8),
         ("convnet_tiny", "tp=1,dp=3,zero=1,mb=2", 3, 12),
         ("bert_tiny", "tp=1,dp=4,mb=4", 4, 16),
         ("convnet_tiny", "tp=3,dp=1,zero=1", 3, 6),
         ("bert_tiny", "tp=1,dp=3,zero=2,mb=2", 3, 6),
         ("bert_tiny", "tp=2,dp=2,zero=2,mb=3", 4, 12),
         ("convnet_tiny", "tp=1,dp=2,zero=2", 2, 4),
         ("bert_tiny", "tp=1,dp=3,zero=3,mb=2", 3, 6),
         ("bert_tiny", "tp=2,dp=2,zero=3", 4, 4),
         ("convnet_tiny", "tp=1,dp=4,zero=3,mb=2", 4, 8)]


@pytest.mark.parametrize("model,strategy,ranks,batch", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_trains_like_one_process_and_sends_what_it_predicts(plans, tmp_path, model, strategy, ranks, batch):
    plan = tmp_path / "plan.json"
    optimize(plans.model(model), cpu_spec(tmp_path, ranks), plan, batch, "--strategy", strategy)
    loaded = load_plan(plan)
    mb = int(strategy.split("mb=")[1]) if "mb=" in strategy else 1
    zero = int(strategy.split("zero=")[1][0]) if "zero=" in strategy else 0
    assert loaded.training == Training(zero, mb)
    first = next(iter(loaded.model["inputs"].values()))
    assert first["dims"][0] == batch // mb                       # the graph is one micro-batch's
    doc = run_json(plan, "--steps", "2", "--check", "--optimizer", "sgd", ranks=ranks)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"] == loaded.comm_bytes
    assert sum(doc["comm_bytes"]["measured"]) > 0
    assert doc["memory_bytes"]["measured"] == doc["memory_bytes"]["predicted"]
    assert doc["memory_bytes"]["parts"]["measured"] == doc["memory_bytes"]["parts"]["predicted"]


def test_an_export_of_a_fixed_batch_takes_micro_batches_of_it(plans, tmp_path):
    """``--batch-size`` is the global batch: a dynamo export whose shapes fix the batch at 4
    plans a global batch of 16 as 4 micro-batches of 4 when the search chooses the step's
    shape (and says so), and 2 of 4 at batch 8 with ``mb=2`` given (read at the micro-batch's
    size, not refused for the global one); both train so under ``--check``, whose
    one-process run, unable to take the batch whole, runs the micro-batches one at a time
    and averages them. A global batch that is no multiple of 4 is refused, naming the
    export's shape and the way out."""
    model = plans.model("bert_tiny_dynamo")
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(cpu_spec(tmp_path, 2)), "--batch-size",
                                 "10", "--out", str(plan)])
    assert r.exit_code != 0 and "exported [4, 32]" in r.output and "a multiple of the exported batch" in r.output
    assert not plan.exists()
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(cpu_spec(tmp_path, 2)), "--batch-size",
                                 "16", "--out", str(plan), "--max-candidates", "20", "--json"])
    assert r.exit_code == 0, r.output
    assert any("fix its batch at 4" in n and "4 micro-batches of 4 (mb=4)" in n for n in json.loads(r.output)["notes"])
    assert load_plan(plan).training.micro_batches == 4
    doc = run_json(plan, "--steps", "2", "--check", ranks=2)
    assert doc["check"]["passed"], doc["check"]
    optimize(model, cpu_spec(tmp_path, 2), plan, 8, "--strategy", "tp=1,dp=2,zero=3,mb=2")
    assert load_plan(plan).training == Training(3, 2)
    doc = run_json(plan, "--steps", "2", "--check", ranks=2)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"]


def test_adam_state_on_shards_updates_like_whole_weights(plans, tmp_path):
    """Adam's state kept for a shard of the flat buffer gives the update Adam gives the whole
    weight (each element's update is its own), over several steps."""
    plan = tmp_path / "plan.json"
    optimize(plans.model("bert_tiny"), cpu_spec(tmp_path, 3), plan, 6, "--strategy", "tp=1,dp=3,zero=1,mb=2")
    doc = run_json(plan, "--steps", "3", "--check", ranks=3)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"]


def test_micro_batches_train_as_one_batch(tmp_path):
    """Two micro-batches of 4 rows and one batch of 8, from the same weights and data: the
    same losses and the same trained weights (float32 sums in another order)."""
    model = mlp_model(tmp_path / "mlp.onnx", hidden=24)
    rng = np.random.default_rng(5)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.standard_normal((16, 16)).astype(np.float32),
             labels=rng.standard_normal((16, 8)).astype(np.float32))
    runs = {}
    for name, strategy in (("whole", "tp=1,dp=2"), ("micro", "tp=1,dp=2,mb=2"), ("sharded", "tp=1,dp=2,zero=1,mb=2")):
        plan = tmp_path / f"{name}.json"
        optimize(model, SPECS / "local-cpu.yaml", plan, 8, "--strategy", strategy)
        saved = tmp_path / f"{name}.onnx"
        runs[name] = (run_json(plan, "--steps", "4", "--data", str(data), "--save", str(saved)), saved)
    import onnx
    from onnx import numpy_helper

    def weights(path):
        return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    base, base_file = runs["whole"]
    for name in ("micro", "sharded"):
        doc, saved = runs[name]
        assert doc["loss"] == pytest.approx(base["loss"], rel=1e-5)
        for k, w in weights(saved).items():
            np.testing.assert_allclose(w, weights(base_file)[k], rtol=1e-5, atol=1e-6)
    assert runs["micro"][0]["comm_bytes"]["measured"] == runs["micro"][0]["comm_bytes"]["predicted"]


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_wrong_gradient_share_is_caught_under_zero(plans, tmp_path, zero):
    """One rank's gradient 1 % off before the reduce-scatter: --check fails and names a weight."""
    plan = tmp_path / "plan.json"
    optimize(plans.model("bert_tiny"), cpu_spec(tmp_path, 2), plan, 4, "--strategy", f"tp=1,dp=2,zero={zero},mb=2")
    r = unity_run(plan, "--steps", "1", "--check", env={"UNITY_FAULT_GRAD_RANK": "1"})
    assert r.returncode != 0 and "gradient of weight" in r.stderr, r.stderr


def test_the_search_takes_micro_batches_where_nothing_fits_without(tmp_path):
    """A memory limit that one batch's activations exceed on every plan (small weights, a large
    batch: data parallelism needs the least, and too much): the search goes on to ZeRO-1 and
    then to micro-batches, and the plan it writes fits, trains and sends what it predicts."""
    model = mlp_model(tmp_path / "mlp.onnx")
    spec = SPECS / "local-cpu.yaml"
    loose = optimize(model, spec, tmp_path / "loose.json", 2048, "--strategy", "parallel_only")
    assert load_plan(tmp_path / "loose.json").training.micro_batches == 1   # (ZeRO-1 where it prices faster)
    least = min(row["max_memory_bytes"] for row in loose["baselines"].values())
    limit = int(least * 0.7)
    plan = tmp_path / "plan.json"
    doc = optimize(model, spec, plan, 2048, "--strategy", "parallel_only", "--memory-limit", f"{limit}B")
    got = load_plan(plan)
    assert got.training.micro_batches > 1
    assert max(doc["predicted"]["memory_bytes"]) <= limit
    assert next(iter(got.model["inputs"].values()))["dims"][0] == 2048 // got.training.micro_batches
    out = run_json(plan, "--steps", "2", "--check", "--optimizer", "sgd")
    assert out["check"]["passed"] and out["comm_bytes"]["measured"] == out["comm_bytes"]["predicted"]
    # the stage fixed, the micro-batches left to the search (and the other way round)
    doc = optimize(model, spec, tmp_path / "z0.json", 2048, "--strategy", "parallel_only", "--memory-limit",
                   f"{limit}B", "--zero", "0")
    z0 = load_plan(tmp_path / "z0.json").training
    assert z0.zero == 0 and z0.micro_batches > 1 and max(doc["predicted"]["memory_bytes"]) <= limit
    optimize(model, spec, tmp_path / "k4.json", 2048, "--strategy", "parallel_only", "--micro-batches", "4")
    assert load_plan(tmp_path / "k4.json").training.micro_batches == 4
    # fixed by hand, and too few micro-batches to fit: refused in one line, nothing written
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(spec), "--batch-size", "2048",
                                 "--out", str(tmp_path / "no.json"), "--memory-limit", f"{limit}B",
                                 "--strategy", "parallel_only", "--micro-batches", "1", "--zero", "0"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1 and not (tmp_path / "no.json").exists()


@pytest.mark.parametrize("text,needle", [("tp=1,dp=2,zero=4", "ZeRO stages built are 0, 1, 2, 3"),
                                         ("tp=1,dp=2,mb=0", "at least 1"),
                                         ("tp=1,dp=2,mb=²", "expected tp=T,dp=D"),
                                         ("tp=1,dp=2,recompute=sometimes", "recompute=sometimes: expected one of"),
                                         ("tp=1,dp=2,mb=3", "do not divide the batch 4")])
def test_bad_training_options_are_one_line(tmp_path, text, needle):
    model = mlp_model(tmp_path / "mlp.onnx")
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(SPECS / "local-cpu.yaml"), "--batch-size",
                                 "4", "--out", str(tmp_path / "p.json"), "--strategy", text])
    lines = r.output.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1 and needle in lines[0], r.output
    assert not (tmp_path / "p.json").exists()


def test_a_hybrid_across_nodes_trains_and_sends_what_it_predicts(tmp_path):
    """tp=2,dp=2 on two nodes of two CPU ranks behind a slow link, with weights large against
    the batch: priced at its best placement, each tensor-parallel pair spans the nodes and
    the replicas sync inside them; that plan trains like one process, bytes as predicted."""
    spec = tmp_path / "cpu-2x2.yaml"
    spec.write_text((SPECS / "local-cpu.yaml").read_text().replace("count: 1", "count: 2")
                    .replace("name: local-cpu", "name: cpu-2x2") +
                    "inter_node_link:\n  bandwidth: 0.1 GB/s\n  latency: 50 us\n")
    model = mlp_model(tmp_path / "wide.onnx", d_in=64, hidden=256, d_out=64)
    plan = tmp_path / "plan.json"
    optimize(model, spec, plan, 4, "--strategy", "tp=2,dp=2,zero=1")
    loaded = load_plan(plan)
    assert "in groups of devices 2 apart" in loaded.baselines["tp=2,dp=2,zero=1"]["description"]
    doc = run_json(plan, "--steps", "2", "--check", "--optimizer", "sgd", ranks=4)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"]


def test_a_small_llama_with_grouped_query_attention(tmp_path):
    """The small Llama-2-70B (grouped-query attention, rotary, SwiGLU, cross entropy over the
    vocabulary): tensor x data parallel with ZeRO-1 and 2 micro-batches on 4 ranks."""
    from unity_cli import zoo
    model = tmp_path / "llama.onnx"
    zoo.write("llama2-70b", model, "small")
    plan = tmp_path / "plan.json"
    optimize(model, cpu_spec(tmp_path, 4), plan, 8, "--strategy", "tp=2,dp=2,zero=1,mb=2")
    doc = run_json(plan, "--steps", "2", "--check", ranks=4)
    assert doc["loss_kind"] == "cross_entropy" and doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"]
