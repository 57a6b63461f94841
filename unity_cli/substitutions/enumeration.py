"""Enumerating small graphs for the rule generator (steps 1 and 2 of ``generator.py``).

Every graph of up to ``max_ops`` operators over a few unpartitioned input tensors, where
every op type-checks (parallel shapes included) and no op is dead. Graphs are
hash-consed: a node is its structural hash (the one ``PCG.node_hashes`` computes), so
equal graphs built in different orders are one graph, and a partial graph is explored
once. Each graph is fingerprinted by its outputs' exact values on seeded integer inputs
(at two degrees), their parallel shapes and the inputs it uses.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..ir.ops.elementwise import BinaryAttrs, ScaleAttrs, UnaryAttrs
from ..ir.ops.linear import MatMulAttrs
from ..ir.ops.parallel import (
    REPLICA_DIM,
    CombineAttrs,
    ReductionAttrs,
    RepartitionAttrs,
    ReplicateAttrs,
)
from ..ir.ops.shape_ops import ConcatAttrs, SplitAttrs, TransposeAttrs
from ..ir.ops.sources import InputAttrs
from ..ir.opspec import attrs_key, spec_of
from ..ir.pcg import PCG, GraphBuilder, TensorRef
from ..ir.shapes import ParallelTensorShape, TensorShape
from .semantics import reference

ProgressFn = Callable[[int, int], None]

DEFAULT_OPS = ("MatMul", "Add", "Mul", "Relu", "Transpose", "Concat0", "Concat1", "Split0", "Split1",
               "Repartition0", "Repartition1", "Combine0", "Combine1", "CombineCopy", "Replicate",
               "Reduction", "Scale")
"""The op set, by generator name; ``Concat1`` is a Concat on axis 1, ``CombineCopy`` a
Combine of replicas, ``Split0`` a split of axis 0 into two equal halves."""


@dataclass(frozen=True, slots=True)
class GeneratorSettings:
    """What the generator enumerates; the defaults are the shipped rule set's."""

    max_ops: int = 3
    n_inputs: int = 3
    input_dims: tuple[int, ...] = (4, 4)
    degree: int = 2
    ops: tuple[str, ...] = DEFAULT_OPS
    seed: int = 0
    check_degree: int = 3
    """Fingerprints also evaluate each graph at this degree (0: don't), so graphs equal
    only at ``degree`` (``Scale(x, 2)`` and ``Add(x, x)``) give no rule."""

    def __post_init__(self) -> None:
        unknown = [o for o in self.ops if o not in OPS]
        if unknown:
            raise ValueError(f"unknown generator ops {unknown}; known: {', '.join(OPS)}")

    def to_json(self) -> dict[str, Any]:
        return {"max_ops": self.max_ops, "n_inputs": self.n_inputs, "input_dims": list(self.input_dims),
                "degree": self.degree, "ops": list(self.ops), "seed": self.seed,
                "check_degree": self.check_degree}


# ---------------------------------------------------------------------------
# The op set


def _op(name: str, shapes: Sequence[ParallelTensorShape], d: int) -> Any | None:
    """Concrete attributes of generator op ``name`` on inputs of these shapes (None: n/a)."""
    rank = shapes[0].rank
    axis = int(name[-1]) if name[-1].isdigit() else None
    if axis is not None and axis >= rank:
        return None
    match name.rstrip("0123456789"):
        case "MatMul":
            return MatMulAttrs()
        case "Add" | "Mul":
            return BinaryAttrs(name)
        case "Relu":
            return UnaryAttrs("Relu")
        case "Transpose":
            return TransposeAttrs(tuple(range(rank - 2)) + (rank - 1, rank - 2)) if rank >= 2 else None
        case "Concat":
            return ConcatAttrs(axis)
        case "Split":
            n = shapes[0].sizes[axis]
            return SplitAttrs(axis, (n // 2, n // 2)) if n % 2 == 0 else None
        case "Repartition":
            return RepartitionAttrs(axis, d)
        case "Combine":
            return CombineAttrs(axis, d)
        case "CombineCopy":
            return CombineAttrs(REPLICA_DIM, d)
        case "Replicate":
            return ReplicateAttrs(d)
        case "Reduction":
            return ReductionAttrs(d)
        case "Scale":
            return ScaleAttrs(d)
    raise AssertionError(name)


OPS: dict[str, int] = {name: 2 if name in ("MatMul", "Add", "Mul", "Concat0", "Concat1") else 1 for name in DEFAULT_OPS}
"""Generator op name -> number of inputs."""


# ---------------------------------------------------------------------------
# Hash-consed nodes

Ref = tuple[str, int]
"""A tensor during enumeration: (node hash, output index)."""


@dataclass(frozen=True, slots=True)
class GNode:
    """An enumerated node: its op, inputs, parallel output shapes and per-output
    fingerprints (exact values on the seeded inputs, shape, inputs used)."""

    h: str
    op: Any
    inputs: tuple[Ref, ...]
    shapes: tuple[ParallelTensorShape, ...]
    used: int                      # bit i: reads input x_i
    fps: tuple[str, ...]
    n_ops: int                     # op nodes in its cone (itself included; 0 for an input)
    name: str = ""                 # inputs only: x0, x1, ...

    @property
    def kind(self) -> str:
        return spec_of(self.op).kind

    @property
    def is_input(self) -> bool:
        return isinstance(self.op, InputAttrs)


def node_hash(op: Any, shapes: Sequence[ParallelTensorShape], inputs: Sequence[Ref], name: str | None) -> str:
    """The structural hash of a node, exactly as ``PCG.node_hashes`` computes it."""
    h = hashlib.sha256()
    h.update(attrs_key(op).encode())
    h.update("|".join(map(str, shapes)).encode())
    if name is not None:
        h.update(b"name:" + name.encode())
    for ih, k in inputs:
        h.update(f"<{ih}:{k}".encode())
    return h.hexdigest()


def graph_hash(root: GNode) -> str:
    """``PCG.canonical_hash`` of the graph whose outputs are ``root``'s (its only sink)."""
    h = hashlib.sha256()
    for k in range(len(root.shapes)):
        h.update(f"out {root.h}:{k}\n".encode())
    h.update(f"sink {root.h}\n".encode())
    return h.hexdigest()


def _fingerprint(value: np.ndarray, shape: ParallelTensorShape, used: int) -> str:
    h = hashlib.sha256()
    h.update(f"{shape}|{value.shape}|{value.dtype}|{used}|".encode())
    h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


def input_values(settings: GeneratorSettings, dims: Sequence[int] | None = None,
                 seed: int | None = None) -> dict[str, np.ndarray]:
    """The seeded integer inputs ``x0 ..`` in [-4, 4] (int64: every kernel is exact)."""
    rng = np.random.default_rng(settings.seed if seed is None else seed)
    dims = tuple(settings.input_dims if dims is None else dims)
    return {f"x{i}": rng.integers(-4, 5, size=dims).astype(np.int64) for i in range(settings.n_inputs)}


@dataclass(slots=True)
class _State:
    nodes: tuple[str, ...]         # sorted op node hashes
    dangling: tuple[Ref, ...]      # sorted op outputs nothing reads yet


class _Enumerator:
    """Enumerates graphs, hash-consing nodes and memoizing shape inference.

    Each node is also evaluated as a *shadow*: the same ops with the degree
    ``check_degree`` on inputs scaled by ``check_degree**2``. Its values go into the
    fingerprint, so graphs that agree only at one degree (``Scale(x, 2)`` and
    ``Add(x, x)``) fall into different classes and every rule holds with ``d`` a parameter.
    """

    def __init__(self, settings: GeneratorSettings):
        self.s = settings
        self.choices = [(name, OPS[name]) for name in settings.ops]
        self.nodes: dict[str, GNode] = {}
        self.values: dict[str, tuple] = {}     # node -> (values, shadow shapes, shadow values)
        self.memo: dict[tuple, str | None] = {}
        self.shape_memo: dict[tuple, tuple | None] = {}
        self.inputs: list[Ref] = []
        vals = input_values(settings)
        k = settings.check_degree
        dims = tuple(settings.input_dims)
        shadow = input_values(settings, tuple(n * k * k for n in dims), settings.seed + 1) if k else {}
        for i in range(settings.n_inputs):
            name = f"x{i}"
            op = InputAttrs(TensorShape(dims))
            shape = ParallelTensorShape.unpartitioned(op.shape)
            h = node_hash(op, (shape,), (), name)
            sv = (shadow[name],) if k else None
            ss = (ParallelTensorShape.unpartitioned(TensorShape(shadow[name].shape)),) if k else None
            fps = self._fps((vals[name],), (shape,), ss, sv, 1 << i)
            self.nodes[h] = GNode(h, op, (), (shape,), 1 << i, fps, 0, name)
            self.values[h] = ((vals[name],), ss, sv)
            self.inputs.append((h, 0))

    @staticmethod
    def _fps(vals: Sequence[np.ndarray], shapes: Sequence[ParallelTensorShape], s_shapes: Sequence | None,
             s_vals: Sequence | None, used: int) -> tuple[str, ...]:
        out = []
        for k, (v, sh) in enumerate(zip(vals, shapes, strict=True)):
            fp = _fingerprint(v, sh, used)
            if s_vals is not None:
                fp += _fingerprint(s_vals[k], s_shapes[k], used)
            out.append(hashlib.sha256(fp.encode()).hexdigest())
        return tuple(out)

    def make(self, ci: int, ins: tuple[Ref, ...]) -> str | None:
        """The node of choice ``ci`` on these inputs (hash-consed), or None if it does not type-check."""
        key = (ci, ins)
        if key in self.memo:
            return self.memo[key]
        typed = self._infer(ci, tuple(self.nodes[h].shapes[k] for h, k in ins), self.s.degree)
        h = None
        if typed is not None:
            op, shapes, outs = typed
            h = node_hash(op, outs, ins, None)
            if h not in self.nodes:
                n_ops = 1 + len(self.cone(ins))
                used = functools.reduce(operator.or_, (self.nodes[ih].used for ih, _ in ins), 0)
                vals = reference(op, [self.values[ih][0][k] for ih, k in ins], shapes)
                shadow = self._shadow(ci, ins) if self.s.check_degree else None
                s_outs = s_vals = None
                if self.s.check_degree:  # no shadow (it does not type-check): a fingerprint of its own
                    s_outs, s_vals = shadow or (outs, [np.zeros(0, np.int64)] * len(outs))
                fps = self._fps(vals, outs, s_outs, s_vals, used)
                self.nodes[h] = GNode(h, op, ins, outs, used, fps, n_ops)
                if n_ops < self.s.max_ops:  # keep only what a later op may read
                    self.values[h] = (vals,) + (shadow or (None, None))
        self.memo[key] = h
        return h

    def _shadow(self, ci: int, ins: tuple[Ref, ...]) -> tuple | None:
        """(output shapes, values) of the node at the check degree, or None."""
        s_in = [self.values[ih] for ih, _ in ins]
        if any(v[1] is None for v in s_in):
            return None
        typed = self._infer(ci, tuple(v[1][k] for v, (_, k) in zip(s_in, ins, strict=True)), self.s.check_degree)
        if typed is None:
            return None
        op, shapes, outs = typed
        return outs, reference(op, [v[2][k] for v, (_, k) in zip(s_in, ins, strict=True)], shapes)

    def _infer(self, ci: int, shapes: tuple[ParallelTensorShape, ...], degree: int) -> tuple | None:
        """(attrs, input shapes, output shapes) of choice ``ci`` on these inputs, or None."""
        skey = (ci, shapes, degree)
        if skey not in self.shape_memo:
            op, out = _op(self.choices[ci][0], shapes, degree), None
            with contextlib.suppress(ShapeError):
                out = None if op is None else (op, shapes, tuple(spec_of(op).infer_parallel(op, list(shapes))))
            self.shape_memo[skey] = out
        return self.shape_memo[skey]

    def cone(self, refs: Iterable[Ref]) -> set[str]:
        """The op nodes that the tensors ``refs`` are computed from (inclusive)."""
        seen: set[str] = set()
        stack = [h for h, _ in refs]
        while stack:
            h = stack.pop()
            n = self.nodes[h]
            if h in seen or n.is_input:
                continue
            seen.add(h)
            stack.extend(ih for ih, _ in n.inputs)
        return seen

    def explore(self, first: Sequence[_State], finals: dict[str, int], seen: set[tuple]) -> None:
        """Every complete graph reachable from the given one-op states, into ``finals``."""
        for st in first:
            if st.nodes in seen:
                continue
            seen.add(st.nodes)
            frontier = [st]
            while frontier:
                nxt: dict[tuple, _State] = {}
                for s in frontier:
                    self._expand(s, nxt, finals)
                frontier = [s for k, s in nxt.items() if k not in seen]
                seen.update(s.nodes for s in frontier)

    def _expand(self, st: _State, out: dict[tuple, _State], finals: dict[str, int]) -> None:
        level = len(st.nodes)
        remaining = self.s.max_ops - level - 1
        if remaining < 0:
            return
        avail = self.inputs + [(h, k) for h in st.nodes for k in range(len(self.nodes[h].shapes))]
        dang = set(st.dangling)
        for ci, (_, arity) in enumerate(self.choices):
            for ins in self._combos(arity, avail, st.dangling, remaining):
                h = self.make(ci, ins)
                if h is None or h in st.nodes:
                    continue
                new_d = (dang - set(ins)) | {(h, k) for k in range(len(self.nodes[h].shapes))}
                if dang <= set(ins):
                    finals[h] = level + 1
                if remaining > 0 and len(new_d) <= remaining + 1:
                    key = tuple(sorted(st.nodes + (h,)))
                    if key not in out:
                        out[key] = _State(key, tuple(sorted(new_d)))

    @staticmethod
    def _combos(arity: int, avail: list[Ref], dangling: tuple[Ref, ...], remaining: int) -> Iterable[tuple[Ref, ...]]:
        if remaining > 0 or not dangling:
            return itertools.product(avail, repeat=arity)
        if len(dangling) > arity:   # the last op must read every dangling output
            return []
        if arity == 1 or len(dangling) == 2:
            return itertools.permutations(dangling)
        (a,) = dangling
        return [(a, x) for x in avail] + [(x, a) for x in avail if x != a]


# ---------------------------------------------------------------------------
# The enumerated graphs


@dataclass
class Enumeration:
    """All enumerated graphs (the bare inputs too, as 0-op graphs), hash-consed: a graph
    is named by its root, the node whose outputs are the graph's outputs."""

    settings: GeneratorSettings
    nodes: dict[str, GNode]
    roots: list[str]
    seconds: float = 0.0
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def inputs(self) -> list[GNode]:
        """The input nodes, x0 first."""
        return [self.nodes[h] for h in self.roots[:self.settings.n_inputs]]

    def graph_fingerprint(self, root: str) -> str:
        n = self.nodes[root]
        return hashlib.sha256(("|".join(n.fps) + f"|{n.used}").encode()).hexdigest()

    def _raw(self, ref: Ref) -> str:
        key = ("text", ref)
        if key not in self._memo:
            n = self.nodes[ref[0]]
            if n.is_input:
                text = f"${n.name}$"
            else:
                fields = ",".join(f"{f.name}={_short(getattr(n.op, f.name))}" for f in dataclasses.fields(n.op))
                sel = f"#{ref[1]}" if len(n.shapes) > 1 else ""
                text = f"{n.kind}[{fields}]({','.join(self._raw(r) for r in n.inputs)}){sel}"
            self._memo[key] = text
        return self._memo[key]

    def text(self, root: str, names: dict[str, str] | None = None) -> str:
        """A graph as a term, e.g. ``Unary[fn=Relu](Repartition[dim=0,degree=2](x0))``."""
        text = self._raw((root, 0)).removesuffix("#0")
        for x in self.input_order([root]):
            text = text.replace(f"${x}$", (names or {}).get(x, x))
        return text

    def input_order(self, roots: Sequence[str]) -> list[str]:
        """Input names in order of first use, reading the graphs' terms left to right."""
        out: list[str] = []
        for r in roots:
            key = ("inputs", r)
            if key not in self._memo:
                n = self.nodes[r]
                mine = [n.name] if n.is_input else [x for ih, _ in n.inputs for x in self.input_order([ih])]
                self._memo[key] = list(dict.fromkeys(mine))
            out += [x for x in self._memo[key] if x not in out]
        return out

    def order(self, root: str) -> list[str]:
        """The op nodes of a graph in postorder (inputs left to right): a canonical topological order."""
        key = ("order", root)
        if key not in self._memo:
            out: list[str] = []
            n = self.nodes[root]
            if not n.is_input:
                for ih, _ in n.inputs:
                    out += [h for h in self.order(ih) if h not in out]
                out.append(root)
            self._memo[key] = out
        return self._memo[key]

    def pcg(self, root: str) -> PCG:
        """The graph as a PCG over the inputs it uses (named ``x0 ..``)."""
        b = GraphBuilder()
        env: dict[Ref, TensorRef] = {}
        for i, n in enumerate(self.inputs):
            if self.nodes[root].used >> i & 1:
                env[(n.h, 0)] = b.add(n.op, (), n.name, outputs=n.shapes)[0]
        for h in self.order(root):
            n = self.nodes[h]
            outs = b.add(n.op, [env[r] for r in n.inputs])
            env.update(((h, k), o) for k, o in enumerate(outs))
        return b.build([env[(root, k)] for k in range(len(self.nodes[root].shapes))])

    def evaluate(self, root: str, feed: dict[str, np.ndarray], override: dict[str, tuple] | None = None,
                 reached: set[str] | None = None) -> tuple[np.ndarray, ...]:
        """A graph's output values, inputs fed by name and some nodes' outputs replaced by
        ``override`` (``reached`` collects the inputs still read)."""
        memo: dict[str, tuple] = dict(override or {})

        def run(h: str) -> tuple:
            if h not in memo:
                n = self.nodes[h]
                if n.is_input:
                    memo[h] = (feed[n.name],)
                    if reached is not None:
                        reached.add(n.name)
                else:
                    args = [run(ih)[k] for ih, k in n.inputs]
                    memo[h] = tuple(reference(n.op, args, [self.nodes[ih].shapes[k] for ih, k in n.inputs]))
            return memo[h]

        return run(root)


def _short(v: Any) -> str:
    return "(" + ",".join(map(_short, v)) + ")" if isinstance(v, tuple) else str(v)


def enumerate_graphs(settings: GeneratorSettings, progress: ProgressFn | None = None,
                     progress_span: tuple[int, int, int] = (0, 1, 1)) -> Enumeration:
    """Every graph of up to ``settings.max_ops`` ops over the inputs (see the module docstring).

    ``progress`` is called after each first op's subtree; ``progress_span`` = (start, end,
    total) maps that onto a longer bar. (One process: the default run takes seconds, and
    worker processes measured slower, shipping nodes back costs more than they save.)
    """
    t0 = time.monotonic()
    e = _Enumerator(settings)
    finals: dict[str, int] = {}
    one_op: dict[tuple, _State] = {}
    e._expand(_State((), ()), one_op, finals)
    first = list(one_op.values())
    lo, hi, total = progress_span

    def report(done: int, of: int) -> None:
        if progress:
            progress(lo + (hi - lo) * done // max(1, of), total)

    seen: set[tuple] = set()
    for i, st in enumerate(first):
        e.explore([st], finals, seen)
        report(i + 1, len(first))
    nodes = e.nodes
    roots = [h for h, _ in e.inputs] + sorted(finals, key=lambda h: (finals[h], h))
    return Enumeration(settings, nodes, roots, time.monotonic() - t0)
