"""Every rule family's rewritten form runs: `mpiexec -n P unity run --check` on a plan whose
graph a family rule rewrote trains like the original model on one process (the check
compares against the model as the user wrote it), and the bytes each rank sends equal the
bytes the plan predicts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from runtime.mpirun import SPECS, run_json

from unity_cli.cluster.parse import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.ir.simplify import simplify
from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.plan.plan import Plan
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


MM, GEMM = "MatMul", "Gemm"


def qkv(path: Path) -> Path:
    """Attention's projections: three MatMuls of one input, mixed after."""
    nodes = [helper.make_node(MM, ["x", w], [o]) for w, o in (("wq", "q"), ("wk", "k"), ("wv", "v"))]
    nodes += [helper.make_node("Mul", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["s"]),
              helper.make_node("Relu", ["s"], ["r"]), helper.make_node(MM, ["r", "wo"], ["y"])]
    return _model(path, nodes, [("x", 16)], [("wq", (16, 8)), ("wk", (16, 8)), ("wv", (16, 8)), ("wo", (8, 4))], 4)


def linears(path: Path) -> Path:
    """PyTorch-style nn.Linear (Gemm, transB, bias): two of one input, concatenated, into a third."""
    nodes = [helper.make_node(GEMM, ["x", "w1", "b1"], ["p"], transB=1),
             helper.make_node(GEMM, ["x", "w2", "b2"], ["q"], transB=1),
             helper.make_node("Relu", ["p"], ["rp"]), helper.make_node("Tanh", ["q"], ["tq"]),
             helper.make_node("Concat", ["rp", "tq"], ["c"], axis=1),
             helper.make_node(GEMM, ["c", "w3", "b3"], ["y"], transB=1)]
    return _model(path, nodes, [("x", 16)],
                  [("w1", (8, 16)), ("b1", (8,)), ("w2", (8, 16)), ("b2", (8,)), ("w3", (4, 16)), ("b3", (4,))], 4)


def bags(path: Path) -> Path:
    """A layer over the concatenation of three features (XDL's embedding bags)."""
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"r{i}"]) for i in range(3)]
    nodes += [helper.make_node("Concat", ["r0", "r1", "r2"], ["c"], axis=1), helper.make_node(MM, ["c", "w"], ["y"])]
    return _model(path, nodes, [(f"x{i}", 8) for i in range(3)], [("w", (24, 4))], 4)


CASES = [  # model, family instance, ranks
    (qkv, "sibling-matmul-3", 2),
    (qkv, "sibling-matmul-2", 3),
    (linears, "sibling-gemm-2", 2),
    (linears, "concat-gemm-2", 3),
    (linears, "gemm-trans-b-as-matmul-add", 2),
    (bags, "concat-linear-3", 2),
]


def rewritten_plan(root: Path, make, rule_name: str, ranks: int, batch: int = 12) -> Path:
    """The model rewritten by the rule at its first match, data parallel over ``ranks``."""
    model = make(root / f"{make.__name__}.onnx")
    imported = import_model(model, ImportOptions(batch_size=batch))
    rule = next(r for r in FAMILY_RULES if r.name == rule_name)
    matches = find_matches(imported.pcg, rule)
    assert matches, f"{rule_name} does not match {model.name}"
    pcg = simplify(apply_match(imported.pcg, matches[0]))
    spec = root / f"cpu-{ranks}.yaml"
    spec.write_text((SPECS / "local-cpu.yaml").read_text().replace("devices: 2", f"devices: {ranks}")
                    .replace("name: local-cpu", f"name: local-cpu-{ranks}"))
    cluster = load_cluster(spec)
    base = data_parallel(pcg, cluster)
    views = default_views(base.pcg)
    rep = estimate(base.pcg, views, cluster, CostConfig())
    info = {"path": str(model), "sha256": imported.sha256, "outputs": ["y"], "batch_size": batch,
            "inputs": {k: {"dims": list(v.dims), "dtype": v.dtype.value} for k, v in sorted(imported.inputs.items())}}
    predicted = {"step_time_ms": rep.step_time * 1e3, "comm_bytes": list(rep.comm_bytes)}
    rewrite = {"rule": rule.id, "name": rule.name, "reverse": False, "at": "", "params": {}}
    plan = Plan(info, cluster, {"dtype": "float32", "optimizer": "adam"}, "unity", base.pcg, views, predicted,
                {"unity": {"step_time_ms": predicted["step_time_ms"]}}, rewrites=(rewrite,))
    path = root / f"{make.__name__}-{rule_name}-{ranks}.json"
    plan.save(path)
    return path


@pytest.mark.parametrize("make,rule_name,ranks", CASES, ids=[f"{r}-{n}" for _, r, n in CASES])
def test_a_rewritten_plan_trains_like_the_model(tmp_path, make, rule_name, ranks):
    plan = rewritten_plan(tmp_path, make, rule_name, ranks)
    doc = run_json(plan, "--check", "--steps", "2", ranks=ranks)
    assert doc["check"]["passed"], doc["check"]
    got = doc["comm_bytes"]
    assert got["measured"] == got["predicted"], got
