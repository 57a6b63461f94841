"""The bytes a rank holds during a training step: measured from its arrays, and predicted
from the plan by walking the same step (:class:`~.program.StepOrder`).

What is counted ("the tensors the rank holds"), at the boundary between any two actions
of the step and after the optimizer's update:

* **weights**: the trainable weights' masters, the pieces cut from them, a ZeRO-3 weight
  gathered for the pass that reads it, and its shard;
* **gradients**: the gradients backward has made and not yet used, the gradient buffers
  the sync reads (a flat bucket, a ZeRO shard) and those micro-batches add into;
* **optimizer**: the optimizer's state and its scratch buffer;
* **activations**: the values forward made that something still reads, and what each
  kernel keeps for backward (:meth:`~unity_cli.ir.opspec.OpSpec.saved`): inputs, outputs,
  and arrays of its own;
* **inputs and constants**: the micro-batch's inputs and target, and the graph's
  constants, whole, as every rank holds them.

A tensor is counted once, at its own size, however many hold it (a value that a kernel
also keeps, a weight piece that is its master). Arrays that a kernel makes and drops
within one action (its temporaries), and the buffers of a transfer in flight, are not
counted: the account is of what lives across actions. ``tests/runtime/test_ledger.py``
holds the prediction equal to the measurement, byte for byte, and the measurement within
15 % of the process's peak resident memory.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from .program import LOCAL, TensorRef

LEDGER_PARTS = ("weights", "gradients", "optimizer", "activations", "inputs and constants")


def root(a: Any) -> Any:
    """The array that owns ``a``'s memory (``a`` itself, or what it is a view of)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes"):
        a = a.base
    return a


def arrays_in(obj: Any) -> Iterator[Any]:
    """Every array in a kernel's context (nested tuples, lists and dataclasses)."""
    if hasattr(obj, "nbytes") and hasattr(obj, "shape"):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from arrays_in(x)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from arrays_in(getattr(obj, f.name))


def classify(saved: Any, inputs: Sequence[Any], outputs: Sequence[Any]) -> tuple[set[int], set[int], dict[int, int]]:
    """What a kernel's context keeps: the inputs and outputs (by index) whose memory it
    holds on to, and the other arrays it holds (by owner: id -> bytes). An array that is
    (a view of) an input counts as that input, else as the output it is a view of."""
    ins = {id(root(a)): k for k, a in enumerate(inputs) if a is not None}
    outs = {id(root(a)): k for k, a in enumerate(outputs)}
    kept_in: set[int] = set()
    kept_out: set[int] = set()
    extra: dict[int, int] = {}
    for a in arrays_in(saved):
        r = root(a)
        if id(r) in ins:
            kept_in.update(k for k, x in enumerate(inputs) if x is not None and root(x) is r)
        elif id(r) in outs:
            kept_out.add(outs[id(r)])
        else:
            extra[id(r)] = r.nbytes
    return kept_in, kept_out, extra


Held = dict[tuple, tuple[int, str]]
"""What is held at one moment: per tensor (a key naming it once), its bytes and part."""


class Peak:
    """The most bytes held at any of the moments :meth:`see` is shown, and their parts then:
    what the measurement (:class:`Ledger`) and the prediction (``footprint.py``) both keep."""

    def __init__(self) -> None:
        self.peak = -1
        self.parts: dict[str, int] = dict.fromkeys(LEDGER_PARTS, 0)

    def see(self, held: Held) -> None:
        total = sum(nbytes for nbytes, _ in held.values())
        if total > self.peak:
            self.peak = total
            self.parts = dict.fromkeys(LEDGER_PARTS, 0)
            for nbytes, part in held.values():
                self.parts[part] += nbytes


class Ledger(Peak):
    """Measures what one rank's executor and weights hold (the module docstring): each
    :meth:`sample` adds up the arrays alive then; ``peak`` and ``parts`` are of the largest."""

    def __init__(self, ex: Any):
        super().__init__()
        self.ex = ex
        p = ex.p
        self._weights = {i for i, s in enumerate(p.layout) if s is not None and _trainable(p.pcg.nodes[s])}
        self._inputs = [n.name for _, n in p.pcg if n.kind == "Input"]
        self._constants = [n.name for _, n in p.pcg if n.kind == "Weight" and not _trainable(n)]
        self._param_roots = {id(root(a)) for a, _ in ex.params.held()}

    def refresh(self) -> None:
        """Read again which arrays the weights' store holds (a gather in flight when the
        last sample was taken may be a value now)."""
        self._param_roots = {id(root(a)) for a, _ in self.ex.params.held()}

    def value_entry(self, ref: Any, a: Any) -> tuple[tuple, int, str]:
        """The key, bytes and part of a value the executor holds: a weight piece that is its
        master (or a slice of it) is that array; any other value is its own tensor (a
        kernel's view of a weight, a transpose, too: a tensor, at its size)."""
        weight = ref.node in self._weights
        r = root(a)
        if weight and id(r) in self._param_roots:
            return ("root", id(r)), r.nbytes, "weights"
        return ("ref", ref), a.nbytes, "weights" if weight else "activations"

    def ctx_keys(self, m: Any, ins: Sequence[Any], outs: Sequence[Any], saved: Any) -> list[tuple[tuple, int, str]]:
        """What a kernel's context (of the executor's step ``m``) keeps, as ledger entries."""
        kept_in, kept_out, extra = classify(saved, ins, outs)
        sources = self._source_roots()
        self.refresh()
        out = []
        for ri in sorted(kept_in):
            rd, r = m.task.reads[ri], root(ins[ri])
            if ri in m.remote or ri in m.covered:            # a buffer it received
                out.append((("root", id(r)), r.nbytes, "activations"))
            elif rd.src == LOCAL:                               # a piece of an input or constant
                if id(r) not in sources:
                    out.append((("root", id(r)), r.nbytes, "inputs and constants"))
            else:
                out.append(self.value_entry(rd.ref, self.ex.values[rd.ref]))
        out += [self.value_entry(TensorRef(m.step.node, j), outs[j]) for j in sorted(kept_out)]
        out += [(("root", k), nbytes, "activations") for k, nbytes in extra.items()]
        return out

    def _wholes(self) -> list[Any]:
        """The micro-batch's inputs and the graph's constants, whole, as the executor holds them."""
        ex = self.ex
        return [a for a in [ex._inputs.get(n) for n in self._inputs] + [ex.constants.get(n) for n in self._constants]
                if a is not None]

    def _source_roots(self) -> set[int]:
        return {id(root(a)) for a in self._wholes()}

    def sample(self) -> None:
        ex = self.ex
        held: Held = {}
        for a, part in ex.params.held():
            r = root(a)
            held.setdefault(("root", id(r)), (r.nbytes, part))
        self._param_roots = {k[1] for k in held}
        for ref, a in [*ex._resident.items(), *ex.values.items()]:
            key, nbytes, part = self.value_entry(ref, a)
            held.setdefault(key, (nbytes, part))
        for entries in ex.ctx_keys.values():
            for key, nbytes, part in entries:
                held.setdefault(key, (nbytes, part))
        for ref, g in ex.grads.items():
            if id(root(g)) not in self._param_roots:     # (a gradient made in the sync's buffer is that buffer)
                held.setdefault(("grad", ref), (g.nbytes, "gradients"))
        whole = self._wholes()
        sources = {id(root(a)) for a in whole}
        for a in [*whole, *([] if ex._target is None else [ex._target])]:
            held.setdefault(("source", id(a)), (a.nbytes, "inputs and constants"))
        for cache in (ex._cut, ex._fed):
            for k, piece in cache.items():
                r = root(piece)
                if isinstance(k, tuple) and id(r) not in sources:
                    held.setdefault(("root", id(r)), (r.nbytes, "inputs and constants"))
        self.see(held)


def _trainable(n: Any) -> bool:
    return n.kind == "Weight" and getattr(n.op, "trainable", False)
