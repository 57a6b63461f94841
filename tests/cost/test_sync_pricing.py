"""The cost model prices the gradient sync as the runtime runs it, flat or bucketed
(``ir/buckets.py``), and picks the bucket size by the profile's measured overlap."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from unity_cli.cli import cli
from unity_cli.cluster import load_cluster
from unity_cli.cost.model import SYNC_BUCKETS, CostConfig, Stream, estimate, sync_bucket_choices, weight_syncs
from unity_cli.cost.moves import Structure, node_moves
from unity_cli.cost.profile import Profile
from unity_cli.errors import ProfileError
from unity_cli.ir.buckets import sync_buckets
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.phase import Phase, StepNode
from unity_cli.ir.recompute import Recompute
from unity_cli.ir.shapes import TensorShape
from unity_cli.ir.training import Training
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.plan.config import plan_config
from unity_cli.plan.plan import load_plan
from unity_cli.runtime.phases import predicted_phases_ms
from unity_cli.search.baselines import data_parallel
from unity_cli.search.views import default_views


def profile(fraction: float | None, device: str = "a100-40gb", kind: str = "gpu", slow: bool = False) -> Profile:
    """The cluster's GPUs with a measured overlap (``slow``: and an all-reduce at 1 GB/s)."""
    fit = {"ranks": 8, "alpha_s": 2e-5, "beta_s_per_byte": 1e-9, "samples": []}
    comm = {"device_type": device, "device_kind": kind, "ranks": 8, "hosts": 1, "links": {},
            "collectives": {"all-reduce": {"intra-node": fit}} if slow else {}}
    if fraction is not None:
        comm["sync_overlap"] = {"fraction": fraction, "bytes": 4 << 20, "samples": [[1e-3, 1e-3, 1.5e-3]]}
    return Profile.from_json({"format": "unity-profile/1", "machine": {}, "settings": {}, "compute": {},
                              "comm": comm})


@pytest.fixture(scope="module")
def dp(cluster_dir, tiny_models):
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    pcg = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(64)).pcg
    g = data_parallel(pcg, cluster).pcg
    return g, default_views(g), cluster


def test_without_a_measured_overlap_the_sync_is_flat(dp):
    pcg, views, cluster = dp
    assert sync_bucket_choices(cluster, CostConfig()) == (0,)
    assert sync_bucket_choices(cluster, CostConfig(profile=profile(None))) == (0,)
    assert sync_bucket_choices(cluster, CostConfig(profile=profile(0.02))) == (0,)
    assert sync_bucket_choices(cluster, CostConfig(profile=profile(1.0, "other"))) == (0,)  # not this device type
    assert estimate(pcg, views, cluster, CostConfig()).sync_bucket == 0


def test_auto_is_the_fastest_bucket_size(dp):
    pcg, views, cluster = dp
    for fraction in (0.0, 0.5, 1.0):
        prof = profile(fraction)
        auto = estimate(pcg, views, cluster, CostConfig(profile=prof))
        each = {b: estimate(pcg, views, cluster, CostConfig(profile=prof, sync_bucket=b)) for b in (0, *SYNC_BUCKETS)}
        assert auto.step_time == min(r.step_time for r in each.values())
        assert auto.step_time == each[auto.sync_bucket].step_time
    # hidden under backward, a bucketed sync is faster than one after it
    hidden = {b: estimate(pcg, views, cluster, CostConfig(profile=profile(1.0), sync_bucket=b)).step_time
              for b in (0, 1 << 16)}
    assert hidden[1 << 16] < hidden[0]


def wide_mlp(layers: int = 6, width: int = 512, batch: int = 64):
    """A batch-split MLP whose weights are a MiB each: its gradient sync is worth hiding."""
    b = GraphBuilder()
    h = b.add1(InputAttrs(TensorShape((batch, width))), (), "x")
    for k in range(layers):
        w = b.add1(WeightAttrs(TensorShape((width, width))), (), f"w{k}")
        h = b.add1(UnaryAttrs("Relu"), (b.add1(MatMulAttrs(), (h, w), f"mm{k}"),))
    return b.build([h])


@pytest.mark.parametrize("fraction,bucketed", [(1.0, True), (0.0, False)])
def test_the_measured_overlap_decides(cluster_dir, fraction, bucketed):
    """Hidden under compute, buckets win; not hidden, their extra calls only cost: flat."""
    cluster = load_cluster(cluster_dir / "dgx-a100-8.yaml")
    g = data_parallel(wide_mlp(), cluster).pcg
    prof = profile(fraction, slow=True)
    r = estimate(g, default_views(g), cluster, CostConfig(profile=prof))
    flat = estimate(g, default_views(g), cluster, CostConfig(profile=prof, sync_bucket=0))
    assert (r.sync_bucket > 0) == bucketed
    assert (r.step_time < flat.step_time) == bucketed


def test_a_bucketed_sync_prices_every_bucket_and_its_copy(dp):
    """The same all-reduce bytes whatever the buckets; the gradient sync's busy time grows
    with the calls (each pays its latency), and filling the buffers moves from the
    optimizer's phase into backward's."""
    pcg, views, cluster = dp
    flat = estimate(pcg, views, cluster, CostConfig(sync_bucket=0))
    small = estimate(pcg, views, cluster, CostConfig(sync_bucket=1 << 16))
    assert flat.comm_bytes == small.comm_bytes
    f, s = predicted_phases_ms(flat, 8), predicted_phases_ms(small, 8)
    assert s["grad_sync"] > f["grad_sync"] > 0
    assert s["optimizer"] < f["optimizer"] and s["bwd_compute"] > f["bwd_compute"]
    st = Structure.of(pcg, 8)
    buckets = sync_buckets(pcg, weight_syncs(st, [node_moves(st, i, views) for i in range(len(pcg))]), 1 << 16)
    transfers = [e for e in small.events if e.hidden]
    assert len(transfers) == len(buckets) > 5      # one group: one transfer a bucket
    assert [e.start for e in transfers] == sorted(e.start for e in transfers)
    assert all(e.phase == "sync" and e.stream is Stream.COMM for e in transfers)
    # no overlap measured: each device's compute stream pays every transfer (and then waits
    # for the last one), and those are the phase's predicted time
    paid = sum(e.end - e.start for e in small.events if e.phase == "sync" and not e.hidden and 0 in e.devices)
    assert paid >= sum(e.end - e.start for e in transfers) * (1 - 1e-9)
    assert s["grad_sync"] * 1e-3 == pytest.approx(paid)


def wide_mlp_onnx(path, layers: int = 6, width: int = 512):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.05, f"w{k}")
             for k in range(layers)]
    nodes, h = [], "x"
    for k in range(layers):
        nodes += [helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"]), helper.make_node("Relu", [f"m{k}"], [f"h{k}"])]
        h = f"h{k}"
    g = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["batch", width])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_plan_records_the_choice_and_prices_again_the_same(tmp_path):
    path = tmp_path / "profile.json"
    profile(1.0, slow=True).save(path)
    model = wide_mlp_onnx(tmp_path / "wide.onnx")
    for bucket in ("auto", "4MiB"):
        out = tmp_path / f"plan-{bucket}.json"
        r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", "dgx-a100-8", "--batch-size", "64",
                                     "--strategy", "data_parallel", "--profile", str(path), "--sync-bucket", bucket,
                                     "--out", str(out), "--json"])
        assert r.exit_code == 0, r.output
        plan = load_plan(out)
        assert plan.sync_bucket_bytes in SYNC_BUCKETS if bucket == "auto" else plan.sync_bucket_bytes == 4 << 20
        again = estimate(plan.pcg, plan.views, plan.cluster, plan_config(plan))
        assert again.sync_bucket == plan.sync_bucket_bytes
        assert round(again.step_time * 1e3, 6) == pytest.approx(plan.predicted["step_time_ms"])


@pytest.mark.parametrize("value,message", [
    ("fast", "--sync-bucket 'fast'"), ("-4MiB", "--sync-bucket '-4MiB'"), ("0.5 B", "--sync-bucket '0.5 B'")])
def test_a_bad_bucket_size_is_one_line(tiny_models, tmp_path, value, message):
    r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "bert_tiny.onnx"), "--sync-bucket", value,
                                 "--out", str(tmp_path / "p.json")])
    assert r.exit_code != 0 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("overlap,field", [
    ({"fraction": 1.5, "bytes": 4, "samples": []}, "comm.sync_overlap.fraction"),
    ({"fraction": 0.5, "bytes": 0, "samples": []}, "comm.sync_overlap.bytes"),
    ({"fraction": 0.5, "bytes": 4, "samples": [[1, 2]]}, "comm.sync_overlap.samples"),
    ({"fraction": 0.5, "samples": []}, "comm.sync_overlap")])
def test_a_bad_overlap_names_its_field(overlap, field):
    doc = profile(None).to_json()
    doc["comm"]["sync_overlap"] = overlap
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        Profile.from_json(doc)


def _gathers_exposed(report, device: int = 0) -> float:
    """The seconds ``device``'s compute stream spends on ZeRO-3's gathers (blocked or waiting)."""
    return sum(e.end - e.start for e in report.events if e.node == StepNode.SYNC and e.comm and
               e.stream is Stream.COMPUTE and e.phase in (Phase.FWD, Phase.BWD) and device in e.devices)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_a_zero3_gather_is_prefetched_behind_the_compute_before_it(recompute):
    """Each of ZeRO-3's gathers (forward's, and a recompute's or backward's) starts where the
    one before it is needed (``ir/recompute.gathers``):
    with no overlap measured the step pays every gather in full, as before; where the profile
    measured all of an all-reduce hiding under compute, every gather but the first hides
    behind the compute of the weight before it (the MLP's layers compute longer than they
    gather), and the step is faster by the rest."""
    cluster = load_cluster(Path(__file__).resolve().parents[2] / "cluster_specs" / "dgx-a100-8.yaml")
    g = data_parallel(wide_mlp(layers=6, width=1024, batch=1 << 16), cluster).pcg
    views = default_views(g)
    training = Training(3, 1, Recompute(recompute))
    reports = {f: estimate(g, views, cluster, CostConfig(profile=profile(f), training=training))
               for f in (0.0, 1.0)}
    each = reports[0.0].comm_bytes
    assert reports[1.0].comm_bytes == each                  # the same bytes, moved earlier
    passes = 2           # forward, and the recompute's or backward's
    exposed = {f: _gathers_exposed(r) for f, r in reports.items()}
    one = exposed[0.0] / (6 * passes)                       # every gather alike: 6 weights, each pass
    assert exposed[0.0] == pytest.approx(6 * passes * one)
    assert exposed[1.0] == pytest.approx(one)               # only the first one waits
    assert reports[0.0].step_time - reports[1.0].step_time == pytest.approx((6 * passes - 1) * one)
