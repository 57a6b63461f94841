"""``simplify`` folds a Concat of weights into one weight that records its parts, and only
where that is the same graph: each part read by the Concat alone, whole, of one kind."""
from __future__ import annotations

from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import RepartitionAttrs
from unity_cli.ir.ops.shape_ops import ConcatAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.opspec import OpKind, attrs_from_json, attrs_to_json
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.shapes import TensorShape
from unity_cli.ir.simplify import simplify


def graph(share: bool = False, constant: bool = False, split: bool = False, nested: int | None = None):
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 16 if nested == 0 else 8))), (), "x")
    w1 = b.add1(WeightAttrs(TensorShape((8, 3))), (), "w1")
    w2 = b.add1(WeightAttrs(TensorShape((8, 5)), not constant), (), "w2")
    if split:    # pieces of the weights, not the weights
        w1, w2 = b.add1(RepartitionAttrs(0, 2), (w1,)), b.add1(RepartitionAttrs(0, 2), (w2,))
        x = b.add1(RepartitionAttrs(1, 2), (x,))
    cat = b.add1(ConcatAttrs(1), (w1, w2))
    if nested is not None:    # along the same axis as the parts, or another
        w3 = b.add1(WeightAttrs(TensorShape((8, 2) if nested == 1 else (8, 8))), (), "w3")
        cat = b.add1(ConcatAttrs(nested), (cat, w3))
    outs = [b.add1(MatMulAttrs(), (x, cat))]
    if share:
        outs.append(b.add1(MatMulAttrs(), (x, w1)))
    return b.build(outs)


def weights(g):
    return {n.name: n.op for _, n in g if n.kind == OpKind.Weight}


def test_a_concat_of_weights_becomes_one_weight_with_its_parts():
    g = simplify(graph())
    assert not any(n.kind == OpKind.Concat for _, n in g)
    (name, op), = weights(g).items()
    assert name == "w1+w2" and op.parts == (("w1", 3), ("w2", 5)) and op.part_axis == 1
    assert op.shape == TensorShape((8, 8)) and op.trainable
    assert attrs_from_json(attrs_to_json(op)) == op        # a plan keeps the parts


def test_folds_along_one_axis_flatten():
    op = weights(simplify(graph(nested=1)))["w1+w2+w3"]
    assert op.parts == (("w1", 3), ("w2", 5), ("w3", 2))


def test_what_is_not_folded():
    for g in (graph(share=True), graph(constant=True), graph(split=True)):
        assert sum(n.kind == OpKind.Concat for _, n in simplify(g)) == 1
    # a fold, then a Concat of it along another axis than its parts'
    g = simplify(graph(nested=0))
    assert sum(n.kind == OpKind.Concat for _, n in g) == 1 and "w1+w2" in weights(g)


def test_one_weight_twice_is_not_folded():
    b = GraphBuilder()
    x = b.add1(InputAttrs(TensorShape((4, 8))), (), "x")
    w = b.add1(WeightAttrs(TensorShape((8, 3))), (), "w")
    g = simplify(b.build([b.add1(MatMulAttrs(), (x, b.add1(ConcatAttrs(1), (w, w))))]))
    assert sum(n.kind == OpKind.Concat for _, n in g) == 1


def test_an_unfolded_weight_keeps_its_json():
    """Graphs without folds keep their bytes (and plans their hashes)."""
    assert attrs_to_json(WeightAttrs(TensorShape((2, 3)))) == {
        "kind": "Weight", "shape": {"dims": [2, 3], "dtype": "float32"}, "trainable": True}
