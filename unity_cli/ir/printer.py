"""A readable one-line-per-node listing of a PCG (debugging and golden tests)."""
from __future__ import annotations

import dataclasses

from .opspec import spec_of
from .pcg import PCG


def op_label(op) -> str:
    kind = spec_of(op).kind
    fields = [f"{f.name}={getattr(op, f.name)}" for f in dataclasses.fields(op)
              if f.name not in ("shape",)]
    if hasattr(op, "fn"):
        return op.fn
    return f"{kind}({', '.join(fields)})" if fields else kind


def format_pcg(pcg: PCG) -> str:
    lines = []
    for i, n in pcg:
        ins = ", ".join(f"%{r.node}" + (f".{r.index}" if r.index else "") for r in n.inputs)
        outs = " ".join(str(s) for s in n.outputs)
        name = f"  # {n.name}" if n.name else ""
        lines.append(f"%{i} = {op_label(n.op)}({ins}) -> {outs}{name}")
    lines.append("return " + ", ".join(f"%{r.node}" for r in pcg.outputs))
    return "\n".join(lines)
