"""``validate(pcg)``: every node's stored shapes are what its specification infers."""
from __future__ import annotations

from ..errors import ShapeError
from .opspec import spec_of
from .pcg import PCG


def problems(pcg: PCG) -> list[str]:
    """Every inconsistency in the graph, one message each (empty when valid)."""
    out = []
    for i, n in pcg:
        where = f"node %{i} {n.name or n.kind}"
        for k, s in enumerate(n.outputs):
            for p in s.problems():
                out.append(f"{where}: output {k}: {p}")
        if n.spec.is_source:
            if n.inputs:
                out.append(f"{where}: a source has inputs")
            if n.outputs != n.spec.infer_parallel(n.op, ()):
                out.append(f"{where}: stored output {[str(s) for s in n.outputs]} differs from its "
                           f"declared shape {n.op.shape}")
            continue
        try:
            want = spec_of(n.op).infer_parallel(n.op, [pcg.shape(r) for r in n.inputs])
        except ShapeError as e:
            out.append(f"{where}: {e}")
            continue
        if tuple(want) != n.outputs:
            out.append(f"{where}: stored outputs {[str(s) for s in n.outputs]} but the spec infers "
                       f"{[str(s) for s in want]}")
    return out


def validate(pcg: PCG) -> None:
    """Raise ShapeError naming the first bad node if the PCG is inconsistent."""
    bad = problems(pcg)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ShapeError(bad[0] + more)
