"""A bucketed gradient sync on real ranks (``mpiexec``): each bucket's all-reduce starts
during backward, as soon as its gradients are whole (``ir/buckets.py``), and the run trains
exactly as the flat sync does, sends the bytes its plan predicts, and passes ``--check``."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from runtime.mpirun import MPIEXEC, SPECS, UNITY, run_json
from runtime.test_comm_bytes import assert_equal, scrambled

from unity_cli.cluster import load_cluster
from unity_cli.cost.profile import load_profile
from unity_cli.ir.buckets import sync_buckets
from unity_cli.plan.plan import load_plan
from unity_cli.runtime.program import build_program
from unity_cli.runtime.weights import weight_syncs


def buckets_of(plan) -> int:
    p = load_plan(plan)
    return len(sync_buckets(p.pcg, weight_syncs(build_program(p.pcg, p.views, None)), p.sync_bucket_bytes))


@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel"])
def test_bucketed_trains_as_flat_does(plans, strategy):
    """One weight a bucket (1 byte): every all-reduce starts during backward. With two ranks
    a sum is the same in any order, so the losses are the same to the bit."""
    flat = plans.get("bert_tiny", strategy, 2, sync_bucket="flat")
    bucketed = plans.get("bert_tiny", strategy, 2, sync_bucket="1B")
    assert json.loads(bucketed.read_text())["config"]["sync_bucket_bytes"] == 1
    assert "sync_bucket_bytes" not in json.loads(flat.read_text())["config"]
    assert buckets_of(bucketed) > buckets_of(flat) >= 1
    a = run_json(flat, "--steps", "3")
    b = run_json(bucketed, "--steps", "3", "--check")
    assert b["check"]["passed"], b["check"]
    assert a["loss"] == b["loss"]
    assert_equal(b, 2)
    assert b["phases_ms"]["measured"]["grad_sync"] > 0 and b["phases_ms"]["predicted"]["grad_sync"] > 0
    assert a["sync"] == {"bucket_bytes": 0, "all_reduces": buckets_of(flat)}
    assert b["sync"] == {"bucket_bytes": 1, "all_reduces": buckets_of(bucketed)}


def test_bucketed_over_random_views_on_three_ranks(plans, tmp_path):
    """Weights read on ranks that do not keep them, gradients sent back to their keepers: a
    bucket starts only once every rank's reads of its weights have run backward."""
    spec = tmp_path / "local-cpu-3.yaml"
    spec.write_text(plans.specs[4].read_text().replace("devices: 4", "devices: 3")
                    .replace("name: local-cpu-4", "name: local-cpu-3"))
    plan = scrambled(plans.get("bert_tiny", "data_parallel", 2, sync_bucket="2KiB"), tmp_path / "s.json",
                     load_cluster(spec), 5)
    assert buckets_of(plan) > 1
    doc = run_json(plan, "--steps", "2", "--check", "--optimizer", "sgd", ranks=3)
    assert doc["check"]["passed"], doc["check"]
    assert_equal(doc, 3)


def test_bucketed_searched_plan_on_four_ranks(plans):
    plan = plans.get("convnet_tiny", "unity", 4, sync_bucket="1KiB")
    doc = run_json(plan, "--steps", "2", "--check", ranks=4)
    assert doc["check"]["passed"], doc["check"]
    assert_equal(doc, 4)


def test_a_bucketed_plan_profiled_in_its_own_steps(plans, tmp_path):
    """`unity profile --plan` runs a bucketed plan's steps as `unity run` does, and times its
    pieces and the optimizer's fixed cost there (the buffers filled in backward, not in the
    update)."""
    plan = plans.get("bert_tiny", "data_parallel", 2, sync_bucket="16KiB")
    out = tmp_path / "profile.json"
    r = subprocess.run([str(MPIEXEC), "-n", "2", str(UNITY), "profile", "--cluster", str(SPECS / "local-cpu.yaml"),
                        "--out", str(out), "--plan", str(plan)], capture_output=True, text=True, timeout=240,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    dev = load_profile(out).to_json()["compute"]["cpu-core"]
    assert any(e.get("in_situ") for e in dev["dtypes"]["float32"].values())
    assert dev["update_s"]["adam"] >= 0
