"""The parallel computation graph (PCG): an immutable DAG of operator nodes.

Nodes are stored in topological order and a node's id is its index, so a graph is a
plain tuple that compares, hashes and serializes cheaply. Rewrites never mutate a PCG:
they build a new one with :class:`GraphBuilder`.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ..errors import ShapeError
from .opspec import OpSpec, attrs_key, spec_of
from .shapes import ParallelTensorShape


@dataclass(frozen=True, slots=True, order=True)
class TensorRef:
    """Output ``index`` of node ``node``."""

    node: int
    index: int = 0


@dataclass(frozen=True, slots=True)
class Node:
    """One operator: its attributes, the tensors it reads and the shapes it produces."""

    op: Any
    inputs: tuple[TensorRef, ...]
    outputs: tuple[ParallelTensorShape, ...]
    name: str = ""

    @property
    def spec(self) -> OpSpec:
        return spec_of(self.op)

    @property
    def kind(self) -> str:
        return spec_of(self.op).kind


@dataclass(frozen=True)
class PCG:
    """An immutable parallel computation graph.

    ``nodes`` are in topological order (inputs of node ``i`` are nodes ``< i``);
    ``outputs`` are the model's outputs.
    """

    nodes: tuple[Node, ...]
    outputs: tuple[TensorRef, ...]

    def __post_init__(self) -> None:
        for i, n in enumerate(self.nodes):
            for r in n.inputs:
                if not (0 <= r.node < i) or r.index >= len(self.nodes[r.node].outputs):
                    raise ShapeError(f"node {i} ({n.name or n.kind}) reads {r}, which is not an earlier output")
        for r in self.outputs:
            if not (0 <= r.node < len(self.nodes)) or r.index >= len(self.nodes[r.node].outputs):
                raise ShapeError(f"graph output {r} does not exist")

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[tuple[int, Node]]:
        return iter(enumerate(self.nodes))

    def shape(self, ref: TensorRef) -> ParallelTensorShape:
        return self.nodes[ref.node].outputs[ref.index]

    @cached_property
    def consumers(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per node, the (consumer node, input position) pairs that read any of its outputs."""
        users: list[list[tuple[int, int]]] = [[] for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            for pos, r in enumerate(n.inputs):
                users[r.node].append((i, pos))
        return tuple(tuple(u) for u in users)

    @cached_property
    def by_kind(self) -> dict[str, tuple[int, ...]]:
        """Node ids of each op kind, in topological order (what the matcher scans)."""
        out: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            out.setdefault(n.kind, []).append(i)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def node_hashes(self) -> tuple[str, ...]:
        """A structural hash per node: its op, shapes and (recursively) its inputs.

        Names of sources (inputs and weights) are part of their hash, names of other
        nodes are not, so equal computations hash equal however they were built.
        """
        return self._node_hashes(unordered=False)

    @cached_property
    def canonical_hash(self) -> str:
        """A hash that is equal for structurally equal graphs (stable across runs)."""
        return self._graph_hash(self.node_hashes)

    @cached_property
    def unordered_hash(self) -> str:
        """Like :attr:`canonical_hash`, but blind to the input order of commutative ops
        (``Add(a, b)`` and ``Add(b, a)`` hash equal): the search's deduplication key."""
        return self._graph_hash(self._node_hashes(unordered=True))

    def _node_hashes(self, unordered: bool) -> tuple[str, ...]:
        hashes: list[str] = []
        for n in self.nodes:
            h = hashlib.sha256()
            h.update(attrs_key(n.op).encode())
            h.update("|".join(map(str, n.outputs)).encode())
            if n.spec.is_source:
                h.update(b"name:" + n.name.encode())
            ins = [f"<{hashes[r.node]}:{r.index}" for r in n.inputs]
            if unordered and n.spec.commutative(n.op):
                ins.sort()
            for x in ins:
                h.update(x.encode())
            hashes.append(h.hexdigest())
        return tuple(hashes)

    def _graph_hash(self, hashes: tuple[str, ...]) -> str:
        h = hashlib.sha256()
        for r in self.outputs:
            h.update(f"out {hashes[r.node]}:{r.index}\n".encode())
        for s in sorted(hashes[i] for i, users in enumerate(self.consumers) if not users):
            h.update(f"sink {s}\n".encode())
        return h.hexdigest()

    def sources(self) -> list[int]:
        return [i for i, n in self if n.spec.is_source]

    def find(self, name: str) -> int:
        for i, n in self:
            if n.name == name:
                return i
        raise KeyError(name)


class GraphBuilder:
    """Builds a PCG node by node, inferring each node's parallel output shapes."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def add(self, op: Any, inputs: Sequence[TensorRef] = (), name: str = "",
            outputs: Sequence[ParallelTensorShape] | None = None) -> tuple[TensorRef, ...]:
        """Add a node; shapes are inferred unless given (sources give theirs)."""
        ins = tuple(inputs)
        if outputs is None:
            shapes = [self.nodes[r.node].outputs[r.index] for r in ins]
            try:
                outputs = spec_of(op).infer_parallel(op, shapes)
            except ShapeError as e:
                where = f" at node {name!r}" if name else ""
                raise ShapeError(f"{e}{where}") from None
        self.nodes.append(Node(op, ins, tuple(outputs), name))
        i = len(self.nodes) - 1
        return tuple(TensorRef(i, k) for k in range(len(outputs)))

    def add1(self, op: Any, inputs: Sequence[TensorRef] = (), name: str = "") -> TensorRef:
        return self.add(op, inputs, name)[0]

    def shape(self, ref: TensorRef) -> ParallelTensorShape:
        return self.nodes[ref.node].outputs[ref.index]

    def build(self, outputs: Iterable[TensorRef]) -> PCG:
        return PCG(tuple(self.nodes), tuple(outputs))
