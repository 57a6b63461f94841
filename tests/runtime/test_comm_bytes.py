"""`mpiexec -n P unity run --json`: the bytes each rank's communicator sends per training step
equal, exactly, the bytes the plan predicts for its device (``comm_bytes``)."""
from __future__ import annotations

import dataclasses
import json
import random

import pytest
from cost.test_moves import random_view
from runtime.mpirun import run_json, unity_run
from runtime.test_run_mpi import handmade_plan

from unity_cli.cluster import load_cluster
from unity_cli.cluster.collectives import Collective
from unity_cli.cost.moves import Structure, moves_of
from unity_cli.plan.plan import load_plan


def scrambled(plan_path, out, cluster, seed: int):
    """The plan on ``cluster`` (more devices than it was made for) with random machine views:
    compute ops read pieces on other devices, weights are read where they are not kept,
    parallel ops move between unrelated groups and fused pairs come apart."""
    plan = load_plan(plan_path)
    rng = random.Random(seed)
    n = cluster.num_devices
    views = tuple(random_view(node.outputs[0], n, rng) for _, node in plan.pcg)
    dataclasses.replace(plan, cluster=cluster, views=views).save(out)
    return out


def assert_equal(doc: dict, ranks: int) -> None:
    got = doc["comm_bytes"]
    assert len(got["measured"]) == len(got["predicted"]) == ranks
    assert got["measured"] == got["predicted"], got
    assert sum(got["measured"]) > 0


CASES = [("bert_tiny", "tensor_parallel", 2),      # all-reduces, all-gathers, slices
         ("convnet_tiny", "unity", 4)]             # a broadcast to 4 ranks


@pytest.mark.parametrize("model,strategy,devices", CASES, ids=[f"{m}-{s}-{d}" for m, s, d in CASES])
def test_measured_equals_predicted(plans, model, strategy, devices):
    plan = plans.get(model, strategy, devices)
    doc = run_json(plan, "--steps", "2", ranks=devices)
    assert_equal(doc, devices)
    written = json.loads(plan.read_text())
    assert written["predicted"]["comm_bytes"] == doc["comm_bytes"]["predicted"]
    assert doc["plan_sha256"] == written["content_sha256"]   # what report --measured checks
    # Each rank's peak resident memory: a Python process with numpy and the model, well under a GiB.
    assert len(doc["peak_rss_bytes"]) == devices and all(20 * 2**20 < b < 2**30 for b in doc["peak_rss_bytes"])


def test_reduce_broadcast_and_every_gradient(plans, tmp_path):
    """Partial sums reduced onto one rank and broadcast to three (a reduce and a broadcast);
    mse: every output piece's gradient goes back to its rank."""
    plan = handmade_plan(tmp_path, plans.specs[4])
    doc = run_json(plan, "--steps", "2", "--loss", "mse", ranks=4)
    assert_equal(doc, 4)


def test_random_views_read_remote_pieces(plans, tmp_path):
    """bert_tiny's 2-way tensor-parallel plan spread over 3 ranks by random views: the run
    trains like one process, and sends what the plan predicts, most of it point to point."""
    spec = tmp_path / "local-cpu-3.yaml"
    spec.write_text(plans.specs[4].read_text().replace("devices: 4", "devices: 3")
                    .replace("name: local-cpu-4", "name: local-cpu-3"))
    plan = scrambled(plans.get("bert_tiny", "tensor_parallel", 2), tmp_path / "scrambled.json", load_cluster(spec), 3)
    loaded = load_plan(plan)
    kinds = {m.kind for m in moves_of(Structure.of(loaded.pcg, 3), loaded.views)}
    assert Collective.P2P in kinds and Collective.ALL_REDUCE in kinds
    doc = run_json(plan, "--steps", "2", "--check", "--optimizer", "sgd", ranks=3)   # (adam amplifies sum-order noise)
    assert doc["check"]["passed"], doc["check"]
    assert_equal(doc, 3)


def test_summary_shows_both(plans):
    r = unity_run(plans.get("bert_tiny", "tensor_parallel", 2), "--steps", "1")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("bytes")]
    assert [row[1] for row in rows] == ["measured", "predicted"] and "(equal)" in r.stdout
    assert rows[0][2:4] == rows[1][2:4]            # rank 0's and rank 1's bytes
    lines = r.stdout.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("memory"))
    assert "measured" in lines[at] and "predicted" in lines[at] and "equal on every rank" in lines[at]
    assert any("peak resident" in line and "MiB" in line for line in lines[at + 1:at + 3])
