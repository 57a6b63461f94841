"""Small ONNX models, written as exporters write them, that contain what each algebraic rule
family rewrites (``substitutions/families.py``); ``width`` scales every feature dim, so the
tests run them tiny and ``benchmarks/rewrites.py`` large enough to time."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
from models.catalog import absent_initializer
from onnx import TensorProto, helper, numpy_helper

from unity_cli.cluster.parse import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.ir.simplify import simplify
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.plan.build import plan_of
from unity_cli.search.baselines import data_parallel
from unity_cli.search.views import default_views
from unity_cli.substitutions.families import FAMILY_RULES
from unity_cli.substitutions.match import apply_match, find_matches


def _model(path: Path, nodes, inputs, inits, out_dims) -> Path:
    rng = np.random.default_rng(7)
    tensors = [numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n) for n, s in inits]
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", d])
                                             for n, d in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_dims])], tensors)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _model_of_x(path: Path, nodes, x_dims: list, inits) -> Path:
    """A model of one input ``x`` of ``x_dims`` and a ``[batch, 4]`` output ``y``."""
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


MM, GEMM = "MatMul", "Gemm"


def qkv(path: Path, width: int = 8) -> Path:
    """Attention's projections: three MatMuls of one input, mixed after."""
    d, h = 2 * width, width
    nodes = [helper.make_node(MM, ["x", w], [o]) for w, o in (("wq", "q"), ("wk", "k"), ("wv", "v"))]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["s"]),
              helper.make_node("Relu", ["s"], ["r"]), helper.make_node(MM, ["r", "wo"], ["y"])]
    return _model(path, nodes, [("x", d)], [("wq", (d, h)), ("wk", (d, h)), ("wv", (d, h)), ("wo", (h, 4))], 4)


def ffn(path: Path, width: int = 8) -> Path:
    """A transformer's feed-forward layer over a batch of 3-token sequences: a rank-3
    MatMul, its bias and a ReLU, then the second MatMul, pooled over the tokens by a
    third."""
    d, h, seq = width, 2 * width, 3
    nodes = [helper.make_node(MM, ["x", "w1"], ["p"]), helper.make_node("Add", ["p", "b1"], ["q"]),
             helper.make_node("Relu", ["q"], ["r"]), helper.make_node(MM, ["r", "w2"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["t", "flat"], ["f"]), helper.make_node(MM, ["f", "wo"], ["y"])]
    rng = np.random.default_rng(7)
    tensors = [numpy_helper.from_array((rng.standard_normal(sh) * 0.4).astype(np.float32), n)
               for n, sh in (("w1", (d, h)), ("b1", (h,)), ("w2", (h, d)), ("wo", (d * seq, 4)))]
    tensors.append(numpy_helper.from_array(np.array([-1, d * seq], dtype=np.int64), "flat"))
    return _model_of_x(path, nodes, ["batch", seq, d], tensors)


def linears(path: Path, width: int = 8) -> Path:
    """PyTorch-style nn.Linear (Gemm, transB, bias): two of one input, concatenated, into a third."""
    nodes = [helper.make_node(GEMM, ["x", "w1", "b1"], ["p"], transB=1),
             helper.make_node(GEMM, ["x", "w2", "b2"], ["q"], transB=1),
             helper.make_node("Relu", ["p"], ["rp"]), helper.make_node("Tanh", ["q"], ["tq"]),
             helper.make_node("Concat", ["rp", "tq"], ["c"], axis=1),
             helper.make_node(GEMM, ["c", "w3", "b3"], ["y"], transB=1)]
    d, h = 2 * width, width
    return _model(path, nodes, [("x", d)],
                  [("w1", (h, d)), ("b1", (h,)), ("w2", (h, d)), ("b2", (h,)), ("w3", (4, 2 * h)), ("b3", (4,))], 4)


def bags(path: Path, width: int = 8) -> Path:
    """A layer over the concatenation of three features (XDL's embedding bags)."""
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"r{i}"]) for i in range(3)]
    nodes += [helper.make_node("Concat", ["r0", "r1", "r2"], ["c"], axis=1), helper.make_node(MM, ["c", "w"], ["y"])]
    return _model(path, nodes, [(f"x{i}", width) for i in range(3)], [("w", (3 * width, 4))], 4)


def uneven_bags(path: Path, width: int = 8) -> Path:
    """A layer over the concatenation of three features of unequal widths (1, 1 and a half
    of ``width``: CANDLE's and DLRM's interactions are so)."""
    widths = (width, width, max(1, width // 2))
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"r{i}"]) for i in range(3)]
    nodes += [helper.make_node("Concat", ["r0", "r1", "r2"], ["c"], axis=1), helper.make_node(MM, ["c", "w"], ["y"])]
    return _model(path, nodes, [(f"x{i}", w) for i, w in enumerate(widths)], [("w", (sum(widths), 4))], 4)


TABLE_ROWS = (4, 3, 2)
"""Rows of the ``embeddings`` model's tables, per unit of ``width``: unequal, as real
recommendation models' are."""


def embeddings(path: Path, width: int = 8) -> Path:
    """DLRM's sparse side: three lookups from tables of unequal rows, each by its own ids,
    concatenated with a dense feature and classified."""
    rng = np.random.default_rng(5)
    tables = [(f"t{k}", (r * width, width)) for k, r in enumerate(TABLE_ROWS)]
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n)
             for n, s in tables + [("wo", ((len(tables) + 1) * width, 4))]]
    nodes = [helper.make_node("Gather", [t, f"ids{k}"], [f"e{k}"], axis=0) for k, (t, _) in enumerate(tables)]
    nodes += [helper.make_node("Concat", ["x"] + [f"e{k}" for k in range(len(tables))], ["c"], axis=1),
              helper.make_node("Relu", ["c"], ["r"]), helper.make_node(MM, ["r", "wo"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])]
    inputs += [helper.make_tensor_value_info(f"ids{k}", TensorProto.INT64, ["batch"]) for k in range(len(tables))]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    g = helper.make_graph(nodes, path.stem, inputs, [out], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def towers(path: Path, width: int = 8) -> Path:
    """Two 1x1 convolutions of one image (an Inception module's reductions), each with its
    activation, added, pooled and classified."""
    rng = np.random.default_rng(3)
    c, hw = width, 8
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n)
             for n, s in (("w1", (c, c, 1, 1)), ("w2", (c, c, 1, 1)), ("wo", (c, 4)))]
    conv = {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0], "strides": [1, 1]}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="branch1", **conv),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="branch2", **conv),
             helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Sigmoid", ["b"], ["sb"]),
             helper.make_node("Add", ["ra", "sb"], ["s"]), helper.make_node("GlobalAveragePool", ["s"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node(MM, ["f", "wo"], ["y"])]
    return _model_of_x(path, nodes, ["batch", c, hw, hw], inits)


def reductions(path: Path, width: int = 8) -> Path:
    """An Inception module's reductions as they are: three 1x1 convolutions of one image of
    unequal widths (1, 1 and a half of ``width``), each with its ReLU, concatenated along
    the channels, pooled and classified."""
    rng = np.random.default_rng(6)
    c, hw = width, 8
    widths = (c, c, max(1, c // 2))
    inits = [numpy_helper.from_array((rng.standard_normal((w, c, 1, 1)) * 0.4).astype(np.float32), f"w{k}")
             for k, w in enumerate(widths)]
    inits.append(numpy_helper.from_array((rng.standard_normal((sum(widths), 4)) * 0.4).astype(np.float32), "wo"))
    conv = {"kernel_shape": [1, 1], "pads": [0, 0, 0, 0], "strides": [1, 1]}
    nodes = []
    for k in range(len(widths)):
        nodes += [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], name=f"branch{k}_1x1", **conv),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"branch{k}_relu")]
    nodes += [helper.make_node("Concat", [f"r{k}" for k in range(len(widths))], ["s"], axis=1),
              helper.make_node("GlobalAveragePool", ["s"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node(MM, ["f", "wo"], ["y"])]
    return _model_of_x(path, nodes, ["batch", c, hw, hw], inits)


def channels_last(path: Path, width: int = 8) -> Path:
    """A channels-last (NHWC) network as a TensorFlow converter writes it: each convolution
    between a transpose to NCHW and one back, its activation applied channels-last, so
    every pair of transposes between two convolutions undoes itself once the activation
    is moved through."""
    rng = np.random.default_rng(4)
    c, hw = max(4, width // 4), 8    # (a quarter of the width: 3x3 convolutions are the costly part)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in (("w1", (c, c, 3, 3)), ("w2", (c, c, 3, 3)), ("w3", (c, c, 3, 3)), ("wo", (hw * hw * c, 4)))]
    inits.append(numpy_helper.from_array(np.array([-1, hw * hw * c], dtype=np.int64), "flat"))
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1]}
    nodes, x = [], "x"
    for k in (1, 2, 3):
        nodes += [helper.make_node("Transpose", [x], [f"nchw{k}"], perm=[0, 3, 1, 2], name=f"conv{k}/to_nchw"),
                  helper.make_node("Conv", [f"nchw{k}", f"w{k}"], [f"c{k}"], name=f"conv{k}", **conv),
                  helper.make_node("Transpose", [f"c{k}"], [f"nhwc{k}"], perm=[0, 2, 3, 1], name=f"conv{k}/to_nhwc"),
                  helper.make_node("Relu", [f"nhwc{k}"], [f"r{k}"], name=f"relu{k}")]
        x = f"r{k}"
    nodes += [helper.make_node("Reshape", [x, "flat"], ["f"]), helper.make_node(MM, ["f", "wo"], ["y"])]
    return _model_of_x(path, nodes, ["batch", hw, hw, c], inits)


def family_plans(root: Path, make, rule_name: str, spec: Path, ranks: int, batch: int = 12,
                 width: int = 8, config: CostConfig = CostConfig(), baseline=data_parallel) -> tuple[Path, Path]:
    """Two plans over ``ranks`` devices of the model ``make`` writes, laid out by ``baseline``
    (data parallel by default): as it is, and rewritten by the family rule at its first
    match (``rule_name``; several joined by "+" are applied in turn, each at its first
    match; ``spec``: a cluster spec whose ``devices:`` count is replaced)."""
    model = make(root / f"{make.__name__}-{width}.onnx", width)
    imported = import_model(model, ImportOptions(batch_size=batch))
    rewritten, rewrites = imported.pcg, []
    for name in rule_name.split("+"):
        rule = next(r for r in FAMILY_RULES if r.name == name)
        matches = find_matches(rewritten, rule)
        assert matches, f"{name} does not match {model.name} (after {[r['name'] for r in rewrites]})"
        rewritten = simplify(apply_match(rewritten, matches[0]))
        rewrites.append({"rule": rule.id, "name": rule.name, "reverse": False, "at": "", "params": {}})
    cluster_file = root / f"cpu-{ranks}.yaml"
    cluster_file.write_text(re.sub(r"devices: \d+", f"devices: {ranks}", spec.read_text()))
    cluster = load_cluster(cluster_file)
    out = []
    for tag, pcg, applied in (("as-is", imported.pcg, ()), (rule_name, rewritten, tuple(rewrites))):
        base = baseline(pcg, cluster)
        views = default_views(base.pcg)
        plan = plan_of(imported, cluster, config, "unity", base.pcg, views,
                       estimate(base.pcg, views, cluster, config), applied)
        path = root / f"{make.__name__}-{width}-{tag}-{ranks}.json"
        plan.save(path)
        out.append(path)
    return out[0], out[1]


def torch_mlp(path: Path, width: int = 8, layers: int = 2, batch: int | str = "batch",
              shape_only: bool = False) -> Path:
    """An MLP as PyTorch exports ``nn.Linear``: Gemm(x, W, b, transB=1) then Relu, ``layers``
    pairs of width ``4 width`` then back to ``width``. A Gemm's bias blocks the row split of
    Megatron's second layer (its partial sums would each add it); written as MatMul + Add, the
    row split can reduce first and add the bias once."""
    rng = np.random.default_rng(5)
    d, h = width, 4 * width
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        for j, (o, i) in enumerate(((h, d), (d, h))):
            w, b, y = f"l{k}.{j}.weight", f"l{k}.{j}.bias", f"l{k}.{j}"
            inits += [_init(w, (o, i), rng, shape_only), _init(b, (o,), rng, shape_only)]
            nodes.append(helper.make_node(GEMM, [x, w, b], [y], transB=1, name=f"{y}.gemm"))
            x = y
            if j == 0:
                nodes.append(helper.make_node("Relu", [y], [y + ".relu"], name=f"{y}.relu"))
                x = y + ".relu"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, d])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _init(name: str, dims: tuple[int, ...], rng: np.random.Generator, shape_only: bool) -> onnx.TensorProto:
    if shape_only:   # dims only, enough to plan
        return absent_initializer(name, dims)
    return numpy_helper.from_array((rng.standard_normal(dims) / np.sqrt(dims[-1])).astype(np.float32), name)
