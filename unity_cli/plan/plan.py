"""The plan file: everything ``unity run`` needs, in one versioned, deterministic JSON document.

Deterministic means the same inputs give a byte-identical file: keys are sorted, node
ids are topological positions, floats are written by ``repr`` (which round-trips), and
nothing time-dependent goes in. The model path is stored as the user gave it.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cluster.parse import parse_cluster
from ..cluster.spec import ClusterSpec
from ..errors import PlanError, ShapeError, UnityError
from ..files import write_atomic
from ..ir import PCG, DType, GraphBuilder, TensorRef
from ..ir.machine_view import MachineView, check_view, devices_used
from ..ir.opspec import OpKind, attrs_from_json, attrs_to_json
from ..ir.recompute import Recompute
from ..ir.shapes import ParallelDim, ParallelTensorShape
from ..ir.training import ZERO_STAGES, Training, unmatched
from ..ir.validate import problems
from ..jsonfile import read_json

FORMAT = "unity-plan/1"
HASH_FIELD = "content_sha256"
"""SHA-256 of the plan's canonical content (every other field): ``run``, ``explain`` and
``report`` refuse a plan whose content no longer matches, so an edited plan never trains."""


def content_hash(doc: Mapping[str, Any]) -> str:
    """SHA-256 of ``doc`` without :data:`HASH_FIELD`, as canonical JSON (sorted keys, no
    spaces; floats by repr, which round-trips). Raises ValueError on NaN or infinity."""
    body = {k: v for k, v in doc.items() if k != HASH_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal(doc: Any) -> Any:
    """``doc`` with its content hash, as ``unity optimize`` writes it (anything but a JSON
    object as it is)."""
    return {**doc, HASH_FIELD: content_hash(doc)} if isinstance(doc, Mapping) else doc


@dataclass(frozen=True)
class Plan:
    model: dict[str, Any]          # path, sha256, inputs {name: {dims, dtype}}, outputs, batch_size
    cluster: ClusterSpec
    config: dict[str, Any]         # dtype, optimizer, [memory_limit_bytes], [profile: {path, sha256}],
                                   # [sync_bucket_bytes]
    strategy: str
    pcg: PCG
    views: tuple[MachineView, ...]
    predicted: dict[str, Any]      # step_time_ms, compute_ms, comm_ms, memory_bytes, [comm_bytes]
    baselines: dict[str, dict[str, Any]]
    rewrites: tuple[dict[str, Any], ...] = ()
    search: dict[str, Any] = field(default_factory=dict)
    sha256: str = field(default="", compare=False)   # its content_sha256, as read (a run report cites it)

    def to_json(self) -> dict[str, Any]:
        nodes = []
        for i, n in self.pcg:
            nodes.append({
                "id": i,
                "name": n.name,
                "op": attrs_to_json(n.op),
                "inputs": [[r.node, r.index] for r in n.inputs],
                "outputs": [shape_to_json(s) for s in n.outputs],
                "view": self.views[i].to_json(),
            })
        return {
            "format": FORMAT,
            "model": self.model,
            "cluster": self.cluster.to_dict(),
            "config": self.config,
            "strategy": self.strategy,
            "pcg": {"nodes": nodes, "outputs": [[r.node, r.index] for r in self.pcg.outputs]},
            "predicted": self.predicted,
            "baselines": self.baselines,
            "rewrites": list(self.rewrites),
            "search": self.search,
        }

    def dumps(self) -> str:
        return json.dumps(seal(self.to_json()), sort_keys=True, indent=1, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        try:
            write_atomic(path, self.dumps())
        except OSError as e:
            raise PlanError(f"{path}: cannot write the plan: {e.strerror}") from None

    @property
    def devices(self) -> int:
        return devices_used(self.pcg, self.views)

    @property
    def sync_bucket_bytes(self) -> int:
        """The gradient sync's bucket size (``ir/buckets.py``; 0, and in plans made before
        plans chose it: one flat all-reduce per group after backward)."""
        return int(self.config.get("sync_bucket_bytes", 0))

    @property
    def training(self) -> Training:
        """The step's micro-batches, ZeRO stage and recomputation (``ir/training.py``; the
        defaults in plans that do not name them)."""
        return Training.from_json(self.config)

    @property
    def comm_bytes(self) -> list[int] | None:
        """The bytes of tensor data each device sends per training step, as predicted when the
        plan was made (None for plans made before plans recorded them)."""
        got = self.predicted.get("comm_bytes")
        return [int(b) for b in got] if isinstance(got, list) else None


def shape_to_json(s: ParallelTensorShape) -> dict[str, Any]:
    return {"sizes": list(s.sizes), "degrees": list(s.degrees), "dtype": s.dtype.value,
            "sum": s.sum_degree, "copy": s.copy_degree}


def shape_from_json(d: Mapping[str, Any]) -> ParallelTensorShape:
    dims = tuple(ParallelDim(int(a), int(b)) for a, b in zip(d["sizes"], d["degrees"], strict=True))
    return ParallelTensorShape(dims, DType(d["dtype"]), int(d["sum"]), int(d["copy"]))


def load_plan(path: str | os.PathLike) -> Plan:
    """Read and check a plan; every problem is a PlanError naming the file and field."""
    p = Path(path)
    data = read_json(p, PlanError, "plan")
    if isinstance(data, dict) and data.get("format") == FORMAT:
        if HASH_FIELD not in data:
            raise PlanError(f"{p}: {HASH_FIELD}: missing (unity optimize writes it; this plan was written by "
                            "something else or edited): re-plan with unity optimize")
        try:
            digest = content_hash(data)
        except ValueError:
            raise PlanError(f"{p}: holds NaN or infinity, which unity optimize never writes: the plan was "
                            "edited; re-plan with unity optimize") from None
        if digest != data[HASH_FIELD]:
            raise PlanError(f"{p}: its content does not match its {HASH_FIELD}: the plan was edited after "
                            "unity optimize wrote it; re-plan with unity optimize")
    try:
        return plan_from_json(data)
    except PlanError as e:
        raise PlanError(f"{p}: {e}") from None


def _disagreement(data: dict, pcg: PCG) -> str:
    """Where the plan's fields contradict its graph (empty when they agree): ``model.inputs``
    must be the graph's inputs, name for name, shape for shape; ``model.outputs`` one name per
    graph output; ``strategy`` one of the priced rows, at the price ``predicted`` states."""
    model = data["model"]
    if not isinstance(model, dict) or not isinstance(model.get("inputs"), dict) \
            or not isinstance(model.get("outputs"), list):
        return "model: expected an object with inputs {name: {dims, dtype}} and a list of outputs"
    graph = {n.name: n.op.shape for _, n in pcg if n.kind == OpKind.Input}
    for name in sorted(set(graph) | set(model["inputs"])):
        if name not in model["inputs"]:
            return f"pcg: input node {name!r} is not among model.inputs ({', '.join(sorted(model['inputs']))})"
        if name not in graph:
            return f"model.inputs.{name}: the graph has no input node of that name"
        have, want = model["inputs"][name], graph[name]
        if not isinstance(have, dict) or have.get("dims") != list(want.dims) or have.get("dtype") != want.dtype.value:
            return (f"model.inputs.{name}: {have} but the graph's input node is "
                    f"{{'dims': {list(want.dims)}, 'dtype': {want.dtype.value!r}}}")
    if len(model["outputs"]) != len(pcg.outputs) or not all(isinstance(o, str) for o in model["outputs"]):
        return f"model.outputs: {model['outputs']} does not name the graph's {len(pcg.outputs)} output(s)"
    rows, strategy = data["baselines"], data["strategy"]
    if not isinstance(rows, dict):
        return "baselines: expected an object of priced rows"
    if not isinstance(strategy, str) or strategy not in rows:
        return f"strategy: {strategy!r} is none of the priced rows in baselines ({', '.join(sorted(rows))})"
    said = data["predicted"].get("step_time_ms") if isinstance(data["predicted"], dict) else None
    if not isinstance(rows[strategy], dict) or rows[strategy].get("step_time_ms") != said:
        return (f"predicted.step_time_ms: {said} but baselines.{strategy}.step_time_ms is "
                f"{rows[strategy].get('step_time_ms') if isinstance(rows[strategy], dict) else rows[strategy]}")
    return ""


def _bad_config(config: Any) -> str:
    """Why the plan's ``config`` cannot be run as it says ('' if it can)."""
    if not isinstance(config, dict):
        return "config: expected an object"
    b = config.get("sync_bucket_bytes", 0)
    if isinstance(b, bool) or not isinstance(b, int) or b < 0:
        return (f"config.sync_bucket_bytes: expected a whole number of bytes >= 0 (0: one all-reduce "
                f"after backward), got {b!r}")
    z = config.get("zero", 0)
    if isinstance(z, bool) or z not in ZERO_STAGES:
        return f"config.zero: expected a ZeRO stage ({', '.join(map(str, ZERO_STAGES))}), got {z!r}"
    k = config.get("micro_batches", 1)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1 << 20:
        return f"config.micro_batches: expected a whole number of micro-batches >= 1, got {k!r}"
    r = config.get("recompute", Recompute.NONE)
    if not isinstance(r, str) or r not in set(Recompute):
        return f"config.recompute: expected one of {', '.join(Recompute)}, got {r!r}"
    n = config.get("recompute_segments", 0)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1 << 20 or n and r == Recompute.NONE:
        return (f"config.recompute_segments: expected a whole number of segments >= 0 (with recompute "
                f"full or selective), got {n!r}")
    by_weight = config.get("zero_by_weight", [])
    if not isinstance(by_weight, list) or not all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and e[0] and type(e[1]) is int
            and e[1] in ZERO_STAGES for e in by_weight):
        return (f"config.zero_by_weight: expected a list of [weight name pattern, ZeRO stage "
                f"({', '.join(map(str, ZERO_STAGES))})], got {str(by_weight)[:200]}")
    if (z or any(e[1] for e in by_weight)) and b:
        field = "config.zero" if z else "config.zero_by_weight"
        return f"{field}: ZeRO's sync runs flat, but config.sync_bucket_bytes names buckets"
    return ""


def _unmatched(config: dict, pcg: PCG) -> str:
    """The first of ``config.zero_by_weight``'s patterns that names no trainable weight of
    ``pcg`` ('' if each names one)."""
    by_weight = config.get("zero_by_weight", [])
    k = unmatched(by_weight, pcg)
    return f"config.zero_by_weight[{k}]: {by_weight[k][0]!r} names no trainable weight of the plan's graph" \
        if k is not None else ""


def plan_from_json(data: Any) -> Plan:
    if not isinstance(data, dict):
        raise PlanError("the plan is not a JSON object")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise PlanError(f"format: expected {FORMAT!r}, got {fmt!r}")
    for key in ("model", "cluster", "config", "strategy", "pcg", "predicted", "baselines"):
        if key not in data:
            raise PlanError(f"{key}: missing")
    try:
        cluster = parse_cluster(data["cluster"], source="plan")
    except UnityError as e:
        raise PlanError(f"cluster: {e}") from None
    b = GraphBuilder()
    views = []
    nodes = data["pcg"].get("nodes") if isinstance(data["pcg"], dict) else None
    if not isinstance(nodes, list):
        raise PlanError("pcg.nodes: missing or not a list")
    for i, nd in enumerate(nodes):
        where = f"pcg.nodes[{i}]"
        try:
            if nd["id"] != i:
                raise PlanError(f"{where}.id: expected {i}, got {nd['id']}")
            op = attrs_from_json(nd["op"])
            ins = [TensorRef(int(a), int(k)) for a, k in nd["inputs"]]
            outs = [shape_from_json(s) for s in nd["outputs"]]
            b.add(op, ins, str(nd.get("name", "")), outputs=outs)
            views.append(MachineView.from_json(nd["view"]))
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise PlanError(f"{where}: malformed ({type(e).__name__}: {e})") from None
    try:
        pcg = b.build(TensorRef(int(a), int(k)) for a, k in data["pcg"]["outputs"])
    except (UnityError, KeyError, TypeError, ValueError) as e:
        raise PlanError(f"pcg: {e}") from None
    bad = problems(pcg)
    if bad:
        raise PlanError(f"pcg: {bad[0]}")
    for i, n in pcg:
        try:
            why = check_view(views[i], n.outputs[0], cluster.num_devices)
        except ShapeError as e:  # e.g. a stride count that does not match the tensor's axes
            why = str(e)
        if why:
            raise PlanError(f"pcg.nodes[{i}].view: {why}")
    why = _disagreement(data, pcg) or _bad_config(data["config"]) or _unmatched(data["config"], pcg)
    if why:
        raise PlanError(why)
    return Plan(data["model"], cluster, data["config"], data["strategy"], pcg, tuple(views), data["predicted"],
                data["baselines"], tuple(data.get("rewrites", ())), data.get("search", {}),
                str(data.get(HASH_FIELD, "")))
