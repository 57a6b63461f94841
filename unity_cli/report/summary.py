"""The short human summary ``unity optimize`` prints."""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..cluster.spec import ClusterSpec
from ..cluster.units import format_bytes as fmt_bytes
from ..cost.model import CostContext, estimate, layout_sources, memory_account, node_cost_and_moves, weight_syncs
from ..ir.buckets import sync_buckets
from ..ir.recompute import Recompute
from ..ir.training import Training
from ..plan.config import plan_config
from ..plan.plan import Plan
from ..runtime.phases import predicted_phases_ms
from ..search.baselines import Strategy
from .markup import clip, devices_label
from .operators import OperatorRow, heaviest_table, node_label, operator_rows


def fmt_ms(ms: float) -> str:
    return f"{ms:.3f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def describe_cluster(c: ClusterSpec) -> str:
    """``name: 4 nodes x 8 a100-40gb`` (runs of equal nodes grouped)."""
    groups: list[list] = []
    for node in c.nodes:
        key = (node.devices, node.device.name)
        if groups and groups[-1][0] == key:
            groups[-1][1] += 1
        else:
            groups.append([key, 1])
    parts = [f"{count} node{'s' if count > 1 else ''} x {d} {name}" for (d, name), count in groups]
    return f"{c.name}: " + " + ".join(parts)


def summary(plan: Plan, plan_path: str | None, notes: list[str], baseline: Mapping[str, OperatorRow] | None = None,
            operators: int = 8) -> str:
    m = plan.model
    inputs = ", ".join(f"{k}[{','.join(map(str, v['dims']))}]" for k, v in m["inputs"].items())
    opset = f"opset {m['opset']}; " if m.get("opset") else ""
    read = "".join(f"{n} written-out {kind} read as one op{' each' if n > 1 else ''}; "
                   for kind, n in m.get("recognised", {}).items())
    lines = [f"model    {m['path']}  ({opset}{read}{inputs})",
             f"cluster  {describe_cluster(plan.cluster)}  ({plan.cluster.num_devices} devices), "
             f"{plan.config['dtype']}, {plan.config['optimizer']}"]
    lines += [f"note     {n}" for n in notes]
    lines.append("")
    dp = plan.baselines.get(Strategy.DATA_PARALLEL, {}).get("step_time_ms")
    header = (f"  {'strategy':<24}{'devices':>8}{'step time':>13}{'compute':>12}{'comm':>12}"
              f"{'memory/device':>15}  {'vs DP':>6}")
    lines.append(header)
    for name, b in plan.baselines.items():
        mark = "*" if name == plan.strategy else " "
        speed = f"{dp / b['step_time_ms']:.2f}x" if dp and b["step_time_ms"] else "-"
        mem = fmt_bytes(b["max_memory_bytes"]) + ("" if b["feasible"] else " (too big)")
        lines.append(f"{mark} {name:<24}{b['devices']:>8}{fmt_ms(b['step_time_ms']):>13}"
                     f"{fmt_ms(b['compute_ms']):>12}{fmt_ms(b['comm_ms']):>12} {mem:>14}  {speed:>6}")
    micro = {b.get("micro_batches", 1) for b in plan.baselines.values()}
    if micro != {1} and len(micro) == 1:
        lines.append(f"  every row: {micro.pop()} micro-batches of {plan.model.get('batch_size')} per step")
    stages = {name: replace(Training.from_json(b), micro_batches=1, recompute=Recompute.NONE, recompute_segments=0)
              for name, b in plan.baselines.items()}      # (each row's stages alone)
    for t in sorted({t for t in stages.values() if t.sharded}, key=lambda t: (t.zero, t.zero_by_weight)):
        names = [name for name, s in stages.items() if s == t]
        words = "each weight at the stage of the last pattern naming it" if t.mixed else ZERO_WORDS[t.zero]
        lines.append(f"  with {t.zero_text} ({words}): {', '.join(names)}")
    again = [name for name, b in plan.baselines.items() if b.get("recompute")]
    if again:
        lines.append(f"  recomputing activations in backward: {', '.join(again)}")
    # What each uniform hybrid row is (which tp=T,dp=D, which ops stayed replicated in their group).
    lines += [f"  {b['description']}" if b["description"].startswith(name) else f"  {name}: {b['description']}"
              for name, b in plan.baselines.items()
              if (name == Strategy.HYBRID or name.startswith("tp=")) and b.get("description")]
    p = plan.predicted
    # the peak against what its own device holds (a cluster of mixed devices: the busiest one's)
    memory = p.get("memory_bytes") or [0]
    busiest = max(range(len(memory)), key=memory.__getitem__)
    kind = plan.cluster.device_type(busiest)
    cap = min(kind.memory_capacity, plan.config.get("memory_limit_bytes", kind.memory_capacity))
    alike = len({plan.cluster.device_type(d).memory_capacity for d in range(plan.cluster.num_devices)}) == 1
    lines.append("")
    devices = f"{p['devices']} device{'s' if p['devices'] != 1 else ''}"
    lines.append(f"chosen   {plan.strategy}: {fmt_ms(p['step_time_ms'])} per step on {devices}, "
                 f"peak memory {fmt_bytes(p['max_memory_bytes'])} of {fmt_bytes(cap)} "
                 + ("per device" if alike else f"on device {busiest} ({kind.name})"))
    train = plan.training
    if not train.default:
        lines.append(f"step     {step_text(plan)}")
    parts = memory_breakdown(plan)
    if parts:
        lines.append(f"memory   {memory_text(parts)}")
    sync = sync_summary(plan)
    if sync["all_reduces"]:
        lines.append(f"sync     {sync_text(sync)}")
    groups = placement(plan)
    if groups:
        lines.append(f"branches independent branches side by side, each on its own devices ({len(groups)} groups):")
        lines += [f"           {placement_text(g)}" for g in groups]
    if operators:
        rows = operator_rows(plan.pcg, plan.views, plan.cluster, plan_config(plan))
        lines.append("")
        lines.append("heaviest operators (forward + backward)" +
                     (", and the data-parallel plan's time for the same operator / this plan's" if baseline else ""))
        lines.append(heaviest_table(rows, operators, baseline))
    if plan.rewrites:
        lines.append(f"rewrites {len(plan.rewrites)} applied:")
        for r in plan.rewrites[:8]:
            arrow = " (right to left)" if r.get("reverse") else ""
            lines.append(f"           {r['name']}{arrow}  at {r['at']}  [rule {r['rule']}]")
            if r.get("bought"):
                lines.append(f"             {bought_text(r['bought'])}")
        if len(plan.rewrites) > 8:
            lines.append(f"           ... and {len(plan.rewrites) - 8} more (see the plan's \"rewrites\")")
    if plan_path:
        lines.append(f"wrote    {plan_path}")
    return "\n".join(lines)


def sync_summary(plan: Plan) -> dict[str, Any]:
    """The plan's gradient sync as its ranks run it (``ir/buckets.py``): its bucket bytes
    (0: flat), how many all-reduces (under ZeRO, reduce-scatters) a step makes, their bytes
    in all, and its ZeRO stage; where weights are kept at different stages, ``stages``: the
    same counts per stage."""
    ctx = CostContext.of(plan.pcg, plan.cluster, plan_config(plan))    # (the prices the search made)
    st = ctx.structure
    moves = [node_cost_and_moves(ctx, i, plan.views)[1] if i in st.sync else () for i in range(len(plan.pcg))]
    buckets = sync_buckets(plan.pcg, weight_syncs(st, moves), plan.sync_bucket_bytes, plan.training.stages(plan.pcg))
    used = {b.zero for b in buckets}        # (the stages the buckets are kept at, whatever the step's)
    out: dict[str, Any] = {"bucket_bytes": plan.sync_bucket_bytes, "all_reduces": len(buckets),
                           "bytes": sum(b.nbytes for b in buckets),
                           "zero": next(iter(used)) if len(used) == 1 else plan.training.zero}
    if len(used) > 1:
        out["stages"] = {str(z): {"all_reduces": sum(b.zero == z for b in buckets),
                                  "bytes": sum(b.nbytes for b in buckets if b.zero == z)} for z in sorted(used)}
    return out


def step_text(plan: Plan) -> str:
    """The step's shape (``ir/training.py``) in words."""
    t = plan.training
    batch = plan.model.get("batch_size")
    parts = []
    if t.micro_batches > 1:
        whole = f"global batch {batch * t.micro_batches} = " if batch else ""
        parts.append(f"{whole}{t.micro_batches} micro-batches of {batch or '?'}, gradients accumulated, "
                     "one sync and update per step")
    if t.mixed:
        parts.append(f"ZeRO per weight: {t.zero_text} (each weight at the stage of the last pattern naming it)")
    elif t.sharded:
        parts.append(f"ZeRO-{t.zero}: {ZERO_WORDS[t.zero]}")
    if t.recompute is not Recompute.NONE:
        parts.append(f"{t.recompute} recomputation: {RECOMPUTE_WORDS[t.recompute]}")
    return "; ".join(parts)


ZERO_WORDS = {1: "each weight's optimizer state (and fp32 master) sharded over its replicas",
              2: "optimizer state and gradients sharded over the replicas",
              3: "weights, gradients and optimizer state sharded over the replicas"}
"""What each ZeRO stage shards, in the summary's words (``ir/training.py``)."""
RECOMPUTE_WORDS = {Recompute.SELECTIVE: "what the weighted products read kept, the rest of each segment "
                                        "(norms, activations, attention scores) run again in backward",
                   Recompute.FULL: "each segment's forward run again in backward, its input kept"}
"""What each recomputation mode keeps and runs again, in the summary's words (``ir/recompute.py``)."""


def memory_breakdown(plan: Plan) -> dict[str, int]:
    """The busiest device's bytes by part (``cost.model.memory_account``), and its index as
    ``device``."""
    config = plan_config(plan)
    devs = [plan.views[i].devices(n.outputs[0]) for i, n in plan.pcg]
    acc = memory_account(plan.pcg, devs, layout_sources(plan.pcg), plan.cluster, config)
    total = sum(acc.values())
    if not len(total) or not total.max():
        return {}
    d = int(total.argmax())
    return {"device": d, **{part: int(v[d]) for part, v in acc.items()}}


def memory_text(parts: Mapping[str, int]) -> str:
    """``device 0 (the busiest): weights 1.0 MiB, gradients ...`` (parts that hold nothing left out)."""
    shown = ", ".join(f"{part} {fmt_bytes(v)}" for part, v in parts.items() if part != "device" and v)
    return f"device {parts['device']} (the busiest): {shown}"


def placement(plan: Plan) -> list[dict]:
    """The plan's compute operators that run on disjoint device groups (parallel branches,
    ``search/groups.py``), by group in device order: each group's devices and operators.
    Empty when no two of them are on disjoint devices (every operator on every device, or
    a few left on the first ones)."""
    n = plan.cluster.num_devices
    by_devices: dict[frozenset[int], list[str]] = {}
    for i, node in plan.pcg:
        if node.spec.is_source or node.spec.is_parallel_op:
            continue
        devs = frozenset(plan.views[i].devices(node.outputs[0]))
        if len(devs) < n:
            by_devices.setdefault(devs, []).append(node_label(plan.pcg, i))
    sets = list(by_devices)
    if not any(a.isdisjoint(b) for k, a in enumerate(sets) for b in sets[k + 1:]):
        return []
    return [{"devices": sorted(d), "operators": by_devices[d]} for d in sorted(sets, key=lambda d: (min(d), len(d)))]


def placement_text(group: Mapping, shown: int = 3, width: int = 40) -> str:
    """``devices 0–1: tower0.0, tower0.1`` (at most ``shown`` names, each clipped to ``width``)."""
    names = [clip(n, width) for n in group["operators"]]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{devices_label(group['devices'])}: {', '.join(names[:shown])}{more}"


def sync_text(sync: Mapping[str, Any]) -> str:
    if "stages" in sync:     # weights kept at different stages: each stage's calls
        rest = {k: v for k, v in sync.items() if k != "stages"}
        return "; ".join(sync_text({**rest, **counts, "zero": int(z)}) for z, counts in sync["stages"].items())
    n, size = sync["all_reduces"], fmt_bytes(sync["bytes"])
    z = sync.get("zero", 0)
    if z >= 3:
        return (f"{n} weights each gathered before each pass that reads it and its gradient reduce-scattered "
                f"after every micro-batch ({size} in all), each member updating its shard (ZeRO-3)")
    if z:
        when = "after every micro-batch" if z >= 2 else "after backward"
        return (f"{n} reduce-scatter{'s' * (n != 1)} of {size} of gradients in all, {when}, each member "
                f"updating its shard, then as many all-gathers of the updated weights (ZeRO-{z})")
    if not sync["bucket_bytes"]:
        return (f"{n} all-reduce{'s' * (n != 1)} of {size} of gradients in all, after backward "
                f"(one flat buffer per group of devices)")
    return (f"{n} all-reduces of {size} of gradients in all, in buckets of at least "
            f"{fmt_bytes(sync['bucket_bytes'])}, each started during backward once its gradients are whole")


def rewrite_counts(names: Sequence[str], width: int = 48) -> str:
    """The rewrites a plan applied, by rule, most used first (``"—"`` for none): a table cell."""
    cells = [(n if len(n) <= width else n[:width - 1] + "…") + (f" x{c}" if c > 1 else "")
             for n, c in Counter(names).most_common()]
    return "; ".join(cells) or "—"


def bought_text(b: Mapping[str, float]) -> str:
    """What one rewrite changed, as the search priced it when it applied it (``bought``
    holds before less after; shown as after less before: "-" is a saving)."""
    def ms(v: float) -> str:
        return f"{'-' if v > 0 else '+'}{fmt_ms(abs(v))}"
    mem = b.get("memory_bytes", 0)
    return (f"changed step time {ms(b.get('step_ms', 0.0))}: compute {ms(b.get('compute_ms', 0.0))}, "
            f"communication {ms(b.get('comm_ms', 0.0))}, memory {'-' if mem > 0 else '+'}{fmt_bytes(abs(mem))} "
            "per device")


def run_prediction(plan: Plan, loss: str) -> tuple[dict[str, float], list[int]]:
    """The cost model's prediction for a run of ``plan`` trained with ``loss`` (its profile
    used when it is still there): the phases in ms (mean over devices) and the bytes each
    device sends per step. ``unity run`` reports both beside what it measures; the CLI
    passes this down, as the runtime does not read the cost model."""
    report = estimate(plan.pcg, plan.views, plan.cluster, replace(plan_config(plan), loss=loss))
    return predicted_phases_ms(report, plan.cluster.num_devices), list(report.comm_bytes)
