"""Activations that exporters write out as several ops, read back as the one op they are.

PyTorch's exporters write ``nn.GELU`` (and Hugging Face's ``gelu``) as
``x * 0.5 * (1 + erf(x / sqrt(2)))``: Div, Erf, Add, Mul, Mul; and GPT-2's ``NewGELU`` as
``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``: Pow, Mul, Add, Mul, Tanh,
Add, Mul, Mul. Five or eight kernel calls, passes over memory and runtime tasks where ONNX's
``Gelu`` (and ``Gelu(approximate="tanh")``) is one; and only the one op can be fused into
the product before it (``substitutions/families.py``).

:func:`recognise` finds those subgraphs among an import's nodes and puts one ``Gelu`` node
in their place. It is exact, not a guess: every constant must equal the formula's (within
float32 rounding), every product is flattened over its factors in any order (``0.5 * x``
first or last), the ``x`` inside must be the ``x`` outside, and every intermediate must be
read by the subgraph alone (no graph output, no other reader); anything else is left as
it was. The tests hold the result to onnxruntime running the original model.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx

Constant = Callable[[str], "np.ndarray | None"]
"""The value of a tensor known at import (an initializer, a Constant node's), else None."""

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def _close(v: float | None, want: float) -> bool:
    return v is not None and math.isclose(v, want, rel_tol=2e-6, abs_tol=0.0)


class _Graph:
    """The nodes being read: who makes each tensor, and how many readers it has."""

    def __init__(self, nodes: Sequence[onnx.NodeProto], constant: Constant, outputs: Iterable[str]):
        self.by_output = {o: n for n in nodes for o in n.output if o}
        self.readers = Counter(i for n in nodes for i in n.input if i)
        self.outputs = set(outputs)
        self.constant = constant

    def scalar(self, name: str) -> float | None:
        v = self.constant(name)
        if v is None or np.size(v) != 1 or not np.issubdtype(np.asarray(v).dtype, np.number):
            return None
        return float(np.asarray(v).reshape(-1)[0])

    def inner(self, name: str, op: str) -> onnx.NodeProto | None:
        """The ``op`` node making ``name`` if only one node reads it and it is no graph output
        (so it can go when that reader does)."""
        n = self.by_output.get(name)
        if n is None or n.op_type != op or n.domain not in ("", "ai.onnx") or len(n.output) != 1:
            return None
        return n if self.readers[name] == 1 and name not in self.outputs else None

    def factors(self, node: onnx.NodeProto, members: list[onnx.NodeProto]) -> tuple[float, list[str]]:
        """A Mul tree's constant product and its other factors, through the Muls only it reads."""
        members.append(node)
        const, rest = 1.0, []
        for name in node.input:
            sub = self.inner(name, "Mul")
            if sub is not None and len(sub.input) == 2:
                c, r = self.factors(sub, members)
                const, rest = const * c, rest + r
            elif (v := self.scalar(name)) is not None:
                const *= v
            else:
                rest.append(name)
        return const, rest


def _gelu(g: _Graph, root: onnx.NodeProto) -> tuple[str, str, list[onnx.NodeProto]] | None:
    """``(x, approximate, the nodes it replaces)`` if ``root`` ends a written-out Gelu."""
    members: list[onnx.NodeProto] = []
    half, rest = g.factors(root, members)
    if not _close(half, 0.5) or len(rest) != 2:
        return None
    for x, term in (rest, rest[::-1]):
        found = _one_plus(g, term, x, members)
        if found is not None:
            return x, found, members
    return None


def _one_plus(g: _Graph, name: str, x: str, members: list[onnx.NodeProto]) -> str | None:
    """The approximation (``none``/``tanh``) if ``name`` is ``1 + erf(x / sqrt 2)`` or
    ``1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))``; the nodes join ``members``."""
    add = g.inner(name, "Add")
    if add is None or len(add.input) != 2:
        return None
    ones = [i for i in add.input if _close(g.scalar(i), 1.0)]
    if len(ones) != 1:
        return None
    t = next(i for i in add.input if i != ones[0])
    if (erf := g.inner(t, "Erf")) is not None:
        scaled: list[onnx.NodeProto] = []
        if _scaled(g, erf.input[0], x, 1 / SQRT2, scaled):
            members += [add, erf] + scaled
            return "none"
    if (tanh := g.inner(t, "Tanh")) is not None:
        inside: list[onnx.NodeProto] = []
        if _tanh_argument(g, tanh.input[0], x, inside):
            members += [add, tanh] + inside
            return "tanh"
    return None


def _scaled(g: _Graph, name: str, x: str, factor: float, members: list[onnx.NodeProto]) -> bool:
    """Whether ``name`` is ``x * factor`` (a Mul by it, or a Div by its inverse)."""
    div = g.inner(name, "Div")
    if div is not None and len(div.input) == 2 and div.input[0] == x and _close(g.scalar(div.input[1]), 1 / factor):
        members.append(div)
        return True
    mul = g.inner(name, "Mul")
    if mul is not None and len(mul.input) == 2:
        trial: list[onnx.NodeProto] = []
        c, rest = g.factors(mul, trial)
        if rest == [x] and _close(c, factor):
            members += trial
            return True
    return False


def _tanh_argument(g: _Graph, name: str, x: str, members: list[onnx.NodeProto]) -> bool:
    """Whether ``name`` is ``sqrt(2/pi) * (x + 0.044715 * x^3)``."""
    mul = g.inner(name, "Mul")
    if mul is None or len(mul.input) != 2:
        return False
    trial: list[onnx.NodeProto] = []
    c, rest = g.factors(mul, trial)
    add = g.inner(rest[0], "Add") if len(rest) == 1 and _close(c, SQRT_2_OVER_PI) else None
    if add is None or len(add.input) != 2 or x not in add.input or add.input[0] == add.input[1]:
        return False
    term = g.inner(next(i for i in add.input if i != x), "Mul")
    if term is None or len(term.input) != 2:
        return False
    inner: list[onnx.NodeProto] = []
    k, factors = g.factors(term, inner)
    cubed = factors == [x, x, x]
    if len(factors) == 1 and (pw := g.inner(factors[0], "Pow")) is not None:
        cubed = pw.input[0] == x and _close(g.scalar(pw.input[1]), 3.0)
        inner.append(pw)
    if not (cubed and _close(k, CUBIC)):
        return False
    members += trial + [add] + inner
    return True


def _name(members: Sequence[onnx.NodeProto]) -> str:
    """The module the subgraph's nodes share (``/m/layer.0/act/Div``, ``/m/layer.0/act/Mul``:
    ``/m/layer.0/act/Gelu``), else its last node's name."""
    paths = [n.name.split("/") for n in members if n.name]
    common: list[str] = []
    for parts in zip(*(p[:-1] for p in paths)):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    if common and any(common):
        return "/".join(common) + "/Gelu"
    return members[0].name if members else ""


def recognise(nodes: Sequence[onnx.NodeProto], constant: Constant, outputs: Iterable[str]
              ) -> tuple[list[onnx.NodeProto], Counter[str]]:
    """``nodes`` (in a topological order) with each written-out Gelu made one ``Gelu`` node
    where its last node was, and how many of each kind were found."""
    g = _Graph(nodes, constant, outputs)
    gone: set[int] = set()
    put: dict[int, onnx.NodeProto] = {}
    found: Counter[str] = Counter()
    for n in reversed(nodes):   # the last node of a subgraph first, so the outermost product roots it
        if n.op_type != "Mul" or n.domain not in ("", "ai.onnx") or id(n) in gone or len(n.input) != 2:
            continue
        match = _gelu(g, n)
        if match is None or any(id(m) in gone for m in match[2]):
            continue
        x, approximate, members = match
        attrs = {"approximate": "tanh"} if approximate == "tanh" else {}
        put[id(n)] = onnx.helper.make_node("Gelu", [x], [n.output[0]], name=_name(members) or n.output[0], **attrs)
        gone.update(id(m) for m in members)
        found["Gelu (tanh)" if approximate == "tanh" else "Gelu"] += 1
    return [put.get(id(n), n) for n in nodes if id(n) in put or id(n) not in gone], found
