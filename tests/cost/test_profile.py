"""The profile DB and ``unity profile``: measuring, the file format, and how optimize uses it.

A tiny MLP is profiled in-process once (a second or so); the rest edits that document.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from unity_cli.cli import cli
from unity_cli.cluster import load_cluster
from unity_cli.cluster.collectives import Collective
from unity_cli.cost.comm import collective_time, groups_time, link_for
from unity_cli.cost.model import CostConfig, CostContext, estimate, node_cost
from unity_cli.cost.profile import Calibration, Profile, default_profile_path, fit_alpha_beta, load_profile
from unity_cli.errors import ProfileError
from unity_cli.ir import DType
from unity_cli.ir.pieces import piece_attrs
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.plan.config import plan_config
from unity_cli.plan.plan import load_plan
from unity_cli.profiling.profiler import (
    TimingPolicy,
    distinct_pieces,
    pieces_of,
    plan_graphs,
    run_profile,
)
from unity_cli.search.baselines import data_parallel
from unity_cli.search.views import default_views

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "cluster_specs" / "local-cpu.yaml"
BIN = Path(sys.executable).parent
FAST = TimingPolicy(min_repeats=2, min_seconds=0.001, max_repeats=5, max_seconds=5.0)


@pytest.fixture(scope="module")
def profiled(mlp, cluster) -> Profile:
    run = run_profile([str(mlp)], cluster, batch_size=8, policy=FAST)
    assert run.profile is not None and run.rank == 0 and run.ranks == 1
    assert run.measured == run.pieces > 0 and not run.failed and not run.skipped
    return run.profile


def _without(profile: Profile, kind: str) -> dict:
    """The profile's document with every entry of op ``kind`` removed."""
    doc = profile.to_json()
    table = doc["compute"]["cpu-core"]["dtypes"]["float32"]
    for k in [k for k, v in table.items() if v["op"] == kind]:
        del table[k]
    return doc


def _compute_pieces(pcg) -> list:
    """(node id, piece) of each compute node, in the order ``pieces_of`` yields them."""
    ids = [i for i, n in pcg if not (n.spec.is_source or n.spec.is_parallel_op)]
    return list(zip(ids, pieces_of(pcg, DType.FLOAT32), strict=True))


def _save(doc: dict, path: Path) -> Path:
    Profile.from_json(doc).save(path)
    return path


# -- the DB ----------------------------------------------------------------------------------


def test_profile_measures_every_piece_of_the_plans(profiled, mlp, cluster):
    pieces = distinct_pieces(plan_graphs([str(mlp)], cluster, 8), DType.FLOAT32)
    table = profiled.to_json()["compute"]["cpu-core"]["dtypes"]["float32"]
    assert set(table) == {p.key for p in pieces}
    assert {v["op"] for v in table.values()} == {"MatMul", "Unary"}
    for v in table.values():
        assert v["fwd_s"] > 0 and v["bwd_s"] > 0 and 2 <= v["repeats"] <= 5
    machine = profiled.to_json()["machine"]
    assert machine["backend"] == "numpy" and machine["hostname"] and machine["numpy"]


def test_round_trip_is_byte_identical(profiled, tmp_path):
    a = tmp_path / "a.json"
    profiled.save(a)
    loaded = load_profile(a)
    b = tmp_path / "b.json"
    loaded.save(b)
    assert a.read_bytes() == b.read_bytes()
    assert loaded == profiled and hash(loaded) == hash(profiled) and loaded.sha256 == profiled.sha256
    assert json.loads(a.read_text())["format"] == "unity-profile/1"
    assert list(json.loads(a.read_text())) == sorted(json.loads(a.read_text()))


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(format="unity-profile/0"), "format"),
    (lambda d: d.pop("comm"), "comm: missing"),
    (lambda d: next(iter(d["compute"]["cpu-core"]["dtypes"]["float32"].values())).update(fwd_s=-1.0), "fwd_s"),
    (lambda d: next(iter(d["compute"]["cpu-core"]["dtypes"]["float32"].values())).update(repeats="5"), "repeats"),
    (lambda d: d["compute"]["cpu-core"].update(kind="tpu"), "compute.cpu-core.kind"),
    (lambda d: d["compute"]["cpu-core"]["dtypes"].update(int8={}), "compute.cpu-core.dtypes.int8"),
    (lambda d: d["comm"]["links"].update({"intra-node": {"latency_s": 1e-6, "bandwidth_Bps": 0, "samples": []}}),
     "comm.links.intra-node.bandwidth_Bps"),
    (lambda d: d["comm"]["collectives"].update({"all-sum": {}}), "comm.collectives.all-sum"),
    (lambda d: d["compute"]["cpu-core"].update(dispatch_s=-1e-6), "compute.cpu-core.dispatch_s"),
    (lambda d: d["compute"]["cpu-core"]["update_s"].update(lamb=1e-6), "compute.cpu-core.update_s.lamb"),
    (lambda d: next(iter(d["compute"]["cpu-core"]["dtypes"]["float32"].values())).pop("roof_bwd_s"),
     "roof_fwd_s and roof_bwd_s come together"),
    (lambda d: next(iter(d["compute"]["cpu-core"]["dtypes"]["float32"].values())).update(roof_fwd_s=-1.0),
     "roof_fwd_s"),
])
def test_bad_file_is_one_line_naming_the_field(profiled, tmp_path, edit, field):
    doc = profiled.to_json()
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProfileError) as e:
        load_profile(bad)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(bad) in msg and field in msg, msg


def test_bad_file_through_the_cli(tmp_path, mlp):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = CliRunner().invoke(cli, ["optimize", str(mlp), "--cluster", str(LOCAL), "--profile", str(bad),
                                 "--out", str(tmp_path / "p.json"), "--strategy", "data_parallel"])
    assert r.exit_code == 1
    lines = [x for x in r.output.splitlines() if x]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(bad) in lines[0], r.output


# -- the cost model --------------------------------------------------------------------------


def test_entries_record_their_roofline(profiled, cluster):
    table = profiled.to_json()["compute"]["cpu-core"]["dtypes"]["float32"]
    assert all(v["roof_fwd_s"] > 0 and v["roof_bwd_s"] > 0 for v in table.values())


def _doc(entries: dict) -> dict:
    """A profile document of one cpu-core with these op entries."""
    return {"format": "unity-profile/1", "machine": {}, "settings": {},
            "compute": {"cpu-core": {"kind": "cpu", "dtypes": {"float32": entries}}},
            "comm": {"device_type": None, "device_kind": None, "ranks": 1, "hosts": 1, "links": {},
                     "collectives": {}}}


def _entry(op: str, fwd: float, roof: float) -> dict:
    return {"op": op, "fwd_s": fwd, "bwd_s": 2 * fwd, "repeats": 5, "roof_fwd_s": roof, "roof_bwd_s": 2 * roof}


def test_unmeasured_pieces_follow_the_fit_of_their_kind(cluster):
    """MatMuls measured at 5 us + 2x their roofline: an unmeasured MatMul costs that line; a
    kind never measured gets the line of all kinds; a profile without rooflines (written
    before they were recorded) leaves unmeasured pieces on the bare roofline."""
    device = cluster.device_type(0)
    entries = {f"mm{k}": _entry("MatMul", 5e-6 + 2 * r, r) for k, r in enumerate((1e-6, 1e-5, 1e-4))}
    entries["relu"] = _entry("Unary", 4e-6, 1e-6)
    prof = Profile.from_json(_doc(entries))
    fwd, bwd = prof.unmeasured(device, "float32", "MatMul", 5e-5, 1e-4)
    assert fwd == pytest.approx(5e-6 + 1e-4, rel=1e-6) and bwd == pytest.approx(1e-5 + 2e-4, rel=1e-6)
    assert prof.unmeasured(device, "float32", "Unary", 3e-6, 6e-6) == pytest.approx((12e-6, 24e-6))  # its ratio
    fwd, _ = prof.unmeasured(device, "float32", "Softmax", 1e-5, 2e-5)   # nothing of its kind: all kinds' line
    assert fwd > 1e-5
    assert prof.unmeasured(device, "float64", "MatMul", 1e-5, 2e-5) is None
    old = _doc({k: {f: v[f] for f in ("op", "fwd_s", "bwd_s", "repeats")} for k, v in entries.items()})
    assert Profile.from_json(old).unmeasured(device, "float32", "MatMul", 1e-5, 2e-5) is None


def test_a_plan_of_unmeasured_pieces_is_not_cheaper_than_the_measured_one(profiled, mlp, cluster):
    """The search must not prefer pieces only because nobody timed them: data parallelism of
    the MLP at batch 64 (pieces of 32 rows the profile, taken at batch 8, never ran) must
    not come out cheaper than at batch 8. On the bare roofline it did (0.058 ms against
    0.067 ms)."""
    config = CostConfig(profile=profiled)
    at8 = estimate(*_dp(mlp, cluster, 8), cluster, config).step_time
    at64 = estimate(*_dp(mlp, cluster, 64), cluster, config).step_time
    assert at64 > at8


def _dp(mlp: Path, cluster, batch: int):
    pcg = data_parallel(import_model(str(mlp), ImportOptions(batch, {})).pcg, cluster).pcg
    return pcg, default_views(pcg)


def test_measured_ops_replace_the_roofline(profiled, mlp, cluster, tmp_path):
    """Relu is left out of the profile: MatMuls cost what was measured, Relu its roofline as
    the profile's measurements correct it (no Relu measured: the fit over all kinds); both
    plus the runtime's measured dispatch per task."""
    path = _save(_without(profiled, "Unary"), tmp_path / "prof.json")
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(mlp), "--cluster", str(LOCAL), "--batch-size", "8",
                                 "--strategy", "data_parallel", "--profile", str(path), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert any(str(path) in n for n in json.loads(r.output)["notes"])
    plan = load_plan(out)
    prof = load_profile(path)
    assert plan.config["profile"] == {"path": str(path), "sha256": prof.sha256}
    config = plan_config(plan)
    assert config.profile == prof
    measured = CostContext.of(plan.pcg, plan.cluster, config)
    roofline = CostContext.of(plan.pcg, plan.cluster, CostConfig())
    table = prof.to_json()["compute"]["cpu-core"]["dtypes"]["float32"]
    kinds = set()
    half = prof.to_json()["compute"]["cpu-core"]["dispatch_s"] / 2
    assert 0 < half < 1e-3
    fit_f = Calibration.fit([(e["roof_fwd_s"], e["fwd_s"]) for e in table.values()])
    fit_b = Calibration.fit([(e["roof_bwd_s"], e["bwd_s"]) for e in table.values()])
    for i, piece in _compute_pieces(plan.pcg):
        got = node_cost(measured, i, plan.views)
        if piece.kind == "MatMul":
            entry = table[piece.key]
            assert (got.compute_fwd, got.compute_bwd) == (entry["fwd_s"] + half, entry["bwd_s"] + half)
        else:
            base = node_cost(roofline, i, plan.views)
            device = plan.cluster.device_type(plan.views[i].devices(plan.pcg.nodes[i].outputs[0])[0])
            fwd, bwd = prof.unmeasured(device, "float32", "Unary", base.compute_fwd, base.compute_bwd)
            assert (got.compute_fwd, got.compute_bwd) == (fwd + half, bwd + half)
            # the fit over every kind measured there, never below the roofline: whether the
            # machine beats the roofline or not (a fast CI core may) is not the test's business
            assert (fwd, bwd) == (fit_f(base.compute_fwd), fit_b(base.compute_bwd))
            assert fwd >= base.compute_fwd and bwd >= base.compute_bwd
        kinds.add(piece.kind)
    assert kinds == {"MatMul", "Unary"}
    plain = estimate(plan.pcg, plan.views, plan.cluster, CostConfig())  # the cache keys on the profile
    assert plain.step_time * 1e3 != pytest.approx(plan.predicted["step_time_ms"], rel=1e-9)
    # the plan's prediction is the profiled cost of its own graph and views
    again = estimate(plan.pcg, plan.views, plan.cluster, config)
    assert again.step_time * 1e3 == pytest.approx(plan.predicted["step_time_ms"], abs=1e-6)


def test_measured_links_and_collectives(cluster):
    """A collective measured at 2 ranks costs its fit; others use the measured link."""
    doc = {"format": "unity-profile/1", "machine": {}, "settings": {}, "compute": {},
           "comm": {"device_type": "cpu-core", "device_kind": "cpu", "ranks": 2, "hosts": 1,
                    "links": {"intra-node": {"latency_s": 3e-6, "bandwidth_Bps": 2e9, "samples": []}},
                    "collectives": {"all-reduce": {"intra-node": {"ranks": 2, "alpha_s": 7e-6,
                                                                  "beta_s_per_byte": 1e-9, "samples": []}}}}}
    prof = Profile.from_json(doc)
    assert prof.fits(cluster) and prof.num_ops == 0
    groups = [(0, 1)]
    assert groups_time(Collective.ALL_REDUCE, 1000, cluster, groups, prof) == pytest.approx(7e-6 + 1e-6)
    link = link_for(cluster, (0, 1), prof)
    assert (link.latency, link.bandwidth) == (3e-6, 2e9)
    assert groups_time(Collective.ALL_GATHER, 1000, cluster, groups, prof) == collective_time(
        Collective.ALL_GATHER, 1000, 2, link)
    assert groups_time(Collective.ALL_GATHER, 1000, cluster, groups) == collective_time(
        Collective.ALL_GATHER, 1000, 2, cluster.link_for((0, 1)))


def test_every_piece_of_a_real_model_is_found(tiny_models, cluster):
    """The cost model looks pieces up under the key the profiler stores them by, Reshape's
    piece attrs and integer Gather indices included (times are fake: nothing is run)."""
    graphs = plan_graphs([str(tiny_models / "bert_tiny.onnx")], cluster, 4)
    pieces = distinct_pieces(graphs, DType.FLOAT32)
    assert {"Reshape", "Gather", "MatMul"} <= {p.kind for p in pieces}
    table = {p.key: {"op": p.kind, "fwd_s": 1e-3 * (k + 1), "bwd_s": 2e-3 * (k + 1), "repeats": 1}
             for k, p in enumerate(pieces)}
    doc = {"format": "unity-profile/1", "machine": {}, "settings": {},
           "compute": {"cpu-core": {"kind": "cpu", "dtypes": {"float32": table}}},
           "comm": {"device_type": None, "device_kind": None, "ranks": 1, "hosts": 1, "links": {},
                    "collectives": {}}}
    config = CostConfig(profile=Profile.from_json(doc))
    for pcg in graphs:
        ctx = CostContext.of(pcg, cluster, config)
        views = default_views(pcg)
        for i, piece in _compute_pieces(pcg):
            assert piece.op == piece_attrs(pcg.nodes[i])  # what the runtime runs
            c = node_cost(ctx, i, views)
            assert (c.compute_fwd, c.compute_bwd) == (table[piece.key]["fwd_s"], table[piece.key]["bwd_s"]), piece


def test_fit_alpha_beta_recovers_a_line():
    samples = [(n, 2e-6 + n / 5e9) for n in (8, 512, 32768, 2**21)]
    a, b = fit_alpha_beta(samples)
    assert a == pytest.approx(2e-6, rel=1e-6) and 1 / b == pytest.approx(5e9, rel=1e-6)


# -- the default location --------------------------------------------------------------------


def _optimize_json(mlp: Path, out: Path, *extra: str) -> dict:
    r = CliRunner().invoke(cli, ["optimize", str(mlp), "--cluster", str(LOCAL), "--batch-size", "8",
                                 "--strategy", "data_parallel", "--out", str(out), "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_default_location(profiled, mlp, tmp_path):
    before = _optimize_json(mlp, tmp_path / "before.json")
    assert not before["notes"] and "profile" not in load_plan(tmp_path / "before.json").config
    default = default_profile_path("local-cpu")
    assert default.parent == Path(os.environ["UNITY_PROFILE_DIR"])
    profiled.save(default)
    used = _optimize_json(mlp, tmp_path / "used.json")
    assert any(str(default) in n and "--no-profile" in n for n in used["notes"])
    assert load_plan(tmp_path / "used.json").config["profile"]["sha256"] == profiled.sha256
    off = _optimize_json(mlp, tmp_path / "off.json", "--no-profile")
    assert (tmp_path / "off.json").read_bytes() == (tmp_path / "before.json").read_bytes()
    assert not off["notes"]
    other = profiled.to_json()
    other["compute"]["a100-40gb"] = other["compute"].pop("cpu-core")
    other["compute"]["a100-40gb"]["kind"] = "gpu"
    _save(other, default)
    ignored = _optimize_json(mlp, tmp_path / "ignored.json")
    assert any("ignored" in n for n in ignored["notes"])
    assert (tmp_path / "ignored.json").read_bytes() == (tmp_path / "before.json").read_bytes()


@pytest.fixture
def thread_env(monkeypatch):
    """`unity profile` sets BLAS thread variables in its process: undo them after the test."""
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(v, "1")  # records the original value (or its absence) for undo
        monkeypatch.delenv(v)


def test_profile_command_merges_into_the_default_file(mlp, tmp_path, thread_env):
    r = CliRunner().invoke(cli, ["profile", "--cluster", str(LOCAL), "--model", str(mlp), "--batch-size", "4",
                                 "--max-seconds", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["profile"] == str(default_profile_path("local-cpu")) and doc["measured"] == doc["pieces"] > 0
    r = CliRunner().invoke(cli, ["profile", "--cluster", str(LOCAL), "--model", str(mlp), "--batch-size", "2",
                                 "--max-seconds", "2"])
    assert r.exit_code == 0, r.output
    assert "kept" in r.output and "wrote" in r.output
    assert load_profile(doc["profile"]).num_ops > doc["measured"]


# -- communication under MPI -----------------------------------------------------------------


@pytest.mark.skipif(not (BIN / "mpiexec").exists(), reason="no mpiexec in the venv")
def test_mpiexec_measures_links_and_collectives(tmp_path):
    out = tmp_path / "comm.json"
    unity = shutil.which("unity", path=str(BIN)) or str(BIN / "unity")
    r = subprocess.run([str(BIN / "mpiexec"), "-n", "2", unity, "profile", "--cluster", str(LOCAL),
                        "--out", str(out)], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("wrote") == 1  # rank 0 alone writes and prints
    comm = load_profile(out).to_json()["comm"]
    assert comm["ranks"] == 2 and comm["device_type"] == "cpu-core"
    link = comm["links"]["intra-node"]
    assert link["latency_s"] > 0 and link["bandwidth_Bps"] > 0
    for name in ("all-reduce", "all-gather", "broadcast", "reduce"):
        fit = comm["collectives"][name]["intra-node"]
        assert fit["ranks"] == 2 and fit["alpha_s"] >= 0 and fit["beta_s_per_byte"] > 0
    prof = load_profile(out)
    assert prof.link("intra-node") is not None and prof.collective("all-reduce", "intra-node", 2) is not None
    # how much of a nonblocking all-reduce hides under compute: measured, a share
    ov = comm["sync_overlap"]
    assert 0 <= ov["fraction"] <= 1 and ov["bytes"] == 4 << 20 and len(ov["samples"]) >= 5
    assert all(alone > 0 and compute > 0 and both > 0 for alone, compute, both in ov["samples"])
    assert prof.sync_overlap(load_cluster(LOCAL).nodes[0].device) == ov["fraction"]


def test_update_overhead_is_added_per_weight_piece(profiled, mlp, cluster):
    """Each stored trainable weight piece pays the measured fixed cost of its optimizer update."""
    per = profiled.to_json()["compute"]["cpu-core"]["update_s"]
    assert set(per) == {"sgd", "momentum", "adam"} and all(0 < t < 1e-3 for t in per.values())
    g = import_model(mlp, ImportOptions(8)).pcg
    views = default_views(g)
    bare = Profile.from_json({**profiled.to_json(), "compute": {
        "cpu-core": {**profiled.to_json()["compute"]["cpu-core"], "update_s": {}}}})
    with_update = estimate(g, views, cluster, CostConfig(profile=profiled))
    without = estimate(g, views, cluster, CostConfig(profile=bare))
    weights = sum(1 for _, n in g if n.kind == "Weight")
    assert with_update.step_time - without.step_time == pytest.approx(weights * per["adam"], rel=1e-6)


def test_a_plans_pieces_are_timed_inside_training_steps(mlp, tmp_path):
    """``--plan`` for this job's rank count: its pieces' entries come from real steps of the
    executor (minus the dispatch the cost model adds back), not from kernels in a loop."""
    spec = tmp_path / "one.yaml"
    spec.write_text(LOCAL.read_text().replace("devices: 2", "devices: 1").replace("name: local-cpu", "name: one"))
    one = load_cluster(spec)
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(cli, ["optimize", str(mlp), "--cluster", str(spec), "--batch-size", "8", "--strategy",
                                 "data_parallel", "--out", str(plan), "--no-profile"])
    assert r.exit_code == 0, r.output
    alone = run_profile([str(mlp)], one, batch_size=8, policy=FAST).profile
    situ = run_profile([], one, batch_size=8, policy=FAST, plans=[str(plan)]).profile
    a = alone.to_json()["compute"]["cpu-core"]["dtypes"]["float32"]
    s = situ.to_json()["compute"]["cpu-core"]["dtypes"]["float32"]
    keys = {p.key for p in pieces_of(load_plan(plan).pcg, DType.FLOAT32)}
    assert keys <= set(s) and keys <= set(a)
    assert all(s[k]["repeats"] == 10 for k in keys)            # 12 steps, 2 of warm-up
    assert any(s[k]["fwd_s"] != a[k]["fwd_s"] for k in keys)     # another measurement
    # marked, with the alone time of the same run beside it and the roofline
    assert all(s[k]["in_situ"] and s[k]["alone_fwd_s"] > 0 and s[k]["roof_fwd_s"] > 0 for k in keys)
    assert not any(v.get("in_situ") for v in a.values())


def test_pieces_timed_only_alone_are_scaled_to_steps(cluster):
    """Pieces run slower inside steps: a MatMul timed both ways at 1.5x sets the ratio for
    a MatMul timed only alone; a kind never timed in steps gets the ratio of all kinds; a
    profile with no piece timed in steps is taken as it is."""
    device = cluster.device_type(0)
    both = {**_entry("MatMul", 3e-6, 1e-6), "fwd_s": 3e-6, "bwd_s": 6e-6, "in_situ": True,
            "alone_fwd_s": 2e-6, "alone_bwd_s": 3e-6}
    entries = {"both": both, "mm": _entry("MatMul", 4e-6, 1e-6), "relu": _entry("Unary", 1e-6, 1e-7)}
    prof = Profile.from_json(_doc(entries))
    assert prof.op_time(device, "float32", "both").fwd == 3e-6                      # as measured in steps
    mm = prof.op_time(device, "float32", "mm")
    assert (mm.fwd, mm.bwd) == pytest.approx((4e-6 * 1.5, 8e-6 * 2.0))
    relu = prof.op_time(device, "float32", "relu")
    assert (relu.fwd, relu.bwd) == pytest.approx((1.5e-6, 4e-6))
    alone = Profile.from_json(_doc({"mm": entries["mm"]}))
    assert alone.op_time(device, "float32", "mm").fwd == 4e-6
    bad = {**entries["mm"], "alone_fwd_s": 1e-6, "alone_bwd_s": 1e-6}
    with pytest.raises(ProfileError, match="only a piece timed in steps"):
        Profile.from_json(_doc({"mm": bad}))


def test_parallel_op_tasks_pay_the_executors_own_work_as_compute(profiled, mlp, cluster):
    """The executor runs a moving parallel op as a task like a compute one, and the runtime
    counts its work around the calls as compute: with a profile, each direction that moves
    data costs the link model as communication, plus half the measured dispatch as compute,
    or the ``parallel_task_s`` timed in steps where the profile has it."""
    from unity_cli.search.baselines import tensor_parallel  # noqa: PLC0415

    pcg = tensor_parallel(import_model(str(mlp), ImportOptions(8, {})).pcg, cluster).pcg
    views = default_views(pcg)
    doc = profiled.to_json()
    half = doc["compute"]["cpu-core"]["dispatch_s"] / 2
    doc["compute"]["cpu-core"]["dispatch_s"] = 0.0
    without = CostContext.of(pcg, cluster, CostConfig(profile=Profile.from_json(doc)))
    doc["compute"]["cpu-core"]["parallel_task_s"] = 3e-5
    timed = CostContext.of(pcg, cluster, CostConfig(profile=Profile.from_json(doc)))
    with_dispatch = CostContext.of(pcg, cluster, CostConfig(profile=profiled))
    moving = 0
    for i, n in pcg:
        if n.spec.is_parallel_op:
            a, b, c = (node_cost(ctx, i, views) for ctx in (with_dispatch, without, timed))
            assert (a.comm_fwd, a.comm_bwd) == (b.comm_fwd, b.comm_bwd) == (c.comm_fwd, c.comm_bwd)
            assert (b.compute_fwd, b.compute_bwd) == (0.0, 0.0)
            assert a.compute_fwd == pytest.approx(half if b.comm_fwd else 0.0)
            assert a.compute_bwd == pytest.approx(half if b.comm_bwd else 0.0)
            assert (c.compute_fwd, c.compute_bwd) == (3e-5 if b.comm_fwd else 0.0, 3e-5 if b.comm_bwd else 0.0)
            moving += b.comm_fwd > 0
    assert moving > 0


def test_every_call_pays_the_profiles_call_overhead(profiled, cluster):
    """``comm.call_overhead_s`` of a phase is added once per call the runtime makes in it: one
    exchange for a phase's messages, one call per class of collectives (disjoint groups run
    at once); a phase it was not measured in pays the mean of those it was."""
    from unity_cli.cluster.collectives import Collective  # noqa: PLC0415
    from unity_cli.cost.moves import Move, phase_seconds  # noqa: PLC0415

    doc = profiled.to_json()
    doc["comm"]["call_overhead_s"] = {"fwd": 1e-5, "bwd": 2e-5}
    over = Profile.from_json(doc)
    moves = [Move(Collective.P2P, "fwd", (0, 1), 4096), Move(Collective.P2P, "fwd", (1, 0), 4096),
             Move(Collective.ALL_REDUCE, "fwd", (0, 1), 1024), Move(Collective.ALL_GATHER, "bwd", (0, 1), 512),
             Move(Collective.ALL_REDUCE, "bwd", (0, 1), 1024)]
    base, more = phase_seconds(moves, cluster, profiled), phase_seconds(moves, cluster, over)
    assert more["fwd"] == pytest.approx(base["fwd"] + 2e-5)      # the exchange and the all-reduce
    assert more["bwd"] == pytest.approx(base["bwd"] + 4e-5)      # two collectives
    assert phase_seconds([], cluster, over) == {}
    assert (over.call_overhead("fwd"), over.call_overhead("sync")) == (1e-5, pytest.approx(1.5e-5))
    assert profiled.call_overhead("fwd") == 0.0
    doc["comm"]["call_overhead_s"] = {"fwd": -1.0}
    with pytest.raises(ProfileError, match=r"comm\.call_overhead_s\.fwd: expected a non-negative number"):
        Profile.from_json(doc)
    doc["comm"]["call_overhead_s"] = {"update": 1e-5}
    with pytest.raises(ProfileError, match=r"comm\.call_overhead_s\.update: unknown phase"):
        Profile.from_json(doc)
    doc["comm"].pop("call_overhead_s")
    doc["compute"]["cpu-core"]["parallel_task_s"] = "fast"
    with pytest.raises(ProfileError, match=r"compute\.cpu-core\.parallel_task_s: expected a non-negative"):
        Profile.from_json(doc)


def test_the_loss_runs_between_forward_and_backward(profiled, mlp, cluster):
    """With a profile, the step pays the runtime's measured loss once, on the output's
    devices, after the last forward event and before the first backward one, beside the
    loss's passes over the output (which a profile without it still pays)."""
    loss = profiled.to_json()["compute"]["cpu-core"]["loss_s"]
    assert 0 < loss < 1e-2
    pcg, views = _dp(mlp, cluster, 8)
    doc = profiled.to_json()
    doc["compute"]["cpu-core"]["loss_s"] = 0.0
    with_loss = estimate(pcg, views, cluster, CostConfig(profile=profiled))
    without = estimate(pcg, views, cluster, CostConfig(profile=Profile.from_json(doc)))
    assert with_loss.step_time == pytest.approx(without.step_time + loss)
    # (the loss's gathering and its loss-value all-reduce are a communication event before it)
    (event,) = [e for e in with_loss.events if e.phase == "loss" and not e.comm]
    assert event.devices == views[pcg.outputs[0].node].devices(pcg.nodes[pcg.outputs[0].node].outputs[0])
    assert max(e.end for e in with_loss.events if e.phase == "fwd") <= event.start
    assert min(e.start for e in with_loss.events if e.phase == "bwd") >= event.end
    (bare,) = [e for e in without.events if e.phase == "loss" and not e.comm]
    assert event.end - event.start == pytest.approx(bare.end - bare.start + loss)


def test_calibration_survives_what_real_profiles_hold(cluster):
    """Times that do not grow with the roofline (small CPU pieces), a piece with no backward
    (timed 0 in steps), and absurd magnitudes: the fit stays a ratio of times, never prices
    a piece below its roofline, ignores the zeros, and never raises."""
    from unity_cli.cost.profile import Calibration  # noqa: PLC0415

    device = cluster.device_type(0)
    flat = Calibration.fit([(1e-6, 5e-5), (2e-6, 4e-5), (4e-6, 3e-5)])
    assert flat(1e-2) >= 1e-2                                   # not 30 us for a 10 ms piece
    line = [(r, 5e-6 + 2 * r) for r in (1e-6, 1e-5, 1e-4)]
    assert Calibration.fit([*line, (5e-6, 0.0)]) == Calibration.fit(line)
    inactive = {**_entry("MatMul", 3e-6, 1e-6), "bwd_s": 0.0, "in_situ": True, "alone_fwd_s": 2e-6,
                "alone_bwd_s": 3e-6}
    prof = Profile.from_json(_doc({"inactive": inactive, "mm": _entry("MatMul", 4e-6, 1e-6)}))
    mm = prof.op_time(device, "float32", "mm")
    assert mm.fwd == pytest.approx(6e-6) and mm.bwd == pytest.approx(8e-6)   # bwd: no usable ratio, kept
    assert prof.unmeasured(device, "float32", "MatMul", 1e-6, 2e-6)[1] > 0
    odd = {"a": {**_entry("MatMul", 1e-300, 1e300)}, "b": {**_entry("MatMul", 1e-300, 1.5e300)},
           "c": {**_entry("Unary", 1e-6, 1e-7), "in_situ": True, "alone_fwd_s": 5e-324, "alone_bwd_s": 5e-324}}
    odd_prof = Profile.from_json(_doc(odd))
    assert odd_prof.op_time(device, "float32", "a") is not None
    for kind in ("MatMul", "Unary", "Softmax"):
        got = odd_prof.unmeasured(device, "float32", kind, 1e-6, 2e-6)
        assert got is None or all(v >= 0 and v < float("inf") for v in got)


def test_saving_never_writes_through_a_planted_temp_name(profiled, tmp_path):
    """The old writer used the fixed name ``F.tmp``: a symlink planted there sent the
    profile over another file. Now the temp file is fresh (mkstemp) and renamed over F."""
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "p.json"
    (tmp_path / "p.json.tmp").symlink_to(victim)
    profiled.save(out)
    assert victim.read_text() == "keep me"
    assert load_profile(out).text == profiled.text
