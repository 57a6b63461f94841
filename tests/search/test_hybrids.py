"""Uniform ``tp=T,dp=D`` hybrids: Megatron tensor parallelism of degree T inside groups of T
consecutive devices, data parallelism of degree D across the groups.

What is held: every factorization of 6, 30 and 3 devices builds a valid graph whose views
put each tensor-parallel group on consecutive devices (its collectives stay inside the
group; gradient all-reduces go across); malformed or mis-sized ``--strategy`` values are
one-line errors; widths that do not divide T fall back to another split or are reported
as replicated; an MLP gets column-then-row with one Reduction per pair; embedding tables
are split by rows; ``best`` is never slower than any hybrid or baseline; a tp=2,dp=1 plan
trains on 2 MPI ranks like one process.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from models.catalog import mlp_model
from onnx import TensorProto, helper, numpy_helper
from runtime.mpirun import run_json

from unity_cli.cli import cli
from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, layout_sources
from unity_cli.errors import UsageError
from unity_cli.ir.machine_view import packed_view, parallel_axes
from unity_cli.ir.ops.gather_reduce import GatherAttrs
from unity_cli.ir.ops.parallel import CombineAttrs, ReductionAttrs, RepartitionAttrs, ReplicateAttrs, reduces_copies
from unity_cli.ir.ops.sources import WeightAttrs
from unity_cli.ir.validate import validate
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.search.baselines import hybrid, hybrid_degrees, hybrid_name, parse_hybrid
from unity_cli.search.optimize import BASELINES, HYBRID, best_hybrid, optimize, price_hybrid

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "cluster_specs"


def _spec(tmp: Path, base: str, name: str, count: int, devices: int) -> Path:
    text = (SPECS / f"{base}.yaml").read_text()
    old_nodes = "count: 32\n  devices: 6" if base == "summit-192" else "count: 1\n  devices: 2"
    assert old_nodes in text
    path = tmp / f"{name}.yaml"
    path.write_text(text.replace(old_nodes, f"count: {count}\n  devices: {devices}")
                    .replace(f"name: {base}", f"name: {name}"))
    return path


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hybrid-specs")
    return {"1x6": _spec(tmp, "summit-192", "summit-1x6", 1, 6),
            "2x3": _spec(tmp, "summit-192", "summit-2x3", 2, 3),
            "5x6": _spec(tmp, "summit-192", "summit-5x6", 5, 6),
            "cpu3": _spec(tmp, "local-cpu", "local-cpu-3", 1, 3)}


@pytest.fixture(scope="module")
def clusters(specs):
    return {k: load_cluster(p) for k, p in specs.items()}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hybrid-models")


def _mlp(folder: Path, d_in: int = 16, hidden: int = 60, d_out: int = 8) -> Path:
    """x[batch,d_in] -> fc1 -> Relu -> fc2 -> y[batch,d_out] (hidden 60: every degree of 6 and 30 divides it)."""
    return mlp_model(folder / f"mlp-{d_in}-{hidden}-{d_out}.onnx", d_in=d_in, hidden=hidden, d_out=d_out)


def _deep_mlp(folder: Path, widths=(12, 24, 12, 24, 6)) -> Path:
    """Four MatMuls with a Relu between each: two column-then-row pairs."""
    rng = np.random.default_rng(0)
    inits, nodes, cur = [], [], "x"
    for k, (a, b) in enumerate(zip(widths, widths[1:])):
        inits.append(numpy_helper.from_array((rng.standard_normal((a, b)) * 0.3).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [cur, f"w{k}"], [f"h{k}"], name=f"fc{k}"))
        cur = f"h{k}"
        if k < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [cur], [f"r{k}"], name=f"relu{k}"))
            cur = f"r{k}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", widths[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", widths[-1]])], inits)
    path = folder / "deep.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _embedding(folder: Path, vocab: int, dim: int) -> Path:
    """ids[batch,4] -> Gather(table[vocab,dim]) -> MatMul(dim x 6) -> y[batch,4,6]."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, dim)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.standard_normal((dim, 6)).astype(np.float32), "w")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0, name="emb"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6])], inits)
    path = folder / f"emb-{vocab}-{dim}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _kinds(g) -> collections.Counter:
    return collections.Counter(n.kind for _, n in g)


def _talk_groups(g, views, i):
    """The device groups parallel op ``i`` talks in (what its collective spans)."""
    n = g.nodes[i]
    x, y = g.shape(n.inputs[0]), n.outputs[0]
    vin, vout = views[n.inputs[0].node], views[i]
    match n.op:
        case RepartitionAttrs(dim=dim, degree=d):
            return vout.groups(y, dim, d)
        case CombineAttrs(dim=dim, degree=d) if dim >= 0:
            return vin.groups(x, dim, d)
        case CombineAttrs():
            return []
        case ReplicateAttrs(degree=d):
            return vout.groups(y, y.rank + 1, d)
        case ReductionAttrs(degree=d):
            return vin.groups(x, x.rank + 1 if reduces_copies(x) else x.rank, d)
    raise AssertionError(n.op)


def check_groups(g, views, tp: int, dp: int) -> None:
    """TP group k is devices k*tp .. k*tp+tp-1: every piece of an op sits in the group of its
    batch shard, tensor-parallel collectives stay inside one group, and the gradient
    all-reduce of a weight split tp ways joins one device of each group, the same shard."""
    layout = layout_sources(g)
    for i, n in g:
        y = n.outputs[0]
        if n.spec.is_source:
            continue
        if layout[i] is None and y.rank and y.degrees[0] == dp:  # computed every step, batch split
            for idx, dev in zip(np.ndindex(*parallel_axes(y)), views[i].devices(y), strict=True):
                assert dev // tp == idx[0], f"{n.name or n.kind}: batch shard {idx[0]} on device {dev}"
        if layout[i] is None and not n.spec.is_parallel_op:   # an operator the runtime runs
            assert y.pieces == tp * dp, f"{n.name}: {y}"
        elif layout[i] is None:                               # a collective between operators
            for group in _talk_groups(g, views, i):
                assert len({d // tp for d in group}) == 1, f"{n.kind} {n.op} talks across TP groups: {group}"
        elif isinstance(n.op, ReplicateAttrs) and isinstance(g.nodes[layout[i]].op, WeightAttrs) \
                and y.shard_degree in (1, tp) and n.op.degree == dp:  # the gradient all-reduce
            for group in views[i].groups(y, y.rank + 1, n.op.degree):
                assert sorted(d // tp for d in group) == list(range(dp)), group
                assert len({d % tp for d in group}) == 1, group


# -- every factorization, on 6, 30 and 3 devices --------------------------------------------------


@pytest.mark.parametrize("cluster_name", ["1x6", "2x3", "5x6", "cpu3"])
def test_every_factorization(models, clusters, cluster_name):
    cluster = clusters[cluster_name]
    n = cluster.num_devices
    pcg = import_model(_mlp(models), ImportOptions(30)).pcg
    degrees = hybrid_degrees(n, 30)
    assert [t * d for t, d in degrees] == [n] * len(degrees)
    assert len(degrees) == {6: 4, 30: 8, 3: 2}[n]             # 6 = 1x6, 2x3, 3x2, 6x1; 30 has 8 divisors
    for tp, dp in degrees:
        b = hybrid(pcg, tp, dp)
        assert b.name == hybrid_name(tp, dp) == f"tp={tp},dp={dp}" and b.devices == n
        validate(b.pcg)
        assert b.replicated == ()                              # 60 divides by every degree of 6 and 30
        cand = price_hybrid(b, cluster, CostConfig())
        assert cand.report.feasible and cand.report.step_time > 0
        check_groups(b.pcg, cand.views, tp, dp)
        fc1 = b.pcg.nodes[b.pcg.find("fc1")]
        assert fc1.outputs[0].degrees == (dp, tp)              # batch split dp ways, columns tp ways
        assert b.pcg.shape(b.pcg.nodes[b.pcg.find("fc2")].inputs[1]).degrees == (tp, 1)


def test_groups_check_catches_a_strided_layout(models, clusters):
    """The group check is not vacuous: views that interleave the groups (TP stride dp) fail it."""
    pcg = import_model(_mlp(models), ImportOptions(30)).pcg
    b = hybrid(pcg, 5, 6)
    good = price_hybrid(b, clusters["5x6"], CostConfig()).views
    bad = list(good)
    for i, n in b.pcg:
        if n.kind == "MatMul":     # batch innermost: the 5 column shards land on devices 6 apart
            r = n.outputs[0].rank
            bad[i] = packed_view(n.outputs[0], [0, r, r + 1] + list(range(r - 1, 0, -1)))
    with pytest.raises(AssertionError):
        check_groups(b.pcg, bad, 5, 6)


def test_three_cpu_ranks_layouts(models, clusters):
    pcg = import_model(_mlp(models, hidden=30), ImportOptions(6)).pcg
    tp3 = hybrid(pcg, 3, 1)
    assert tp3.pcg.nodes[tp3.pcg.find("fc1")].outputs[0].degrees == (1, 3)
    assert _kinds(tp3.pcg)["Reduction"] == 1
    dp3 = hybrid(pcg, 1, 3)
    assert _kinds(dp3.pcg)["Reduction"] == 0 and dp3.description == "tp=1,dp=3: data parallel 3 ways"
    for b in (tp3, dp3):
        cand = price_hybrid(b, clusters["cpu3"], CostConfig())
        check_groups(b.pcg, cand.views, *(int(x[3:]) for x in b.name.split(",")))


# -- --strategy tp=T,dp=D ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["tp=0,dp=8", "tp=a", "dp=3", "tp=5", "tp=2,dp=4,tp=2", "tp=2,pp=4", "tp=-2,dp=-4",
                                  "tp=2;dp=4", "tp=,dp=8", "tp=3,dp=2", "tp=16,dp=1", "zero=1", "dp=0"])
def test_malformed_strategy(text):
    with pytest.raises(UsageError) as e:
        parse_hybrid(text, 8)
    msg = str(e.value)
    assert "--strategy" in msg and ("8 devices" in msg or "T*D = 8 (the cluster's device count" in msg), msg
    assert "\n" not in msg


@pytest.mark.parametrize("text,want", [("tp=2,dp=4", (2, 4)), ("dp=4,tp=2", (2, 4)), (" tp = 8 , dp = 1 ", (8, 1)),
                                       ("TP=1,DP=8", (1, 8)), ("dp=4", (2, 4)), ("tp=8", (8, 1)),
                                       ("dp=8,zero=3,recompute=full", (1, 8))])
def test_parse_strategy(text, want):
    assert parse_hybrid(text, 8) == want


@pytest.mark.parametrize("text,needle", [("tp=0,dp=8", "T*D = 6"), ("tp=a", "T*D = 6"),
                                         ("dp=4", "dp=4 does not divide the cluster's 6 devices"),
                                         ("tp=2,dp=2", "has 6 devices"), ("tp=1,dp=6", "does not divide the batch 4")])
def test_strategy_errors_are_one_line(models, specs, tmp_path, text, needle):
    r = CliRunner().invoke(cli, ["optimize", str(_mlp(models)), "--cluster", str(specs["1x6"]), "--batch-size", "4",
                                 "--out", str(tmp_path / "p.json"), "--strategy", text])
    assert r.exit_code != 0
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--strategy" in lines[0] and needle in lines[0], r.output
    assert "Traceback" not in r.output and not (tmp_path / "p.json").exists()


def test_named_hybrid_plan(models, specs, tmp_path):
    """The plan and the summary name the hybrid and what it is; the best hybrid sits beside it."""
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, ["optimize", str(_mlp(models)), "--cluster", str(specs["2x3"]), "--batch-size", "6",
                                 "--out", str(out), "--strategy", "dp=2,tp=3"])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["strategy"] == "tp=3,dp=2"
    assert set(plan["baselines"]) == {"data_parallel", "tensor_parallel", HYBRID, "tp=3,dp=2"}
    assert plan["baselines"]["tp=3,dp=2"]["description"].startswith("tp=3,dp=2: tensor parallel 3 ways")
    assert plan["baselines"][HYBRID]["description"].startswith("tp=")
    assert "* tp=3,dp=2" in r.output and "all 2 weighted ops split 3 ways" in r.output
    # tp=3 on 2 nodes x 3 devices is the same graph as tensor_parallel (3 per node, 2 nodes)
    assert plan["baselines"]["tp=3,dp=2"]["step_time_ms"] >= plan["baselines"][HYBRID]["step_time_ms"]


# -- the Megatron policy ---------------------------------------------------------------------------


def test_mlp_is_column_then_row_per_pair(models):
    pcg = import_model(_deep_mlp(models), ImportOptions(6)).pcg
    b = hybrid(pcg, 2, 3)
    g = b.pcg
    validate(g)
    fc = [g.nodes[g.find(f"fc{k}")] for k in range(4)]
    for k in (0, 2):   # column: weight split on its output dim, output split on features, no partial sums
        assert g.shape(fc[k].inputs[1]).degrees == (1, 2) and fc[k].outputs[0].degrees == (3, 2)
        assert fc[k].outputs[0].sum_degree == 1
    for k in (1, 3):   # row: weight split on its input dim, input straight from the split Relu, partial sums
        assert g.shape(fc[k].inputs[1]).degrees == (2, 1) and fc[k].outputs[0].sum_degree == 2
        assert g.nodes[fc[k].inputs[0].node].kind == "Unary"
    kinds = _kinds(g)
    assert kinds["Reduction"] == 2 and kinds["Combine"] == 0
    for _, n in g:
        if isinstance(n.op, ReductionAttrs):
            assert g.nodes[n.inputs[0].node].name in ("fc1", "fc3") and n.op.degree == 2


def test_embedding_rows_split(models, clusters):
    pcg = import_model(_embedding(models, 30, 6), ImportOptions(6)).pcg
    for tp, dp in [(3, 2), (6, 1), (2, 3)]:
        b = hybrid(pcg, tp, dp)
        g = b.pcg
        emb = g.nodes[g.find("emb")]
        assert isinstance(emb.op, GatherAttrs)
        assert g.shape(emb.inputs[0]).degrees == (tp, 1)          # the table's rows
        assert emb.outputs[0].sum_degree == tp                     # each shard looks up its rows only
        assert emb.outputs[0].degrees[0] == dp
        assert b.replicated == ()
        check_groups(g, price_hybrid(b, clusters["1x6"], CostConfig()).views, tp, dp)


def test_embedding_falls_back_to_columns(models):
    """31 rows do not divide 3: the embedding dim is split instead, and nothing is called replicated."""
    pcg = import_model(_embedding(models, 31, 6), ImportOptions(6)).pcg
    b = hybrid(pcg, 3, 2)
    emb = b.pcg.nodes[b.pcg.find("emb")]
    assert b.pcg.shape(emb.inputs[0]).degrees == (1, 3) and emb.outputs[0].degrees == (2, 1, 3)
    assert b.replicated == () and "all 2 weighted ops split 3 ways" in b.description


def test_width_that_does_not_divide_is_reported(models):
    pcg = import_model(_mlp(models, d_in=16, hidden=32), ImportOptions(6)).pcg
    b = hybrid(pcg, 3, 2)   # 16, 32 and 8 are not multiples of 3: nothing can split
    validate(b.pcg)
    assert b.replicated == ("fc1", "fc2")
    assert "2 of 2 weighted ops stayed replicated in their group (fc1, fc2)" in b.description
    assert all(s.shard_degree == 1 for _, n in b.pcg if n.kind == "MatMul" for s in [b.pcg.shape(n.inputs[1])])
    six = hybrid(pcg, 6, 1)  # 6 does not divide 32, but 2 does: split 2 ways, 3 replicas in the group
    assert six.replicated == () and "2 split fewer than 6 ways (fc1 2, fc2 2)" in six.description
    assert six.pcg.nodes[six.pcg.find("fc1")].outputs[0].degrees == (1, 2)


def test_rows_when_columns_do_not_divide(models):
    """fc1 has 20 output columns (not a multiple of 8) but 16 input rows: it is split by rows."""
    pcg = import_model(_mlp(models, d_in=16, hidden=20, d_out=8), ImportOptions(8)).pcg
    b = hybrid(pcg, 8, 1)
    g = b.pcg
    validate(g)
    fc1, fc2 = g.nodes[g.find("fc1")], g.nodes[g.find("fc2")]
    assert g.shape(fc1.inputs[1]).degrees == (8, 1) and fc1.outputs[0].sum_degree == 8
    assert g.shape(fc2.inputs[1]).degrees == (1, 8)           # its input is whole again: columns
    assert b.replicated == ()


# -- best against every hybrid and baseline ---------------------------------------------------------


CASES = [("mlp", "1x6", 6), ("mlp", "5x6", 30), ("deep", "2x3", 6), ("emb", "1x6", 12), ("bert_tiny", "2x3", 6),
         ("wide", "1x6", 240)]   # wide: tp=2,dp=3 beats every other baseline and search start


@pytest.mark.parametrize("model,cluster_name,batch", CASES, ids=[f"{m}-{c}" for m, c, _ in CASES])
def test_best_is_never_slower(models, clusters, tiny_models, model, cluster_name, batch):
    path = {"mlp": lambda: _mlp(models), "deep": lambda: _deep_mlp(models), "emb": lambda: _embedding(models, 30, 6),
            "bert_tiny": lambda: tiny_models / "bert_tiny.onnx",
            "wide": lambda: mlp_model(models / "wide.onnx", d_in=256, hidden=1024, d_out=256, shape_only=True)}[model]()
    cluster = clusters[cluster_name]
    pcg = import_model(path, ImportOptions(batch)).pcg
    config = CostConfig()
    result = optimize(pcg, cluster, config, "best", max_candidates=30)
    best = result.chosen.report.step_time
    assert set(BASELINES) <= set(result.candidates)
    for c in result.candidates.values():
        assert best <= c.report.step_time or not c.report.feasible
    every = {hybrid_name(t, d): price_hybrid(hybrid(pcg, t, d), cluster, config, mapped=True)
             for t, d in hybrid_degrees(cluster.num_devices, batch)}
    fastest = min((c for c in every.values() if c.report.feasible), key=lambda c: c.report.step_time)
    assert [c.baseline.name for c in result.hybrids] == [k for k, c in every.items() if c.report.feasible]
    row = result.candidates[HYBRID]
    assert row.report.step_time == fastest.report.step_time
    assert row.baseline.description.startswith(fastest.baseline.name + ":")
    assert all(best <= c.report.step_time for c in every.values() if c.report.feasible)


def test_hybrids_that_cannot_fit_are_not_simulated(models, clusters):
    """Under a 6 MB limit only tp=2,dp=3 fits (weights split in two, a third of the batch): the
    others are counted out by memory alone, as the full estimate would have."""
    pcg = import_model(mlp_model(models / "wide.onnx", d_in=256, hidden=1024, d_out=256, shape_only=True),
                       ImportOptions(240)).pcg
    cluster = clusters["1x6"]
    tight = CostConfig(memory_limit=6_000_000)
    for t, d in hybrid_degrees(6, 240):
        full = price_hybrid(hybrid(pcg, t, d), cluster, tight).report
        assert full.feasible == (t == 2), (t, max(full.memory))
    row, tried = best_hybrid(pcg, cluster, tight)
    assert [c.baseline.name for c in tried] == ["tp=2,dp=3"] and row.report.feasible
    assert "3 do not fit in memory (tp=1, tp=3, tp=6)" in row.baseline.description
    none, tried = best_hybrid(pcg, cluster, CostConfig(memory_limit=1_000_000))
    assert not none.report.feasible and len(tried) == 1 and "4 do not fit" in none.baseline.description


def test_forced_hybrid_prices_as_the_sweep(models, clusters):
    pcg = import_model(_mlp(models), ImportOptions(6)).pcg
    cluster = clusters["2x3"]
    for t, d in hybrid_degrees(6, 6):
        forced = optimize(pcg, cluster, CostConfig(), f"tp={t},dp={d}")
        assert forced.chosen.baseline.name == f"tp={t},dp={d}"
        mapped = price_hybrid(hybrid(pcg, t, d), cluster, CostConfig(), mapped=True).report.step_time
        assert forced.chosen.report.step_time == mapped
        assert mapped <= price_hybrid(hybrid(pcg, t, d), cluster, CostConfig()).report.step_time
        assert forced.candidates[HYBRID].report.step_time <= forced.chosen.report.step_time


# -- it runs ------------------------------------------------------------------------------------------


def test_tp2_plan_runs_on_two_ranks(models, tmp_path):
    out = tmp_path / "tp2.json"
    r = CliRunner().invoke(cli, ["optimize", str(_mlp(models, hidden=32)), "--cluster", str(SPECS / "local-cpu.yaml"),
                                 "--batch-size", "4", "--strategy", "tp=2,dp=1", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(out.read_text())
    assert plan["strategy"] == "tp=2,dp=1"
    kinds = collections.Counter(n["op"]["kind"] for n in plan["pcg"]["nodes"])
    assert kinds["Reduction"] == 1
    doc = run_json(out, "--check", "--steps", "2", ranks=2)
    assert doc["check"]["passed"], doc["check"]
    assert doc["ranks"] == 2


def test_a_hybrid_is_priced_at_its_best_placement(tmp_path):
    """A person's tp=T,dp=D is priced as the faster of its tensor-parallel groups inside the
    nodes and the transposed grid (its replicas inside, each group across the nodes), as the
    mapping DP would lay it out: weights large and activations small, the gradient sync wants
    the fast links. The transposed views put each group on every D-th device."""
    from unity_cli.cluster.parse import parse_cluster
    doc = {"name": "two-by-four", "device_types": {"gpu": {"kind": "gpu", "peak_flops": {"float32": "19.5 TFLOP/s"},
                                                         "memory": {"bandwidth": "1.5 TB/s", "capacity": "40 GiB"}}},
           "nodes": {"count": 2, "devices": 4, "device": "gpu", "intra_link": {"bandwidth": "300 GB/s",
                                                                               "latency": "2 us"}},
           "inter_node_link": {"bandwidth": "10 GB/s", "latency": "5 us"}}
    cluster = parse_cluster(doc, "test")
    pcg = import_model(mlp_model(tmp_path / "wide.onnx", d_in=1024, hidden=4096, d_out=1024, shape_only=True),
                       ImportOptions(8)).pcg
    b = hybrid(pcg, 2, 4)
    plain = price_hybrid(b, cluster, CostConfig())
    best = price_hybrid(b, cluster, CostConfig(), mapped=True)
    assert best.report.step_time < plain.report.step_time
    assert "in groups of devices 4 apart" in best.baseline.description and best.baseline.name == "tp=2,dp=4"
    fc1 = b.pcg.find("fc1")
    devs = best.views[fc1].devices(b.pcg.nodes[fc1].outputs[0])
    assert sorted(devs) == list(range(8)) and {devs[1] - devs[0]} <= {4, 1}
    groups = best.views[fc1].groups(b.pcg.nodes[fc1].outputs[0], 1, 2)   # the column split's pairs
    assert all(abs(a - c) == 4 for a, c in groups)                       # across the two nodes


@pytest.mark.parametrize("hidden,short", [(32, True), (60, False)])
def test_a_hybrid_that_does_not_fit_says_which_ops_its_degree_could_not_split(models, specs, tmp_path, hidden,
                                                                               short):
    """tp=3 on a hidden width of 32 leaves fc1 and fc2 whole in each group: the refusal says
    so (it held the memory of no split at all); at 60 it splits every op 3 ways, and the
    refusal is the memory alone."""
    r = CliRunner().invoke(cli, ["optimize", str(_mlp(models, hidden=hidden)), "--cluster", str(specs["cpu3"]),
                                 "--batch-size", "6", "--strategy", "tp=3", "--memory-limit", "1KiB",
                                 "--out", str(tmp_path / "p.json")])
    assert r.exit_code != 0 and "tp=3,dp=1 does not fit" in r.output, r.output
    assert ("2 of 2 weighted ops split fewer than 3 ways" in r.output) == short, r.output
    assert len(r.output.strip().splitlines()) == 1
