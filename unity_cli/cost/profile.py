"""The profile DB: measured operator and communication times that replace the roofline.

``unity profile`` writes it; ``unity optimize`` reads it (``--profile``, or the default
location :func:`default_profile_path` when that file exists and fits the cluster). It is
one versioned JSON document, written deterministically (sorted keys, floats by ``repr``)
so that save -> load -> save is byte-identical and its SHA-256 names one measurement::

    {"format": "unity-profile/1",
     "machine":  {...},   # where it was measured (host, CPU/GPU, numpy/cupy version): for people
     "settings": {...},   # how (repeats, time caps, models, cluster): for people
     "compute": {DEVICE TYPE: {"kind": "cpu" | "gpu",
                               "dtypes": {DTYPE: {PIECE KEY: {"op": KIND, "fwd_s": s, "bwd_s": s,
                                                              "repeats": n,
                                                              "roof_fwd_s": s, "roof_bwd_s": s,
                                                              "in_situ": true,
                                                              "alone_fwd_s": s, "alone_bwd_s": s}}},
                               "dispatch_s": s,                 # optional: per task, beside its kernels
                               "update_s": {OPTIMIZER: s},      # optional: per weight piece and step
                               "loss_s": s,                     # optional: per step
                               "parallel_task_s": s}},          # optional: per pass of a parallel op that moves data
     "comm": {"device_type": NAME | null, "ranks": P, "hosts": H,
              "call_overhead_s": {PHASE: s},                    # optional: per data-plane call
              "sync_overlap": {"fraction": f, "bytes": n,       # optional: how much of an all-reduce
                               "samples": [[alone_s, compute_s, both_s], ...]},  # hides under compute
              "links": {LINK KIND: {"latency_s": s, "bandwidth_Bps": b, "samples": [[bytes, s], ...]}},
              "collectives": {COLLECTIVE: {LINK KIND: {"ranks": p, "alpha_s": s, "beta_s_per_byte": s,
                                                       "samples": [[bytes, s], ...]}}}}}

``DEVICE TYPE`` is the cluster spec's device type key (``cpu-core``); a ``PIECE KEY``
(:func:`piece_key`) is the canonical attrs of the op as one piece runs it plus the shapes of
its input and output pieces; ``LINK KIND`` is ``intra-node`` or ``inter-node``; a
``COLLECTIVE`` is a :class:`~unity_cli.cost.comm.Collective` value, fitted as
``alpha + beta * bytes`` at ``p`` ranks with the byte counts of ``cost.comm``. Times are
medians of repeats after a warm-up.

``roof_fwd_s``/``roof_bwd_s`` (optional) are the spec's roofline for the same piece. From
them the profile fits, per operator kind, ``measured = a + b * roofline`` and prices the
pieces it did not measure with that fit rather than with the bare roofline: a search
would otherwise prefer exactly the pieces nobody timed, because the roofline is
optimistic (a plan identical to data parallelism but for a replicated batch came out 25 %
faster on paper, and ran slower).

``in_situ`` marks a piece timed inside training steps (``unity profile --plan``), with
the time it took alone (``alone_*``) when that was measured too. Pieces run slower among
their neighbours than alone, so a piece timed only alone is scaled by the median in-step
to alone ratio of its kind (else of all kinds); without that, a search re-run on the
profile would prefer the pieces that were only timed alone.

``dispatch_s`` is what the runtime's executor spends on one task (forward and backward)
besides its kernels or messages, ``update_s`` the fixed cost of one optimizer update of
one weight piece and ``loss_s`` that of a step's loss; all are measured by
``runtime/calibrate.py`` and added by the cost model to every task, every stored weight
piece and every step on that device type.

``unity profile --plan`` also times what a training step pays besides kernels and the
links' fits, in the plan's own steps (``profiling/profiler.py``, :func:`measure_in_situ`):
``update_s`` and ``loss_s`` are then the optimizer's and the loss's phases less the
bandwidth terms the cost model adds, per weight piece and per step; ``parallel_task_s``
is what the executor spends on one pass of a parallel op's task outside the
communicator (buffers, copies, the calls' bookkeeping), which the runtime counts as
compute; and ``comm.call_overhead_s`` is the mean excess of a data-plane call in a step
over what the fits price it at (the least time any rank spent in it, so waiting for a
late rank is not counted), per phase of the step (``fwd``, ``bwd``, ``loss``, ``sync``:
a call after a long stretch of compute costs more than one among others), which the
cost model adds to every call it prices in that phase (in a phase it was not measured
in, the mean of those it was).

``comm.sync_overlap`` is the share of an all-reduce started without waiting that runs
beside the compute after it (0: none, the compute waits for all of it; 1: all of it):
``unity profile`` times an all-reduce of ``bytes`` alone, a stretch of matrix products of
about the same length alone, and both together, the all-reduce started first and tested
between the products, as the runtime's bucketed gradient sync does (``runtime/weights.py``);
the fraction is ``(alone + compute - both) / min(alone, compute)`` from the medians of the
slowest rank. The cost model prices a bucketed sync with it and chooses the bucket size
by it (``cost/model.py``); without it, the sync is one all-reduce per group after backward.

Only ``compute`` and ``comm`` feed the cost model; ``machine`` and ``settings`` reach a
plan only through the profile's content hash.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from ..cluster.collectives import Collective
from ..cluster.spec import ClusterSpec, DeviceType
from ..errors import ProfileError
from ..files import write_atomic
from ..ir.dtypes import DType
from ..ir.opspec import attrs_key
from ..ir.shapes import TensorShape
from ..jsonfile import read_json
from .comm import INTER_NODE, INTRA_NODE

FORMAT = "unity-profile/1"
LINK_KINDS = (INTRA_NODE, INTER_NODE)
COLLECTIVES = tuple(c.value for c in Collective)
PROFILE_DIR_ENV = "UNITY_PROFILE_DIR"
_TOP_KEYS = ("comm", "compute", "format", "machine", "settings")
CALL_PHASES = ("fwd", "bwd", "loss", "sync")
_FLOAT_DTYPES = tuple(d.value for d in DType if d.is_float)


def piece_key(op: Any, inputs: Sequence[TensorShape], outputs: Sequence[TensorShape],
              mask: Sequence[bool] | None = None) -> str:
    """The DB key of one operator piece: ``<canonical attrs>|<input pieces>-><output pieces>``,
    e.g. ``{"kind":"Relu"...}|float32[4,32]->float32[4,32]``. ``op`` is the attrs the piece
    runs with (:func:`unity_cli.ir.pieces.piece_op`), shapes are piece shapes. A piece whose
    backward makes only some input gradients (``mask``, :func:`unity_cli.ir.opspec.backward_mask`)
    ends in ``|grads=01`` (here: not the first input's)."""
    key = f"{attrs_key(op)}|{';'.join(map(str, inputs))}->{';'.join(map(str, outputs))}"
    return key if mask is None else key + "|grads=" + "".join("1" if m else "0" for m in mask)


def default_profile_dir() -> Path:
    """``$UNITY_PROFILE_DIR``, else ``~/.cache/unity/profiles``."""
    env = os.environ.get(PROFILE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "unity" / "profiles"


def default_profile_path(cluster_name: str) -> Path:
    """Where ``unity profile`` writes, and ``unity optimize`` looks, by default: one file
    per cluster name (characters unsafe in a file name become ``_``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", cluster_name) or "cluster"
    return default_profile_dir() / f"{safe}.json"


@dataclass(frozen=True, slots=True)
class OpTime:
    """Measured seconds of one piece, forward and backward (medians of ``repeats``)."""

    op: str
    fwd: float
    bwd: float
    repeats: int
    roof_fwd: float | None = None     # the spec's roofline for the same piece, when recorded
    roof_bwd: float | None = None
    in_situ: bool = False             # timed inside training steps
    alone_fwd: float | None = None    # ... and alone, when both were measured
    alone_bwd: float | None = None


@dataclass(frozen=True, slots=True)
class Calibration:
    """``measured = a + b * roofline`` for one direction of one operator kind, never below
    the roofline itself (a lower bound by construction)."""

    a: float
    b: float

    def __call__(self, roof: float) -> float:
        return max(roof, self.a + self.b * roof) if roof > 0 else 0.0

    @staticmethod
    def fit(pairs: Sequence[tuple[float, float]]) -> Calibration | None:
        """From (roofline, measured) pairs with both positive (a zero measurement is a piece
        that did no work there, not a data point). Least squares on relative error with
        ``a, b >= 0``; a single distinct roofline, or times that do not grow with it, give
        the plain median ratio. None when nothing usable is left."""
        pairs = sorted((r, m) for r, m in pairs if r > 0 and m > 0 and math.isfinite(r) and math.isfinite(m))
        if not pairs:
            return None
        ratio = Calibration(0.0, statistics.median(m / r for r, m in pairs))
        fallback = ratio if math.isfinite(ratio.b) else None
        if len({r for r, _ in pairs}) < 2:
            return fallback
        a, b = _relative_line(pairs)
        if not (b > 0 and math.isfinite(a) and math.isfinite(b)):
            return fallback
        return Calibration(a, b)


@dataclass(frozen=True, slots=True)
class LinkFit:
    """A measured point-to-point link: ``latency + bytes / bandwidth`` seconds."""

    latency: float
    bandwidth: float


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """A collective of ``ranks`` ranks, fitted as ``alpha + beta * bytes`` seconds."""

    ranks: int
    alpha: float
    beta: float

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


@dataclass(frozen=True, slots=True)
class Overheads:
    """The runtime's own work on one device type (seconds; see the module's docstring)."""

    dispatch: float = 0.0
    update: Mapping[str, float] = field(default_factory=dict)
    loss: float = 0.0
    parallel_task: float | None = None


_NO_OVERHEADS = Overheads()


@dataclass(frozen=True, eq=False)
class Profile:
    """A loaded, validated profile DB. Immutable; equal and hashed by content (SHA-256 of
    its canonical text), so a :class:`~unity_cli.cost.model.CostConfig` holding one can key
    caches. ``source`` (where it was read from) is not content."""

    text: str
    source: str | None = None
    sha256: str = field(init=False)
    _ops: Mapping[tuple[str, str, str], Mapping[str, OpTime]] = field(init=False, repr=False)
    _links: Mapping[str, LinkFit] = field(init=False, repr=False)
    _collectives: Mapping[tuple[str, str], CollectiveFit] = field(init=False, repr=False)
    _types: frozenset[tuple[str, str]] = field(init=False, repr=False)
    _overheads: Mapping[tuple[str, str], Overheads] = field(init=False, repr=False)
    _call_overhead: Mapping[str, float] = field(init=False, repr=False)
    _sync_overlap: float | None = field(init=False, repr=False)
    _comm_type: tuple[str, str] | None = field(init=False, repr=False)
    _calibrations: Mapping[tuple[str, str, str], Mapping[str, tuple[Calibration, Calibration]]] = field(
        init=False, repr=False)
    _hash: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        data = json.loads(self.text)
        ops, links, colls, comm_type, overheads = _validate(data)
        object.__setattr__(self, "_overheads", MappingProxyType(overheads))
        over = data["comm"].get("call_overhead_s", {})
        object.__setattr__(self, "_call_overhead", MappingProxyType(
            {**dict.fromkeys(CALL_PHASES, statistics.fmean(over.values()) if over else 0.0), **over}))
        ov = data["comm"].get("sync_overlap")
        object.__setattr__(self, "_sync_overlap", None if ov is None else ov["fraction"])
        digest = hashlib.sha256(self.text.encode()).hexdigest()
        object.__setattr__(self, "sha256", digest)
        object.__setattr__(self, "_hash", int(digest[:16], 16))
        ops = {k: MappingProxyType(_as_in_steps(t)) for k, t in ops.items()}
        object.__setattr__(self, "_ops", MappingProxyType(ops))
        object.__setattr__(self, "_calibrations", MappingProxyType({k: _calibrate(t) for k, t in ops.items()}))
        object.__setattr__(self, "_links", MappingProxyType(links))
        object.__setattr__(self, "_collectives", MappingProxyType(colls))
        types = {(name, kind) for name, kind, _ in ops}
        if comm_type is not None and (links or colls):
            types.add(comm_type)
        object.__setattr__(self, "_types", frozenset(types))
        object.__setattr__(self, "_comm_type", comm_type)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and other.sha256 == self.sha256

    # -- building and writing ----------------------------------------------------------

    @staticmethod
    def from_json(data: Any, source: str | None = None) -> Profile:
        """Validate a document (a :class:`ProfileError` names the field) and freeze it."""
        try:
            text = dumps(data)
        except (TypeError, ValueError) as e:
            raise ProfileError(f"not a JSON profile: {e}") from None
        return Profile(text, source)

    def to_json(self) -> dict[str, Any]:
        return json.loads(self.text)

    def save(self, path: str | os.PathLike) -> None:
        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(p, self.text)  # a reader never sees half a file
        except OSError as e:
            raise ProfileError(f"{p}: cannot write the profile: {e.strerror}") from None

    # -- what the cost model asks --------------------------------------------------------

    def op_time(self, device: DeviceType, dtype: str, key: str) -> OpTime | None:
        """The measured piece on ``device`` (matched by type name and kind) in ``dtype``."""
        table = self._ops.get((device.name, device.kind.value, dtype))
        return table.get(key) if table is not None else None

    def unmeasured(self, device: DeviceType, dtype: str, kind: str, roof_fwd: float, roof_bwd: float
                   ) -> tuple[float, float] | None:
        """A piece of operator ``kind`` this profile did not measure, priced from its roofline
        by the fit of the pieces it did measure on ``device`` (that kind's, else all kinds');
        None when it recorded no rooflines there."""
        table = self._calibrations.get((device.name, device.kind.value, dtype))
        fits = table.get(kind) or table.get("*") if table else None
        return (fits[0](roof_fwd), fits[1](roof_bwd)) if fits else None

    def _overhead(self, device: DeviceType) -> Overheads:
        return self._overheads.get((device.name, device.kind.value), _NO_OVERHEADS)

    def dispatch(self, device: DeviceType) -> float:
        """Seconds the runtime adds to each compute task on ``device`` (0 if not measured)."""
        return self._overhead(device).dispatch

    def update_overhead(self, device: DeviceType, optimizer: str) -> float:
        """Fixed seconds of one optimizer update of one weight piece (0 if not measured)."""
        return self._overhead(device).update.get(optimizer, 0.0)

    def loss(self, device: DeviceType) -> float:
        """Fixed seconds of a step's loss on ``device`` (0 if not measured)."""
        return self._overhead(device).loss

    def parallel_task(self, device: DeviceType) -> float:
        """Seconds the executor spends on one pass of a parallel op's task that moves data,
        outside the communicator: measured in steps, else half a dispatch (0 if neither)."""
        o = self._overhead(device)
        return o.parallel_task if o.parallel_task is not None else o.dispatch / 2

    def call_overhead(self, phase: str) -> float:
        """Seconds a data-plane call in ``phase`` of a step (``fwd``, ``bwd``, ``loss``,
        ``sync``) takes beyond what the fits price it at (0 if not measured)."""
        return self._call_overhead.get(phase, 0.0)

    def sync_overlap(self, device: DeviceType) -> float | None:
        """The share of a nonblocking all-reduce between devices of this type that runs beside
        their compute (``comm.sync_overlap``; None if not measured for this type)."""
        ct = self._comm_type
        if self._sync_overlap is None or ct != (device.name, device.kind.value):
            return None
        return self._sync_overlap

    def link(self, kind: str) -> LinkFit | None:
        """The measured point-to-point link of a kind (``intra-node``/``inter-node``)."""
        return self._links.get(kind)

    def collective(self, name: str, link_kind: str, ranks: int) -> CollectiveFit | None:
        """The fit of a collective over a link kind, if it was measured at ``ranks`` ranks."""
        fit = self._collectives.get((name, link_kind))
        return fit if fit is not None and fit.ranks == ranks else None

    @property
    def num_ops(self) -> int:
        return sum(len(t) for t in self._ops.values())

    @property
    def device_types(self) -> frozenset[tuple[str, str]]:
        """(name, kind) of every device type with measurements (compute or comm)."""
        return self._types

    def fits(self, cluster: ClusterSpec) -> bool:
        """Whether it measured one of the cluster's device types (same name and kind)."""
        types = {(n.device.name, n.device.kind.value) for n in cluster.nodes}
        return bool(types & self.device_types)

    def describe(self) -> str:
        """``12 op pieces on cpu-core (float32), intra-node link 1.2 us + 5.1 GB/s``."""
        parts = []
        by_dev: dict[str, list[str]] = {}
        for (name, _, dtype), table in sorted(self._ops.items()):
            by_dev.setdefault(name, []).append(f"{len(table)} {dtype}")
        if by_dev:
            parts.append("op pieces on " + ", ".join(f"{k} ({', '.join(v)})" for k, v in by_dev.items()))
        for kind, fit in sorted(self._links.items()):
            parts.append(f"{kind} link {fit.latency * 1e6:.2f} us + {fit.bandwidth / 1e9:.2f} GB/s")
        return "; ".join(parts) or "no measurements"


def _pair(t: Mapping[str, Any], where: str, name: str) -> tuple[float | None, float | None]:
    """``<name>_fwd_s`` and ``<name>_bwd_s``: both or neither."""
    f, b = f"{name}_fwd_s", f"{name}_bwd_s"
    if (f in t) != (b in t):
        raise ProfileError(f"{where}: {f} and {b} come together")
    return (_num(t[f], f"{where}.{f}"), _num(t[b], f"{where}.{b}")) if f in t else (None, None)


RATIO_BOUNDS = (0.2, 5.0)
"""In-step / alone ratios outside these are measurement accidents, not slowdowns."""


def _as_in_steps(table: Mapping[str, OpTime]) -> dict[str, OpTime]:
    """Pieces timed only alone, scaled to what they would take inside steps: by the median
    in-step / alone ratio of the pieces of their kind timed both ways (else of all kinds).
    A direction timed 0 on either side (a piece without backward, a time below the
    dispatch) says nothing about the ratio and is left out."""
    lo, hi = RATIO_BOUNDS
    ratios: dict[str, tuple[list[float], list[float]]] = {}
    for t in table.values():
        if not t.in_situ:
            continue
        for k, (situ, alone) in enumerate(((t.fwd, t.alone_fwd), (t.bwd, t.alone_bwd))):
            if alone and situ > 0 and alone > 0 and lo <= situ / alone <= hi:
                for kind in (t.op, "*"):
                    ratios.setdefault(kind, ([], []))[k].append(situ / alone)
    if not ratios:
        return dict(table)

    def scale(kind: str, k: int) -> float:
        for key in (kind, "*"):
            got = ratios.get(key, ([], []))[k]
            if got:
                return statistics.median(got)
        return 1.0

    return {key: t if t.in_situ else OpTime(t.op, t.fwd * scale(t.op, 0), t.bwd * scale(t.op, 1), t.repeats,
                                               t.roof_fwd, t.roof_bwd)
            for key, t in table.items()}


def _calibrate(table: Mapping[str, OpTime]) -> dict[str, tuple[Calibration, Calibration]]:
    """Per operator kind (and ``*`` for all of them), the forward and backward fits."""
    groups: dict[str, list[OpTime]] = {}
    for t in table.values():
        if t.roof_fwd is not None and t.roof_bwd is not None:
            groups.setdefault(t.op, []).append(t)
            groups.setdefault("*", []).append(t)
    out = {}
    for kind, ts in groups.items():
        f = Calibration.fit([(t.roof_fwd, t.fwd) for t in ts])
        b = Calibration.fit([(t.roof_bwd, t.bwd) for t in ts])
        if f is not None and b is not None:
            out[kind] = (f, b)
    return out


def _relative_line(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``y = a + b * x`` by least squares on relative error, ``a >= 0`` (else
    refitted through the origin); non-finite when the numbers defeat the solver."""
    x = np.array([s[0] for s in samples], dtype=float)
    y = np.array([s[1] for s in samples], dtype=float)
    w = 1 / np.maximum(y, 1e-12)
    with np.errstate(all="ignore"):  # absurd magnitudes end up non-finite; callers check
        try:
            a, b = np.linalg.lstsq(np.stack([w, x * w], axis=1), y * w, rcond=None)[0]
        except np.linalg.LinAlgError:
            return math.nan, math.nan
        if a < 0:
            a, b = 0.0, np.sum(x * y * w * w) / np.sum(x * x * w * w)
    return float(a), float(b)


def fit_alpha_beta(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(alpha, beta)`` of ``t = alpha + beta * n`` by least squares on relative error (so
    small messages, which fix the latency, count as much as large ones); neither negative.
    ``samples`` are ``(n, t)`` in increasing ``n``."""
    a, b = _relative_line(samples)
    if not b > 0:  # no bandwidth term visible: take the largest message's
        n, t = samples[-1]
        b = float(t / max(n, 1.0))
        a = max(0.0, min(a, min(s[1] for s in samples))) if math.isfinite(a) else 0.0
    return a, b


def dumps(data: Any) -> str:
    """The canonical text of a profile document."""
    return json.dumps(data, sort_keys=True, indent=1, allow_nan=False) + "\n"


def load_profile(path: str | os.PathLike, source: str | None = None) -> Profile:
    """Read and validate a profile; every problem is one :class:`ProfileError` line naming
    the file and the field. ``source`` (default: ``path``) is how a plan will name it."""
    p = Path(path)
    data = read_json(p, ProfileError, "profile")
    try:
        return Profile.from_json(data, source if source is not None else str(path))
    except ProfileError as e:
        raise ProfileError(f"{p}: {e}") from None


# ---------------------------------------------------------------------------
# Validation: the shape of the document, field by field.


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ProfileError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _num(v: Any, where: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        want = "a positive number" if positive else "a non-negative number"
        raise ProfileError(f"{where}: expected {want}, got {v!r}")
    return float(v)


def _int(v: Any, where: str, least: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ProfileError(f"{where}: expected an integer >= {least}, got {v!r}")
    return v


def _keys(d: dict[str, Any], where: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    for k in required:
        if k not in d:
            raise ProfileError(f"{where}.{k}: missing" if where else f"{k}: missing")
    extra = sorted(set(d) - set(required) - set(optional))
    if extra:
        at = f"{where}.{extra[0]}" if where else extra[0]
        raise ProfileError(f"{at}: unknown field")


def _samples(v: Any, where: str) -> None:
    if not isinstance(v, list) or any(not isinstance(s, list) or len(s) != 2 for s in v):
        raise ProfileError(f"{where}: expected a list of [bytes, seconds] pairs")
    for k, (n, t) in enumerate(v):
        _num(n, f"{where}[{k}][0]")
        _num(t, f"{where}[{k}][1]")


def _validate(data: Any) -> tuple[dict, dict, dict, tuple[str, str] | None, dict]:
    """The lookup tables of a document, or a ProfileError naming the bad field."""
    data = _obj(data, "the profile")
    if data.get("format") != FORMAT:
        raise ProfileError(f"format: expected {FORMAT!r}, got {data.get('format')!r}")
    _keys(data, "", _TOP_KEYS)
    _obj(data["machine"], "machine")
    _obj(data["settings"], "settings")
    ops: dict[tuple[str, str, str], dict[str, OpTime]] = {}
    overheads: dict[tuple[str, str], Overheads] = {}
    for dev, entry in sorted(_obj(data["compute"], "compute").items()):
        where = f"compute.{dev}"
        _keys(_obj(entry, where), where, ("dtypes", "kind"), ("dispatch_s", "loss_s", "parallel_task_s", "update_s"))
        kind = entry["kind"]
        if kind not in ("cpu", "gpu"):
            raise ProfileError(f"{where}.kind: expected 'cpu' or 'gpu', got {kind!r}")
        dispatch = _num(entry.get("dispatch_s", 0.0), f"{where}.dispatch_s")
        update = {}
        for opt, t in sorted(_obj(entry.get("update_s", {}), f"{where}.update_s").items()):
            if opt not in ("sgd", "momentum", "adam"):
                raise ProfileError(f"{where}.update_s.{opt}: unknown optimizer (expected sgd, momentum or adam)")
            update[opt] = _num(t, f"{where}.update_s.{opt}")
        task = entry.get("parallel_task_s")
        overheads[(dev, kind)] = Overheads(dispatch, MappingProxyType(update),
                                           _num(entry.get("loss_s", 0.0), f"{where}.loss_s"),
                                           None if task is None else _num(task, f"{where}.parallel_task_s"))
        for dtype, table in sorted(_obj(entry["dtypes"], f"{where}.dtypes").items()):
            at = f"{where}.dtypes.{dtype}"
            if dtype not in _FLOAT_DTYPES:
                raise ProfileError(f"{at}: not a float dtype (expected one of {', '.join(_FLOAT_DTYPES)})")
            out: dict[str, OpTime] = {}
            for key, t in sorted(_obj(table, at).items()):
                w = f"{at}[{key!r}]"
                _keys(_obj(t, w), w, ("bwd_s", "fwd_s", "op", "repeats"),
                      ("alone_bwd_s", "alone_fwd_s", "in_situ", "roof_bwd_s", "roof_fwd_s"))
                if not isinstance(t["op"], str) or not t["op"]:
                    raise ProfileError(f"{w}.op: expected an operator kind, got {t['op']!r}")
                if not isinstance(t.get("in_situ", False), bool):
                    raise ProfileError(f"{w}.in_situ: expected true or false, got {t['in_situ']!r}")
                roof = _pair(t, w, "roof")
                alone = _pair(t, w, "alone")
                if alone[0] is not None and not t.get("in_situ", False):
                    raise ProfileError(f"{w}.alone_fwd_s: only a piece timed in steps (in_situ) has an alone time")
                out[key] = OpTime(t["op"], _num(t["fwd_s"], f"{w}.fwd_s"), _num(t["bwd_s"], f"{w}.bwd_s"),
                                  _int(t["repeats"], f"{w}.repeats", 1), *roof, t.get("in_situ", False), *alone)
            ops[(dev, kind, dtype)] = MappingProxyType(out)
    comm = _obj(data["comm"], "comm")
    _keys(comm, "comm", ("collectives", "device_kind", "device_type", "hosts", "links", "ranks"),
          ("call_overhead_s", "sync_overlap"))
    if "sync_overlap" in comm:
        ov = _obj(comm["sync_overlap"], "comm.sync_overlap")
        _keys(ov, "comm.sync_overlap", ("bytes", "fraction", "samples"))
        f = _num(ov["fraction"], "comm.sync_overlap.fraction")
        if f > 1:
            raise ProfileError(f"comm.sync_overlap.fraction: expected a share from 0 to 1, got {f!r}")
        _int(ov["bytes"], "comm.sync_overlap.bytes", 1)
        rows = ov["samples"]
        if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != 3 for r in rows):
            raise ProfileError("comm.sync_overlap.samples: expected a list of [alone_s, compute_s, both_s] triples")
        for k, r in enumerate(rows):
            for j, t in enumerate(r):
                _num(t, f"comm.sync_overlap.samples[{k}][{j}]")
    for phase, t in _obj(comm.get("call_overhead_s", {}), "comm.call_overhead_s").items():
        if phase not in CALL_PHASES:
            raise ProfileError(f"comm.call_overhead_s.{phase}: unknown phase (expected {', '.join(CALL_PHASES)})")
        _num(t, f"comm.call_overhead_s.{phase}")
    if comm["device_type"] is not None and not isinstance(comm["device_type"], str):
        raise ProfileError(f"comm.device_type: expected a device type name or null, got {comm['device_type']!r}")
    if comm["device_kind"] not in ("cpu", "gpu", None):
        raise ProfileError(f"comm.device_kind: expected 'cpu', 'gpu' or null, got {comm['device_kind']!r}")
    if (comm["device_type"] is None) != (comm["device_kind"] is None):
        raise ProfileError("comm.device_kind: given without comm.device_type, or the other way round")
    comm_type = (comm["device_type"], comm["device_kind"]) if comm["device_type"] is not None else None
    ranks = _int(comm["ranks"], "comm.ranks", 1)
    _int(comm["hosts"], "comm.hosts", 1)
    links: dict[str, LinkFit] = {}
    for kind, fit in sorted(_obj(comm["links"], "comm.links").items()):
        where = f"comm.links.{kind}"
        if kind not in LINK_KINDS:
            raise ProfileError(f"{where}: unknown link kind (expected one of {', '.join(LINK_KINDS)})")
        _keys(_obj(fit, where), where, ("bandwidth_Bps", "latency_s", "samples"))
        _samples(fit["samples"], f"{where}.samples")
        links[kind] = LinkFit(_num(fit["latency_s"], f"{where}.latency_s"),
                              _num(fit["bandwidth_Bps"], f"{where}.bandwidth_Bps", positive=True))
    colls: dict[tuple[str, str], CollectiveFit] = {}
    for name, per_link in sorted(_obj(comm["collectives"], "comm.collectives").items()):
        if name not in COLLECTIVES:
            raise ProfileError(f"comm.collectives.{name}: unknown collective (expected one of "
                               f"{', '.join(COLLECTIVES)})")
        for kind, fit in sorted(_obj(per_link, f"comm.collectives.{name}").items()):
            where = f"comm.collectives.{name}.{kind}"
            if kind not in LINK_KINDS:
                raise ProfileError(f"{where}: unknown link kind (expected one of {', '.join(LINK_KINDS)})")
            _keys(_obj(fit, where), where, ("alpha_s", "beta_s_per_byte", "ranks", "samples"))
            _samples(fit["samples"], f"{where}.samples")
            colls[(name, kind)] = CollectiveFit(_int(fit["ranks"], f"{where}.ranks", 2),
                                                _num(fit["alpha_s"], f"{where}.alpha_s"),
                                                _num(fit["beta_s_per_byte"], f"{where}.beta_s_per_byte"))
            if colls[(name, kind)].ranks > ranks:
                raise ProfileError(f"{where}.ranks: {fit['ranks']} is more than comm.ranks ({ranks})")
    return ops, links, colls, comm_type, overheads


def profile_for(cluster: ClusterSpec, path: str | None = None, use_default: bool = True
                ) -> tuple[Profile | None, str | None]:
    """The profile ``unity optimize`` plans with, and a note saying which (or why none).

    ``path`` is used whatever it holds; without it, the default location for the
    cluster's name is used when that file exists and measured one of the cluster's
    device types. A malformed file is an error either way: it is never skipped silently.
    """
    if path is not None:
        prof = load_profile(path)
        if not prof.fits(cluster):
            return prof, (f"profile {path} measured none of cluster {cluster.name!r}'s device types; "
                          "operators keep their roofline estimates")
        return prof, f"profile {path}: {prof.describe()}"
    default = default_profile_path(cluster.name)
    if not use_default or not default.is_file():
        return None, None
    try:
        prof = load_profile(default)
    except ProfileError as e:
        raise ProfileError(f"{e} (the default profile of cluster {cluster.name!r}: rerun unity profile, "
                           "or pass --no-profile)") from None
    if not prof.fits(cluster):
        return None, f"ignored {default}: it measured none of cluster {cluster.name!r}'s device types"
    return prof, f"using the measured profile {default} ({prof.describe()}); --no-profile plans without it"
