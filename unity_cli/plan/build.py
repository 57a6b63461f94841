"""Turning a search result into a :class:`Plan`."""
from __future__ import annotations

from pathlib import Path

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostReport
from ..ir.machine_view import MachineView
from ..ir.pcg import PCG
from ..ir.training import Training
from ..onnx_import import ImportedModel
from ..search.optimize import SearchResult
from .plan import Plan


def report_summary(report: CostReport, devices: int) -> dict:
    return {
        "step_time_ms": round(report.step_time * 1e3, 6),
        "compute_ms": round(report.compute_time * 1e3, 6),
        "comm_ms": round(report.comm_time * 1e3, 6),
        "max_memory_bytes": max(report.memory, default=0),
        "devices": devices,
        "feasible": report.feasible,
        **({"infeasible": report.infeasible} if report.infeasible else {}),
        **report.training.to_json(),      # its micro-batches and ZeRO stage, where not the default
    }


def make_plan(model: ImportedModel, cluster: ClusterSpec, config: CostConfig, result: SearchResult,
              search: dict | None = None) -> Plan:
    chosen = result.chosen
    predicted = report_summary(chosen.report, chosen.baseline.devices)
    predicted["memory_bytes"] = list(chosen.report.memory)
    predicted["comm_bytes"] = list(chosen.report.comm_bytes)   # sent per device per step (cost.moves)
    baselines = {name: {**report_summary(c.report, c.baseline.devices), "description": c.baseline.description}
                 for name, c in sorted(result.candidates.items())}
    search = dict(search or {})
    search["cut_by_budget"] = result.cut_by_budget   # only then may the plan depend on the machine's speed
    if result.not_priced:
        search["not_priced"] = list(result.not_priced)  # rows the time ceiling left out
    if result.stats is not None:  # only what does not depend on the machine's speed
        search.update(candidates=result.stats.candidates, expanded=result.stats.expanded,
                      rules_applied=result.stats.rules_applied,
                      converged=result.stats.converged,
                      capped=result.stats.capped, segments=result.stats.segments,
                      segment_problems=result.stats.segment_problems)
    rewrites = tuple({"rule": a.rule_id, "name": a.rule_name, "reverse": a.reverse, "at": a.at,
                      "params": dict(a.params), **({"bought": dict(a.bought)} if a.bought else {})}
                     for a in result.rewrites)
    return Plan(model_info(model), cluster, config_json(config, chosen.report.sync_bucket, chosen.report.training),
                chosen.baseline.name, chosen.baseline.pcg, chosen.views, predicted, baselines,
                rewrites=rewrites, search=search)


def model_info(model: ImportedModel) -> dict:
    """What a plan records of the model it was made for."""
    return {
        "path": Path(model.path).as_posix(),
        "sha256": model.sha256,
        "inputs": {k: {"dims": list(v.dims), "dtype": v.dtype.value} for k, v in sorted(model.inputs.items())},
        "outputs": list(model.outputs),
        "batch_size": model.batch_size,
        "opset": model.opset,
        # only when there are some: plans of other models stay byte-identical
        **({"recognised": dict(sorted(model.recognised.items()))} if model.recognised else {}),
    }


def config_json(config: CostConfig, sync_bucket: int = 0, training: Training | None = None) -> dict:
    """The plan's ``config``: what it was priced with, the gradient sync's bucket bytes its
    price chose (``ir/buckets.py``; written only when bucketed, so that plans with a flat
    sync stay byte-identical to those made before plans chose it), and its micro-batches and
    ZeRO stage (``ir/training.py``; ``training``: the chosen plan's, default the config's;
    written only where not the default)."""
    cfg = {"dtype": config.dtype.value, "optimizer": config.optimizer.value}
    cfg.update((training or config.training).to_json())
    if config.loss != "auto":      # the loss its targets were priced for (ir/schedule.planned_loss)
        cfg["loss"] = config.loss
    if config.memory_limit is not None:
        cfg["memory_limit_bytes"] = config.memory_limit
    if sync_bucket:
        cfg["sync_bucket_bytes"] = sync_bucket
    if config.profile is not None:  # only then: plans made without one stay byte-identical
        cfg["profile"] = {"path": config.profile.source, "sha256": config.profile.sha256}
    return cfg


def plan_of(model: ImportedModel, cluster: ClusterSpec, config: CostConfig, strategy: str, pcg: PCG,
            views: tuple[MachineView, ...], report: CostReport, rewrites: tuple[dict, ...] = ()) -> Plan:
    """A plan for one priced graph (a benchmark's or a test's: a graph no search chose),
    with the prediction ``unity run`` compares against, its bytes per device included."""
    summary = report_summary(report, cluster.num_devices)
    predicted = {**summary, "memory_bytes": list(report.memory), "comm_bytes": list(report.comm_bytes)}
    return Plan(model_info(model), cluster, config_json(config, report.sync_bucket, report.training), strategy, pcg,
                views, predicted, {strategy: summary}, rewrites=rewrites)
