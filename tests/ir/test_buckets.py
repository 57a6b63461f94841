"""The gradient sync's buckets (``ir/buckets.py``): which weights one all-reduce sums, in
which order, and when it may start."""
from __future__ import annotations

import random

import pytest

from unity_cli.ir.buckets import AFTER_BACKWARD, WeightSync, ready_index, sync_buckets
from unity_cli.ir.ops.elementwise import UnaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
from unity_cli.ir.pcg import GraphBuilder
from unity_cli.ir.shapes import TensorShape


def chain(layers: int):
    """x @ w0 -> Relu -> @ w1 -> ... : weight k is read by the k-th MatMul."""
    b = GraphBuilder()
    h = b.add1(InputAttrs(TensorShape((4, 8))), (), "x")
    ws = []
    for k in range(layers):
        w = b.add1(WeightAttrs(TensorShape((8, 8))), (), f"w{k}")
        ws.append(w)
        h = b.add1(UnaryAttrs("Relu"), (b.add1(MatMulAttrs(), (h, w), f"mm{k}"),))
    return b.build([h]), ws


def syncs(ws, group=(0, 1), nbytes=256, dtype="float32"):
    return [WeightSync(w.node, dtype, (w.node,), ((group, nbytes),)) for w in ws]


def test_flat_is_one_all_reduce_per_group_after_backward():
    g, ws = chain(4)
    (b,) = sync_buckets(g, syncs(ws), 0)
    assert b.ready == AFTER_BACKWARD and b.weights == tuple(w.node for w in ws) and b.nbytes == 4 * 256


def test_buckets_start_with_the_last_layer_and_hold_at_least_the_size():
    g, ws = chain(5)
    buckets = sync_buckets(g, syncs(ws), 512)
    assert [b.weights for b in buckets] == [(ws[4].node, ws[3].node), (ws[2].node, ws[1].node), (ws[0].node,)]
    assert all(b.nbytes >= 512 for b in buckets[:-1])
    # a bucket may start once backward has passed the first MatMul that reads one of its weights
    readers = {w.node: next(u for u, _ in g.consumers[w.node]) for w in ws}
    assert [b.ready for b in buckets] == [readers[ws[3].node], readers[ws[1].node], readers[ws[0].node]]
    assert [b.ready for b in buckets] == sorted((b.ready for b in buckets), reverse=True)


def test_every_weight_once_per_group_and_dtype():
    rng = random.Random(0)
    g, ws = chain(8)
    weights = []
    for w in ws:
        groups = rng.sample([(0, 1), (2, 3), (0, 2), (1,)], rng.randint(1, 3))
        weights.append(WeightSync(w.node, rng.choice(["float32", "float16"]), (w.node,),
                                  tuple((gr, rng.choice([4, 100, 1000])) for gr in groups)))
    for size in (0, 1, 300, 10**6):
        buckets = sync_buckets(g, weights, size)
        seen = sorted((b.group, b.dtype, w) for b in buckets for w in b.weights)
        want = sorted((gr, ws_.dtype, ws_.weight) for ws_ in weights for gr, _ in ws_.groups if len(gr) > 1)
        assert seen == want, size
        assert all(len(b.group) > 1 for b in buckets)
        # one order per group, in the order they start: never a later bucket ready sooner
        assert [b.ready for b in buckets] == sorted((b.ready for b in buckets), reverse=True)


def test_ready_index_of_an_unread_weight_is_the_end():
    g, ws = chain(2)
    b = GraphBuilder()
    b.add1(WeightAttrs(TensorShape((2,))), (), "unread")
    x = b.add1(InputAttrs(TensorShape((2,))), (), "x")
    lone = b.build([b.add1(UnaryAttrs("Relu"), (x,))])
    assert ready_index(lone, (0,)) == len(lone)
    assert ready_index(g, (ws[1].node,)) == next(u for u, _ in g.consumers[ws[1].node])


def test_negative_size_refused():
    g, ws = chain(1)
    with pytest.raises(ValueError, match="bucket_bytes"):
        sync_buckets(g, syncs(ws), -1)


def test_a_stage_per_weight_buckets_each_stage_apart():
    """Weights of one group kept under different ZeRO stages never share a buffer: the
    stage-0 and stage-1 ones each in one flat buffer after backward, every stage-2 and -3
    one its own bucket as soon as its gradient is whole; one stage for all is the int."""
    g, ws = chain(6)
    nodes = [w.node for w in ws]
    for z in range(4):
        assert sync_buckets(g, syncs(ws), 0, {n: z for n in nodes}) == sync_buckets(g, syncs(ws), 0, z)
    stages = {nodes[0]: 0, nodes[1]: 2, nodes[2]: 1, nodes[3]: 3, nodes[4]: 0}     # the last: unnamed, 0
    buckets = sync_buckets(g, syncs(ws), 0, stages)
    by_stage = {}
    for b in buckets:
        by_stage.setdefault(b.zero, []).append(b.weights)
    assert by_stage[0] == [(nodes[0], nodes[4], nodes[5])] and by_stage[1] == [(nodes[2],)]
    assert sorted(by_stage[2] + by_stage[3]) == [(nodes[1],), (nodes[3],)]
    assert [b.ready for b in buckets if b.zero >= 2] == [ready_index(g, (nodes[3],)), ready_index(g, (nodes[1],))]
    assert all(b.ready == AFTER_BACKWARD for b in buckets if b.zero < 2)
