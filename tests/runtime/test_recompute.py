"""Activation recomputation (``ir/recompute.py``): backward runs each segment's forward again,
so forward keeps no context of a recomputed node. On real MPI ranks a recomputed step trains
like one process keeping everything (``--check``), sends the bytes its plan predicts (a
recomputed resharding sends twice), and a wrong gradient is still caught."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from models.catalog import mlp_model
from runtime.mpirun import SPECS, run_json, small_model, unity_run
from test_training_steps import cpu_spec, optimize

from unity_cli import zoo
from unity_cli.cli import cli
from unity_cli.cluster.parse import load_cluster
from unity_cli.cost.model import CostConfig, memory_account
from unity_cli.ir.recompute import Recompute, reads_weight, recomputed, segments
from unity_cli.ir.schedule import layout_sources, needs_grad
from unity_cli.ir.training import Training
from unity_cli.onnx_import import ImportOptions, import_model, import_model_proto
from unity_cli.plan.plan import load_plan, seal
from unity_cli.runtime.comm import mpi
from unity_cli.runtime.executor import build_executor
from unity_cli.runtime.footprint import planned_memory
from unity_cli.runtime.loss import LossKind
from unity_cli.runtime.model_io import weight_values
from unity_cli.runtime.optim import OptimizerConfig, OptimizerKind
from unity_cli.runtime.program import Action, StepOrder, build_program, single_device_views
from unity_cli.zoo.net import WeightMode, Weights


def _small(name: str, batch: int = 2):
    built = zoo.build(name, "small", batch, Weights(WeightMode.INLINE))
    return import_model_proto(built.model, ImportOptions(batch))


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-70b", "gpt3-175b"])
def test_a_decoder_is_cut_at_its_residual_stream(name):
    """Each decoder block is two segments (attention, then MLP), each starting at the norm
    that reads the residual stream; every activation node is in exactly one segment."""
    pcg = _small(name).pcg
    layout = layout_sources(pcg)
    segs = segments(pcg, layout)
    flat = [i for s in segs for i in s]
    assert flat == sorted(flat) and len(flat) == len(set(flat))
    assert set(flat) == {i for i, n in pcg if not n.spec.is_source and layout[i] is None}
    blocks = [s for s in segs if any(pcg.nodes[i].name.startswith(("model.layers.", "transformer.h.")) for i in s)]
    layers = zoo.lookup(name).config("small").layers
    assert len(blocks) == 2 * layers
    for j, s in enumerate(blocks):
        assert "norm" in pcg.nodes[s[0]].name or "ln_" in pcg.nodes[s[0]].name, pcg.nodes[s[0]].name
        assert sum(pcg.nodes[i].name.endswith("residual") for i in s) == 1
        if j < len(blocks) - 1:     # (the last runs on into the final norm, which reads no weight first)
            assert pcg.nodes[s[-1]].name.endswith("residual"), pcg.nodes[s[-1]].name


def test_the_order_recomputes_each_segment_before_its_backward():
    """Every step forward keeps no context of is run again before its backward, in forward
    order, after every later segment's backward; its values are dropped once it is done."""
    imported = _small("llama2-70b")
    program = build_program(imported.pcg, single_device_views(imported.pcg), None)
    order = StepOrder.of(program, Recompute.FULL)
    none = StepOrder.of(program, Recompute.NONE)
    assert not none.no_context and not none.kept and all(a in (Action.FORWARD, Action.LOSS, Action.BACKWARD)
                                                         for a, _ in none.actions)
    acts = order.actions
    assert [k for a, k in acts if a is Action.FORWARD] == list(range(len(program.steps)))
    again = [k for a, k in acts if a is Action.RECOMPUTE]
    assert sorted(again) == sorted(order.no_context) and len(again) == len(set(again))
    where = {(a, k): j for j, (a, k) in enumerate(acts)}
    for s, seg in enumerate(order.segments):
        assert list(seg) == sorted(seg)
        first = where[(Action.RECOMPUTE, seg[0])]
        assert [acts[first + j] for j in range(len(seg))] == [(Action.RECOMPUTE, k) for k in seg]
        assert all(where[(Action.BACKWARD, k)] > where[(Action.RECOMPUTE, k)] for k in seg)
        assert all(where[(Action.BACKWARD, k)] < first for k in range(seg[-1] + 1, len(program.steps)))
        assert where[(Action.DROP, s)] == where[(Action.BACKWARD, seg[0])] + 1
    out = program.output.node
    assert all(program.steps[k].node != out for k in order.no_context)


def test_forward_keeps_no_context_of_what_it_recomputes_and_the_gradients_agree(tmp_path):
    """One process, the small Llama: after forward, the recomputing executor holds the context
    of the output's node only (and of nothing that is recomputed), and its loss and every
    weight's gradient equal those of the executor that keeps everything."""
    path = tmp_path / "llama.onnx"
    zoo.write("llama2-7b", path, "small", 2)
    imported = import_model(path, ImportOptions(2))
    pcg = imported.pcg
    values = weight_values(path, imported, [pcg], 0)
    weights, constants = values.trainable, values.constants
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, size=(2, 16))
    target = rng.integers(0, 64, size=(2, 16))
    got = {}
    for mode in Recompute:
        _, _, params, ex = build_executor(pcg, single_device_views(pcg), 2, "numpy", mpi().COMM_SELF, np,
                                          weights, OptimizerConfig(OptimizerKind.SGD, 0.1), LossKind.CROSS_ENTROPY,
                                          constants, 0, Training(recompute=mode))
        held = []
        loss_step = ex._loss_step

        def spy(t, ex=ex, held=held, loss_step=loss_step):
            held.append(set(ex.ctx))
            return loss_step(t)

        ex._loss_step = spy
        loss = ex.step({"input_ids": ids}, target, apply=False)
        got[mode] = (loss, {k: np.asarray(v) for k, v in params.sync(ex.pending).items()}, held[0], ex)
    loss0, grads0, held0, ex0 = got[Recompute.NONE]
    loss1, grads1, held1, ex1 = got[Recompute.FULL]
    again = {ex1.p.steps[k].node for k in ex1.order.no_context}
    assert again and not held1 & again and held1 < held0
    assert held1 <= {ex1.p.output.node}
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    assert grads1.keys() == grads0.keys()
    for name in grads0:
        np.testing.assert_allclose(grads1[name], grads0[name], rtol=1e-5, atol=1e-7, err_msg=name)
    # selective: the weighted products keep their contexts, the rest is recomputed
    loss2, grads2, held2, ex2 = got[Recompute.SELECTIVE]
    some = {ex2.p.steps[k].node for k in ex2.order.no_context}
    assert some and some < again and held1 < held2 < held0
    assert not any(reads_weight(ex2.p.pcg, i, ex2.p.layout) for i in some)
    assert loss2 == pytest.approx(loss0, rel=1e-6)
    for name in grads0:
        np.testing.assert_allclose(grads2[name], grads0[name], rtol=1e-5, atol=1e-7, err_msg=name)


# (model, strategy, ranks, global batch): data, tensor and hybrid parallel, with ZeRO-1 and
# micro-batches, on 2-4 ranks
CASES = [("mlp", "tp=1,dp=2,recompute=full", 2, 8),
         ("bert_tiny", "tp=2,dp=1,recompute=full", 2, 4),
         ("bert_tiny", "tp=2,dp=2,zero=3,mb=2,recompute=selective", 4, 8),
         ("convnet_tiny", "tp=1,dp=3,recompute=full", 3, 6),
         ("llama2-70b", "tp=2,dp=2,mb=2,recompute=selective", 4, 8),
         ("llama2-7b", "tp=2,dp=1,zero=1,recompute=full:2", 2, 4),     # the first 2 segments only
         ("gpt3-175b", "tp=1,dp=3,zero=3,mb=2,recompute=full", 3, 6)]


@pytest.mark.parametrize("name,strategy,ranks,batch", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_recomputing_trains_like_one_process_and_sends_what_it_predicts(plans, tmp_path, name, strategy, ranks,
                                                                       batch):
    model = small_model(plans, tmp_path, name)
    spec = cpu_spec(tmp_path, ranks)
    plan = tmp_path / "plan.json"
    optimize(model, spec, plan, batch, "--strategy", strategy)
    loaded = load_plan(plan)
    head, mode = strategy.split(",recompute=")
    assert loaded.training.recompute_name == mode
    kept = tmp_path / "kept.json"
    optimize(model, spec, kept, batch, "--strategy", head)
    doc = run_json(plan, "--steps", "2", "--check", ranks=ranks)
    assert doc["check"]["passed"], doc["check"]
    assert doc["comm_bytes"]["measured"] == doc["comm_bytes"]["predicted"] == loaded.comm_bytes
    assert doc["memory_bytes"]["parts"]["measured"] == doc["memory_bytes"]["parts"]["predicted"]
    # a resharding inside a recomputed segment runs again; nothing else is sent twice
    again, once = loaded.comm_bytes, load_plan(kept).comm_bytes
    assert all(a >= b for a, b in zip(again, once, strict=True))
    if not strategy.startswith("tp=1,"):
        assert sum(again) > sum(once)
    # it holds less than the plan keeping everything would (an MLP's segments are its layers,
    # whose outputs are kept: no less), and pays a second forward
    less, more = max(doc["memory_bytes"]["measured"]), _walked(kept, ranks, doc["loss_kind"])
    assert less <= more if name == "mlp" else less < more
    assert loaded.predicted["step_time_ms"] > load_plan(kept).predicted["step_time_ms"]


def _walked(path, ranks: int, loss: str) -> int:
    """The most bytes a rank of the plan would hold (``runtime/footprint.py``, which every run
    holds equal to the measurement), without running it."""
    plan = load_plan(path)
    program = build_program(plan.pcg, plan.views, plan.pcg.shape(plan.pcg.outputs[0]).rank - 1)
    return max(planned_memory(program, r, plan.training, plan.config.get("optimizer", "adam"),
                              plan.sync_bucket_bytes, LossKind(loss))[0] for r in range(ranks))


def test_a_wrong_gradient_is_caught_under_recomputation(plans, tmp_path):
    plan = tmp_path / "plan.json"
    optimize(plans.model("bert_tiny"), cpu_spec(tmp_path, 2), plan, 4, "--strategy", "tp=2,dp=1,recompute=full")
    r = unity_run(plan, "--steps", "1", "--check", env={"UNITY_FAULT_GRAD_RANK": "1"})
    assert r.returncode != 0 and "gradient of weight" in r.stderr, r.stderr


def test_the_memory_account_keeps_only_the_segments_inputs(tmp_path):
    """Priced on one device, the small GPT: full recomputation keeps the residual stream at
    each cut and one segment's workspace, far less than every activation."""
    imported = _small("gpt3-175b", 4)
    pcg = imported.pcg
    views = single_device_views(pcg)
    devs = [v.devices(n.outputs[0]) for v, (_, n) in zip(views, pcg, strict=True)]
    layout = layout_sources(pcg)
    one = load_cluster(cpu_spec(tmp_path, 1))
    acc = {m: memory_account(pcg, devs, layout, one, CostConfig(training=Training(recompute=m))) for m in Recompute}
    none, full, some = acc[Recompute.NONE], acc[Recompute.FULL], acc[Recompute.SELECTIVE]
    for part in ("weights", "optimizer", "inputs and constants"):
        assert (none[part] == full[part]).all() and (none[part] == some[part]).all(), part
    # selective keeps what the products read: between keeping everything and the residual stream
    assert full["activations"][0] < some["activations"][0] < none["activations"][0]
    assert none["recompute workspace"].sum() == 0 < full["recompute workspace"].sum()
    # the workspace: the segments' inputs, kept until backward is done, and one segment's
    # values alive again (an attention half-block's), far less than keeping everything
    segs = recomputed(pcg, layout, needs_grad(pcg, pcg.outputs[0]), Recompute.FULL)
    assert len(segs) > 4
    assert full["activations"][0] + full["recompute workspace"][0] < none["activations"][0] / 2


def test_the_search_recomputes_only_where_nothing_fits_without(tmp_path):
    """On two ranks, a limit below what the step keeps at one sequence per micro-batch: the
    search turns recomputation on (and writes it in the plan), and the plan fits
    and trains; with room, it never recomputes. (On one device the accumulated gradients,
    beside backward's, dominate the step's peak: recomputing there saves little.)"""
    zoo.write("gpt3-175b", tmp_path / "gpt.onnx", "small")
    model = tmp_path / "gpt.onnx"
    spec = cpu_spec(tmp_path, 2)
    loose = optimize(model, spec, tmp_path / "loose.json", 8, "--strategy", "parallel_only")
    assert load_plan(tmp_path / "loose.json").training.recompute is Recompute.NONE
    at_one = optimize(model, spec, tmp_path / "one.json", 8, "--strategy", "parallel_only", "--micro-batches", "8",
                      "--recompute", "none")
    least = min(row["max_memory_bytes"] for row in at_one["baselines"].values())
    limit = int(least * 0.97)
    plan = tmp_path / "plan.json"
    doc = optimize(model, spec, plan, 8, "--strategy", "parallel_only", "--memory-limit", f"{limit}B")
    got = load_plan(plan)
    assert got.training.recompute is not Recompute.NONE and max(doc["predicted"]["memory_bytes"]) <= limit
    assert loose["predicted"]["step_time_ms"] < doc["predicted"]["step_time_ms"]
    assert got.training.micro_batches <= 8      # (the fewest with which it fits, recomputing)
    out = run_json(plan, "--steps", "2", "--check", ranks=2)
    assert out["check"]["passed"]
    # fixed to none (and no ZeRO), nothing fits: refused in one line
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(spec), "--batch-size", "8", "--out",
                                 str(tmp_path / "no.json"), "--memory-limit", f"{limit}B", "--strategy",
                                 "parallel_only", "--recompute", "none", "--zero", "0"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1 and not (tmp_path / "no.json").exists()


@pytest.mark.parametrize("args,needle", [(["--strategy", "tp=1,dp=2,recompute=some"], "recompute=some: expected one"),
                                         (["--strategy", "tp=1,dp=2,recompute=full", "--recompute", "none"],
                                          "not --zero, --micro-batches or --recompute"),
                                         (["--recompute", "half"], "--recompute 'half': expected one of"),
                                         (["--recompute", "full:0"], "--recompute 'full:0': expected one of"),
                                         (["--recompute", "none:2"], "--recompute 'none:2': expected one of"),
                                         (["--strategy", "tp=1,dp=2,recompute=full:²"], "recompute=full:²: expected"),
                                         (["--strategy", "tp=1,dp=2,recompute=full:x"], "recompute=full:x: expected"),
                                         (["--strategy", "tp=1,dp=2,recompute=full:99"],
                                          "recompute=full:99: the model has"),     # more segments than it has
                                         (["--recompute", "selective:99"], "recompute=selective:99: the model has")])
def test_bad_recompute_options_are_one_line(tmp_path, args, needle):
    model = mlp_model(tmp_path / "mlp.onnx")
    r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", str(SPECS / "local-cpu.yaml"), "--batch-size",
                                 "4", "--out", str(tmp_path / "p.json"), *args])
    assert r.exit_code != 0 and needle in r.output, r.output
    assert not (tmp_path / "p.json").exists()


def test_an_edited_recompute_field_is_refused(tmp_path):
    model = mlp_model(tmp_path / "mlp.onnx")
    plan = tmp_path / "p.json"
    optimize(model, SPECS / "local-cpu.yaml", plan, 4, "--strategy", "tp=1,dp=2,recompute=full")
    doc = json.loads(plan.read_text())
    doc["config"]["recompute"] = "selective-ish"
    plan.write_text(json.dumps(seal(doc)))     # sealed again: only the field's check can refuse it
    r = unity_run(plan, "--steps", "1")
    assert r.returncode != 0 and "config.recompute" in r.stderr and len(r.stderr.strip().splitlines()) == 1, \
        r.stderr
    for bad in (-1, "2", True, 3.5):
        doc["config"]["recompute"] = "full"
        doc["config"]["recompute_segments"] = bad
        plan.write_text(json.dumps(seal(doc)))
        r = unity_run(plan, "--steps", "1")
        assert r.returncode != 0 and "config.recompute_segments" in r.stderr, r.stderr
