"""``unity report``: one self-contained HTML page that shows a plan.

The page holds the PCG as a diagram, a per-device timeline of one predicted training
step, memory per device against capacity, and the baselines' predicted step times (with
the measured one from ``unity run --json`` beside them when given). Everything is
inline: hand-written SVG from Python, a small stylesheet and script from ``assets/``,
no network. The same plan gives the same bytes: nothing time-dependent goes in, and
every float is written with a fixed precision.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..cost.model import CostConfig, CostReport, estimate
from ..errors import ReportError
from ..files import write_atomic
from ..jsonfile import read_json
from ..plan.config import plan_config, plan_profile
from ..plan.plan import Plan
from ..runtime.phases import HEADINGS, PHASES
from ..search.baselines import Strategy
from .diagram import CATEGORIES, GLYPHS, Diagram, build_diagram, render_group, render_overview
from .markup import esc, ms, num
from .operators import operator_rows
from .summary import (
    bought_text,
    describe_cluster,
    fmt_bytes,
    memory_breakdown,
    memory_text,
    placement,
    placement_text,
    step_text,
)
from .timeline import KINDS, capacities, render_memory, render_timeline

_NUMBER = (int, float)
MEASURED_FIELDS: dict[str, tuple[str, Any]] = {
    "measured_step_time_ms": ("a number", lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool)),
    "predicted_step_time_ms": ("a number", lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool)),
    "ratio": ("a number or null", lambda v: v is None or isinstance(v, _NUMBER) and not isinstance(v, bool)),
    "loss": ("a list of numbers", lambda v: isinstance(v, list) and all(isinstance(x, _NUMBER) for x in v)),
    "steps": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
}
_ERRORS_JS = ('window.addEventListener("error",function(e){var r=document.documentElement;'
              'r.setAttribute("data-errors",(r.getAttribute("data-errors")||"")+e.message+";");});')


def load_measured(path: str | os.PathLike, plan: Plan | None = None) -> dict[str, Any]:
    """A ``unity run --json`` report, checked: every problem is one line naming the file and
    field. Given ``plan``, the run must be of that plan (its ``plan_sha256``)."""
    data = read_json(path, ReportError, "unity run --json report")
    if not isinstance(data, dict):
        raise ReportError(f"{path}: not a JSON object (expected the output of 'unity run --json')")
    if plan is not None and data.get("plan_sha256") != plan.sha256:
        ran = data.get("plan_sha256")
        which = f"another plan (plan_sha256 {str(ran)[:12]}…)" if ran else "an unknown plan (no plan_sha256)"
        raise ReportError(f"{path}: is a run of {which}, not of this one ({plan.sha256[:12]}…): run this plan "
                          "with 'unity run --json' and pass that")
    for name, (what, ok) in MEASURED_FIELDS.items():
        if name not in data:
            raise ReportError(f"{path}: missing field {name!r} (expected the output of 'unity run --json')")
        if not ok(data[name]):
            raise ReportError(f"{path}: field {name!r} must be {what}, got {data[name]!r}")
    check = data.get("check")
    if check is not None and not (isinstance(check, dict) and isinstance(check.get("passed"), bool)):
        raise ReportError(f"{path}: field 'check' must be an object with a boolean 'passed'")
    return data


@dataclass(frozen=True)
class ReportOptions:
    collapse: bool | None = None  # collapse repeated layers: None = when the graph is large
    max_nodes: int = 120          # ... larger than this many visible operators
    max_rows: int = 64            # timeline rows drawn (after merging identical devices)


def render_report(plan: Plan, measured: Mapping[str, Any] | None = None, title: str | None = None,
                  options: ReportOptions = ReportOptions()) -> str:
    """The whole page as a string."""
    profile, why = plan_profile(plan)
    config = plan_config(plan, profile)
    # Every number on the page comes from this one simulation of the plan.
    report = estimate(plan.pcg, plan.views, plan.cluster, config)
    diagram = build_diagram(plan, config, options.collapse, options.max_nodes)
    timeline, rows = render_timeline(report, plan.pcg, plan.cluster.num_devices, options.max_rows)
    memory = list(report.memory)
    limit = plan.config.get("memory_limit_bytes")
    name = title or Path(str(plan.model.get("path", "model"))).name
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>unity plan: {esc(name)}</title>", f"<script>{_ERRORS_JS}</script>",
        f"<style>{_asset('report.css')}</style></head><body>",
        f"<h1>Plan for {esc(name)}</h1>", _facts(plan, report, why),
        _diagram_section(plan, diagram),
        '<section id="timeline-section"><h2>One training step, predicted</h2>',
        '<div class="legend">' + "".join(f'<span><i class="sw {k}"></i>{esc(v)}</span>' for k, v in KINDS.items()) +
        '<span><i class="sw idle"></i>idle</span></div>',
        f'<p class="note">Simulated by the cost model: forward in topological order, backward in reverse, '
        f'gradient all-reduces on the communication lane, then the optimizer update. Devices with identical '
        f'timelines share a row ({rows} row{"s" * (rows != 1)} for {plan.cluster.num_devices} devices'
        + (f"; the first {options.max_rows} are drawn" if rows > options.max_rows else "") + ").</p>",
        _toolbar("timeline"), f'<div class="frame">{timeline}</div></section>',
        '<section id="memory-section"><h2>Memory per device</h2>',
        '<p class="note">Weights, gradients, optimizer state and the activations kept for the backward pass, '
        'against each device\'s ' + ("memory limit (--memory-limit)" if limit else "capacity") + ".</p>",
        f'<div class="frame">{render_memory(memory, capacities(plan.cluster, limit), limit is not None)}</div>',
        "</section>", _baselines_section(plan, measured), _heaviest(plan, config),
        f"<script>{_asset('report.js')}</script></body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_report(plan: Plan, path: str | os.PathLike, measured: Mapping[str, Any] | None = None,
                 options: ReportOptions = ReportOptions()) -> int:
    """Write the page; returns its size in bytes."""
    text = render_report(plan, measured, options=options)
    data = text.encode("utf-8")
    try:
        write_atomic(path, data)
    except OSError as e:
        raise ReportError(f"{path}: cannot write the report: {e.strerror}") from None
    return len(data)


def _asset(name: str) -> str:
    return resources.files("unity_cli.report").joinpath("assets", name).read_text(encoding="utf-8")


def _facts(plan: Plan, report: CostReport, why: str | None) -> str:
    m, p = plan.model, plan.predicted
    inputs = ", ".join(f"{k}[{','.join(map(str, v['dims']))}]" for k, v in sorted(m.get("inputs", {}).items()))
    rows = [("model", f"<code>{esc(m.get('path', '?'))}</code> ({esc(inputs)}), sha256 "
                      f"<code>{esc(str(m.get('sha256', ''))[:12])}</code>"),
            ("cluster", esc(f"{describe_cluster(plan.cluster)} ({plan.cluster.num_devices} devices)")),
            ("training", esc(f"{plan.config.get('dtype')}, {plan.config.get('optimizer')}")),
            ("strategy", f"<b>{esc(plan.strategy)}</b> on {esc(p.get('devices', plan.devices))} devices"),
            ("predicted step", esc(ms(report.step_time * 1e3)) + f" (compute {esc(ms(report.compute_time * 1e3))}, "
                                                               f"communication {esc(ms(report.comm_time * 1e3))})"),
            ("peak memory", esc(fmt_bytes(max(report.memory, default=0))) + " per device"),
            ("rewrites", str(len(plan.rewrites)))]
    if not plan.training.default:
        rows.insert(3, ("step", esc(step_text(plan))))
    parts = memory_breakdown(plan)
    if parts:
        rows.insert(-1, ("memory", esc(memory_text(parts))))
    groups = placement(plan)
    if groups:   # independent branches on device groups of their own
        rows.append(("branches", "<br>".join(esc(placement_text(g)) for g in groups)))
    if why:
        rows.append(("note", esc(why)))
    if plan.search.get("candidates") is not None:
        rows.append(("search", esc(f"{plan.search['candidates']} candidates")))
    return '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _toolbar(target: str, back: bool = False) -> str:
    buttons = [("reset", "reset view"), ("fit", "fit"), ("in", "+"), ("out", "−")]
    html = "".join(f'<button type="button" data-zoom="{z}" data-target="{target}">{label}</button>'
                   for z, label in buttons)
    if back:
        html = '<button type="button" data-show="view-overview">← overview</button>' + html
    return f'<div class="toolbar">{html}<span class="note">wheel to zoom, drag to pan</span></div>'


def _diagram_section(plan: Plan, d: Diagram) -> str:
    out = ['<section id="diagram"><h2>Parallel computation graph</h2>',
           '<div class="legend">' + "".join(f'<span><i class="sw cat-{k}"></i>{esc(v)}</span>'
                                            for k, v in CATEGORIES.items()) + "</div>",
           '<div class="legend">parallel ops: ' + "".join(
               f'<span><b class="mono">{g}</b> {k}</span>' for k, g in GLYPHS.items()) +
           '<span><i class="sw" style="border:2px dashed var(--rw)"></i>rewritten (numbered below)</span></div>',
           f'<p class="note">{len(d.ops)} operators drawn; {d.hidden} weights and the parallel ops that lay them '
           "out are folded into their readers (see each operator's tooltip)."
           + (f" Repeated layers are collapsed into {len(d.groups)} box{'es' * (len(d.groups) != 1)}: "
              "click one to see its operators." if d.groups else "") + "</p>"]
    if plan.rewrites:
        items = []
        for r in plan.rewrites:
            found = any(o.name == r.get("at") for o in d.ops.values())
            where = f"at <code>{esc(r.get('at', '?'))}</code>" + ("" if found else
                                                               " (replaced by it: marked on the new operators)")
            arrow = " (right to left)" if r.get("reverse") else ""
            bought = f"<br><span class=\"note\">{esc(bought_text(r['bought']))}</span>" if r.get("bought") else ""
            items.append(f"<li>{esc(r.get('name', '?'))}{arrow} {where} <span class=\"note\">rule "
                         f"{esc(r.get('rule', '?'))}</span>{bought}</li>")
        out.append('<ol class="rewrites">' + "".join(items) + "</ol>")
    out.append('<div id="view-overview" class="diagram-view">' + _toolbar("overview") +
               f'<div class="frame">{render_overview(d)}</div></div>')
    for k, g in enumerate(d.groups):
        out.append(f'<div id="view-group-{k}" class="diagram-view" hidden><h3>{esc(g.label)}</h3>' +
                   _toolbar(f"group-{k}", back=True) + f'<div class="frame">{render_group(d, k)}</div></div>')
    out.append("</section>")
    return "\n".join(out)


def _baselines_section(plan: Plan, measured: Mapping[str, Any] | None) -> str:
    bars = [(name, float(b["step_time_ms"]), "chosen" if name == plan.strategy else
             ("infeasible" if not b.get("feasible", True) else "")) for name, b in plan.baselines.items()]
    if measured is not None:
        bars.append((f"measured ({plan.strategy}, unity run)", float(measured["measured_step_time_ms"]), "measured"))
    top = max((v for _, v, _ in bars), default=1.0) or 1.0
    label_w, bar_w, row_h = 260.0, 560.0, 24.0
    width = label_w + bar_w + 120
    svg = [f'<svg id="baselines" class="bars" width="{num(width)}" viewBox="0 0 {num(width)} '
           f'{num(row_h * len(bars) + 8)}" role="img" aria-label="predicted step time of each strategy">']
    for k, (name, v, cls) in enumerate(bars):
        y = 4 + k * row_h
        svg.append(f'<g><title>{esc(name)}: {esc(ms(v))}</title><text x="4" y="{num(y + 13)}">{esc(name)}</text>'
                   f'<rect class="bar {cls}" x="{num(label_w)}" y="{num(y)}" width="{num(max(v / top * bar_w, 1))}"'
                   f' height="16"/><text x="{num(label_w + v / top * bar_w + 6)}" y="{num(y + 13)}">'
                   f"{esc(ms(v))}</text></g>")
    svg.append("</svg>")
    dp = plan.baselines.get(Strategy.DATA_PARALLEL, {}).get("step_time_ms")
    rows = ["<tr><th>strategy</th><th>devices</th><th>step time</th><th>compute</th><th>communication</th>"
            "<th>memory / device</th><th>vs data parallel</th></tr>"]
    for name, b in plan.baselines.items():
        speed = f"{dp / b['step_time_ms']:.2f}x" if dp and b.get("step_time_ms") else "-"
        mem = fmt_bytes(b.get("max_memory_bytes", 0)) + ("" if b.get("feasible", True) else " (does not fit)")
        rows.append(f'<tr class="{"chosen" if name == plan.strategy else ""}"><td>{esc(name)}'
                    f'{" (chosen)" if name == plan.strategy else ""}</td><td>{esc(b.get("devices", "-"))}</td>'
                    f"<td>{esc(ms(b['step_time_ms']))}</td><td>{esc(ms(b.get('compute_ms', 0.0)))}</td>"
                    f"<td>{esc(ms(b.get('comm_ms', 0.0)))}</td><td>{esc(mem)}</td><td>{speed}</td></tr>")
    out = ['<section id="baselines-section"><h2>Strategies</h2>',
           '<p class="note">Predicted step time of every strategy the search priced with the same cost model'
           + ("; the measured one from <code>unity run --json</code> in red" if measured else "") + ".</p>",
           '<div class="frame">' + "".join(svg) + "</div>", "<table>" + "".join(rows) + "</table>"]
    if measured is not None:
        out.append(_measured_table(plan, measured))
    out.append("</section>")
    return "\n".join(out)


def _measured_table(plan: Plan, m: Mapping[str, Any]) -> str:
    loss = m["loss"]
    losses = f"{loss[0]:.6g} → {loss[-1]:.6g}" if loss else "-"
    ratio = f"{m['ratio']:.2f}" if m["ratio"] is not None else "-"
    rows = [("measured step time", ms(m["measured_step_time_ms"])),
            ("predicted step time (run)", ms(m["predicted_step_time_ms"])),
            ("predicted step time (plan)", ms(plan.predicted.get("step_time_ms", 0.0))),
            ("measured / predicted", ratio), ("steps", str(m["steps"])), ("loss", losses)]
    if isinstance(m.get("check"), dict):
        c = m["check"]
        err = c.get("max_rel_err")
        rows.append(("check", ("passed" if c["passed"] else "FAILED") +
                     (f", max relative error {err:.2e}" if isinstance(err, _NUMBER) else "")))
    for key in ("ranks", "backend"):
        if key in m:
            rows.append((key, str(m[key])))
    return ('<table id="measured"><tr><th colspan="2">measured with unity run</th></tr>' +
            "".join(f'<tr class="measured"><td>{esc(k)}</td><td>{esc(v)}</td></tr>' for k, v in rows) + "</table>"
            + _phases_table(m.get("phases_ms")))


def _phases_table(phases: Any) -> str:
    """Measured and predicted ms per phase, when the run reported them (older runs did not)."""

    if not isinstance(phases, dict) or not isinstance(phases.get("measured"), dict):
        return ""
    rows = {k: phases.get(k) if isinstance(phases.get(k), dict) else {} for k in ("measured", "predicted")}
    cols = [p for p in PHASES if p in rows["measured"] or p in rows["predicted"]]

    def cell(v: Any) -> str:
        return esc(ms(v)) if isinstance(v, _NUMBER) and not isinstance(v, bool) else "-"

    head = "<tr><th>ms per step</th>" + "".join(f"<th>{esc(HEADINGS[p])}</th>" for p in cols) + "</tr>"
    body = "".join(f'<tr class="{k}"><td>{k}</td>' + "".join(f"<td>{cell(v.get(p))}</td>" for p in cols) + "</tr>"
                   for k, v in rows.items())
    return ('<p class="note">Where the step\'s time went, per phase: measured (mean over ranks; communication is '
            'time inside the communicator, waiting included) and predicted (mean over devices; busy time, so '
            'overlapping phases can add up to more than the step).</p><table id="phases">' + head + body + "</table>")


def _heaviest(plan: Plan, config: CostConfig, limit: int = 12) -> str:
    """The table ``unity explain`` prints: weights' gradient all-reduces included."""
    top = sorted(operator_rows(plan.pcg, plan.views, plan.cluster, config), key=lambda r: (-r.total_ms, r.name))
    rows = ["<tr><th>operator</th><th>kind</th><th>parallel shape</th><th>devices</th><th>compute</th>"
            "<th>communication</th></tr>"]
    rows += [f'<tr><td class="mono">{esc(r.name)}</td><td>{esc(r.kind)}</td><td class="mono">{esc(r.degrees)}</td>'
             f"<td>{r.devices}</td><td>{esc(ms(r.compute_ms))}</td><td>{esc(ms(r.comm_ms))}</td></tr>"
             for r in top[:limit]]
    return ('<section id="operators"><h2>Costliest operators (forward + backward)</h2><table>' + "".join(rows) +
            "</table></section>")
