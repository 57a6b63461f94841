"""Operator specifications: the one place where each operator kind is defined.

An :class:`OpSpec` says, for one kind of operator, what its attributes are, which ONNX
ops it imports from, how to infer its logical output shapes, how it may be
parallelized, and what one piece of it costs. Everything else (import, validation,
parallel shape inference, the cost model) is derived from these specifications.

Parallelization is declared, not coded per op. For each input dim a spec gives a
:data:`Role`:

* an ``int`` ``j``: the dim is the input's view of output dim ``j``; a shard of it is a
  shard of the output along ``j`` (so their degrees must be equal);
* ``SUM``: the dim is contracted; sharding it leaves each piece with a partial sum, so
  the output gets ``sum_degree`` equal to its degree;
* ``WHOLE``: the op needs the dim whole (degree 1).

and, by ``terms``, how partial sums flow: the output is a sum of terms, each term a
product that is linear in each of its inputs separately (``Add`` is ``((0,), (1,))``,
``Mul`` and ``MatMul`` are ``((0, 1),)``, ``Relu`` is ``()``: not linear at all).
:func:`infer_parallel` turns these into the parallel shape rules of the design.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any, ClassVar, Final

from ..errors import ShapeError
from .dtypes import DType
from .kernel import Kernel
from .shapes import ParallelDim, ParallelTensorShape, TensorShape
from .terms import Axiom, Symbol


class OpKind(StrEnum):
    """Every operator kind, as its spec registers it and rule files and plans spell it (a
    ``str``, so a kind read from a file is one). A new operator adds its member here and its
    spec in ``ir/ops/``; :func:`register` refuses a spec whose kind is not a member."""

    Attention = "Attention"
    BatchNormalization = "BatchNormalization"
    Binary = "Binary"
    Cast = "Cast"
    Combine = "Combine"
    Concat = "Concat"
    Conv = "Conv"
    CumSum = "CumSum"
    Einsum = "Einsum"
    Expand = "Expand"
    Gather = "Gather"
    GatherElements = "GatherElements"
    GatherND = "GatherND"
    GroupedGather = "GroupedGather"
    Gemm = "Gemm"
    GlobalPool = "GlobalPool"
    Hardmax = "Hardmax"
    Input = "Input"
    LRN = "LRN"
    LayerNormalization = "LayerNormalization"
    MatMul = "MatMul"
    OneHot = "OneHot"
    Pad = "Pad"
    Pool = "Pool"
    Reduce = "Reduce"
    Reduction = "Reduction"
    Repartition = "Repartition"
    Replicate = "Replicate"
    Reshape = "Reshape"
    Scale = "Scale"
    ScatterElements = "ScatterElements"
    Slice = "Slice"
    Softmax = "Softmax"
    Split = "Split"
    Tile = "Tile"
    TopK = "TopK"
    Transpose = "Transpose"
    Trilu = "Trilu"
    Unary = "Unary"
    Weight = "Weight"
    Where = "Where"


class DimRole(StrEnum):
    """What an input dim is to the op when it is no output dim's view (module docstring)."""

    SUM = "sum"
    WHOLE = "whole"


SUM: Final = DimRole.SUM
WHOLE: Final = DimRole.WHOLE
Role = int | DimRole
"""What one input dim is to the op: an output dim index, ``SUM`` or ``WHOLE``."""


@dataclass(frozen=True, slots=True)
class Opaque:
    """What the z3 verifier sees of an operator or function it does not model: an
    uninterpreted function (a rule can only move it around whole), and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class OpCost:
    """Work of one piece of an operator, forward and backward."""

    fwd_flops: float
    fwd_bytes: float
    bwd_flops: float
    bwd_bytes: float
    kernels: int = 1
    bwd_kernels: int | None = None    # kernel calls backward makes (None: two per forward one)
    then: tuple[OpCost, ...] = ()     # passes the same call makes after this work (:meth:`followed_by`)
    strided: bool = False             # its bytes are read out of order (a transposing copy): no cache serves them

    def __post_init__(self) -> None:
        if self.bwd_kernels == 2 * self.kernels:   # one spelling of each cost, so costs compare equal
            object.__setattr__(self, "bwd_kernels", None)

    @property
    def bwd_launches(self) -> int:
        return 2 * self.kernels if self.bwd_kernels is None else self.bwd_kernels

    def __add__(self, other: OpCost) -> OpCost:
        both = None if self.bwd_kernels is None and other.bwd_kernels is None else \
            self.bwd_launches + other.bwd_launches
        return OpCost(self.fwd_flops + other.fwd_flops, self.fwd_bytes + other.fwd_bytes,
                      self.bwd_flops + other.bwd_flops, self.bwd_bytes + other.bwd_bytes,
                      self.kernels + other.kernels, both, self.then + other.then, self.strided or other.strided)

    def followed_by(self, stage: OpCost) -> OpCost:
        """This work, then ``stage``'s in the same call: a pass of its own over memory (a
        Gemm's bias and activation after its product), priced on its own roofline and added,
        not hidden under the product's (the kernels run one after the other; ``stage``'s
        launches are not counted)."""
        return dataclasses.replace(self, then=self.then + (dataclasses.replace(stage, then=()),) + stage.then)


ZERO_COST = OpCost(0.0, 0.0, 0.0, 0.0, 0)


@dataclass(frozen=True, slots=True)
class Imported:
    """What a spec makes of one ONNX node: its attributes and which ONNX inputs stay tensors."""

    attrs: Any
    tensor_inputs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Saved:
    """What a kernel keeps for backward (:meth:`OpSpec.saved`)."""

    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    extra: tuple[TensorShape, ...] = ()

    def extra_bytes(self, float_itemsize: int | None = None) -> int:
        """The bytes of ``extra``; with ``float_itemsize``, floats counted at that size
        (the planner's activation dtype)."""
        return sum(t.numel * (float_itemsize if float_itemsize and t.dtype.is_float else t.dtype.itemsize)
                   for t in self.extra)


class OpSpec:
    """Base class of operator specifications; subclasses override what differs.

    Subclasses set ``kind`` (the PCG op name), ``attrs_type`` (a frozen dataclass) and
    ``onnx_ops`` (the ONNX op types imported through this spec).
    """

    kind: ClassVar[OpKind]
    attrs_type: ClassVar[type]
    onnx_ops: ClassVar[tuple[str, ...]] = ()
    is_parallel_op: ClassVar[bool] = False
    is_source: ClassVar[bool] = False
    state_inputs: ClassVar[tuple[int, ...]] = ()
    """Inputs that are running statistics, never trained (BatchNormalization's mean and var)."""
    verifier: ClassVar[str | Opaque] = "encoded"
    """How the z3 verifier sees the op: ``encoded`` (:meth:`encode` writes it in the
    signature's symbols), or :class:`Opaque` with the reason."""
    kernel: ClassVar[Kernel | None] = None
    """Forward and backward against ``xp`` (``ir/kernel.py``); None where the executor moves
    the tensors itself (parallel ops, sources)."""
    symbols: ClassVar[tuple[Symbol, ...]] = ()
    """The function symbols this op brings into the verifier's signature (``ir/terms.py``)."""
    axioms: ClassVar[tuple[Axiom, ...]] = ()
    """The verifier's laws whose left side this op's symbol roots (``ir/terms.py``)."""
    weight_inputs: ClassVar[tuple[int, ...]] = ()
    """Inputs that are the op's parameters when they are constants (a Conv's kernel and bias):
    a tensor computed at import from constants (``ConstantOfShape``, ``Expand``, ``Cast``)
    and read here is a trainable weight; read anywhere else it is a constant."""

    def encode(self, s: Any, attrs: Any, x: Sequence[Any], ins: Sequence[ParallelTensorShape],
               outs: Sequence[ParallelTensorShape]) -> list[Any] | None:
        """The verifier's terms of the outputs, from the inputs' terms ``x``, in the symbols
        of the signature ``s`` (``ir/terms.py``); None where this instance has none (the
        verifier then sees an uninterpreted function)."""
        return None

    def from_onnx(self, node: Any) -> Imported:
        """Attributes from an ONNX node (see ``onnx_import.convert.OnnxNode``)."""
        raise NotImplementedError(f"{self.kind} cannot be imported from ONNX")

    def infer(self, attrs: Any, inputs: Sequence[TensorShape]) -> tuple[TensorShape, ...]:
        raise NotImplementedError

    def roles(self, attrs: Any, inputs: Sequence[TensorShape]) -> tuple[tuple[Role, ...], ...]:
        """Per input, per dim: the dim's :data:`Role`. Default: nothing may be split."""
        return tuple((WHOLE,) * s.rank for s in inputs)

    def terms(self, attrs: Any, n_inputs: int) -> tuple[tuple[int, ...], ...]:
        """How partial sums pass through (see the module docstring). Default: not linear."""
        return ()

    def cost(self, attrs: Any, inputs: Sequence[TensorShape], outputs: Sequence[TensorShape]) -> OpCost:
        """Work for one piece, given the piece shapes. Default: one pass over memory."""
        moved = sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs)
        flops = float(sum(s.numel for s in outputs))
        return OpCost(flops, moved, 2 * flops, 2 * moved)

    def saved(self, attrs: Any, inputs: Sequence[TensorShape], outputs: Sequence[TensorShape]) -> Saved:
        """What the kernel's forward keeps in its context for backward, given the piece
        shapes: which inputs and outputs (by index), and the shape of each array it makes
        for it besides (a fused activation's input, a norm's normalized input, an index's
        mask). The runtime's memory ledger and the memory account read this; a test holds
        every kernel to it. Default: every input and output, nothing else."""
        return Saved(tuple(range(len(inputs))), tuple(range(len(outputs))))

    def no_grad_inputs(self, attrs: Any) -> tuple[int, ...]:
        """The inputs the kernel's backward gives no gradient (taken as constants): a rewrite
        may not make this operator where such an input needs one (``substitutions/match.py``).
        Default none."""
        return ()

    selective_backward: ClassVar[bool] = False
    """Whether the kernel's backward makes only the input gradients it is asked for (a
    product skips ``dX`` of a graph input: a whole GEMM); the cost then prices only those
    (:meth:`cost_of_grads`), and a profile keys the piece by which it makes."""

    def cost_of_grads(self, attrs: Any, inputs: Sequence[TensorShape], outputs: Sequence[TensorShape],
                      wanted: Sequence[bool]) -> OpCost:
        """Work for one piece whose backward makes the gradients of the inputs ``wanted``
        marks. Default: all of them, as a kernel that is not selective does anyway."""
        return self.cost(attrs, inputs, outputs)

    def infer_parallel(self, attrs: Any, inputs: Sequence[ParallelTensorShape]) -> tuple[ParallelTensorShape, ...]:
        return infer_parallel(self, attrs, inputs)

    def piece_attrs(self, attrs: Any, output: ParallelTensorShape) -> Any:
        """The attributes that run the op on one piece, given its (first) output's parallel
        shape (``ir/pieces.piece_op``). Default: the op's own, for ops whose attributes do
        not name sizes that a split changes."""
        return attrs

    def commutative(self, attrs: Any) -> bool:
        """Whether the op's value is the same for any order of its inputs."""
        return False


def backward_mask(spec: OpSpec, inputs: Sequence[TensorShape], wanted: Sequence[bool]) -> tuple[bool, ...] | None:
    """What one piece's backward makes, as the cost model and a profile see it, from which
    inputs want a gradient: None for all of them (every float input wanted, or a kernel
    that makes them all anyway), else per input whether its gradient is made. With none
    wanted it is all False whatever the kernel: the runtime does not call backward."""
    made = tuple(bool(w) and s.dtype.is_float for w, s in zip(wanted, inputs, strict=True))
    if not any(made):
        return made
    if not spec.selective_backward or all(m for m, s in zip(made, inputs) if s.dtype.is_float):
        return None
    return made


_REGISTRY: dict[OpKind, OpSpec] = {}
_BY_ATTRS: dict[type, OpSpec] = {}
_BY_ONNX: dict[str, OpSpec] = {}


def register(spec_cls: type[OpSpec]) -> type[OpSpec]:
    """Class decorator: add a spec to the registry; duplicates are an error."""
    spec = spec_cls()
    if not isinstance(spec.kind, OpKind):
        raise RuntimeError(f"operator {spec.kind}: its kind must be an OpKind member")
    if spec.kind in _REGISTRY:
        raise RuntimeError(f"operator {spec.kind} is specified twice")
    if spec.attrs_type in _BY_ATTRS:
        raise RuntimeError(f"attrs type {spec.attrs_type.__name__} is used by two specs")
    for op in spec.onnx_ops:
        if op in _BY_ONNX:
            raise RuntimeError(f"ONNX op {op} is imported by {_BY_ONNX[op].kind} and {spec.kind}")
    _REGISTRY[spec.kind] = spec
    _BY_ATTRS[spec.attrs_type] = spec
    for op in spec.onnx_ops:
        _BY_ONNX[op] = spec
    return spec_cls


def spec_of(attrs: Any) -> OpSpec:
    return _BY_ATTRS[type(attrs)]


def spec_by_kind(kind: str) -> OpSpec:
    return _REGISTRY[kind]


def spec_for_onnx(op_type: str) -> OpSpec | None:
    return _BY_ONNX.get(op_type)


def all_specs() -> Mapping[str, OpSpec]:
    return dict(sorted(_REGISTRY.items()))


def encode_terms(s: Any, attrs: Any, x: Sequence[Any], ins: Sequence[ParallelTensorShape],
                 outs: Sequence[ParallelTensorShape]) -> list[Any]:
    """The verifier's terms of an op's outputs from its inputs' terms ``x``: as its spec writes
    them (:meth:`OpSpec.encode`), or, where it has none, an uninterpreted function of its
    attributes (``s.opaque``: equal only to itself applied to equal terms)."""
    out = spec_of(attrs).encode(s, attrs, x, ins, outs)
    if out is not None:
        return out
    key = attrs_key(attrs)
    return [s.opaque(f"{key}|{len(x)}|{k}", len(x))(*x) for k in range(len(outs))]


OMIT_DEFAULT = "omit_default"
"""Field metadata: the field is left out of an op's JSON while it holds its default (a
field added later, so that graphs and plans without it keep their bytes and hashes)."""


def attrs_to_json(attrs: Any) -> dict[str, Any]:
    """Canonical JSON-able form of an attrs dataclass (kind + fields)."""
    out: dict[str, Any] = {"kind": spec_of(attrs).kind}
    for f in dataclasses.fields(attrs):
        v = getattr(attrs, f.name)
        if f.metadata.get(OMIT_DEFAULT) and v == f.default:
            continue
        out[f.name] = _plain(v)
    return out


def attrs_from_json(data: Mapping[str, Any]) -> Any:
    """Inverse of :func:`attrs_to_json` (raises KeyError/TypeError/ValueError on bad data)."""
    spec = spec_by_kind(data["kind"])
    hints = typing.get_type_hints(spec.attrs_type)
    # A field added later (with a default) may be absent from an older plan: it takes its default.
    kwargs = {f.name: _typed(data[f.name], hints[f.name]) for f in dataclasses.fields(spec.attrs_type)
              if f.name in data or f.default is dataclasses.MISSING}
    return spec.attrs_type(**kwargs)


@functools.lru_cache(maxsize=1 << 16)
def attrs_key(attrs: Any) -> str:
    """The canonical JSON text of attrs (cached: the search hashes every node of every candidate)."""
    return json.dumps(attrs_to_json(attrs), sort_keys=True, separators=(",", ":"))


def _plain(v: Any) -> Any:
    if isinstance(v, Enum):
        return v.value
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _typed(v: Any, hint: Any) -> Any:
    """Rebuild a field value from JSON following its type hint."""
    if hint is TensorShape:
        return TensorShape(tuple(int(d) for d in v["dims"]), DType(v["dtype"]))
    if hint is DType:
        return DType(v)
    if hint is float:
        return math.inf if v == "inf" else -math.inf if v == "-inf" else float(v)
    if hint is bool:
        if not isinstance(v, bool):
            raise TypeError(f"expected a boolean, got {v!r}")
        return v
    if hint is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"expected an integer, got {v!r}")
        return v
    if hint is str:
        if not isinstance(v, str):
            raise TypeError(f"expected a string, got {v!r}")
        return v
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if not isinstance(v, list):
            raise TypeError(f"expected a list, got {v!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(x, args[0]) for x in v)
        if len(args) != len(v):
            raise TypeError(f"expected {len(args)} items, got {len(v)}")
        return tuple(_typed(x, a) for x, a in zip(v, args, strict=True))
    return v


# ---------------------------------------------------------------------------
# Parallel shape inference, derived from roles and terms.


def infer_parallel(spec: OpSpec, attrs: Any, inputs: Sequence[ParallelTensorShape]) -> tuple[ParallelTensorShape, ...]:
    """Output parallel shapes of an op from its inputs' (raises ShapeError if illegal)."""
    logical_in = [p.logical for p in inputs]
    outs = spec.infer(attrs, logical_in)
    roles = spec.roles(attrs, logical_in)
    out_rank = outs[0].rank
    out_deg = [0] * out_rank
    contracted = 0
    for i, (p, rs) in enumerate(zip(inputs, roles, strict=True)):
        for d, (pd, role) in enumerate(zip(p.dims, rs, strict=True)):
            if role == WHOLE:
                if pd.degree != 1:
                    raise ShapeError(f"{spec.kind} needs input {i} dim {d} whole, but it is split {pd.degree} ways")
            elif role == SUM:
                if contracted and pd.degree != contracted:
                    raise ShapeError(f"{spec.kind}: contracted dims are split {contracted} and {pd.degree} ways")
                contracted = pd.degree
            else:
                if out_deg[role] and pd.degree != out_deg[role]:
                    raise ShapeError(f"{spec.kind}: input {i} dim {d} is split {pd.degree} ways, "
                                     f"but output dim {role} is split {out_deg[role]} ways by another input")
                out_deg[role] = pd.degree
    contracted = contracted or 1
    out_deg = [d or 1 for d in out_deg]
    out_sum = _output_sum(spec, attrs, inputs, roles, contracted)
    pieces = inputs[0].pieces if inputs else 1
    for i, p in enumerate(inputs):
        if p.pieces != pieces:
            raise ShapeError(f"{spec.kind}: input 0 has {pieces} pieces but input {i} has {p.pieces}")
    per_copy = math.prod(out_deg) * out_sum
    if pieces % per_copy:
        raise ShapeError(f"{spec.kind}: {pieces} pieces cannot hold an output split {per_copy} ways")
    copy = pieces // per_copy
    result = []
    for o in outs:
        dims = tuple(ParallelDim(s, g) for s, g in zip(o.dims, out_deg, strict=True))
        shape = ParallelTensorShape(dims, o.dtype, out_sum, copy)
        bad = shape.problems()
        if bad:
            raise ShapeError(f"{spec.kind}: output {bad[0]}")
        result.append(shape)
    return tuple(result)


def _output_sum(spec: OpSpec, attrs: Any, inputs: Sequence[ParallelTensorShape],
                roles: Sequence[Sequence[Role]], contracted: int) -> int:
    terms = spec.terms(attrs, len(inputs))
    in_term = {i for t in terms for i in t}
    for i, p in enumerate(inputs):
        if i not in in_term and p.sum_degree != 1:
            raise ShapeError(f"{spec.kind} is not linear in input {i}, which holds partial sums")
    has_sum_dim = [SUM in rs for rs in roles]
    term_sums = []
    for t in terms:
        partial = [i for i in t if inputs[i].sum_degree > 1]
        if len(partial) > 1:
            raise ShapeError(f"{spec.kind}: inputs {partial} both hold partial sums of one product")
        s = inputs[partial[0]].sum_degree if partial else 1
        if any(has_sum_dim[i] for i in t):
            s *= contracted
        term_sums.append(s)
    if contracted > 1 and not terms:
        raise ShapeError(f"{spec.kind} cannot split a contracted dim")
    if len(set(term_sums)) > 1:
        raise ShapeError(f"{spec.kind}: its terms hold different partial sums {term_sums}")
    return term_sums[0] if term_sums else 1


def input_layout(spec: OpSpec, attrs: Any, inputs: Sequence[TensorShape], out_degrees: Sequence[int],
                 contracted: int, pieces: int) -> list[ParallelTensorShape] | None:
    """The input parallel shapes that run the op with the given output split, or None.

    ``out_degrees`` are the degrees of output 0's dims, ``contracted`` the degree of the
    contracted dims (the output then holds that many partial sums) and ``pieces`` the
    number of tasks; the rest of each input is replicated.
    """
    roles = spec.roles(attrs, inputs)
    terms = spec.terms(attrs, len(inputs))
    result = []
    for shape, rs in zip(inputs, roles, strict=True):
        degs = []
        for size, role in zip(shape.dims, rs, strict=True):
            if role == WHOLE:
                g = 1
            elif role == SUM:
                g = contracted
            else:
                g = out_degrees[role]
            if size % g:
                return None
            degs.append(g)
        covered = math.prod(degs)
        if pieces % covered:
            return None
        result.append(ParallelTensorShape.of(shape.dims, tuple(degs), shape.dtype, 1, pieces // covered))
    if contracted > 1:
        # Terms without the contracted dim must bring matching partial sums: not expressible here.
        for t in terms:
            if not any(SUM in roles[i] for i in t):
                return None
    try:
        outs = spec.infer_parallel(attrs, result)    # with the op's own checks (a Conv's whole groups)
    except ShapeError:
        return None
    if outs and tuple(d.degree for d in outs[0].dims) != tuple(out_degrees):
        return None
    return result
