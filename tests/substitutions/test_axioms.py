"""Every z3 axiom is sound: both sides agree on random integer tensors of sizes that
meet its preconditions, through the numpy model of the signature."""
from __future__ import annotations

import numpy as np
import pytest
import z3

from unity_cli.ir.ops.conv import ConvAttrs, conv_attrs, conv_config
from unity_cli.ir.ops.unary import EW_FUNCS
from unity_cli.substitutions.axioms import (
    AXIOMS,
    Axiom,
    IllTyped,
    Law,
    axiom_formulas,
    axioms_hash,
    evaluate_term,
    quantified,
    signature,
)

ABS, SIGN = EW_FUNCS.index("Abs"), EW_FUNCS.index("Sign")
CONV_PAD = conv_config(ConvAttrs((3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1))
CONV_GROUPED = conv_config(ConvAttrs((3, 3), (2, 2), (0, 1, 0, 1), (1, 1), 2))


def ids(shape: tuple[int, ...], bound: int) -> tuple:
    """An integer-tensor placeholder: values in [0, bound)."""
    return ("ids", shape, bound)


S = (3, 4)
# Per axiom: assignments of its variables (tensor shapes or integers) that meet its preconditions.
EXAMPLES: dict[str, list[dict]] = {
    "add-comm": [dict(x=S, y=S)],
    "add-assoc": [dict(x=S, y=S, z=S)],
    "mul-comm": [dict(x=S, y=S)],
    "mul-assoc": [dict(x=S, y=S, z=S)],
    "mul-add": [dict(x=S, y=S, z=S)],
    "badd-comm": [dict(x=(3, 4), y=(4,)), dict(x=(3, 1), y=(1, 4))],
    "bmul-comm": [dict(x=(3, 4), y=(4,)), dict(x=(2, 3, 1), y=(3, 4))],
    "add-self": [dict(x=S)],
    "add-cancel": [dict(x=S, y=S)],
    "add-scaled-self": [dict(j=3, x=S), dict(j=-2, x=S)],
    "add-scaled-scaled": [dict(j=2, k=-3, x=S)],
    "scale-one": [dict(k=1, x=S), dict(k=2, x=S)],
    "scale-scale": [dict(j=2, k=-3, x=S)],
    "scale-add": [dict(k=3, x=S, y=S)],
    "scale-mul": [dict(k=-2, x=S, y=S)],
    "relu-scale": [dict(k=3, x=S), dict(k=-1, x=S)],
    "relu-relu": [dict(x=S)],
    "relu-square": [dict(x=S)],
    "relu-times-square": [dict(x=S, y=S)],
    "mul-relu-self": [dict(x=S)],
    "matmul-concat-contracted-left": [dict(n1=2, n2=3, a=(4, 2), b=(4, 3), c=(5, 6))],
    "matmul-concat-contracted-right": [dict(n1=2, n2=3, a=(4, 5), b=(2, 6), c=(3, 6))],
    "split-concat-across": [dict(ax=-1, n1=2, n2=3, i=0, j=-2, m=1, n3=2, a=(1, 5), b=(2, 5)),
                            dict(ax=-2, n1=1, n2=1, i=1, j=-1, m=3, n3=1, a=(2, 3), b=(2, 1))],
    "matmul-assoc": [dict(a=(2, 3), b=(3, 4), c=(4, 5)), dict(a=(2, 2, 3), b=(2, 3, 4), c=(2, 4, 5))],
    "matmul-add-left": [dict(a=(2, 3), b=(2, 3), c=(3, 4))],
    "matmul-add-right": [dict(a=(2, 3), b=(3, 4), c=(3, 4))],
    "matmul-scale-left": [dict(k=3, a=(2, 3), b=(3, 4))],
    "matmul-scale-right": [dict(k=-2, a=(2, 3), b=(3, 4))],
    "transpose-transpose": [dict(x=(2, 3, 4))],
    "transpose-matmul": [dict(a=(2, 3), b=(3, 4)), dict(a=(2, 2, 3), b=(2, 3, 4))],
    "transpose-add": [dict(a=S, b=S)],
    "transpose-mul": [dict(a=S, b=S)],
    "transpose-relu": [dict(x=S)],
    "transpose-ew": [dict(k=ABS, x=S), dict(k=SIGN, x=(2, 3, 4))],
    "transpose-scale": [dict(k=2, x=S)],
    "concat-assoc-left": [dict(ax=-1, n1=2, n2=3, n3=1, m=4, a=(3, 2), b=(3, 3), c=(3, 1))],
    "concat-assoc-right": [dict(ax=-2, n1=2, n2=3, n3=1, m=5, a=(2, 4), b=(3, 4), c=(1, 4))],
    "concat-interchange": [dict(ax=-1, i=-2, m=2, n3=3, n1=1, n2=4, a=(1, 2), b=(4, 2), c=(1, 3), d=(4, 3)),
                           dict(ax=-3, i=-1, m=1, n3=2, n1=2, n2=1, a=(1, 3, 2), b=(1, 3, 1), c=(2, 3, 2),
                                d=(2, 3, 1))],
    "split-concat-first": [dict(ax=-1, n1=2, n2=3, a=(3, 2), b=(3, 3))],
    "split-concat-second": [dict(ax=-2, n1=2, n2=3, a=(2, 3), b=(3, 3))],
    "concat-split": [dict(ax=-1, n1=2, n2=3, x=(3, 5)), dict(ax=-3, n1=1, n2=1, x=(2, 3, 4))],
    "relu-concat": [dict(ax=-2, n1=2, n2=1, a=(2, 3), b=(1, 3))],
    "ew-concat": [dict(k=ABS, ax=-1, n1=2, n2=1, a=(3, 2), b=(3, 1))],
    "scale-concat": [dict(k=-3, ax=-1, n1=2, n2=1, a=(3, 2), b=(3, 1))],
    "add-concat": [dict(ax=-1, n1=2, n2=3, a=(3, 2), b=(3, 3), c=(3, 2), d=(3, 3))],
    "mul-concat": [dict(ax=-2, n1=2, n2=3, a=(2, 3), b=(3, 3), c=(2, 3), d=(3, 3))],
    "matmul-concat-rows": [dict(n1=2, n2=3, a=(2, 4), b=(3, 4), c=(4, 5))],
    "matmul-concat-cols": [dict(n1=2, n2=3, a=(2, 4), b=(4, 2), c=(4, 3))],
    "matmul-concat-batch": [dict(ax=-3, n1=1, n2=2, a=(1, 2, 3), b=(2, 2, 3), c=(1, 3, 4), d=(2, 3, 4))],
    "matmul-concat-contracted": [dict(n1=2, n2=3, a=(4, 2), b=(4, 3), c=(2, 5), d=(3, 5))],
    "transpose-concat-last": [dict(n1=2, n2=3, a=(4, 2), b=(4, 3))],
    "transpose-concat-rows": [dict(n1=2, n2=3, a=(2, 4), b=(3, 4))],
    "transpose-concat-batch": [dict(ax=-3, n1=1, n2=2, a=(1, 2, 3), b=(2, 2, 3))],
    "permute-inverse": [dict(j=201, k=120, x=(2, 3, 4, 5)), dict(j=1320, k=3021, x=(2, 3, 4, 5)),
                        dict(j=102, k=102, x=(6, 2, 3, 4)), dict(j=120, k=120, x=(2, 3, 4))],
    "permute-relu": [dict(k=102, x=(2, 3, 4)), dict(k=2301, x=(2, 3, 4, 5)), dict(k=120, x=(6, 2, 3, 4))],
    "permute-ew": [dict(k=1230, j=ABS, x=(2, 3, 4, 5)), dict(k=201, j=SIGN, x=(3, 4, 5))],
    "permute-scale": [dict(k=120, j=3, x=(2, 3, 4))],
    "permute-add": [dict(k=3012, a=(2, 3, 4, 5), b=(2, 3, 4, 5))],
    "permute-mul": [dict(k=210, a=(3, 4, 5), b=(3, 4, 5))],
    "matmul-permute-batch": [dict(k=1023, a=(2, 3, 4, 5), b=(2, 3, 5, 4)),
                             dict(k=1023, a=(2, 2, 3, 4, 5), b=(2, 2, 3, 5, 2))],
    "split-relu": [dict(ax=-1, n1=2, n2=3, i=0, x=(3, 5)), dict(ax=-2, n1=2, n2=3, i=1, x=(5, 3))],
    "split-ew": [dict(k=ABS, ax=-1, n1=2, n2=3, i=1, x=(3, 5))],
    "split-scale": [dict(k=4, ax=-1, n1=2, n2=3, i=0, x=(3, 5))],
    "split-add": [dict(ax=-1, n1=2, n2=3, i=1, x=(3, 5), y=(3, 5))],
    "split-badd": [dict(ax=-1, n1=2, n2=3, i=1, x=(3, 5), y=(5,)), dict(ax=-2, n1=1, n2=2, i=0, x=(2, 3, 4), y=(3, 1))],
    "split-mul": [dict(ax=-2, n1=1, n2=2, i=0, x=(3, 5), y=(3, 5))],
    "split-transpose-last": [dict(n1=2, n2=3, i=0, x=(5, 3)), dict(n1=2, n2=3, i=1, x=(5, 3))],
    "split-transpose-rows": [dict(n1=2, n2=3, i=1, x=(3, 5))],
    "split-transpose-batch": [dict(ax=-3, n1=2, n2=3, i=1, x=(5, 2, 3))],
    "split-matmul-rows": [dict(n1=2, n2=3, i=0, a=(5, 3), b=(3, 4)), dict(n1=2, n2=3, i=1, a=(5, 3), b=(3, 4))],
    "split-matmul-cols": [dict(n1=2, n2=3, i=1, a=(4, 3), b=(3, 5))],
    "split-matmul-batch": [dict(ax=-3, n1=2, n2=3, i=1, a=(5, 2, 3), b=(5, 3, 4))],
    "repartition-id": [dict(ax=0, k=2, x=S)],
    "combine-id": [dict(ax=-1, k=2, x=S)],
    "replicate-id": [dict(k=3, x=S)],
    "reduce-sum-id": [dict(k=3, x=S)],
    "reduce-copies-scale": [dict(k=3, x=S)],
    "gather-add": [dict(ax=-2, a=(5, 3), b=(5, 3), c=ids((4,), 5)), dict(ax=-1, a=(2, 5), b=(2, 5), c=ids((2, 3), 5))],
    "gather-scale": [dict(ax=-2, k=3, a=(5, 3), c=ids((4,), 5))],
    "conv-add-input": [dict(cfg=CONV_PAD, a=(2, 4, 5, 5), b=(2, 4, 5, 5), c=(3, 4, 3, 3)),
                       dict(cfg=CONV_GROUPED, a=(1, 4, 7, 7), b=(1, 4, 7, 7), c=(6, 2, 3, 3))],
    "conv-add-weight": [dict(cfg=CONV_PAD, a=(2, 4, 5, 5), b=(3, 4, 3, 3), c=(3, 4, 3, 3))],
    "conv-scale-input": [dict(cfg=CONV_GROUPED, k=-2, a=(1, 4, 7, 7), b=(6, 2, 3, 3))],
    "conv-scale-weight": [dict(cfg=CONV_PAD, k=3, a=(2, 4, 5, 5), b=(3, 4, 3, 3))],
    "conv-concat-out-channels": [dict(cfg=CONV_PAD, n1=3, n2=2, a=(2, 4, 5, 5), b=(3, 4, 3, 3), c=(2, 4, 3, 3)),
                                 dict(cfg=CONV_GROUPED, n1=6, n2=2, a=(1, 4, 7, 7), b=(6, 2, 3, 3),
                                      c=(2, 2, 3, 3))],   # grouped: the guard does not hold
}


def instantiate(example: dict, rng: np.random.Generator) -> dict:
    env = {}
    for name, v in example.items():
        if isinstance(v, tuple) and v and v[0] == "ids":
            env[name] = rng.integers(0, v[2], v[1])
        elif isinstance(v, tuple):
            env[name] = rng.integers(-5, 6, v).astype(np.int64)
        else:
            env[name] = v
    return env

EXAMPLES.update({a.name: [dict(x=(2, 3, 4, 5)), dict(x=(3, 2, 3, 4, 5))]
                 for a in AXIOMS if a.name.startswith("softmax-permute-")})


def check(law: Law, example: dict, seed: int) -> bool | None:
    """None if the example does not meet the guard; else whether both sides agree."""
    env = instantiate(example, np.random.default_rng(seed))
    if law.guard is not None and not evaluate_term(law.guard, env):
        return None
    lhs, rhs = evaluate_term(law.lhs, env), evaluate_term(law.rhs, env)
    return lhs.shape == rhs.shape and np.array_equal(lhs, rhs)


def test_every_axiom_has_examples():
    assert sorted(EXAMPLES) == sorted(a.name for a in AXIOMS)


@pytest.mark.parametrize("axiom", AXIOMS, ids=lambda a: a.name)
def test_axiom_is_sound(axiom: Axiom):
    law, _ = quantified(axiom, signature())
    applied = 0
    for example in EXAMPLES[axiom.name]:
        for seed in range(4):
            ok = check(law, example, seed)
            if ok is None:
                continue
            applied += 1
            assert ok, f"{axiom.name} is false for {example} (seed {seed})"
    assert applied, f"no example of {axiom.name} meets its guard"


def test_the_check_catches_a_false_axiom():
    s = signature()
    x, y = z3.Consts("x y", s.T)
    wrong = Law(s.relu(s.add(x, y)), s.add(s.relu(x), s.relu(y)))
    assert not all(check(wrong, dict(x=S, y=S), seed) for seed in range(4))


def test_model_refuses_ill_typed_applications():
    s = signature()
    a, b = z3.Consts("a b", s.T)
    env = dict(a=np.zeros((2, 3)), b=np.zeros((2, 4)))
    with pytest.raises(IllTyped):
        evaluate_term(s.concat(-1, 3, 3, a, b), env)  # b's part is 4 wide, not 3
    with pytest.raises(IllTyped):
        evaluate_term(s.add(a, b), env)
    with pytest.raises(IllTyped):
        evaluate_term(s.split(-2, 1, 2, 0, a), env)


def test_every_axiom_has_a_trigger_that_binds_all_its_variables():
    for f in axiom_formulas():
        assert f.num_patterns() >= 1, f


def test_axioms_hash_is_stable_and_content_sensitive():
    h = axioms_hash()
    assert h == axioms_hash() and len(h) == 64
    fewer = tuple(a for a in AXIOMS if a.name != "add-self")
    assert axioms_hash(fewer) != h
    changed = tuple(Axiom(a.name, AXIOMS[0].law) if a.name == "add-self" else a for a in AXIOMS)
    assert axioms_hash(changed) != h


def test_conv_config_round_trips():
    for attrs in (ConvAttrs((3, 3), (2, 2), (0, 1, 0, 1), (1, 1), 2), ConvAttrs((1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
                  ConvAttrs((3,), (1,), (1, 1), (1,))):
        assert conv_attrs(conv_config(attrs)) == attrs
    # the guard of conv-concat-out-channels: ungrouped 2-D convs only
    assert CONV_PAD < 0 < CONV_GROUPED and conv_config(ConvAttrs((3,), (1,), (1, 1), (1,))) > 0


def test_the_out_channel_law_is_false_for_a_grouped_conv():
    """Without its guard the law is false: a grouped conv's output channels read only their
    group's input channels, and stacking weights regroups them."""
    (axiom,) = [a for a in AXIOMS if a.name == "conv-concat-out-channels"]
    law, _ = quantified(axiom, signature())
    unguarded = Law(law.lhs, law.rhs)
    example = dict(cfg=CONV_GROUPED, n1=2, n2=2, a=(1, 4, 7, 7), b=(2, 2, 3, 3), c=(2, 2, 3, 3))
    assert not all(check(unguarded, example, seed) for seed in range(4))


def test_conv_model_matches_onnxruntime():
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    attrs = ConvAttrs((3, 3), (2, 2), (0, 1, 0, 1), (1, 1), 2)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 0, 1],
                            dilations=[1, 1], group=2)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 7, 7]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (1, 4, 7, 7)).astype(np.float32)
    w = rng.integers(-3, 4, (6, 2, 3, 3)).astype(np.float32)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "w": w})
    s = signature()
    a, b = z3.Consts("a b", s.T)
    got = evaluate_term(s.conv(conv_config(attrs), a, b), dict(a=x.astype(np.int64), b=w.astype(np.int64)))
    assert np.array_equal(got, want)
