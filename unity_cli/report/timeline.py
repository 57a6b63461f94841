"""One predicted training step as a per-device timeline (Gantt), and memory per device
against its capacity, both as SVG.

Devices whose timelines are identical (every device of a data-parallel plan) share one
row labelled with their range, so 192 devices stay readable; each row has a compute
lane and a communication lane, and whatever is not covered by an event is idle.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..cluster.spec import ClusterSpec
from ..cost.model import LOSS_NODE, SYNC_NODE, CostReport, Event, Stream
from ..ir.pcg import PCG
from ..ir.phase import StepNode
from .markup import devices_label, esc, ms, nice_step, num
from .operators import node_label
from .summary import fmt_bytes

KINDS = {
    "compute-fwd": "forward compute",
    "compute-bwd": "backward compute",
    "comm-fwd": "forward communication",
    "comm-bwd": "backward communication",
    "loss": "loss",
    "sync": "gradient all-reduce",
    "update": "optimizer update",
}
LABEL_W, PLOT_W, LANE_C, LANE_M, ROW_GAP, AXIS_H = 170.0, 900.0, 16.0, 10.0, 10.0, 26.0


def event_kind(e: Event, report: CostReport) -> str:
    """What an event is, for its colour: moving data is communication on either stream (the
    loss's gathering counts as forward communication, as ``unity run`` times it)."""
    if e.phase == "loss" and e.comm:
        return "comm-fwd"
    if e.phase in ("loss", "sync", "update"):
        return e.phase
    comm = e.stream is Stream.COMM or e.comm
    return f"{'comm' if comm else 'compute'}-{e.phase}"


@dataclass(frozen=True)
class Row:
    devices: tuple[int, ...]
    events: tuple[Event, ...]


def device_rows(report: CostReport, num_devices: int) -> list[Row]:
    """Devices grouped by identical event lists, ordered by their first device."""
    per: list[list[Event]] = [[] for _ in range(num_devices)]
    for e in report.events:
        for d in e.devices:
            per[d].append(e)
    groups: dict[tuple, list[int]] = {}
    for d in range(num_devices):
        evs = tuple(sorted(per[d], key=lambda e: (e.start, e.end, e.stream.value, e.phase, e.node)))
        key = tuple((e.node, e.phase, e.stream.value, e.start, e.end) for e in evs)
        groups.setdefault(key, []).append(d)
        per[d] = list(evs)
    return sorted((Row(tuple(ds), tuple(per[ds[0]])) for ds in groups.values()), key=lambda r: r.devices[0])


def render_timeline(report: CostReport, pcg: PCG, num_devices: int, max_rows: int = 64) -> tuple[str, int]:
    """The SVG and how many rows it has (identical devices merged)."""
    rows = device_rows(report, num_devices)
    shown = rows[:max_rows]
    span = report.step_time * 1e3 or 1.0
    scale = PLOT_W / span
    row_h = LANE_C + 2 + LANE_M + ROW_GAP
    height = AXIS_H + row_h * len(shown) + 8
    width = LABEL_W + PLOT_W + 16
    out = [f'<svg id="timeline" class="timeline zoomable" viewBox="0 0 {num(width)} {num(height)}" role="img" '
           f'aria-label="predicted timeline of one training step"><g class="viewport">']
    step = nice_step(span)
    t = 0.0
    while t <= span + 1e-12:
        x = LABEL_W + t * scale
        out.append(f'<line class="tick" x1="{num(x)}" y1="{num(AXIS_H - 6)}" x2="{num(x)}" y2="{num(height)}"/>'
                   f'<text class="tl" x="{num(x)}" y="{num(AXIS_H - 10)}">{_tick(t, step)}</text>')
        t += step
    labels = {}
    for k, row in enumerate(shown):
        y = AXIS_H + k * row_h
        busy = sum((e.end - e.start) * e.times for e in row.events if e.stream is Stream.COMPUTE)
        comm = sum((e.end - e.start) * e.times for e in row.events if e.stream is Stream.COMM)
        step_s = report.step_time or 1.0
        name = devices_label(row.devices) + ("" if row.events else " (idle)")
        out.append(f'<g class="row" data-devices="{len(row.devices)}">'
                   f'<text class="rl" x="4" y="{num(y + 12)}">{esc(name)}</text>'
                   f'<text class="rs" x="4" y="{num(y + 25)}">compute {busy / step_s:.0%} · comm lane '
                   f'{comm / step_s:.0%}</text>'
                   f'<rect class="idle" x="{num(LABEL_W)}" y="{num(y)}" width="{num(PLOT_W)}" height="{num(LANE_C)}"/>'
                   f'<rect class="idle" x="{num(LABEL_W)}" y="{num(y + LANE_C + 2)}" width="{num(PLOT_W)}" '
                   f'height="{num(LANE_M)}"/>')
        for e in row.events:
            kind = event_kind(e, report)
            top = y if e.stream is Stream.COMPUTE else y + LANE_C + 2
            h = LANE_C if e.stream is Stream.COMPUTE else LANE_M
            x = LABEL_W + e.start * 1e3 * scale
            w = max((e.end - e.start) * 1e3 * scale, 0.4)
            if e.node not in labels:
                labels[e.node] = ("optimizer update (all weights)" if e.node == StepNode.UPDATE
                                  else "loss" if e.node == LOSS_NODE
                                  else "gradient all-reduce (all weights, one flat buffer per group)"
                                  if e.node == SYNC_NODE else node_label(pcg, e.node))
            again = f" (and in each of the next {e.times - 1} micro-batches)" if e.times > 1 else ""
            tip = (f"{labels[e.node]}{again}\n{KINDS[kind]} ({e.phase}, {e.stream.value} stream)\n"
                   f"{ms(e.start * 1e3)} – {ms(e.end * 1e3)}: {ms((e.end - e.start) * 1e3)}\n"
                   f"on {devices_label(e.devices)}")
            out.append(f'<rect class="ev {kind}" x="{num(x)}" y="{num(top)}" width="{num(w)}" height="{num(h)}">'
                       f'<title>{esc(tip)}</title></rect>')
        out.append("</g>")
    out.append("</g></svg>")
    return "\n".join(out), len(rows)


def _tick(t: float, step: float) -> str:
    digits = 0 if step >= 1 else min(6, len(f"{step:.6f}".rstrip("0").split(".")[1]))
    return f"{t:.{digits}f} ms" if t == 0 else f"{t:.{digits}f}"


def capacities(cluster: ClusterSpec, limit: int | None) -> list[int]:
    """Bytes each device may use: its capacity, or the plan's memory limit if smaller."""
    caps = [cluster.device_type(d).memory_capacity for d in range(cluster.num_devices)]
    return [min(c, limit) if limit is not None else c for c in caps]


def render_memory(memory: Sequence[int], caps: Sequence[int], limited: bool) -> str:
    """One bar per group of devices with the same use and capacity, against that capacity."""
    groups: dict[tuple[int, int], list[int]] = {}
    for d, (used, cap) in enumerate(zip(memory, caps, strict=True)):
        groups.setdefault((used, cap), []).append(d)
    rows = sorted(groups.items(), key=lambda kv: kv[1][0])
    bar_w, row_h = 560.0, 24.0
    height = row_h * len(rows) + 8
    width = LABEL_W + bar_w + 290
    out = [f'<svg id="memory" class="memory" width="{num(width)}" viewBox="0 0 {num(width)} {num(height)}" role="img" '
           'aria-label="memory per device against capacity">']
    for k, ((used, cap), devs) in enumerate(rows):
        y = 4 + k * row_h
        frac = used / cap if cap else 1.0
        over = " over" if used > cap else ""
        w = max(min(frac, 1.0) * bar_w, 1.0) if used else 0.0
        what = "limit" if limited else "capacity"
        text = f"{fmt_bytes(used)} of {fmt_bytes(cap)} {what} ({frac:.2%})"
        out.append(f'<g class="mem{over}"><title>{esc(devices_label(devs))}: {esc(text)}</title>'
                   f'<text class="rl" x="4" y="{num(y + 14)}">{esc(devices_label(devs))}</text>'
                   f'<rect class="cap" x="{num(LABEL_W)}" y="{num(y)}" width="{num(bar_w)}" height="16"/>'
                   f'<rect class="used" x="{num(LABEL_W)}" y="{num(y)}" width="{num(w)}" height="16"/>'
                   f'<text class="rs" x="{num(LABEL_W + bar_w + 8)}" y="{num(y + 13)}">{esc(text)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)
