"""Rule generation: TASO's method, extended to parallel operators.

1. **Enumerate** every graph of up to ``max_ops`` operators over a few unpartitioned
   input tensors, where every op type-checks (parallel shapes included) and no op is dead
   (every output but the last op's is consumed). Graphs are hash-consed: a node is its
   structural hash (the one ``PCG.node_hashes`` computes), so equal graphs built in
   different orders are one graph, and a partial graph is explored once.
2. **Fingerprint** each graph by its outputs' exact values on seeded integer inputs, their
   parallel shapes and the inputs it uses; graphs with equal fingerprints form a class.
   Each graph is evaluated a second time with another degree on larger inputs, so graphs
   that agree only at one degree (``Scale(x, 2)`` and ``Add(x, x)``) are not one class,
   and every rule holds with the degree as a parameter ``d``.
3. **Pair** each graph with its class's representative (fewest ops, then smallest term)
   into a candidate rule over inputs renamed by first use, with explicit constraints.
4. **Prune** redundant candidates: (1) renamings of one rule, (2) rules whose sides share
   a common subgraph, (3) rules whose sides apply the same op to equivalent operands,
   (4) trivial rules, (5) rules implied by an equivalence of subterms and a smaller rule.

The survivors go to the z3 verifier; a false candidate (a fingerprint collision) is
rejected there.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import math
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
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
    reduces_copies,
)
from ..ir.ops.shape_ops import ConcatAttrs, SplitAttrs, TransposeAttrs
from ..ir.ops.sources import InputAttrs
from ..ir.opspec import attrs_key, spec_of
from ..ir.pcg import PCG, GraphBuilder, TensorRef
from ..ir.shapes import ParallelTensorShape, TensorShape
from .codec import to_pattern
from .rule import Constraint, Param, Pattern, PatternNode, Rule
from .semantics import KERNELS

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


@dataclass
class Generated:
    """The candidate rules (ordered by size, then id) and how many survived each step."""

    rules: list[Rule]
    stats: dict[str, Any] = field(default_factory=dict)

    def stats_counts(self) -> dict[str, int]:
        return {k: v for k, v in self.stats.items() if isinstance(v, int)}


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
                vals = _kernel(op, shapes, [self.values[ih][0][k] for ih, k in ins])
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
        return outs, _kernel(op, shapes, [v[2][k] for v, (_, k) in zip(s_in, ins, strict=True)])

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
                    memo[h] = tuple(_kernel(n.op, [self.nodes[ih].shapes[k] for ih, k in n.inputs], args))
            return memo[h]

        return run(root)


def _kernel(op: Any, shapes: Sequence[ParallelTensorShape], args: list[np.ndarray]) -> list[np.ndarray]:
    """``semantics.evaluate`` for one node."""
    if isinstance(op, ReductionAttrs):
        return [args[0] * op.degree if reduces_copies(shapes[0]) else args[0]]
    return KERNELS[spec_of(op).kind](op, args)


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


# ---------------------------------------------------------------------------
# Candidate rules


PARAM = "d"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _rule_inputs(en: Enumeration, src: str, dst: str) -> dict[str, str]:
    """Rename inputs by first use, source then target, so renamings of a rule collapse."""
    return {name: LETTERS[i] for i, name in enumerate(en.input_order([src, dst]))}


def pattern_of(en: Enumeration, root: str, names: dict[str, str], params: dict[int, Param] | None) -> Pattern:
    """One side of a rule: the graph's op nodes in canonical order over renamed inputs."""
    tensors = {(n.h, 0): names[n.name] for n in en.inputs if n.name in names}
    nodes = []
    for h in en.order(root):
        n = en.nodes[h]
        ins = tuple(tensors[r] for r in n.inputs)
        outs = []
        for k in range(len(n.shapes)):
            tensors[(h, k)] = f"t{len(tensors) - len(names)}"
            outs.append(tensors[(h, k)])
        rank = en.nodes[n.inputs[0][0]].shapes[n.inputs[0][1]].rank
        nodes.append(PatternNode(n.kind, to_pattern(n.kind, n.op, rank, params), ins, tuple(outs)))
    return Pattern(tuple(nodes), tuple(tensors[(root, k)] for k in range(len(en.nodes[root].shapes))))


def make_rule(en: Enumeration, src: str, dst: str) -> Rule:
    """The rule ``src = dst`` between two enumerated graphs, with its constraints."""
    names = _rule_inputs(en, src, dst)
    d = en.settings.degree
    uses_degree = any(_degree_of(en.nodes[h].op) == d for r in (src, dst) for h in en.order(r))
    params = {d: Param(PARAM)} if uses_degree else None
    sp, dp = pattern_of(en, src, names, params), pattern_of(en, dst, names, params)
    degree_operand: Any = ("param", PARAM) if params else d
    cons = _constraints(en, src, dst, names, degree_operand)
    return Rule(tuple(names.values()), (PARAM,) if params else (), sp, dp, cons)


def _degree_of(op: Any) -> int | None:
    if isinstance(op, RepartitionAttrs | CombineAttrs | ReplicateAttrs | ReductionAttrs):
        return op.degree
    if isinstance(op, ScaleAttrs):
        return op.factor
    return None


# Symbolic sizes: a dim's size as a linear form over the rule inputs' dims.
Atom = tuple[str, int]              # (rule input, negative axis)
Form = tuple[tuple[Atom, Fraction], ...]


def _form_add(a: Form | None, b: Form | None) -> Form | None:
    if a is None or b is None:
        return None
    acc = collections.Counter(dict(a)) + collections.Counter(dict(b))
    return tuple(sorted((k, v) for k, v in acc.items() if v))


def _form_div(a: Form | None, p: int) -> Form | None:
    return None if a is None else tuple((k, v / p) for k, v in a)


class _Sizes:
    """Walks one side of a rule, tracking each dim's size as a linear form, and collects
    what the rule needs of its inputs' sizes."""

    def __init__(self, en: Enumeration, names: dict[str, str]):
        self.en = en
        self.forms: dict[Ref, list[Form | None]] = {}
        for n in en.inputs:
            if n.name in names:
                h, r = n.h, n.shapes[0].rank
                self.forms[(h, 0)] = [(((names[n.name], a - r), Fraction(1)),) for a in range(r)]
        self.equal: list[tuple[Form | None, Form | None]] = []
        self.divisible: list[Form | None] = []                 # sizes that are repartitioned
        self.aligned: list[tuple[Form | None, int]] = []       # (size, parts) of a Split
        self.contracted: list[Form | None] = []

    def walk(self, root: str) -> None:
        for h in self.en.order(root):
            n = self.en.nodes[h]
            ins = [self.forms[r] for r in n.inputs]
            outs = self._node(n, ins)
            for k in range(len(n.shapes)):
                self.forms[(h, k)] = outs[k] if outs is not None else [None] * n.shapes[k].rank

    def _node(self, n: GNode, ins: list[list[Form | None]]) -> list[list[Form | None]] | None:
        op, x = n.op, ins[0]
        match n.kind:
            case "Unary" | "Scale" | "Combine" | "Replicate" | "Reduction":
                return [list(x)]
            case "Repartition":
                self.divisible.append(x[op.dim])
                return [list(x)]
            case "Binary":
                self.equal += list(zip(x, ins[1], strict=False))
                return [list(x)]
            case "Transpose":
                return [[x[p] for p in op.perm]]
            case "MatMul" if len(x) == 2 and len(ins[1]) == 2:
                self.equal.append((x[1], ins[1][0]))
                self.contracted += [x[1], ins[1][0]]
                return [[x[0], ins[1][1]]]
            case "Concat":
                out = list(x)
                for other in ins[1:]:
                    self.equal += [(a, b) for k, (a, b) in enumerate(zip(x, other, strict=False)) if k != op.axis]
                    out[op.axis] = _form_add(out[op.axis], other[op.axis])
                return [out]
            case "Split":
                parts = len(op.sizes)
                self.aligned.append((x[op.axis], parts))
                return [[_form_div(f, parts) if k == op.axis else f for k, f in enumerate(x)] for _ in op.sizes]
        return None


def _constraints(en: Enumeration, src: str, dst: str, names: dict[str, str], degree: Any) -> tuple[Constraint, ...]:
    """What the rule needs of its inputs beyond type-checking its source.

    * every input without partial sums (the rules were found on unpartitioned inputs, and
      a Reduction's meaning depends on its input's partial sums);
    * dims that are repartitioned or split divisible by the degree or the parts;
    * equal sizes where a Split must cut a Concat at its seam, and the equalities the
      target's type-checking needs that the source's does not imply;
    * in rules with a Reduction, no split of the input dims that get contracted (else a
      contraction would leave partial sums where the rule was found with none).
    """
    out: set[Constraint] = {Constraint("EQUAL", ("sum", x), 1) for x in names.values()}
    s, d = _Sizes(en, names), _Sizes(en, names)
    s.walk(src)
    d.walk(dst)
    for f in s.divisible + d.divisible:
        for atom, coef in f or ():
            m = coef.denominator
            if m > 1:
                out.add(Constraint("DIVISIBLE_BY", ("dim", *atom), m))
            out.add(Constraint("DIVISIBLE_BY", ("dim", *atom), degree))
    for f, parts in s.aligned + d.aligned:
        atoms = list(f or ())
        coefs = {c for _, c in atoms}
        if len(atoms) == 1 or len(coefs) > 1:
            for atom, coef in atoms:
                q = coef.denominator * parts // math.gcd(coef.numerator, parts)
                if q > 1:
                    out.add(Constraint("DIVISIBLE_BY", ("dim", *atom), q))
        elif atoms:
            # A Split of a Concat of equal parts: the halves fall on the seams only if equal.
            (a0, coef), rest = atoms[0], atoms[1:]
            out.update(Constraint("EQUAL", *sorted((("dim", *a0), ("dim", *a)))) for a, _ in rest)
            q = coef.denominator * parts // math.gcd(coef.numerator * len(atoms), parts)
            if q > 1:
                out.add(Constraint("DIVISIBLE_BY", ("dim", *a0), q))
    # Target equalities the source does not already force.
    uf: dict[Atom, Atom] = {}

    def find(a: Atom) -> Atom:
        while uf.get(a, a) != a:
            a = uf[a]
        return a

    def single(f: Form | None) -> tuple[Atom, Fraction] | None:
        return f[0] if f is not None and len(f) == 1 else None

    for a, b in s.equal:
        sa, sb = single(a), single(b)
        if sa and sb and sa[1] == sb[1]:
            uf[find(sa[0])] = find(sb[0])
    for a, b in d.equal:
        sa, sb = single(a), single(b)
        if sa and sb and sa[1] == sb[1] and find(sa[0]) != find(sb[0]):
            uf[find(sa[0])] = find(sb[0])
            out.add(Constraint("EQUAL", *sorted((("dim", *sa[0]), ("dim", *sb[0])))))
    kinds = {en.nodes[h].kind for r in (src, dst) for h in en.order(r)}
    if "Reduction" in kinds:
        for f in s.contracted + d.contracted:
            for atom, _ in f or ():
                out.add(Constraint("EQUAL", ("degree", atom[0], atom[1]), 1))
    return tuple(sorted(out, key=lambda c: repr((c.kind, c.lhs, c.rhs))))


def _same_root(en: Enumeration, a: str, b: str) -> bool:
    """Both sides apply one op (same attributes) to pairwise equivalent operands."""
    na, nb = en.nodes[a], en.nodes[b]
    if na.is_input or nb.is_input or na.op != nb.op:
        return False
    # Operands from one node: equivalent as whole graphs (all outputs), so a rule relates them.
    return all(x[1] == y[1] and en.nodes[x[0]].fps == en.nodes[y[0]].fps
               for x, y in zip(na.inputs, nb.inputs, strict=True))


def _common_subgraph(en: Enumeration, a: str, b: str) -> bool:
    """Both sides contain an identical op applied to identical inputs."""
    return not set(en.order(a)).isdisjoint(en.order(b))


def _implied_by_subterms(en: Enumeration, src: str, dst: str) -> bool:
    """``src`` has a subterm ``S1`` and ``dst`` an equivalent one ``S2`` (a smaller rule
    ``S1 = S2``), and ``src[S1 := z] = dst[S2 := z]`` holds for a fresh input ``z`` (a
    smaller rule over at most as many inputs): together they imply ``src = dst``."""
    s = en.settings
    ok_shape = ParallelTensorShape.unpartitioned(TensorShape(tuple(s.input_dims)))
    side_a = [h for h in en.order(src) if h != src] + [n.h for n in en.inputs if n.name in en.input_order([src])]
    side_b = [h for h in en.order(dst) if h != dst] + [n.h for n in en.inputs if n.name in en.input_order([dst])]
    for h1, h2 in itertools.product(side_a, side_b):
        n1, n2 = en.nodes[h1], en.nodes[h2]
        if (n1.is_input and n2.is_input) or n1.fps != n2.fps or n1.shapes != (ok_shape,):
            continue
        for trial in range(2):
            feed = input_values(s, seed=s.seed + 10 + trial)
            z = (np.random.default_rng(s.seed + 20 + trial).integers(-4, 5, size=s.input_dims).astype(np.int64),)
            reached: set[str] = set()
            a = en.evaluate(src, feed, {h1: z}, reached)
            b = en.evaluate(dst, feed, {h2: z}, reached)
            if len(reached) + 1 > s.n_inputs or not all(np.array_equal(u, v) for u, v in zip(a, b, strict=True)):
                break
        else:
            return True
    return False


def candidate_pairs(en: Enumeration) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """Each graph paired with its class's representative (fewest ops, then smallest term
    with inputs renamed by first use, then smallest term): (graph, representative)."""
    classes: dict[str, list[str]] = {}
    for r in en.roots:
        classes.setdefault(en.graph_fingerprint(r), []).append(r)

    def rep_key(r: str) -> tuple:
        names = {x: LETTERS[i] for i, x in enumerate(en.input_order([r]))}
        return (en.nodes[r].n_ops, en.text(r, names), en.text(r))

    pairs: list[tuple[str, str]] = []
    for members in classes.values():
        if len(members) > 1:
            members = sorted(members, key=rep_key)
            pairs += [(m, members[0]) for m in members[1:]]
    stats = {"graphs": len(en.roots), "classes": len(classes),
             "classes_with_rules": sum(len(m) > 1 for m in classes.values()), "candidates": len(pairs)}
    return pairs, stats


def generate(settings: GeneratorSettings = GeneratorSettings(), progress: ProgressFn | None = None) -> Generated:
    """Enumerate, fingerprint, pair and prune (see the module docstring).

    ``progress`` is called with (done, total) now and then, in thousandths of the run.
    """
    t0 = time.monotonic()
    en = enumerate_graphs(settings, progress, (0, 500, 1000))
    pairs, stats = candidate_pairs(en)

    # (1) renamings: one rule once inputs are renamed by first use (source, then target).
    unique: dict[tuple[str, str], tuple[str, str]] = {}
    for src, dst in pairs:
        names = _rule_inputs(en, src, dst)
        unique.setdefault((en.text(src, names), en.text(dst, names)), (src, dst))
    kept = list(unique.values())
    stats["after_renamings"] = len(kept)
    # (2) common subgraphs, (3) the same op on equivalent operands: implied by smaller rules.
    kept = [(a, b) for a, b in kept if not _common_subgraph(en, a, b)]
    stats["after_common_subgraph"] = len(kept)
    kept = [(a, b) for a, b in kept if not _same_root(en, a, b)]
    stats["after_same_root"] = len(kept)
    # (4) trivial rules and rules without a source op.
    kept = [(a, b) for a, b in kept if a != b and en.nodes[a].n_ops > 0]
    stats["after_trivial"] = len(kept)
    # (5) an equivalence of subterms plus a smaller rule over a fresh input.
    survivors = []
    for i, (a, b) in enumerate(kept):
        if not _implied_by_subterms(en, a, b):
            survivors.append((a, b))
        if progress and i % 256 == 0:
            progress(500 + 400 * i // len(kept), 1000)
    stats["after_equivalent_subterms"] = len(survivors)

    rules: dict[str, Rule] = {}
    for rule in (make_rule(en, src, dst) for src, dst in survivors):
        rules.setdefault(rule.id, rule)
    stats["rules"] = len(rules)
    stats["parametric_rules"] = sum(bool(r.params) for r in rules.values())
    stats["seconds_enumeration"] = round(en.seconds, 2)
    stats["seconds"] = round(time.monotonic() - t0, 2)
    if progress:
        progress(1000, 1000)
    return Generated(sorted(rules.values(), key=lambda r: (r.size, r.id)), stats)
