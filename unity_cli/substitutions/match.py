"""Finding a rule's source pattern in a PCG and replacing it with the target.

Matching anchors the pattern's first output at each node of the right kind and walks the
pattern's inputs backwards; each pattern edge pins down the PCG node behind it, so the
walk needs no search except for pattern parts not reachable from that output (a
multi-output rule's other outputs), which a bounded backtracking search fills, pruned by
the rule's constraints as their tensors are matched. The same operators matched from
another of their outputs are one match, not several. A failed match returns the reason
(a debugging aid: ``unity`` can say why a rule does not apply).
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ShapeError
from ..ir.opspec import OpSpec, spec_by_kind
from ..ir.pcg import PCG, GraphBuilder, TensorRef
from ..ir.schedule import needs_grad
from ..ir.simplify import prune
from ..ir.validate import problems
from .codec import instantiate, matches_attrs, moved_names
from .rule import Constraint, Param, Rule

MAX_TRIES = 256
"""Candidate nodes a match may try for the pattern nodes its first output does not reach."""


class RewriteError(ShapeError):
    """A match that cannot be applied (the result would not type-check)."""


@dataclass(frozen=True)
class Match:
    rule: Rule
    nodes: tuple[int, ...]                     # PCG node of each source pattern node
    tensors: Mapping[str, TensorRef]           # rule inputs and source tensors -> PCG tensors
    binding: Mapping[str, int] = field(default_factory=dict)

    @property
    def root(self) -> int:
        return max(self.nodes)


@dataclass
class _State:
    nodes: dict[int, int] = field(default_factory=dict)
    tensors: dict[str, TensorRef] = field(default_factory=dict)
    binding: dict[str, int] = field(default_factory=dict)

    def copy(self) -> _State:
        return _State(dict(self.nodes), dict(self.tensors), dict(self.binding))


class Matcher:
    """Matches one rule's source pattern against one PCG."""

    def __init__(self, pcg: PCG, rule: Rule):
        self.pcg = pcg
        self.rule = rule
        self.src = rule.src
        self.producers = rule.src.producers()
        # A source whose output is a bare input (a reversed rule whose target has no op)
        # would match every tensor: such rules are not matched.
        first = rule.src.outputs[0] if rule.src.outputs else None
        self.root = self.producers[first][0] if first in self.producers else None

    def at(self, node: int, seen: set[frozenset[int]] | None = None) -> Match | str:
        """The match whose first output is produced by ``node``, or why there is none; with
        ``seen``, one whose nodes are not a set in it (the same operators matched from
        another of their outputs)."""
        if self.root is None:
            return "the source pattern has no operator at its output"
        st = _State()
        why = self._node(self.root, node, st) or self._partial(st)
        if why:
            return why
        return self._complete(st, seen or set(), [MAX_TRIES])

    def all(self, limit: int | None = None) -> list[Match]:
        if self.root is None:
            return []
        kind = self.src.nodes[self.root].kind
        out: list[Match] = []
        seen: set[frozenset[int]] = set()
        for i in self.pcg.by_kind.get(kind, ()):
            m = self.at(i, seen)
            if isinstance(m, Match):
                seen.add(frozenset(m.nodes))
                out.append(m)
                if limit and len(out) >= limit:
                    break
        return out

    def _complete(self, st: _State, seen: set[frozenset[int]], budget: list[int]) -> Match | str:
        """Pattern nodes not reachable from the first output (siblings, lookups of other
        tables) by search: each candidate node in turn, backing out of any that leaves a
        constraint or the rest unsatisfiable, within ``budget`` trials in all."""
        p = next((q for q in range(len(self.src.nodes)) if q not in st.nodes), None)
        if p is None:
            m = self._check(st)
            if isinstance(m, Match) and frozenset(m.nodes) in seen:
                return "the same operators as an earlier match"
            return m
        kind = self.src.nodes[p].kind
        last = f"no {kind} node fits pattern node {p}"
        used = set(st.nodes.values())
        for i in self.pcg.by_kind.get(kind, ()):
            if i in used:
                continue
            if budget[0] <= 0:
                return last
            budget[0] -= 1
            trial = st.copy()
            why = self._node(p, i, trial) or self._partial(trial)
            if why:
                last = why
                continue
            found = self._complete(trial, seen, budget)
            if isinstance(found, Match):
                return found
            last = found
        return last

    def _partial(self, st: _State) -> str | None:
        """The first constraint over tensors matched so far that fails (a search prunes there)."""
        for c in self.rule.constraints:
            names = [v[1] for v in (c.lhs, c.rhs) if isinstance(v, tuple) and v[:1] != ("param",)]
            if all(t in st.tensors for t in names) and not _needs_free_param(c, st.binding):
                why = check_constraint(self.pcg, c, st.tensors, st.binding)
                if why:
                    return why
        return None

    def _node(self, p: int, n: int, st: _State) -> str | None:
        if p in st.nodes:
            return None if st.nodes[p] == n else f"pattern node {p} would be two nodes"
        if n in st.nodes.values():
            return f"node %{n} would match two pattern nodes"
        pn, node = self.src.nodes[p], self.pcg.nodes[n]
        rank = self.pcg.shape(node.inputs[0]).rank if node.inputs else node.outputs[0].rank
        why = matches_attrs(pn, node.op, rank, st.binding)
        if why:
            return f"%{n} ({node.name or node.kind}): {why}"
        if len(pn.inputs) != len(node.inputs) or len(pn.outputs) != len(node.outputs):
            return f"%{n}: arity differs from the pattern's {pn.kind}"
        st.nodes[p] = n
        for k, t in enumerate(pn.outputs):
            st.tensors[t] = TensorRef(n, k)
        if len(node.inputs) != 2 or not node.spec.commutative(node.op):
            return self._inputs(pn, node.inputs, n, st)
        # a + b is b + a: a graph's operands may come in the other order (BERT's exports add
        # the bias first); the pattern's order is tried first
        trial = st.copy()
        why = self._inputs(pn, node.inputs, n, trial)
        if why:
            trial = st.copy()
            if self._inputs(pn, node.inputs[::-1], n, trial):
                return why
        st.nodes, st.tensors, st.binding = trial.nodes, trial.tensors, trial.binding
        return None

    def _inputs(self, pn, refs, n: int, st: _State) -> str | None:
        """Match the pattern node's inputs to the graph node ``n``'s ``refs``, in that order."""
        for pos, t in enumerate(pn.inputs):
            ref = refs[pos]
            if t in self.producers:
                q, k = self.producers[t]
                if ref.index != k:
                    return f"%{n} input {pos} is output {ref.index} of its producer, the pattern wants {k}"
                why = self._node(q, ref.node, st)
                if why:
                    return why
            elif t in st.tensors and st.tensors[t] != ref:
                return f"pattern input {t} would be two different tensors"
            else:
                st.tensors[t] = ref
        return None

    def _check(self, st: _State) -> Match | str:
        matched = set(st.nodes.values())
        outs = {st.tensors[t] for t in self.src.outputs}
        graph_outs = set(self.pcg.outputs)
        for t, ref in st.tensors.items():
            if t in self.rule.inputs:
                if ref.node in matched:
                    return f"pattern input {t} is computed inside the match"
                continue
            if ref in outs:
                continue
            users = [u for u, pos in self.pcg.consumers[ref.node] if self.pcg.nodes[u].inputs[pos] == ref]
            if any(u not in matched for u in users) or ref in graph_outs:
                return f"intermediate %{ref.node} is also used outside the match"
        for c in self.rule.constraints:
            if not _needs_free_param(c, st.binding):
                why = check_constraint(self.pcg, c, st.tensors, st.binding)
                if why:
                    return why
        order = tuple(st.nodes[p] for p in range(len(self.src.nodes)))
        return Match(self.rule, order, dict(st.tensors), dict(st.binding))


def _needs_free_param(c: Constraint, binding: Mapping[str, int]) -> bool:
    return any(isinstance(v, tuple) and v[:1] == ("param",) and v[1] not in binding for v in (c.lhs, c.rhs))


def _operand(pcg: PCG, v, tensors: Mapping[str, TensorRef], binding: Mapping[str, int]) -> int:
    if isinstance(v, int):
        return v
    match v:
        case ("param", name):
            return binding[name]
        case ("dim", t, axis):
            s = pcg.shape(tensors[t])
            return s.sizes[axis]
        case ("degree", t, axis):
            return pcg.shape(tensors[t]).degrees[axis]
        case ("sum", t):
            return pcg.shape(tensors[t]).sum_degree
        case ("copy", t):
            return pcg.shape(tensors[t]).copy_degree
        case ("rank", t):
            return pcg.shape(tensors[t]).rank
        case ("shape", t):
            return pcg.shape(tensors[t]).sizes
    raise ShapeError(f"unknown constraint operand {v!r}")


def check_constraint(pcg: PCG, c: Constraint, tensors: Mapping[str, TensorRef],
                     binding: Mapping[str, int]) -> str | None:
    try:
        a = _operand(pcg, c.lhs, tensors, binding)
        b = _operand(pcg, c.rhs, tensors, binding)
    except (IndexError, KeyError):
        return f"constraint {c.kind}({c.lhs}, {c.rhs}) does not apply here"
    return None if holds(c.kind, a, b) else f"constraint {c.kind}({c.lhs}={a}, {c.rhs}={b}) fails"


def holds(kind: str, a, b) -> bool:
    """Whether a constraint of ``kind`` holds between its operands' values (a shape, a
    tuple, is only ever equal or not)."""
    if kind == "EQUAL":
        return a == b
    if kind == "UNEQUAL":
        return a != b
    if isinstance(a, tuple) or isinstance(b, tuple):
        return False
    if kind == "DIVISIBLE_BY":
        return b != 0 and a % b == 0
    return kind == "AT_LEAST" and a >= b


def find_matches(pcg: PCG, rule: Rule, limit: int | None = None) -> list[Match]:
    return Matcher(pcg, rule).all(limit)


def why_not(pcg: PCG, rule: Rule, node: int) -> str | None:
    """None if ``rule`` matches with its first output at ``node``, else the reason."""
    m = Matcher(pcg, rule).at(node)
    return None if isinstance(m, Match) else m


def free_params(rule: Rule) -> tuple[str, ...]:
    """Parameters the target uses that matching the source does not bind (chosen by the
    caller, e.g. the degree of a parallelization rule)."""
    bound = {prm for n in rule.src.nodes for _, v in n.attrs for prm in _params(v)}
    return tuple(p for p in rule.params if p not in bound)


def _params(v) -> list[str]:
    if isinstance(v, Param):
        return [v.name]
    if isinstance(v, tuple):
        return [p for x in v for p in _params(x)]
    return []


def _check_target(pcg: PCG, m: Match, inputs: Mapping[str, TensorRef], src_outs: list[TensorRef],
                  binding: Mapping[str, int], max_pieces: int | None) -> None:
    """The target built after the graph's nodes, on its own: what :func:`apply_match` refuses
    (a shape error, an output that differs from the source's, too many pieces) is refused
    before the graph is rebuilt."""
    b = GraphBuilder()
    b.nodes = list(pcg.nodes)
    try:
        outs = instantiate(m.rule.dst, b, inputs, binding)
    except ShapeError as e:
        raise RewriteError(f"rule {m.rule.id} at %{m.root}: {e}") from None
    for old, new in zip(src_outs, outs, strict=True):
        if b.shape(new) != pcg.shape(old):
            raise RewriteError(f"target output {b.shape(new)} differs from source {pcg.shape(old)}")
    if max_pieces is not None:   # (a parallel op's may cancel against another's when the graph is simplified)
        for n in b.nodes[len(pcg.nodes):]:
            if not n.spec.is_parallel_op and n.outputs[0].pieces > max_pieces:
                raise RewriteError(f"rule {m.rule.id} at %{m.root}: {n.kind} would make {n.outputs[0].pieces} "
                                   f"pieces, more than {max_pieces}")


class _Unmoved(dict):
    """A remapping of tensor refs where the nodes before ``start`` keep their places."""

    def __init__(self, start: int):
        super().__init__()
        self.start = start

    def __missing__(self, r: TensorRef) -> TensorRef:
        if r.node < self.start:
            return r
        raise KeyError(r)


def apply_match(pcg: PCG, m: Match, params: Mapping[str, int] | None = None, check: bool = True,
                max_pieces: int | None = None) -> PCG:
    """The PCG with the match replaced by the rule's target; RewriteError if that fails.

    ``params`` gives the values of the rule's free parameters (see :func:`free_params`).
    The target's nodes are always shape-checked, before the graph is rebuilt, and so is
    ``max_pieces`` (a target operator with more pieces than that is refused: the search's
    device count); ``check`` also re-validates the whole graph (the search turns it off:
    nothing outside the match can change).
    """
    binding = {**(params or {}), **m.binding}
    missing = [p for p in m.rule.params if p not in binding]
    if missing:
        raise RewriteError(f"rule {m.rule.id}: parameter {missing[0]!r} needs a value")
    for c in m.rule.constraints:
        why = check_constraint(pcg, c, m.tensors, binding)
        if why:
            raise RewriteError(f"rule {m.rule.id} at %{m.root}: {why}")
    matched = set(m.nodes)
    src_outs = [m.tensors[t] for t in m.rule.src.outputs]
    inputs = {t: m.tensors[t] for t in m.rule.inputs if t in m.tensors}
    _check_target(pcg, m, inputs, src_outs, binding, max_pieces)
    dst_key = min(matched)
    # Kahn's algorithm over the unmatched nodes plus one block for the target, in original
    # order. The nodes before the match's first come first and unchanged (theirs are all
    # earlier still): they are copied as they are, and the order is walked from there.
    deps: dict[object, set[object]] = {"dst": {r.node for r in inputs.values() if r.node >= dst_key}}
    for i in range(dst_key, len(pcg.nodes)):
        if i not in matched:
            deps[i] = {("dst" if r.node in matched else r.node) for r in pcg.nodes[i].inputs if r.node >= dst_key}
    users: dict[object, list[object]] = {k: [] for k in deps}
    for k, ds in deps.items():
        for d in ds:
            users.setdefault(d, []).append(k)
    indeg = {k: len(v) for k, v in deps.items()}
    heap = [((dst_key if k == "dst" else k), str(k), k) for k, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    b = GraphBuilder()
    b.nodes = list(pcg.nodes[:dst_key])
    remap: dict[TensorRef, TensorRef] = _Unmoved(dst_key)
    done = 0
    try:
        while heap:
            _, _, k = heapq.heappop(heap)
            done += 1
            if k == "dst":
                # (its outputs have the source's shapes: _check_target saw the same inputs)
                outs = instantiate(m.rule.dst, b, {t: remap[r] for t, r in inputs.items()}, binding,
                                   [pcg.nodes[r.node].name for r in src_outs], pcg.nodes[m.root].name,
                                   moved_names(m.rule.src, m.rule.dst, [pcg.nodes[i].name for i in m.nodes]))
                remap.update(zip(src_outs, outs, strict=True))
            else:
                n = pcg.nodes[k]
                # The target's outputs have the source's shapes (_check_target), so no node
                # outside the match changes shape: keep its stored outputs.
                refs = b.add(n.op, [remap[r] for r in n.inputs], n.name, outputs=n.outputs)
                for idx, r in enumerate(refs):
                    remap[TensorRef(k, idx)] = r
            for u in users.get(k, ()):
                indeg[u] -= 1
                if indeg[u] == 0:
                    heapq.heappush(heap, ((dst_key if u == "dst" else u), str(u), u))
    except ShapeError as e:
        raise RewriteError(f"rule {m.rule.id} at %{m.root}: {e}") from None
    if done != len(deps):
        raise RewriteError(f"rule {m.rule.id} at %{m.root}: the rewrite would create a cycle")
    out = prune(b.build([remap[r] for r in pcg.outputs]))
    why = _constant_needs_grad(out, {n.kind for n in m.rule.dst.nodes})
    if why:
        raise RewriteError(f"rule {m.rule.id} at %{m.root}: {why}")
    if check:
        bad = problems(out)
        if bad:
            raise RewriteError(f"rule {m.rule.id} at %{m.root}: {bad[0]}")
    return out


def _constant_needs_grad(g: PCG, kinds: set[str]) -> str | None:
    """Why ``g`` cannot be trained as built (None: it can): an operator of ``kinds`` whose
    backward gives one of its inputs no gradient (``OpSpec.no_grad_inputs``: Attention's
    mask) reads there a tensor whose gradient training needs (a learned additive bias)."""
    kinds = {k for k in kinds if type(spec_by_kind(k)).no_grad_inputs is not OpSpec.no_grad_inputs}
    if not kinds or not g.outputs:
        return None
    grads = needs_grad(g, g.outputs[0])
    for kind in sorted(kinds):
        for i in g.by_kind.get(kind, ()):
            n = g.nodes[i]
            for pos in n.spec.no_grad_inputs(n.op):
                if n.inputs[pos] in grads:
                    return (f"{n.name or n.kind} ({kind}) takes input {pos} as a constant, but training needs its "
                            "gradient")
    return None
