"""The Attention operator (``ir/ops/attention.py``): its blocked kernels compute what the chain
``MatMul(Softmax(Add(Mul(MatMul(q, Transpose(k)), s), mask)), v)`` computes with the repo's own
kernels, forward and backward, and what onnxruntime computes of that chain; they hold no
[Sq, Sk] tensor; its shapes, parallel roles, cost and kept memory are the operator's."""
from __future__ import annotations

import math
import tracemalloc

import numpy as np
import onnxruntime as ort
import pytest
from ir.graph_grads import run_graph
from onnx import TensorProto, helper, numpy_helper

from unity_cli.errors import ShapeError
from unity_cli.ir import DType, GraphBuilder, ParallelTensorShape, TensorShape
from unity_cli.ir.ops.attention import KEY_BLOCK, SOFTMAX_FLOPS, AttentionAttrs
from unity_cli.ir.ops.elementwise import BinaryAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.norm import SoftmaxAttrs
from unity_cli.ir.ops.shape_ops import TransposeAttrs
from unity_cli.ir.ops.sources import InputAttrs
from unity_cli.ir.opspec import WHOLE, attrs_from_json, attrs_to_json, spec_of
from unity_cli.kernels import backward, forward
from unity_cli.substitutions.pieces import assemble, evaluate_pieces

MASKED = -1e9
S = 2 * KEY_BLOCK + 44          # three key blocks, the last one short


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _causal(sq: int, sk: int) -> np.ndarray:
    return np.triu(np.full((sq, sk), MASKED), 1 + sk - sq)


def _padding(n: int, sk: int, rng: np.random.Generator) -> np.ndarray:
    """[N, 1, 1, Sk]: each sequence's last keys are padding."""
    keep = rng.integers(sk // 2, sk + 1, n)
    return np.where(np.arange(sk) < keep[:, None], 0.0, MASKED)[:, None, None, :]


def _case(name: str, dtype: str, seed: int = 0) -> tuple[list[np.ndarray], AttentionAttrs]:
    """Inputs ``q, k, v[, mask], s`` of one case and the Attention attrs that read them."""
    rng = _rng(seed)
    n, h, d = 2, 3, 16
    heads, kv = ((2, 2), (2, 1)) if name == "grouped-query" else ((h,), (h,))
    sq = 70 if name == "cross" else S
    q = rng.standard_normal((n, *heads, sq, d))
    k, v = (rng.standard_normal((n, *kv, S, d)) for _ in range(2))
    mask = {"causal": _causal(sq, S), "grouped-query": _causal(sq, S), "padding": _padding(n, S, rng),
            "cross": np.where(rng.random((sq, S)) < 0.3, MASKED, 0.0), "no mask": None}[name]
    s = np.array(1 / math.sqrt(d))
    xs = [q, k, v] + ([] if mask is None else [mask]) + [s]
    return [x.astype(dtype) for x in xs], AttentionAttrs(1.0, mask is not None, True)


CASES = ["causal", "padding", "no mask", "grouped-query", "cross"]


def _graph(xs: list[np.ndarray], build) -> tuple:
    """A PCG over Input nodes ``x0..`` (the arrays' shapes) whose output ``build(b, refs)`` makes."""
    b = GraphBuilder()
    refs = [b.add(InputAttrs(TensorShape(x.shape, DType.from_numpy(x.dtype))), (), f"x{i}")[0]
            for i, x in enumerate(xs)]
    return b.build([build(b, refs)])


def _chain(b, refs, masked: bool):
    """The decoder's chain, operator by operator, as the zoo writes it."""
    q, k, v, *rest = refs
    rank = b.shape(k).rank
    kt = b.add(TransposeAttrs((*range(rank - 2), rank - 1, rank - 2)), [k])[0]
    y = b.add(BinaryAttrs("Mul"), [b.add(MatMulAttrs(), [q, kt])[0], rest[-1]])[0]
    if masked:
        y = b.add(BinaryAttrs("Add"), [y, rest[0]])[0]
    y = b.add(SoftmaxAttrs(b.shape(y).rank - 1), [y])[0]
    return b.add(MatMulAttrs(), [y, v])[0]


def _close(dtype: str) -> dict[str, float]:
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-10, "atol": 1e-11}


# -- the kernels against the chain ---------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", CASES)
def test_the_blocked_kernels_compute_the_chain(name, dtype):
    """Forward and every gradient (q, k, v and the scale tensor; k and v summed over the group
    axis they are broadcast along) equal the chain's, run with the repo's kernels."""
    xs, op = _case(name, dtype)
    feed = {f"x{i}": x for i, x in enumerate(xs)}
    chain = _graph(xs, lambda b, refs: _chain(b, refs, op.mask))
    fused = _graph(xs, lambda b, refs: b.add(op, refs)[0])
    assert fused.nodes[-1].outputs[0].logical == chain.nodes[-1].outputs[0].logical
    (want,), want_grads = run_graph(chain, feed)
    (got,), got_grads = run_graph(fused, feed)
    assert got.dtype == want.dtype == np.dtype(dtype) and not np.isnan(got).any()
    np.testing.assert_allclose(got, want, **_close(dtype))
    mask_name = "x3" if op.mask else None
    assert set(got_grads) == set(want_grads) - {mask_name}       # the mask gets no gradient
    for name_, g in got_grads.items():
        assert g.shape == feed[name_].shape and g.dtype == np.dtype(dtype)
        np.testing.assert_allclose(g, want_grads[name_], **_close(dtype), err_msg=name_)


def test_gradients_match_finite_differences():
    """Independently of the chain's kernels: central differences in float64, at entries in
    every key block, of q, k (through the group axis), v and the scale factor."""
    xs, op = _case("grouped-query", "float64", seed=3)
    xs[0], xs[1], xs[2] = xs[0][:1, :, :, :40], xs[1][:1], xs[2][:1]
    xs[3] = xs[3][:40]
    (y,), ctx = forward(op, xs, np)
    r = _rng(4).standard_normal(y.shape)
    grads = backward(op, ctx, [r], np)

    def loss(arrays):
        return float((forward(op, arrays, np)[0][0] * r).sum())

    eps = 1e-6
    for i, idx in ((0, (0, 1, 1, 39, 3)), (1, (0, 1, 0, 5, 7)), (1, (0, 0, 0, KEY_BLOCK + 3, 2)),
                   (2, (0, 1, 0, S - 1, 15)), (4, ())):
        hi, lo = [x.copy() for x in xs], [x.copy() for x in xs]
        hi[i][idx] += eps
        lo[i][idx] -= eps
        numeric = (loss(hi) - loss(lo)) / (2 * eps)
        assert grads[i][idx] == pytest.approx(numeric, rel=1e-6, abs=1e-8), (i, idx)
    assert grads[3] is None


def test_a_row_masked_to_minus_infinity_in_its_first_blocks_is_not_nan():
    """The online softmax meets rows whose first key block is all -inf (a window mask): the
    running max is taken as 0 there, not -inf - -inf."""
    rng = _rng(5)
    q, k, v = rng.standard_normal((1, 20, 8)), rng.standard_normal((1, S, 8)), rng.standard_normal((1, S, 8))
    mask = np.zeros((20, S))
    mask[:10, :KEY_BLOCK + 5] = -np.inf
    feed = {"x0": q, "x1": k, "x2": v, "x3": mask, "x4": np.array(0.5)}
    xs = list(feed.values())
    (want,), want_grads = run_graph(_graph(xs, lambda b, refs: _chain(b, refs, True)), feed)
    (got,), got_grads = run_graph(_graph(xs, lambda b, refs: b.add(AttentionAttrs(1.0, True, True), refs)[0]), feed)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for n in ("x0", "x1", "x2", "x4"):
        np.testing.assert_allclose(got_grads[n], want_grads[n], rtol=1e-9, atol=1e-11)


def test_the_scale_attribute_and_no_factor():
    xs, _ = _case("causal", "float64")
    q, k, v, mask, s = xs
    (a,), _ = forward(AttentionAttrs(float(s), True), [q, k, v, mask], np)
    (b,), _ = forward(AttentionAttrs(2.0, True, True), [q, k, v, mask, s / 2], np)
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_half_precision_is_computed_in_float32():
    xs, op = _case("causal", "float32")
    xs[3] = np.where(xs[3] < 0, -np.inf, 0)       # float16 has no -1e9
    xs = [x.astype("float16") for x in xs]
    (y,), ctx = forward(op, xs, np)
    (want,), _ = forward(op, [x.astype("float32") for x in xs], np)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype("float32"), want, rtol=2e-3, atol=2e-3)
    grads = backward(op, ctx, [np.ones_like(y)], np)
    assert [None if g is None else g.dtype for g in grads] == [np.float16] * 3 + [None, np.float16]


def test_no_score_tensor_of_the_whole_sequence_is_held():
    """Peak memory of forward plus backward, traced, stays under half of one [Sq, Sk] score
    tensor and does not grow with the keys (only dK and dV do, [Sk, d] each)."""
    sq, d, short, long = 512, 16, 1024, 4096
    peaks = {}
    for sk in (short, long):
        rng = _rng(6)
        q, k, v = rng.standard_normal((1, sq, d)), rng.standard_normal((1, sk, d)), rng.standard_normal((1, sk, d))
        mask = np.where(rng.random((sq, sk)) < 0.1, MASKED, 0.0)
        op = AttentionAttrs(0.25, True)
        tracemalloc.start()
        try:
            (y,), ctx = forward(op, [q, k, v, mask], np)
            backward(op, ctx, [np.ones_like(y)], np)
            peaks[sk] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peaks[long] < sq * long * 8 / 2, peaks
    assert peaks[long] - peaks[short] < 4 * (long - short) * d * 8, peaks      # dK, dV and their blocks


# -- onnxruntime ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["causal", "grouped-query", "no mask"])
def test_onnxruntime_agrees_on_the_chain(name):
    """The chain exported as ONNX (Transpose of k, MatMul, Mul by a scalar initializer, Add
    of the mask, Softmax, MatMul), run by onnxruntime, is the Attention's forward."""
    xs, op = _case(name, "float32")
    q, k, v = xs[:3]
    mask = xs[3] if op.mask else None
    scale = xs[-1]
    rank = k.ndim
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[*range(rank - 2), rank - 1, rank - 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"])]
    last = "scaled"
    if mask is not None:
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"])]
    feeds = {"q": q, "k": k, "v": v} | ({} if mask is None else {"mask": mask})
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(scale, "scale")])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                .SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    (got,), _ = forward(op, xs, np)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (by_attr,), _ = forward(AttentionAttrs(float(scale), op.mask), xs[:-1], np)
    np.testing.assert_allclose(by_attr, want, rtol=1e-5, atol=1e-6)


# -- the specification ------------------------------------------------------------------

SPEC = spec_of(AttentionAttrs())


def _t(*dims: int) -> TensorShape:
    return TensorShape(dims)


def test_shapes_broadcast_the_heads_and_refuse_what_does_not_fit():
    gqa = [_t(2, 8, 4, 64, 16), _t(2, 8, 1, 64, 16), _t(2, 8, 1, 64, 32), _t(64, 64), _t()]
    assert SPEC.infer(AttentionAttrs(1.0, True, True), gqa) == (_t(2, 8, 4, 64, 32),)
    assert SPEC.infer(AttentionAttrs(), [_t(5, 16), _t(7, 16), _t(7, 3)]) == (_t(5, 3),)
    bad = {
        "last dim": (AttentionAttrs(), [_t(5, 16), _t(7, 8), _t(7, 3)]),
        "keys": (AttentionAttrs(), [_t(5, 16), _t(7, 16), _t(6, 3)]),
        "broadcast": (AttentionAttrs(mask=True), [_t(5, 16), _t(7, 16), _t(7, 3), _t(5, 6)]),
        "one element": (AttentionAttrs(factor=True), [_t(5, 16), _t(7, 16), _t(7, 3), _t(2)]),
        "takes": (AttentionAttrs(mask=True), [_t(5, 16), _t(7, 16), _t(7, 3)]),
        "float type": (AttentionAttrs(), [_t(5, 16), TensorShape((7, 16), DType.FLOAT64), _t(7, 3)]),
    }
    for what, (attrs, shapes) in bad.items():
        with pytest.raises(ShapeError, match=what):
            SPEC.infer(attrs, shapes)


def test_roles_split_batch_heads_and_queries_never_keys_or_head_dims():
    gqa = [_t(2, 8, 4, 64, 16), _t(2, 8, 1, 64, 16), _t(2, 8, 1, 64, 16), _t(64, 64), _t()]
    q, k, v, mask, s = SPEC.roles(AttentionAttrs(1.0, True, True), gqa)
    assert q == (0, 1, 2, 3, WHOLE)
    assert k == v == (0, 1, WHOLE, WHOLE, WHOLE)          # the group axis is broadcast
    assert mask == (3, WHOLE) and s == ()
    padding = SPEC.roles(AttentionAttrs(mask=True), [_t(2, 4, 64, 16)] * 3 + [_t(2, 1, 1, 64)])[3]
    assert padding == (0, WHOLE, WHOLE, WHOLE)


def _split(dims, degrees, copy=1, sum_degree=1) -> ParallelTensorShape:
    return ParallelTensorShape.of(dims, degrees, DType.FLOAT32, sum_degree, copy)


def test_a_split_of_the_query_axis_passes_through_and_one_of_the_keys_is_refused():
    attrs = AttentionAttrs(mask=True)
    (out,) = SPEC.infer_parallel(attrs, [_split((2, 4, 64, 16), (2, 1, 2, 1)), _split((2, 4, 64, 16), (2, 1, 1, 1), 2),
                                         _split((2, 4, 64, 16), (2, 1, 1, 1), 2), _split((64, 64), (2, 1), 2)])
    assert out.degrees == (2, 1, 2, 1)
    with pytest.raises(ShapeError):
        SPEC.infer_parallel(attrs, [_split((2, 4, 64, 16), (1, 1, 1, 1), 2), _split((2, 4, 64, 16), (1, 1, 2, 1)),
                                    _split((2, 4, 64, 16), (1, 1, 2, 1)), _split((64, 64), (1, 2))])


def test_pieces_split_by_batch_and_queries_with_partial_sums_of_v_assemble_to_the_whole():
    """Run as devices would (``substitutions.pieces``): q split along the batch and the queries,
    the mask along its rows, v held as 2 partial sums; the assembled pieces are the output."""
    rng = _rng(7)
    q, k, v = (rng.integers(-3, 4, (2, 3, 8, 4)).astype(np.float64) for _ in range(3))
    mask, s = _causal(8, 8), np.array(0.5)
    shapes = [_split((2, 3, 8, 4), (2, 1, 2, 1), 2), _split((2, 3, 8, 4), (2, 1, 1, 1), 4),
              _split((2, 3, 8, 4), (2, 1, 1, 1), 2, 2), _split((8, 8), (2, 1), 4), _split((), (), 8)]
    b = GraphBuilder()
    refs = [b.add(InputAttrs(sh.logical), (), n, outputs=[sh])[0] for n, sh in zip("qkvms", shapes)]
    pcg = b.build([b.add(AttentionAttrs(1.0, True, True), refs)[0]])
    out = pcg.nodes[-1].outputs[0]
    assert out.degrees == (2, 1, 2, 1) and out.sum_degree == 2
    feed = dict(zip("qkvms", (q, k, v, mask.astype(np.float64), s)))
    (pieces,) = evaluate_pieces(pcg, feed, check=True, rng=rng)
    (want,), _ = forward(AttentionAttrs(1.0, True, True), list(feed.values()), np)
    np.testing.assert_allclose(assemble(pieces, out), want, rtol=1e-12, atol=1e-12)


def test_cost_counts_both_products_and_keeps_one_number_per_query_row():
    n, h, sq, sk, d = 2, 8, 512, 1024, 64
    ins = [_t(n, h, sq, d), _t(n, h, sk, d), _t(n, h, sk, d), _t(sq, sk), _t()]
    attrs = AttentionAttrs(1.0, True, True)
    (out,) = SPEC.infer(attrs, ins)
    cost = SPEC.cost(attrs, ins, [out])
    scores = n * h * sq * sk
    assert cost.fwd_flops == 4 * scores * d + SOFTMAX_FLOPS * scores
    assert cost.bwd_flops == 10 * scores * d + SOFTMAX_FLOPS * scores      # recompute, dV, dP, dQ, dK
    assert cost.fwd_bytes < scores * 4                                      # no score is written
    assert SPEC.saved(attrs, ins, [out]).extra_bytes() == (n * h * sq + 1) * 4   # the log-sum-exp, the multiplier


def test_attrs_round_trip_through_json():
    attrs = AttentionAttrs(0.125, True, False)
    assert attrs_from_json(attrs_to_json(attrs)) == attrs


def test_no_attention_is_made_where_its_mask_needs_a_gradient():
    """Swin's scores add a learned relative-position bias: the kernels give the mask no
    gradient, so the rewrite is refused there (it would train the bias wrongly), while
    Whisper's constant masks are rewritten; every Attention made reads a mask nothing trains."""
    from pathlib import Path

    from unity_cli.ir.schedule import needs_grad
    from unity_cli.onnx_import import ImportOptions, import_model
    from unity_cli.search.step import attention_rewritten
    from unity_cli.substitutions.cache import load_cache
    from unity_cli.substitutions.match import RewriteError, apply_match, find_matches

    hf = Path(__file__).resolve().parents[1] / "models" / "hf"
    rules = [r for r in load_cache(None).rules if r.makes_attention]
    swin = import_model(hf / "swin_dynamo.onnx", ImportOptions(None, {})).pcg
    matches = [m for r in rules for m in find_matches(swin, r)]
    assert matches
    for m in matches:
        with pytest.raises(RewriteError, match="needs its gradient"):
            apply_match(swin, m, check=False)
    assert attention_rewritten(swin, rules) == (swin, ())
    whisper = import_model(hf / "whisper_dynamo.onnx", ImportOptions(None, {})).pcg
    g, path = attention_rewritten(whisper, rules)
    made = g.by_kind.get("Attention", ())
    assert made and len(path) == len(made)
    grads = needs_grad(g, g.outputs[0])
    assert not any(g.nodes[i].inputs[3] in grads for i in made if g.nodes[i].op.mask)
