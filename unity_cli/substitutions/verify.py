"""The rule verifier: a rule is kept only if z3 proves ``src != dst`` unsatisfiable.

:func:`verify_rule` runs three steps and stops at the first that rejects:

1. **layouts** — both sides are built as PCGs over a few generic input layouts
   (unpartitioned ``[4,4]``, ``[6,6]``, ``[2,4,4]`` tensors, with the degrees and
   replicas the rule's constraints ask of its inputs; each parameter bound to 2 or 3
   where the sizes allow; mixed ``[4,4]``/``[4,8]``/``[8,4]`` inputs if nothing else
   fits; an Attention's q, k and v also grouped-query, where its products broadcast).
   The source must type-check somewhere (with its constraints holding); wherever it
   does, the target must too, with identical output parallel shapes. This is exact:
   which pieces exist is the shape system's business, not z3's.
2. **numbers** — both sides are evaluated on random integer tensors at every such
   layout; a difference rejects the rule with the counterexample.
3. **proof** — one z3 term per output of each side (:func:`terms`), under the axioms
   of :mod:`.axioms`, at each distinct (input ranks, binding); the rule is accepted only
   if ``Or(src_i != dst_i)`` is ``unsat`` every time. ``sat``, a timeout or ``unknown``
   (E-matching saturated, or :data:`MAX_INSTANCES` reached) reject it, with that reason.
"""
from __future__ import annotations

import itertools
import math
import multiprocessing
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from ..errors import ShapeError, UnityError
from ..ir.dtypes import DType
from ..ir.ops.sources import InputAttrs
from ..ir.opspec import OpKind, encode_terms
from ..ir.pcg import PCG, GraphBuilder, Node, TensorRef
from ..ir.shapes import ParallelTensorShape, TensorShape
from .axioms import Signature, axioms_for, function_symbols, signature
from .codec import AXIS_FIELDS, bind_dims, from_pattern, sized_by_dims
from .match import holds
from .rule import Constraint, Pattern, Rule
from .semantics import evaluate


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the verifier made of one rule; ``reason`` is ``"proved"`` or why it was rejected."""

    rule_id: str
    accepted: bool
    reason: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Layout:
    """Input parallel shapes and parameter values to instantiate a rule at."""

    shapes: Mapping[str, ParallelTensorShape]
    binding: Mapping[str, int]

    def __str__(self) -> str:
        ins = ", ".join(f"{k}: {v}" for k, v in self.shapes.items())
        params = ", ".join(f"{k}={v}" for k, v in sorted(self.binding.items()))
        return f"{ins}{'; ' + params if params else ''}"


@dataclass(frozen=True)
class Instance:
    """Both sides of a rule built at one layout."""

    layout: Layout
    src: PCG
    dst: PCG


BASES = ((4, 4), (6, 6), (2, 4, 4))
"""Generic input shapes; every input gets the base shape unless the rule uses it otherwise."""
DEGREES = (2, 3)
"""Values tried for each parameter (only those that divide the base shape's dims)."""
MAX_BINDINGS = 4
MAX_MIXED = 243
"""How many mixed-shape layouts to try when no generic one type-checks the source."""
CONV_SPATIAL = 5
MAX_INSTANCES = 5000
"""Axiom instances z3 may make per check. Proofs of the 2,276 rules that ``max_ops=3``
generates need at most 58; a wrong rule can make E-matching loop (``a - a`` breeds
``Scale(k, a)`` for ever larger ``k``), and this stops it fast and deterministically."""
INSTANCES_PER_OP = 800
"""A wide rule may make more: this many per operator of its two sides, when that is more
than :data:`MAX_INSTANCES` (Concat-Linear over 8 parts, 18 operators, needs 4,703)."""


class Rejected(Exception):
    """Stops verification of a rule; its message is the verdict's reason."""


def verify_rule(rule: Rule, timeout_ms: int = 1000) -> Verdict:
    """Check a rule's layouts and values, then prove it with z3 (see the module docstring)."""
    t0 = time.perf_counter()
    try:
        instances = check_layouts(rule)
        check_numbers(rule, instances)
        reason = prove(rule, instances, timeout_ms)
        accepted = reason == "proved"
    except Rejected as e:
        accepted, reason = False, str(e)
    except Exception as e:  # a malformed rule must be rejected, never crash a batch
        accepted, reason = False, f"verifier error: {type(e).__name__}: {e}"
    return Verdict(rule.id, accepted, reason, time.perf_counter() - t0)


def verify_all(rules: Sequence[Rule], timeout_ms: int = 1000, jobs: int = 2,
               progress: Callable[[int, int, Verdict], None] | None = None) -> list[Verdict]:
    """Verify many rules in a pool of ``jobs`` processes; verdicts come back in the rules'
    order, and ``progress(done, total, verdict)`` is called as each one does.

    Workers are spawned, not forked (z3 state does not survive a fork reliably), so a
    script calling this must guard its main module with ``if __name__ == "__main__"``.
    """
    work = [(r, timeout_ms) for r in rules]
    if jobs <= 1 or len(rules) <= 1:
        return _collect(map(_verify_job, work), len(work), progress)
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        chunk = max(1, min(16, len(work) // (4 * jobs)))
        return _collect(pool.imap(_verify_job, work, chunksize=chunk), len(work), progress)


def _collect(verdicts: Iterable[Verdict], total: int,
             progress: Callable[[int, int, Verdict], None] | None) -> list[Verdict]:
    out: list[Verdict] = []
    for v in verdicts:
        out.append(v)
        if progress:
            progress(len(out), total, v)
    return out


def _verify_job(job: tuple[Rule, int]) -> Verdict:
    return verify_rule(*job)


# ---------------------------------------------------------------------------
# Step 1: layouts


def check_layouts(rule: Rule) -> list[Instance]:
    """The layouts where the source type-checks and its constraints hold; raises Rejected
    if there is none, or if the target does not give the same output layouts there."""
    instances: list[Instance] = []
    first_problem = None
    for layout in candidate_layouts(rule):
        problem = _try_layout(rule, layout, instances)
        first_problem = first_problem or problem
    if not instances and sized_by_dims(rule):   # a rule for unequal sizes only (UNEQUAL)
        for layout in unequal_layouts(rule, candidate_layouts(rule)):
            _try_layout(rule, layout, instances)
    if not instances:
        for layout in mixed_layouts(rule):
            _try_layout(rule, layout, instances)
            if len(instances) >= 3:
                break
    if not instances:
        raise Rejected(f"does not type-check: {first_problem}")
    if sized_by_dims(rule):   # equal sizes cannot tell a right order of the parts from a wrong one
        before = len(instances)
        for layout in unequal_layouts(rule, [i.layout for i in instances]):
            _try_layout(rule, layout, instances)
        if len(instances) == before:
            raise Rejected("does not type-check where the sizes its attributes name differ")
    return instances


def _try_layout(rule: Rule, layout: Layout, instances: list[Instance]) -> str | None:
    """Adds the instance if the source applies at this layout; returns why not, if not."""
    try:
        src, env = build(rule.src, layout)
    except (ShapeError, KeyError, TypeError, ValueError, IndexError) as e:
        return f"src: {_msg(e)} ({layout})"
    bad = failed_constraint(rule.constraints, env, layout.binding)
    if bad:
        return f"constraint {bad} fails ({layout})"
    try:
        dst, _ = build(rule.dst, layout)
    except (ShapeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise Rejected(f"does not type-check: dst fails where src type-checks: {_msg(e)} ({layout})") from None
    for k, (a, b) in enumerate(zip(src.outputs, dst.outputs, strict=True)):
        sa, sb = src.shape(a), dst.shape(b)
        if sa != sb:
            which = f" at output {k}" if len(src.outputs) > 1 else ""
            raise Rejected(f"layouts differ: src gives {sa}, dst gives {sb}{which} ({layout})")
    instances.append(Instance(layout, src, dst))
    return None


def _msg(e: Exception) -> str:
    return str(e) if isinstance(e, UnityError) else f"{type(e).__name__}: {e}"


def build(pattern: Pattern, layout: Layout) -> tuple[PCG, dict[str, ParallelTensorShape]]:
    """One side as a PCG over Input nodes (as ``codec.build_side``), and the shape of every
    tensor it names. Pattern axes out of range are type errors here."""
    b = GraphBuilder()
    env: dict[str, TensorRef] = {}
    for name, shape in layout.shapes.items():
        env[name] = b.add(InputAttrs(shape.logical), (), name, outputs=[shape])[0]
    binding = bind_dims(pattern, layout.binding, lambda t: b.shape(env[t]))
    for n in pattern.nodes:
        refs = [env[t] for t in n.inputs]
        shapes = [b.shape(r) for r in refs]
        rank = shapes[0].rank if shapes else 0
        for f in AXIS_FIELDS.get(n.kind, ()):
            v = dict(n.attrs).get(f)
            if isinstance(v, int) and not -rank <= v < 0:
                raise ShapeError(f"{n.kind}: axis {v} does not exist in a rank-{rank} tensor")
        outs = b.add(from_pattern(n, shapes, binding), refs)
        if len(outs) != len(n.outputs):
            raise ShapeError(f"{n.kind} makes {len(outs)} outputs, the pattern names {len(n.outputs)}")
        env.update(zip(n.outputs, outs, strict=True))
    pcg = b.build([env[t] for t in pattern.outputs])
    return pcg, {t: b.shape(r) for t, r in env.items()}


def candidate_layouts(rule: Rule) -> list[Layout]:
    """Generic layouts: each base shape, each binding of the parameters, adjusted to what
    the constraints say about the inputs' degrees and replicas."""
    out = []
    for base in BASES:
        shapes = {name: _input_shape(rule, name, base) for name in rule.inputs}
        for binding in _bindings(rule):
            if any(size % math.prod(binding.values()) for size in base):
                continue  # only degrees the sizes allow
            layout = _constrained(Layout(shapes, binding), rule.constraints)
            if layout is not None:
                out.append(layout)
    return out + grouped_query_layouts(rule)


GROUPED_QUERY = ((2, 2, 4, 4), (2, 1, 4, 4))
"""An Attention's q, and its k and v, in the grouped-query layout: two query heads per
key/value head, which they read through a size-1 group axis (the products broadcast)."""


def grouped_query_layouts(rule: Rule) -> list[Layout]:
    """For a rule with an Attention: its q, k and v (or the rule inputs they transpose) in the
    :data:`GROUPED_QUERY` layout, the other inputs as at base ``[4, 4]``; none without one."""
    grouped: dict[str, tuple[int, ...]] = {}
    for side in (rule.src, rule.dst):
        made = {t: n for n in side.nodes for t in n.outputs}
        for n in side.nodes:
            if n.kind != OpKind.Attention:
                continue
            for t, dims in zip(n.inputs[:3], (GROUPED_QUERY[0],) + (GROUPED_QUERY[1],) * 2, strict=True):
                m = made.get(t)
                t = m.inputs[0] if m is not None and m.kind == OpKind.Transpose else t
                if t in rule.inputs:
                    grouped[t] = dims
    if not grouped:
        return []
    shapes = {name: ParallelTensorShape.unpartitioned(TensorShape(grouped[name])) if name in grouped
              else _input_shape(rule, name, BASES[0]) for name in rule.inputs}
    layout = _constrained(Layout(shapes, _bindings(rule)[0]), rule.constraints)
    return [] if layout is None else [layout]


def unequal_layouts(rule: Rule, layouts: Sequence[Layout]) -> list[Layout]:
    """Each layout again with the rule-input dims an attribute names (``sized_by_dims``) made
    4, 8, 12, ... in order, and in the reverse order."""
    refs = sized_by_dims(rule)
    out = []
    for layout in layouts:
        for order in (refs, refs[::-1]):
            shapes = dict(layout.shapes)
            for k, (t, a) in enumerate(order):
                s = shapes[t]
                dims = list(s.logical.dims)
                dims[a] = 4 * (k + 1)
                shapes[t] = ParallelTensorShape.unpartitioned(TensorShape(tuple(dims), s.dtype))
            _weights_follow(rule, shapes)
            _biases_follow(rule, shapes)
            out.append(Layout(shapes, layout.binding))
    return out


def _weights_follow(rule: Rule, shapes: dict[str, ParallelTensorShape]) -> None:
    """A source product over a concatenation of rule inputs: its weight's contracted dim
    made as long as the concatenation is wide (Concat-Linear over parts of unequal widths)."""
    made = {t: n for n in rule.src.nodes for t in n.outputs}
    for n in rule.src.nodes:
        if n.kind not in (OpKind.MatMul, OpKind.Gemm) or len(n.inputs) < 2 or n.inputs[1] not in shapes:
            continue
        cat = made.get(n.inputs[0])
        if cat is None or cat.kind != OpKind.Concat or not all(t in shapes for t in cat.inputs):
            continue
        width = sum(shapes[t].sizes[-1] for t in cat.inputs)
        w = shapes[n.inputs[1]]
        dims = list(w.logical.dims)
        dims[-1 if n.kind == OpKind.Gemm and dict(n.attrs).get("trans_b") else -2] = width
        shapes[n.inputs[1]] = ParallelTensorShape.unpartitioned(TensorShape(tuple(dims), w.logical.dtype))


def _biases_follow(rule: Rule, shapes: dict[str, ParallelTensorShape]) -> None:
    """A source Gemm's bias made as wide as its weight's output dim (a sibling Gemm's
    weights of unequal widths carry biases of those widths)."""
    for n in rule.src.nodes:
        if n.kind == OpKind.Gemm and len(n.inputs) == 3 and n.inputs[1] in shapes and n.inputs[2] in shapes:
            w, b = shapes[n.inputs[1]], shapes[n.inputs[2]]
            width = w.sizes[-2 if dict(n.attrs).get("trans_b") else -1]
            if b.rank == 1 and b.sizes[0] != width:
                shapes[n.inputs[2]] = ParallelTensorShape.unpartitioned(TensorShape((width,), b.logical.dtype))


def mixed_layouts(rule: Rule) -> list[Layout]:
    """Layouts whose inputs differ in shape ([4,4], [4,8], [8,4], and [4,4n], [4n,4] for a
    rule with an n-input operator, whose weight spans n parts), for rules that need it."""
    wide = max((len(n.inputs) for n in rule.src.nodes + rule.dst.nodes), default=2)
    menu = ((4, 4), (4, 8), (8, 4)) + (((4, 4 * wide), (4 * wide, 4)) if wide > 2 else ())
    out = []
    names = list(rule.inputs)
    for combo in itertools.islice(itertools.product(menu, repeat=len(names)), MAX_MIXED):
        shapes = {name: _input_shape(rule, name, dims) for name, dims in zip(names, combo, strict=True)}
        layout = _constrained(Layout(shapes, _bindings(rule)[0]), rule.constraints)
        if layout is not None:
            out.append(layout)
    return out


def _bindings(rule: Rule) -> list[dict[str, int]]:
    combos = itertools.product(DEGREES, repeat=len(rule.params))
    return [dict(zip(rule.params, c, strict=True)) for c in itertools.islice(combos, MAX_BINDINGS)]


def _input_shape(rule: Rule, name: str, base: tuple[int, ...]) -> ParallelTensorShape:
    """A generic shape for one input, bent to how the rule uses it (ids, conv operands)."""
    n = base[-1]
    for node in rule.src.nodes + rule.dst.nodes:
        if name not in node.inputs:
            continue
        pos = node.inputs.index(name)
        attrs = dict(node.attrs)
        if node.kind == OpKind.Gemm and pos == 2:   # a bias, broadcast along the rows
            return ParallelTensorShape.unpartitioned(TensorShape((n,)))
        if node.kind in (OpKind.Gather, OpKind.GatherND) and pos == 1 or node.kind == OpKind.GroupedGather and pos:
            return ParallelTensorShape.unpartitioned(TensorShape((n,), DType.INT64))
        if node.kind == OpKind.Conv and isinstance(attrs.get("kernel"), tuple):
            kernel, groups = attrs["kernel"], attrs.get("groups", 1)
            groups = groups if isinstance(groups, int) and n % groups == 0 else 1
            dims = {0: (base[0], n) + (CONV_SPATIAL + max(kernel),) * len(kernel),
                    1: (n, n // groups) + tuple(kernel), 2: (n,)}[pos]
            return ParallelTensorShape.unpartitioned(TensorShape(dims))
    rank = next((c.rhs for c in rule.constraints if c.kind == "EQUAL" and c.lhs == ("rank", name)
                 and isinstance(c.rhs, int) and c.rhs >= 0), None)
    moved = max((len(n.attr("perm")) for n in rule.src.nodes + rule.dst.nodes
                 if n.kind == OpKind.Transpose and name in n.inputs), default=0)
    if rank is None and moved > 2:   # a transpose of 3 or 4 dims: sizes all different
        return ParallelTensorShape.unpartitioned(TensorShape(tuple(range(2, 2 + max(moved, len(base))))))
    rank = len(base) if rank is None else rank
    dims = (2,) * (rank - len(base)) + base[-rank:] if rank > len(base) else base[len(base) - rank:]
    return ParallelTensorShape.unpartitioned(TensorShape(dims))   # of the rank a constraint asks


def _constrained(layout: Layout, constraints: Sequence[Constraint]) -> Layout | None:
    """Apply constraints that fix an input's degree/replicas (``EQUAL``/``DIVISIBLE_BY``
    with a number or parameter); None if the result is not a valid shape."""
    shapes = dict(layout.shapes)
    for c in constraints:
        for lhs, rhs in ((c.lhs, c.rhs), (c.rhs, c.lhs)):
            if c.kind not in ("EQUAL", "DIVISIBLE_BY") or not _is_layout_operand(lhs, shapes):
                continue
            want = _value(rhs, {}, layout.binding)
            if want is None or want < 1:
                continue
            s = shapes[lhs[1]]
            have = _value(lhs, shapes, layout.binding) or 1
            new = want if c.kind == "EQUAL" else math.lcm(have, want)
            if lhs[0] == "degree":
                s = s.with_dim(lhs[2], new)
            elif lhs[0] == "sum":
                s = s.with_replicas(sum_degree=new)
            else:
                s = s.with_replicas(copy_degree=new)
            if s.problems():
                return None
            shapes[lhs[1]] = s
    return Layout(shapes, layout.binding)


def _is_layout_operand(v: Any, shapes: Mapping[str, ParallelTensorShape]) -> bool:
    if not isinstance(v, tuple) or len(v) < 2 or v[0] not in ("degree", "sum", "copy") or v[1] not in shapes:
        return False
    if v[0] == "degree":
        return len(v) == 3 and isinstance(v[2], int) and -shapes[v[1]].rank <= v[2] < shapes[v[1]].rank
    return True


def _value(v: Any, shapes: Mapping[str, ParallelTensorShape], binding: Mapping[str, int]) -> int | None:
    """The integer a constraint operand stands for, or None if it names nothing known."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if not isinstance(v, tuple) or not v:
        return None
    match v:
        case ("param", str(name)):
            return binding.get(name)
        case ("dim" | "degree", str(t), int(axis)) if t in shapes and -shapes[t].rank <= axis < shapes[t].rank:
            s = shapes[t]
            return s.sizes[axis] if v[0] == "dim" else s.degrees[axis]
        case ("sum", str(t)) if t in shapes:
            return shapes[t].sum_degree
        case ("copy", str(t)) if t in shapes:
            return shapes[t].copy_degree
        case ("rank", str(t)) if t in shapes:
            return shapes[t].rank
        case ("shape", str(t)) if t in shapes:
            return shapes[t].sizes
    return None


def failed_constraint(constraints: Sequence[Constraint], shapes: Mapping[str, ParallelTensorShape],
                      binding: Mapping[str, int]) -> str | None:
    """The first constraint that does not hold (as text), or None."""
    for c in constraints:
        a, b = _value(c.lhs, shapes, binding), _value(c.rhs, shapes, binding)
        if a is None or b is None or not holds(c.kind, a, b):
            return f"{c.kind}({c.lhs}, {c.rhs})"
    return None


# ---------------------------------------------------------------------------
# Step 2: numbers


def check_numbers(rule: Rule, instances: Sequence[Instance], draws: int = 2) -> bool:
    """Evaluate both sides on random integers at every layout with the runtime's own kernels
    (``semantics.evaluate``); raises Rejected with a counterexample if they differ. False if
    an op has no kernel."""
    rng = np.random.default_rng(int(rule.id[:8], 16))
    for inst in instances:
        for _ in range(draws):
            values = random_inputs(inst.layout, rng)
            try:
                a, b = evaluate(inst.src, values), evaluate(inst.dst, values)
            except NotImplementedError:
                return False
            for k, (u, v) in enumerate(zip(a, b, strict=True)):
                if u.shape != v.shape or not np.allclose(u, v, rtol=1e-9, atol=1e-9, equal_nan=True):
                    raise Rejected(_counterexample(values, k, u, v, inst.layout))
    return True


def random_inputs(layout: Layout, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Small random integers; integer tensors (ids) stay within the smallest dim."""
    float_dims = [d for s in layout.shapes.values() if not s.dtype.value.startswith("int") for d in s.sizes]
    bound = max(1, min(float_dims, default=2))
    out = {}
    for name, s in layout.shapes.items():
        if s.dtype.value.startswith("int"):
            out[name] = rng.integers(0, bound, s.sizes).astype(np.int64)
        else:
            out[name] = rng.integers(-3, 4, s.sizes).astype(np.float64)
    return out


def _counterexample(values: Mapping[str, np.ndarray], k: int, u: np.ndarray, v: np.ndarray, layout: Layout) -> str:
    ins = "; ".join(f"{n}={_short(x)}" for n, x in values.items())
    if u.shape != v.shape:
        diff = f"src output {k} has shape {list(u.shape)}, dst {list(v.shape)}"
    else:
        where = tuple(int(i) for i in np.argwhere(~np.isclose(u, v, equal_nan=True))[0])
        diff = f"output {k} at {list(where)}: src gives {_num(u[where])}, dst gives {_num(v[where])}"
    params = ", ".join(f"{p}={d}" for p, d in sorted(layout.binding.items()))
    return f"counterexample: {diff}; with {ins}{'; ' + params if params else ''}"


def _short(x: np.ndarray) -> str:
    flat = x.astype(np.int64) if np.all(np.mod(x, 1) == 0) else x
    return np.array2string(flat, separator=",", threshold=64, max_line_width=10_000).replace("\n", "")


def _num(x: Any) -> str:
    f = float(x)
    return str(int(f)) if f.is_integer() else f"{f:g}"


# ---------------------------------------------------------------------------
# Step 3: proof


def prove(rule: Rule, instances: Sequence[Instance], timeout_ms: int) -> str:
    """"proved" if z3 shows ``src != dst`` unsatisfiable at every distinct (input ranks,
    binding, sizes named by attributes) instance; else raises Rejected with z3's answer."""
    seen = set()
    sized = sized_by_dims(rule)
    for inst in instances:
        key = (tuple(s.rank for s in inst.layout.shapes.values()), tuple(sorted(inst.layout.binding.items())),
               tuple(inst.layout.shapes[t].sizes[a] for t, a in sized))   # the sizes an attribute names, too
        if key in seen:
            continue
        seen.add(key)
        s = signature()
        try:
            lhs, rhs = terms(inst.src, s), terms(inst.dst, s)
        except NotImplementedError as e:
            raise Rejected(f"cannot encode for z3: {e}") from None
        cap = max(MAX_INSTANCES, INSTANCES_PER_OP * (rule.src.size + rule.dst.size))
        result = check_equal(lhs, rhs, timeout_ms, cap)
        if result != "unsat":
            raise Rejected(f"z3: {result} ({inst.layout})")
    return "proved"


def check_equal(lhs: Sequence[z3.ExprRef], rhs: Sequence[z3.ExprRef], timeout_ms: int,
                max_instances: int = MAX_INSTANCES) -> str:
    """z3's answer to ``Or(lhs_i != rhs_i)`` under the axioms: "unsat", "sat", "timeout" or
    "unknown (why)"; E-matching stops after ``max_instances`` axiom instances."""
    solver = z3.SimpleSolver()  # the SMT core itself: the default tactic front end ignores smt.mbqi
    solver.set("smt.mbqi", False)  # E-matching only: every instance grows from a well-typed graph's terms
    solver.set("smt.qi.max_instances", max_instances)
    solver.set("timeout", int(timeout_ms))
    solver.add(*axioms_for(function_symbols(*lhs, *rhs)))
    solver.add(z3.Or([a != b for a, b in zip(lhs, rhs, strict=True)]))
    r = solver.check()
    if r == z3.unsat:
        return "unsat"
    if r == z3.sat:
        return "sat"
    stats = solver.statistics()
    if "quant instantiations" in stats.keys() and stats.get_key_value("quant instantiations") >= max_instances:
        return f"unknown (gave up after {max_instances} axiom instances)"
    why = solver.reason_unknown().strip("()")
    return "timeout" if why in ("timeout", "canceled") else f"unknown ({why})"


def terms(pcg: PCG, s: Signature | None = None) -> list[z3.ExprRef]:
    """One z3 term per output of a PCG, its sources as constants named like them."""
    s = s or signature()
    values: dict[tuple[int, int], z3.ExprRef] = {}
    for i, n in pcg:
        if n.spec.is_source:
            values[(i, 0)] = z3.Const(n.name, s.T)
            continue
        args = [values[(r.node, r.index)] for r in n.inputs]
        ins = [pcg.shape(r) for r in n.inputs]
        for k, t in enumerate(encode(s, n, args, ins)):
            values[(i, k)] = t
    return [values[(r.node, r.index)] for r in pcg.outputs]


def encode(s: Signature, n: Node, x: list[z3.ExprRef], ins: list[ParallelTensorShape]) -> list[z3.ExprRef]:
    """The terms of one node's outputs from its inputs' terms: as its spec writes them
    (``OpSpec.encode``), or an uninterpreted function of its attributes where it has none."""
    return encode_terms(s, n.op, x, ins, n.outputs)
