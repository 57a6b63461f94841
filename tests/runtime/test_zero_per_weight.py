"""Weights kept at different ZeRO stages in one step (``--strategy ...,zero[NAMES]=Z``), on
real MPI ranks: each bucket syncs, updates and gathers as its weights' stage says; the step
trains like one process (``--check``), sends exactly the bytes its plan predicts and holds
exactly the bytes the ledger predicts (``run_json``: with Adam, within the planner's
account too); a wrong gradient is caught; a pattern that names nothing is refused."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from runtime.mpirun import run_json, unity_run
from runtime.test_training_steps import cpu_spec, optimize

from unity_cli.cli import cli
from unity_cli.plan.plan import load_plan
from unity_cli.report.summary import sync_summary
from unity_cli.search.baselines import parse_strategy

# (model, strategy, ranks, global batch): every stage beside another, data and tensor parallel
CASES = [("bert_tiny", "tp=1,dp=3,zero=1,zero[*embeddings*]=3,zero[onnx::MatMul_2[78]*]=2,mb=2", 3, 6),
         ("bert_tiny", "tp=2,dp=2,zero=3,zero[*LayerNorm*]=0,zero[*word_embeddings*]=1,mb=2", 4, 8),
         ("convnet_tiny", "tp=1,dp=2,zero[body.*]=2,zero[head.weight]=3", 2, 4),
         ("llama", "tp=2,dp=2,zero=1,zero[*embed_tokens*]=3,zero[*mlp*]=2,mb=2", 4, 8)]


def _model(plans, tmp_path, name):
    if name != "llama":
        return plans.model(name)
    from unity_cli import zoo
    path = tmp_path / "llama.onnx"
    zoo.write("llama2-70b", path, "small")
    return path


@pytest.mark.parametrize("model,strategy,ranks,batch", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_weights_at_different_stages_train_like_one_process(plans, tmp_path, model, strategy, ranks, batch):
    plan = tmp_path / "plan.json"
    doc = optimize(_model(plans, tmp_path, model), cpu_spec(tmp_path, ranks), plan, batch, "--strategy", strategy)
    loaded = load_plan(plan)
    assert loaded.training == parse_strategy(strategy, ranks)[2] and loaded.training.mixed
    assert len(sync_summary(loaded)["stages"]) > 1          # its buckets are kept at more than one stage
    out = run_json(plan, "--steps", "2", "--check", ranks=ranks)
    assert out["check"]["passed"], out["check"]
    assert out["comm_bytes"]["measured"] == out["comm_bytes"]["predicted"] == loaded.comm_bytes
    assert out["memory_bytes"]["parts"]["measured"] == out["memory_bytes"]["parts"]["predicted"]
    assert out["memory_bytes"]["plan"] == doc["predicted"]["memory_bytes"]


def test_a_wrong_gradient_is_caught_with_weights_at_different_stages(plans, tmp_path):
    plan = tmp_path / "plan.json"
    optimize(plans.model("bert_tiny"), cpu_spec(tmp_path, 2), plan, 4, "--strategy",
             "tp=1,dp=2,zero=3,zero[*encoder*]=1,mb=2")
    r = unity_run(plan, "--steps", "1", "--check", env={"UNITY_FAULT_GRAD_RANK": "1"})
    assert r.returncode != 0 and "gradient of weight" in r.stderr, r.stderr


@pytest.mark.parametrize("text,needle", [("tp=1,dp=2,zero[nothing*]=3", "'nothing*' names no trainable weight"),
                                         ("tp=1,dp=2,zero[w1]=4", "zero[w1]=4: a ZeRO stage is one of"),
                                         ("tp=1,dp=2,zero[w1]=x", "a ZeRO stage is one of"),
                                         ("tp=1,dp=2,zero[w*]=1 --sync-bucket 1MiB", "--sync-bucket: ZeRO's sync "
                                          "runs flat")])
def test_a_bad_stage_per_weight_is_one_line(tmp_path, text, needle):
    from models.catalog import mlp_model
    from runtime.mpirun import SPECS
    strategy, *more = text.split(" ")
    r = CliRunner().invoke(cli, ["optimize", str(mlp_model(tmp_path / "mlp.onnx")), "--cluster",
                                 str(SPECS / "local-cpu.yaml"), "--batch-size", "4", "--out",
                                 str(tmp_path / "p.json"), "--strategy", strategy, *more])
    lines = r.output.strip().splitlines()
    assert r.exit_code != 0 and len(lines) == 1 and needle in lines[0], r.output
    assert not (tmp_path / "p.json").exists()


def test_a_plan_naming_a_weight_it_lacks_is_refused(plans, tmp_path):
    """A plan whose stages name no weight of its graph (edited, with its hash made again) is
    refused in one line naming the field."""
    from unity_cli.errors import PlanError
    from unity_cli.plan.plan import HASH_FIELD, plan_from_json
    plan = tmp_path / "plan.json"
    optimize(plans.model("bert_tiny"), cpu_spec(tmp_path, 2), plan, 4, "--strategy", "tp=1,dp=2,zero[*embed*]=3")
    data = json.loads(plan.read_text())
    data.pop(HASH_FIELD, None)
    data["config"]["zero_by_weight"] = [["*embed*", 3], ["no.such.weight", 1]]
    with pytest.raises(PlanError, match=r"config.zero_by_weight\[1\]: 'no.such.weight' names no trainable weight"):
        plan_from_json(data)
    data["config"]["zero_by_weight"] = [["*embed*", 5]]
    with pytest.raises(PlanError, match="config.zero_by_weight: expected a list"):
        plan_from_json(data)


def test_the_summary_says_the_stage_every_weight_is_kept_at(plans, tmp_path):
    """Every weight named at ZeRO-2 by a pattern (the step's own stage 0): the sync is
    ZeRO-2's, and the summary says so (not the step's flat all-reduce)."""
    from unity_cli.report.summary import sync_text
    plan = tmp_path / "plan.json"
    optimize(plans.model("bert_tiny"), cpu_spec(tmp_path, 2), plan, 4, "--strategy", "tp=1,dp=2,zero[*]=2")
    sync = sync_summary(load_plan(plan))
    assert sync["zero"] == 2 and "stages" not in sync
    assert "(ZeRO-2)" in sync_text(sync) and "all-reduce" not in sync_text(sync)
