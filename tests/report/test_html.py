"""`unity report`: one self-contained HTML page per plan (diagram, timeline, memory, strategies)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from unity_cli.cli import cli
from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, estimate, layout_sources
from unity_cli.ir.ops.sources import WeightAttrs
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.plan.build import make_plan
from unity_cli.plan.plan import load_plan
from unity_cli.report.diagram import build_diagram
from unity_cli.report.html import ReportOptions, render_report, write_report
from unity_cli.report.layout import find_groups, layered_layout
from unity_cli.report.markup import ms
from unity_cli.search.optimize import optimize

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"
EXPORTED = Path(__file__).resolve().parents[1] / "models" / "exported"
BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome", "google-chrome-stable")


def plan_for(model: Path, strategy: str, batch: int = 16, spec: str = "dgx-a100-8.yaml"):
    cluster = load_cluster(SPECS / spec)
    imported = import_model(model, ImportOptions(batch, {}))
    return make_plan(imported, cluster, CostConfig(), optimize(imported.pcg, cluster, CostConfig(), strategy))


@pytest.fixture(scope="module")
def bert_tp(tiny_models):
    return plan_for(tiny_models / "bert_tiny.onnx", "tensor_parallel")


@pytest.fixture(scope="module")
def bert_dp(tiny_models):
    return plan_for(tiny_models / "bert_tiny.onnx", "data_parallel")


def svg(page: str, ident: str) -> str:
    m = re.search(rf'<svg id="{ident}".*?</svg>', page, re.S)
    assert m, f"no <svg id={ident!r}>"
    return m.group(0)


def visible_nodes(plan) -> list[int]:
    """Every node but weights and the parallel ops that lay them out (computed independently)."""
    lay = layout_sources(plan.pcg)
    return [i for i, _ in plan.pcg if lay[i] is None or not isinstance(plan.pcg.nodes[lay[i]].op, WeightAttrs)]


def test_diagram_draws_each_visible_operator_once(bert_tp):
    page = render_report(bert_tp)
    overview = svg(page, "overview")
    drawn = [int(x) for x in re.findall(r'data-node="(\d+)"', overview)]
    assert sorted(drawn) == visible_nodes(bert_tp)
    assert "data-group" not in overview                          # 100 operators: nothing collapsed
    assert overview.count("<path d=") >= len(drawn) - 1           # edges
    # Megatron's split: tensor-parallel matmuls, replicated layer norms, the parallel ops between
    for cls in ("cat-tensor", "cat-replicated", "p-Combine", "p-Reduction", "p-Replicate"):
        assert cls in overview, cls
    tip = re.search(r'data-node="\d+"[^>]*><title>([^<]*query/MatMul[^<]*)</title>', overview).group(1)
    assert "parallel shape [16,32,64/8]" in tip and "devices 0–7" in tip and "compute" in tip
    assert "reads weight" in tip


def test_data_parallel_is_coloured_as_such(bert_dp):
    overview = svg(render_report(bert_dp), "overview")
    assert re.search(r'class="op cat-data"[^>]*><title>/m/encoder/layer.0/attention/self/query/MatMul', overview)


def test_timeline_rows_memory_and_baselines(bert_dp):
    page = render_report(bert_dp)
    timeline = svg(page, "timeline")
    rows = re.findall(r'<g class="row" data-devices="(\d+)">', timeline)
    assert sum(map(int, rows)) == 8 and len(rows) < 8            # identical devices share a row
    assert "devices 1–7" in timeline or "devices 0–7" in timeline
    report = estimate(bert_dp.pcg, bert_dp.views, bert_dp.cluster, CostConfig())
    on_device_0 = [e for e in report.events if 0 in e.devices]
    first_row = timeline.split('<g class="row"')[1]
    assert first_row.count('<rect class="ev ') == len(on_device_0)
    for kind in ("compute-fwd", "compute-bwd", "sync", "update"):
        assert f"ev {kind}" in timeline, kind
    memory = svg(page, "memory")
    assert memory.count('class="used"') >= 1 and "40.0 GiB capacity" in memory
    bars = svg(page, "baselines")
    for name, b in bert_dp.baselines.items():
        assert name in bars
        assert f"{b['step_time_ms']:.3f} ms" in bars or f"{b['step_time_ms']:.4f} ms" in bars
    assert 'class="bar chosen"' in bars


def test_same_plan_same_bytes_and_self_contained(bert_tp, tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    write_report(bert_tp, a)
    bert_tp.save(tmp_path / "plan.json")
    write_report(load_plan(tmp_path / "plan.json"), b)             # saved and reloaded: same page
    assert a.read_bytes() == b.read_bytes()
    page = a.read_text()
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|img|iframe)[^>]+src=|<link\b|@import|url\((?!#)", page)
    assert len(page) < 400_000


def test_rewrites_are_marked_and_listed(bert_dp):
    target = "/m/encoder/layer.1/attention/self/Softmax"
    plan = replace(bert_dp, rewrites=({"rule": "abc123", "name": "a made-up rule", "reverse": False,
                                       "at": target, "params": {}},))
    overview = svg(render_report(plan), "overview")
    marked = re.search(r'<g class="op [^"]* rw"[^>]*><title>([^<]*)</title>', overview)
    assert marked and marked.group(1).startswith(target) and "rewrite 1 applied here" in marked.group(1)
    assert "a made-up rule" in render_report(plan)


def test_measured_run_is_shown_and_a_malformed_one_rejected(bert_dp, tmp_path):
    plan = tmp_path / "plan.json"
    bert_dp.save(plan)
    run = {"measured_step_time_ms": 2.5, "predicted_step_time_ms": 1.0, "ratio": 2.5, "loss": [2.3, 2.1],
           "steps": 2, "ranks": 8, "check": {"passed": True, "max_rel_err": 1e-6},
           "plan_sha256": load_plan(plan).sha256}
    good = tmp_path / "run.json"
    good.write_text(json.dumps(run))
    out = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(out), "--measured", str(good)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert 'class="bar measured"' in svg(page, "baselines") and "2.500 ms" in page
    assert '<table id="measured">' in page and "2.50" in page and "passed" in page
    assert '<table id="phases">' not in page                      # a run without phases (older unity)
    phases = {"measured": {"fwd_compute": 0.75, "loss": 0.125, "other": 0.01},
              "predicted": {"fwd_compute": 0.5, "grad_sync": 0.25}}
    good.write_text(json.dumps(dict(run, phases_ms=phases)))
    r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(out), "--measured", str(good)])
    assert r.exit_code == 0, r.output
    table = out.read_text().split('<table id="phases">')[1].split("</table>")[0]
    assert [h for h in re.findall(r"<th>([^<]*)</th>", table)] == ["ms per step", "fwd comp", "loss", "grad sync",
                                                                  "other"]
    measured_row, predicted_row = re.findall(r'<tr class="(?:measured|predicted)">(.*?)</tr>', table)
    assert re.findall(r"<td>([^<]*)</td>", measured_row) == ["measured", "0.7500 ms", "0.1250 ms", "-", "0.0100 ms"]
    assert re.findall(r"<td>([^<]*)</td>", predicted_row) == ["predicted", "0.5000 ms", "-", "0.2500 ms", "-"]
    for field in ("ratio", "measured_step_time_ms"):
        bad = tmp_path / f"bad-{field}.json"
        bad.write_text(json.dumps({k: v for k, v in run.items() if k != field}))
        r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(out), "--measured", str(bad)])
        assert r.exit_code == 1
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and str(bad) in lines[0] and field in lines[0], r.output
    bad = tmp_path / "bad-loss.json"
    bad.write_text(json.dumps(dict(run, loss="low")))
    r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(out), "--measured", str(bad)])
    assert r.exit_code == 1 and "'loss'" in r.output
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.json"), "-o", str(out)])
    assert r.exit_code == 1 and r.output.startswith("error:")


def test_a_run_of_another_plan_is_refused(bert_dp, bert_tp, tmp_path):
    plan, other = tmp_path / "plan.json", tmp_path / "other.json"
    bert_dp.save(plan)
    bert_tp.save(other)
    run = {"measured_step_time_ms": 2.5, "predicted_step_time_ms": 1.0, "ratio": 2.5, "loss": [2.3], "steps": 1}
    out = tmp_path / "r.html"
    for name, sha in (("theirs", load_plan(other).sha256), ("none", None)):
        path = tmp_path / f"run-{name}.json"
        path.write_text(json.dumps(run if sha is None else dict(run, plan_sha256=sha)))
        r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(out), "--measured", str(path)])
        assert r.exit_code == 1
        (line,) = r.output.strip().splitlines()
        assert str(path) in line and ("another plan" if sha else "no plan_sha256") in line, line
        assert not out.exists()
    mine = tmp_path / "run-mine.json"
    mine.write_text(json.dumps(dict(run, plan_sha256=load_plan(plan).sha256)))
    r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(out), "--measured", str(mine)])
    assert r.exit_code == 0, r.output


def test_optimize_writes_the_same_report(tiny_models, tmp_path):
    plan, html = tmp_path / "plan.json", tmp_path / "a.html"
    r = CliRunner().invoke(cli, ["optimize", str(tiny_models / "bert_tiny.onnx"), "--cluster",
                                 str(SPECS / "dgx-a100-8.yaml"), "--batch-size", "16", "--strategy", "data_parallel",
                                 "--out", str(plan), "--report", str(html)])
    assert r.exit_code == 0, r.output
    assert f"wrote    {html}" in r.output
    r = CliRunner().invoke(cli, ["report", str(plan), "-o", str(tmp_path / "b.html")])
    assert r.exit_code == 0, r.output
    assert html.read_bytes() == (tmp_path / "b.html").read_bytes()


def test_gpt2_layers_collapse_into_one_box():
    plan = plan_for(EXPORTED / "gpt2_tiny.onnx", "data_parallel", batch=2)
    d = build_diagram(plan, CostConfig(), collapse=True)
    assert [g.label for g in d.groups] == ["h.0–1 (×2)"]
    members = set(d.groups[0].nodes)
    assert all("/h.0/" in d.ops[i].label or "/h.1/" in d.ops[i].label for i in members)
    page = render_report(plan, options=ReportOptions(collapse=True))
    overview = svg(page, "overview")
    assert 'data-group="0"' in overview and "h.0–1 (×2)" in overview
    drawn = {int(x) for x in re.findall(r'data-node="(\d+)"', overview)}
    assert not drawn & members and drawn | members == set(d.ops)
    detail = svg(page, "group-0")
    assert {int(x) for x in re.findall(r'data-node="(\d+)"', detail)} == members
    assert 'id="view-group-0" class="diagram-view" hidden' in page


def stack_model(path: Path, layers: int, named: bool, d: int = 16) -> Path:
    """``layers`` identical residual MLP blocks; their names carry the layer index or not."""
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        p = f"/m/layers.{k}/" if named else f"blk{chr(97 + k)}_"
        inits += [numpy_helper.from_array(np.full((d, d), 0.01, np.float32), p + w) for w in ("w1", "w2")]
        nodes += [helper.make_node("MatMul", [x, p + "w1"], [p + "h"], name=p + "fc1"),
                  helper.make_node("Relu", [p + "h"], [p + "r"], name=p + "act"),
                  helper.make_node("MatMul", [p + "r", p + "w2"], [p + "o"], name=p + "fc2"),
                  helper.make_node("Add", [x, p + "o"], [p + "y"], name=p + "add")]
        x = p + "y"
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [8, d])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_large_stack_collapses_by_name_and_by_structure(tmp_path):
    for named, label in ((True, "layers.0–11 (×12)"), (False, "blka_fc1 … blkl_add (×12)")):
        plan = plan_for(stack_model(tmp_path / f"s{named}.onnx", 12, named), "data_parallel", batch=8)
        d = build_diagram(plan, CostConfig(), max_nodes=20)           # 48+ operators: collapsed
        assert [g.label for g in d.groups] == [label], named
        assert len(d.groups[0].nodes) >= 48


def test_group_tooltip_names_the_index_only_for_named_groups(tmp_path):
    """A group found from names says what it indexes; one found by structure has no such name."""
    for named, want in ((True, "operators of /m/layers.N"), (False, "operators")):
        plan = plan_for(stack_model(tmp_path / f"t{named}.onnx", 12, named), "data_parallel", batch=8)
        page = render_report(plan, options=ReportOptions(max_nodes=20))
        tip = re.search(r'class="group[^"]*".*?<title>(.*?)</title>', page, re.S)
        assert tip, named
        assert tip.group(1).splitlines()[0].endswith(want), tip.group(1)


def test_a_missing_profile_is_said_and_the_page_uses_one_simulation(bert_dp, tmp_path):
    """A plan made with a profile that is gone is priced on the roofline, and the page says so;
    the step, compute and communication shown are those of the timeline's simulation."""
    gone = replace(bert_dp, config={**bert_dp.config, "profile": {"path": str(tmp_path / "gone.json"),
                                                                  "sha256": "0" * 64}})
    page = render_report(gone)
    assert "cannot be used" in page and "roofline estimates" in page
    report = estimate(gone.pcg, gone.views, gone.cluster, CostConfig())
    assert ms(report.step_time * 1e3) in page and f"compute {ms(report.compute_time * 1e3)}" in page


def test_layout_points_every_edge_down_without_overlaps():
    sizes = {i: (100.0, 30.0) for i in range(8)}
    edges = [(0, 1), (1, 2), (0, 3), (3, 4), (2, 5), (4, 5), (0, 5), (5, 6), (6, 7), (1, 7)]
    lay = layered_layout(sizes, edges)
    for (u, v), pts in lay.routes.items():
        assert all(b[1] >= a[1] for a, b in zip(pts, pts[1:]))
        assert pts[0] == (lay.pos[u][0] + 50, lay.pos[u][1] + 30) and pts[-1] == (lay.pos[v][0] + 50, lay.pos[v][1])
    boxes = [(x, y, x + 100, y + 30) for x, y in lay.pos.values()]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    assert layered_layout(sizes, edges) == lay


def test_groups_that_would_make_a_cycle_are_refused():
    # block.1 and block.2 are separated by "mid": collapsing them would put mid inside a loop
    names = {0: "in", 1: "/block.1/a/x", 2: "/block.1/b/y", 3: "mid", 4: "/block.2/a/x", 5: "/block.2/b/y"}
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert find_groups(names, edges) == []
    names[3] = "/block.1/c/z"
    assert [g.nodes for g in find_groups(names, edges)] == [(1, 2, 3, 4, 5)]


def _browser() -> str | None:
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


def test_page_loads_in_a_headless_browser_without_errors(bert_tp, tmp_path):
    """The page's script runs (it marks <html data-ready>), reports no error, and the diagram
    and timeline are there; a link to a group opens it."""
    browser = _browser()
    if browser is None:
        pytest.skip(f"no headless browser here (looked for {', '.join(BROWSERS)})")
    page = tmp_path / "report.html"
    write_report(bert_tp, page, options=ReportOptions(collapse=True))
    for url, shown in ((page.as_uri(), "view-overview"), (page.as_uri() + "#view-group-0", "view-group-0")):
        p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                            "--v=0", "--dump-dom", url], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        dom = p.stdout
        console = [line for line in p.stderr.splitlines() if "CONSOLE" in line]
        assert not console, console
        root = re.search(r"<html[^>]*>", dom).group(0)
        assert 'data-ready="1"' in root and "data-errors" not in root, root
        overview = svg(dom, "overview")
        assert re.search(r'<g class="op [^"]*" data-node=', overview) and 'data-group="0"' in overview
        assert svg(dom, "timeline").count('<rect class="ev ') > 10
        view = re.search(rf'<div id="{shown}" class="diagram-view"( hidden="")?', dom)
        assert view and not view.group(1), f"{shown} is not shown"
        assert re.search(rf'<div id="{shown}".*?<svg [^>]*style="height: \d', dom, re.S)  # zoom set up
