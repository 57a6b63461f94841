"""Per-operator cost tables: where a plan spends its step, and how that compares with
data parallelism."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..cluster.spec import ClusterSpec
from ..cost.model import CostConfig, CostContext, node_cost
from ..ir.machine_view import MachineView
from ..ir.pcg import PCG
from ..ir.printer import op_label
from ..ir.shapes import ParallelTensorShape


@dataclass(frozen=True)
class OperatorRow:
    name: str
    kind: str
    degrees: str                   # e.g. "64/8,32,64 copy=2"
    devices: int
    compute_ms: float
    comm_ms: float

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.comm_ms


def operator_rows(pcg: PCG, views: Sequence[MachineView], cluster: ClusterSpec, config: CostConfig
                  ) -> list[OperatorRow]:
    """One row per non-source node, with the cost model's forward+backward times."""
    ctx = CostContext.of(pcg, cluster, config)
    rows = []
    for i, n in pcg:
        if n.spec.is_source:
            continue
        c = node_cost(ctx, i, views)
        shape = n.outputs[0]
        rows.append(OperatorRow(node_label(pcg, i), n.kind, shape_label(shape), len(set(views[i].devices(shape))),
                                (c.compute_fwd + c.compute_bwd) * 1e3, c.comm * 1e3))
    return rows


def shape_label(shape: ParallelTensorShape) -> str:
    """``[64/8,32,64] copy=2``: each dim's size over its degree, then the replica degrees."""
    dims = ",".join(f"{d.size}" if d.degree == 1 else f"{d.size}/{d.degree}" for d in shape.dims)
    extra = "".join(f" {k}={v}" for k, v in (("sum", shape.sum_degree), ("copy", shape.copy_degree)) if v > 1)
    return f"[{dims}]{extra}"


def node_label(pcg: PCG, i: int) -> str:
    """A node's name; a parallel op without one is named by what it does and to what."""
    n = pcg.nodes[i]
    if n.name:
        return n.name
    if n.spec.is_parallel_op:
        src = n.inputs[0].node
        return f"{node_label(pcg, src)} -> {op_label(n.op)}"
    return n.kind


def heaviest_table(rows: Sequence[OperatorRow], limit: int = 10,
                   baseline: Mapping[str, OperatorRow] | None = None) -> str:
    """The ``limit`` costliest operators; with ``baseline`` (rows by name, e.g. the data-
    parallel plan's), each row's total beside the baseline's."""
    top = sorted(rows, key=lambda r: (-r.total_ms, r.name))[:limit]
    if not top:
        return ""
    width = min(max(len(r.name) for r in top), 48)
    kinds = max(18, *(len(r.kind) + 1 for r in top))     # LayerNormalization is 18 letters
    head = f"  {'operator':<{width}}  {'kind':<{kinds}}{'parallel shape':<26}{'devs':>5}{'compute':>11}{'comm':>11}"
    if baseline is not None:
        head += f"{'vs DP':>11}"
    lines = [head]
    for r in top:
        name = r.name if len(r.name) <= width else "…" + r.name[-(width - 1):]
        line = (f"  {name:<{width}}  {r.kind:<{kinds}}{r.degrees[:25]:<26}{r.devices:>5}"
                f"{r.compute_ms:>9.3f}ms{r.comm_ms:>9.3f}ms")
        if baseline is not None:
            b = baseline.get(r.name)
            line += f"{b.total_ms / r.total_ms:>10.2f}x" if b and r.total_ms > 0 else f"{'-':>11}"
        lines.append(line)
    return "\n".join(lines)
