"""Between PCG operator attributes and rank-free pattern attributes.

Pattern attributes count axes from the end, describe a transpose by the permutation of
the trailing dims it moves, a split by its number of equal parts, and a Combine of
replicas by ``dim = "copy"``; parallel degrees may be parameters. A tuple attribute may
name the sizes of rule inputs' dims (``(("dim", input, axis), ...)``: the rows of each
table a ``GroupedGather`` merges), bound where the rule is applied (:func:`bind_dims`).
``to_pattern`` and ``from_pattern`` are inverses for every attribute a rule can carry.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ShapeError
from ..ir.ops.parallel import REPLICA_DIM
from ..ir.ops.sources import InputAttrs
from ..ir.opspec import OMIT_DEFAULT, OpKind, _typed, spec_by_kind, spec_of
from ..ir.pcg import PCG, GraphBuilder, TensorRef
from ..ir.shapes import ParallelTensorShape
from .rule import AttrValue, Param, Pattern, PatternNode

AXIS_FIELDS = {OpKind.Concat: ("axis",), OpKind.Split: ("axis",), OpKind.Repartition: ("dim",),
               OpKind.Combine: ("dim",), OpKind.Softmax: ("axis",), OpKind.LayerNormalization: ("axis",),
               OpKind.Gather: ("axis",)}
DEGREE_FIELDS = {OpKind.Repartition: "degree", OpKind.Combine: "degree", OpKind.Replicate: "degree",
                 OpKind.Reduction: "degree", OpKind.Scale: "factor"}


def to_pattern(kind: str, attrs: Any, rank: int, params: Mapping[int, Param] | None = None
               ) -> tuple[tuple[str, AttrValue], ...]:
    """Pattern attributes of a concrete op whose (first) input has ``rank`` dims.

    ``params`` maps degree values to the parameter that stands for them.
    """
    out: dict[str, AttrValue] = {}
    for f in dataclasses.fields(attrs):
        v = getattr(attrs, f.name)
        if f.metadata.get(OMIT_DEFAULT) and v == f.default:
            continue    # a field added later: rules written before it keep their bytes
        if f.name in AXIS_FIELDS.get(kind, ()):
            v = "copy" if kind == OpKind.Combine and v == REPLICA_DIM else v - rank
        elif kind == OpKind.Transpose and f.name == "perm":
            v = perm_tail(v)
        elif kind == OpKind.Split and f.name == "sizes":
            if len(set(v)) == 1:
                f_name, v = "parts", len(v)
                out[f_name] = v
                continue
            v = tuple(v)
        elif f.name == DEGREE_FIELDS.get(kind) and params and v in params:
            v = params[v]
        elif hasattr(v, "value") and not isinstance(v, int | float | str | tuple):
            v = v.value  # enums (dtypes)
        out[f.name] = v
    return tuple(sorted(out.items()))


def perm_tail(perm: Sequence[int]) -> tuple[int, ...]:
    """The trailing part of a permutation that moves dims, as negative axes."""
    r = len(perm)
    i = 0
    while i < r and perm[i] == i:
        i += 1
    return tuple(p - r for p in perm[i:])


def from_pattern(node: PatternNode, inputs: Sequence[ParallelTensorShape], binding: Mapping[str, int]) -> Any:
    """Concrete attributes for a pattern node applied to inputs of the given shapes."""
    spec = spec_by_kind(node.kind)
    rank = inputs[0].rank if inputs else 0
    pat = dict(node.attrs)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(spec.attrs_type):
        if _sized_by_dims(pat.get(f.name)):
            kwargs[f.name] = tuple(binding[dim_key(t, a)] for _, t, a in pat[f.name])
            continue
        if f.name == "sizes" and node.kind == OpKind.Split and "parts" in pat:
            parts = _value(pat["parts"], binding)
            axis = _value(pat["axis"], binding) + rank
            size = inputs[0].sizes[axis]
            if parts < 1 or size % parts:
                raise ShapeError(f"Split into {parts} equal parts of a dim of size {size}")
            kwargs["sizes"] = (size // parts,) * parts
            continue
        if f.name not in pat:
            if f.metadata.get(OMIT_DEFAULT):
                kwargs[f.name] = f.default
                continue
            raise ShapeError(f"{node.kind}: pattern has no attribute {f.name!r}")
        v = _value(pat[f.name], binding)
        if f.name in AXIS_FIELDS.get(node.kind, ()):
            if v == "copy" and node.kind == OpKind.Combine:
                v = REPLICA_DIM
            elif not isinstance(v, int) or not -rank <= v < 0:
                raise ShapeError(f"{node.kind}: axis {pat[f.name]} does not exist in a rank-{rank} tensor")
            else:
                v += rank
        elif node.kind == OpKind.Transpose and f.name == "perm":
            tail = tuple(v)
            if len(tail) > rank:
                raise ShapeError(f"Transpose of the last {len(tail)} dims of a rank-{rank} tensor")
            v = tuple(range(rank - len(tail))) + tuple(t + rank for t in tail)
        kwargs[f.name] = v
    attrs = spec.attrs_type(**_retyped(spec.attrs_type, kwargs))
    return attrs


def _retyped(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out = {}
    for k, v in kwargs.items():
        hint = hints[k]
        if isinstance(v, tuple | list):
            v = _typed(list(v), hint)
        elif isinstance(v, str) and hint is not str:
            v = _typed(v, hint)
        out[k] = v
    return out


def dim_key(tensor: str, axis: int) -> str:
    """The binding's name for the size of a rule input's dim (``("dim", tensor, axis)``)."""
    return f"dim:{tensor}:{axis}"


def _sized_by_dims(v: Any) -> bool:
    return isinstance(v, tuple) and bool(v) and all(isinstance(x, tuple) and x[:1] == ("dim",) for x in v)


def _named_dims(pattern: Pattern) -> set[tuple[str, int]]:
    """The rule-input dims (``(input, axis)``) whose sizes the pattern's attributes name."""
    return {(t, a) for n in pattern.nodes for _, v in n.attrs if _sized_by_dims(v) for _, t, a in v}


def sized_by_dims(rule: Any) -> tuple[tuple[str, int], ...]:
    """The rule-input dims (``(input, axis)``) whose sizes an attribute of the rule's
    target or source names (none for most rules)."""
    return tuple(sorted(_named_dims(rule.src) | _named_dims(rule.dst)))


def bind_dims(pattern: Pattern, binding: Mapping[str, int],
              shape_of: typing.Callable[[str], ParallelTensorShape]) -> Mapping[str, int]:
    """``binding`` with the size of every rule-input dim the pattern's attributes name,
    read from ``shape_of(input)``."""
    named = _named_dims(pattern)
    if not named:
        return binding
    return {**binding, **{dim_key(t, a): shape_of(t).sizes[a] for t, a in named}}


def _value(v: AttrValue, binding: Mapping[str, int]) -> Any:
    if isinstance(v, Param):
        if v.name not in binding:
            raise ShapeError(f"parameter {v.name!r} is not bound")
        return binding[v.name]
    return v


@functools.cache
def _omitted_fields(kind: str) -> frozenset[str]:
    """The fields of ``kind``'s attrs that patterns leave out at their default."""
    return frozenset(f.name for f in dataclasses.fields(spec_by_kind(kind).attrs_type) if f.metadata.get(OMIT_DEFAULT))


def matches_attrs(node: PatternNode, attrs: Any, rank: int, binding: dict[str, int]) -> str | None:
    """None if a concrete op's attributes fit the pattern node (binding parameters as it
    goes), else the reason they do not."""
    if spec_of(attrs).kind != node.kind:
        return f"op is {spec_of(attrs).kind}, pattern wants {node.kind}"
    have = dict(to_pattern(node.kind, attrs, rank))
    named = {k for k, _ in node.attrs}
    for k in have.keys() - named:   # set away from its default where the pattern (and its proof) left it there
        if k in _omitted_fields(node.kind):
            return f"{k}={have[k]!r}, pattern wants its default"
    for k, want in node.attrs:
        got = have.get(k)
        if isinstance(want, Param):
            if want.name in binding and binding[want.name] != got:
                return f"{k}={got} but parameter {want.name} is already {binding[want.name]}"
            binding[want.name] = got
        elif got != want:
            return f"{k}={got!r}, pattern wants {want!r}"
    return None


def instantiate(pattern: Pattern, b: GraphBuilder, inputs: Mapping[str, TensorRef],
                binding: Mapping[str, int], names: Sequence[str] = (), root: str = "",
                moved: Mapping[tuple, str] | None = None) -> list[TensorRef]:
    """Add a pattern's nodes to ``b`` over the given input tensors; returns its outputs.

    ``names``: the name of what each output replaces; a node making outputs takes theirs
    (joined by "+" when it makes several that had different names), one inside the
    pattern ``root`` + "/" + its kind, so that a plan names what a rewrite made.
    ``moved`` (see :func:`moved_names`): where the pattern only reorders the source's
    operators, each one's name by its kind and attributes; each keeps it."""
    env = dict(inputs)
    binding = bind_dims(pattern, binding, lambda t: b.shape(env[t]))
    made = {t: names[k] for k, t in enumerate(pattern.outputs) if k < len(names) and names[k]}
    for n in pattern.nodes:
        refs = [env[t] for t in n.inputs]
        attrs = from_pattern(n, [b.shape(r) for r in refs], binding)
        mine = list(dict.fromkeys(made[t] for t in n.outputs if t in made))
        name = (moved or {}).get((n.kind, n.attrs)) or \
            ("+".join(mine) if mine else (f"{root}/{n.kind}" if root else ""))
        outs = b.add(attrs, refs, name)
        if len(outs) != len(n.outputs):
            raise ShapeError(f"{n.kind} makes {len(outs)} outputs, the pattern names {len(n.outputs)}")
        env.update(zip(n.outputs, outs, strict=True))
    return [env[t] for t in pattern.outputs]


def moved_names(src: Pattern, dst: Pattern, names: Sequence[str]) -> dict[tuple, str]:
    """Each source node's name (``names``, in pattern order) by its kind and attributes,
    where the target is the source's operators reordered (one of each kind and attributes
    on each side: a transpose moved through an activation); else nothing."""
    def keys(p: Pattern) -> list[tuple]:
        return [(n.kind, n.attrs) for n in p.nodes]
    s, d = keys(src), keys(dst)
    if len(set(s)) != len(s) or sorted(map(repr, s)) != sorted(map(repr, d)) or not all(names):
        return {}   # (an unnamed one would take an output's name, which another may keep)
    return dict(zip(s, names, strict=True))


def build_side(pattern: Pattern, input_shapes: Mapping[str, ParallelTensorShape],
               binding: Mapping[str, int]) -> PCG:
    """A standalone PCG of one side of a rule over Input nodes of the given shapes."""

    b = GraphBuilder()
    refs = {}
    for name, shape in input_shapes.items():
        refs[name] = b.add(InputAttrs(shape.logical), (), name, outputs=[shape])[0]
    outs = instantiate(pattern, b, refs, binding)
    return b.build(outs)
