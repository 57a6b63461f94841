"""The inner parallelization solver (``search/solver.py``): exact against brute force on
small graphs, and the strategies a person would build by hand come out of it on its own."""
from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unity_cli.cluster.parse import parse_cluster
from unity_cli.cost.memory import memory_table
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.errors import ShapeError
from unity_cli.ir.ops.gather_reduce import GatherAttrs
from unity_cli.ir.ops.linear import MatMulAttrs
from unity_cli.ir.ops.parallel import ReductionAttrs
from unity_cli.ir.recompute import Recompute
from unity_cli.ir.schedule import layout_sources
from unity_cli.ir.training import Training
from unity_cli.onnx_import import ImportOptions, import_model_proto
from unity_cli.search.solver import brute_force, build_problem, factorizations, realize, solve, solve_problem
from unity_cli.search.views import default_views


def cluster(nodes: int, per_node: int, inter: str = "25 GB/s", intra: str = "300 GB/s",
            flops: str = "19.5 TFLOP/s", capacity: str = "40 GiB"):
    doc = {"name": f"c{nodes}x{per_node}",
           "device_types": {"gpu": {"kind": "gpu", "peak_flops": {"float32": flops},
                                    "memory": {"bandwidth": "1.5 TB/s", "capacity": capacity},
                                    "launch_overhead": "5 us"}},
           "nodes": {"count": nodes, "devices": per_node, "device": "gpu",
                     "intra_link": {"bandwidth": intra, "latency": "2 us"}}}
    if nodes > 1:
        doc["inter_node_link"] = {"bandwidth": inter, "latency": "5 us"}
    return parse_cluster(doc, "test")


def _model(nodes, inits, inputs, outputs):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return import_model_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                              ImportOptions()).pcg


def mlp(batch: int, widths: list[int], relu: bool = True):
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k, (a, b) in enumerate(zip(widths, widths[1:])):
        inits.append(numpy_helper.from_array(rng.standard_normal((a, b)).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [f"h{k}"], name=f"fc{k}"))
        x = f"h{k}"
        if relu and k < len(widths) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{k}"], name=f"relu{k}"))
            x = f"r{k}"
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, widths[-1]])])


def branches(batch: int, width: int):
    """Two MatMuls on one input, added: a graph that is not a chain."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), n) for n in "ab"]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["p"], name="left"),
             helper.make_node("MatMul", ["x", "b"], ["q"], name="right"),
             helper.make_node("Add", ["p", "q"], ["y"], name="join")]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])])


def reshaped(batch: int, width: int):
    """Products with reshapes between them (heads split and merged, as attention does): a
    chain whose reshapes are views, holding no buffer of their own."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), n) for n in "ab"]
    inits += [numpy_helper.from_array(np.array(s, dtype=np.int64), n)
              for n, s in (("split", [batch, 4, width // 4]), ("merge", [batch, width]))]
    nodes = [helper.make_node("MatMul", ["x", "a"], ["p"], name="first"),
             helper.make_node("Reshape", ["p", "split"], ["heads"], name="split_heads"),
             helper.make_node("Relu", ["heads"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "merge"], ["m"], name="merge_heads"),
             helper.make_node("MatMul", ["m", "b"], ["y"], name="second")]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])])


def embedding(batch: int, rows: int, dim: int, out: int):
    """A big table looked up by ids, then a small dense layer: DLRM's shape."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((rows, dim)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.standard_normal((dim, out)).astype(np.float32), "w")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="lookup", axis=0),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="dense")]
    return _model(nodes, inits, [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, out])])


SMALL = [
    ("mlp3", lambda: mlp(12, [6, 12, 6])),                 # 3 ops
    ("mlp5", lambda: mlp(6, [12, 6, 12, 6])),               # 5 ops
    ("branches", lambda: branches(6, 12)),                  # 3 ops, not a chain
    ("embedding", lambda: embedding(6, 24, 6, 6)),          # 2 ops
    ("mlp-norelu4", lambda: mlp(24, [12, 24, 12, 24, 12], relu=False)),   # 4 ops
]
CLUSTERS = [(1, 2), (1, 4), (1, 6), (2, 3), (3, 2), (2, 2)]


STEPS = [Training(), Training(1, 3), Training(2, 3, Recompute.SELECTIVE), Training(3, 2),
         Training(3, 2, Recompute.FULL),
         Training(1, 2, zero_by_weight=(("w1", 3), ("table", 3), ("[ab]", 2), ("w", 0)))]


@pytest.mark.parametrize("name,make", SMALL, ids=[s[0] for s in SMALL])
@pytest.mark.parametrize("shape", CLUSTERS, ids=[f"{a}x{b}" for a, b in CLUSTERS])
@pytest.mark.parametrize("step", STEPS, ids=["plain", "zero1-mb3", "zero2-mb3-selective", "zero3-mb2",
                                             "zero3-mb2-recompute", "zero-per-weight-mb2"])
def test_solver_equals_brute_force(name, make, shape, step):
    """With the step's options too (ZeRO-1 shrinks a replicated weight's optimizer state and
    update; micro-batches multiply compute and resharding, not the sync, but ZeRO-2's
    reduce-scatter and ZeRO-3's gathers; recomputation pays a second forward and keeps less,
    and under ZeRO-3 a second gather, where a weight's shard is then all it keeps)."""
    pcg = make()
    c = cluster(*shape)
    for mesh in factorizations(c.num_devices):
        p = build_problem(pcg, c, CostConfig(training=step), mesh)
        want = brute_force(p)
        got = solve_problem(p)
        assert want is not None and got is not None
        assert p.objective(got) == pytest.approx(want[0], rel=1e-9, abs=1e-15), (mesh, got, want[1])
        assert p.fits(got)


def test_memory_is_a_hard_constraint():
    pcg = mlp(8, [64, 64, 64])
    c = cluster(1, 4)
    roomy = build_problem(pcg, c, CostConfig(), (1, 4))
    free = solve_problem(roomy)
    assert free is not None
    assert solve_problem(build_problem(pcg, c, CostConfig(memory_limit=1), (1, 4))) is None
    # Just below what the unconstrained optimum needs: the solver moves to the best assignment that fits.
    need = roomy.memory(free)
    tight = build_problem(pcg, c, CostConfig(memory_limit=int(need) - 1), (1, 4))
    want = brute_force(tight)
    got = solve_problem(tight)
    if want is None:
        assert got is None
    else:
        assert got is not None and tight.fits(got) and got != free
        assert tight.objective(got) == pytest.approx(want[0], rel=1e-9)


MEMORY_CASES = [
    ("mlp", lambda: mlp(64, [256, 1024, 256, 1024, 256]), (1, 6)),
    ("mlp", lambda: mlp(64, [256, 1024, 256, 1024, 256]), (2, 3)),
    ("branches", lambda: branches(48, 512), (2, 2)),
    ("embedding", lambda: embedding(96, 4096, 64, 64), (1, 4)),
    ("reshaped", lambda: reshaped(48, 256), (1, 4)),
]


SOLVER_OVER = 2.5


@pytest.mark.parametrize("name,make,shape", MEMORY_CASES, ids=[f"{c[0]}-{c[2][0]}x{c[2][1]}" for c in MEMORY_CASES])
def test_the_solver_counts_every_byte_the_pricing_does(name, make, shape):
    """For every mesh's optimum and at every option of the first operator (so resharding
    edges of many kinds are realized), the solver's memory is never less than what
    ``estimate`` finds on the busiest device of the realized graph, but for the values and
    gradients in flight, which the order of the step decides (the solver adds up every
    operator's outputs and every resharding's buffers, held through the step, where the step
    frees those no context keeps), and on a chain it is at most :data:`SOLVER_OVER` times it."""
    pcg = make()
    c = cluster(*shape)
    for mesh in factorizations(c.num_devices):
        p = build_problem(pcg, c, CostConfig(), mesh)
        free = solve_problem(p)
        first = p.nodes[0]
        for k in range(len(p.options[first])):
            choice = {**free, first: k}
            if not np.isfinite(p.objective(choice)):
                continue
            g = realize(p, choice)
            views = default_views(g)
            held = estimate(g, views, c, CostConfig()).memory
            busiest = max(held)
            # all but the bytes in flight, which the order of the step decides (``cost/memory.py``)
            table = memory_table(g, [views[i].devices(n.outputs[0]) for i, n in g], layout_sources(g), c, CostConfig())
            flight = table.ahead + (table.behind.max(axis=0) if table.behind is not None else 0)
            assert p.memory(choice) >= max(np.asarray(held) - flight), (mesh, k)
            if name in ("mlp", "reshaped"):     # (a sum over the step, where the step frees some)
                assert p.memory(choice) <= SOLVER_OVER * busiest, (mesh, k, p.memory(choice) / busiest)


def test_a_plan_that_fits_the_solver_fits_the_pricing():
    """Memory set just below the unconstrained optimum's: the solver's answer, realized and
    priced by the simulation, fits (its resharding buffers were in the solver's count)."""
    pcg = mlp(64, [256, 1024, 256, 1024, 256])
    c = cluster(1, 4)
    for mesh in factorizations(4):
        free_problem = build_problem(pcg, c, CostConfig(), mesh)
        need = free_problem.memory(solve_problem(free_problem))
        config = CostConfig(memory_limit=int(need) - 1)
        p = build_problem(pcg, c, config, mesh)
        got = solve_problem(p)
        if got is None:
            continue
        g = realize(p, got)
        assert estimate(g, default_views(g), c, config).feasible, mesh


def test_mesh_factorizations_are_every_divisor_pair():
    assert factorizations(6) == [(1, 6), (2, 3)]
    assert factorizations(48) == [(1, 48), (2, 24), (3, 16), (4, 12), (6, 8)]
    assert factorizations(30) == [(1, 30), (2, 15), (3, 10), (5, 6)]


def _kinds(pcg):
    return collections.Counter(n.kind for _, n in pcg)


def test_big_batch_small_weights_is_data_parallel():
    pcg = mlp(65536, [256, 256, 256])
    sol = solve(pcg, cluster(1, 8), CostConfig())
    matmuls = [o for i, o in sol.choice.items() if isinstance(pcg.nodes[i].op, MatMulAttrs)]
    assert all(o.degrees == (8, 1) and o.contracted == 1 for o in matmuls)


def test_small_batch_big_weights_is_megatron_column_then_row():
    pcg = mlp(8, [4096, 4096, 4096], relu=True)
    sol = solve(pcg, cluster(1, 8), CostConfig())
    first, second = (sol.choice[i] for i, n in pcg if isinstance(n.op, MatMulAttrs))
    assert first.degrees == (1, 8) and first.contracted == 1          # columns
    assert second.degrees == (1, 1) and second.contracted == 8        # rows: partial sums
    assert sum(isinstance(n.op, ReductionAttrs) for _, n in sol.pcg) == 1   # one all-reduce for the pair


def test_tp_inside_nodes_dp_across_is_found_for_any_factorization():
    """8192-wide layers at batch 384 on 8 nodes of 6 (48 = 8 x 6): neither pure strategy wins."""
    pcg = mlp(384, [8192, 8192, 8192, 8192])
    c = cluster(8, 6, inter="12.5 GB/s", intra="50 GB/s", flops="15.7 TFLOP/s", capacity="16 GiB")
    sol = solve(pcg, c, CostConfig())
    matmuls = [sol.choice[i] for i, n in pcg if isinstance(n.op, MatMulAttrs)]
    assert any(o.degrees[0] > 1 and (o.degrees[1] > 1 or o.contracted > 1) for o in matmuls), matmuls


def test_embedding_table_is_split_and_so_is_the_dense_layer():
    pcg = embedding(65536, 2_000_000, 64, 512)
    sol = solve(pcg, cluster(1, 8), CostConfig())
    lookup = next(sol.choice[i] for i, n in pcg if isinstance(n.op, GatherAttrs))
    dense = next(sol.choice[i] for i, n in pcg if isinstance(n.op, MatMulAttrs))
    table = lookup.inputs[0]
    assert table.copy_degree == 1 and table.pieces == 8     # split 8 ways, by rows or by columns
    assert max(dense.degrees) * dense.contracted == 8     # and the dense part is split too, not replicated


def test_the_solved_graph_is_priced_like_any_plan():
    pcg = mlp(64, [1024, 1024, 1024])
    c = cluster(2, 4)
    sol = solve(pcg, c, CostConfig())
    rep = estimate(sol.pcg, default_views(sol.pcg), c, CostConfig())
    assert rep.feasible and rep.step_time > 0
    # Re-realizing the same choice gives the same graph (deterministic).
    p = build_problem(pcg, c, CostConfig(), sol.mesh)
    again = realize(p, {i: p.options[i].index(o) for i, o in sol.choice.items()})
    assert again.node_hashes == sol.pcg.node_hashes
    assert _kinds(sol.pcg)["MatMul"] == 2


def test_an_onnx_model_round_trips_through_the_solver():
    m = onnx.helper.make_model(onnx.helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])]), opset_imports=[helper.make_opsetid("", 17)])
    pcg = import_model_proto(m, ImportOptions()).pcg
    assert solve(pcg, cluster(1, 2), CostConfig()) is not None


def test_best_starts_from_the_solver_and_never_returns_less():
    """8192-wide layers at batch 384 on 8 nodes of 6: the solver's hybrid beats every baseline,
    and ``best`` keeps it (or something faster)."""
    from unity_cli.search.optimize import optimize

    pcg = mlp(384, [4096, 4096, 4096])
    c = cluster(4, 6, inter="12.5 GB/s", intra="50 GB/s", flops="15.7 TFLOP/s", capacity="16 GiB")
    res = optimize(pcg, c, CostConfig(), "best", max_candidates=20)
    sol = solve(pcg, c, CostConfig())
    solved = estimate(sol.pcg, sol.views, c, CostConfig()).step_time
    assert res.chosen.report.step_time <= solved * (1 + 1e-9)
    assert all(res.chosen.report.step_time <= cand.report.step_time * (1 + 1e-9) for cand in res.candidates.values())


@pytest.mark.parametrize("seed", range(12))
def test_dropping_dominated_options_keeps_the_optimum(seed):
    """Random cost tables with ties and dominated rows (small integers): the optimum over
    the pruned problem is the brute-force optimum of the whole one, memory included."""
    from unity_cli.search.solver import Problem, prune_dominated

    rng = np.random.default_rng(seed)
    nodes = tuple(range(5))
    k = {i: int(rng.integers(1, 6)) for i in nodes}
    pairs = [(0, 1), (1, 2), (0, 3), (3, 4), (2, 4)] + ([(1, 4)] if seed % 2 else [])
    edges = tuple((u, v, rng.integers(0, 4, size=(k[u], k[v])).astype(float)) for u, v in pairs)
    if seed % 3 == 0:   # an impossible resharding
        edges[0][2][0, 0] = np.inf
    mem = {i: tuple(float(x) for x in rng.integers(0, 3, size=k[i])) for i in nodes}
    held = tuple(rng.integers(0, 2, size=t.shape).astype(float) for _, _, t in edges) if seed % 2 else None
    p = Problem(None, 4, nodes, {i: (None,) * k[i] for i in nodes},
                {i: tuple(float(x) for x in rng.integers(0, 4, size=k[i])) for i in nodes}, mem, edges,
                capacity=float(rng.integers(2, 8)), edge_memory=held)
    want = brute_force(p)
    got = solve_problem(p)
    if want is None:
        assert got is None
        return
    assert got is not None and p.fits(got)
    assert p.objective(got) == pytest.approx(want[0])
    q, kept = prune_dominated(p)
    assert all(len(kept[i]) == len(q.options[i]) >= 1 for i in nodes)


def test_pruning_shrinks_a_real_problem():
    """A five-layer MLP on a 2 x 4 mesh: many options are dominated (replicas that cost more
    and save nothing), so the integer program is much smaller."""
    from unity_cli.search.solver import prune_dominated

    pcg = mlp(64, [256, 1024, 256, 1024, 256])
    p = build_problem(pcg, cluster(1, 8), CostConfig(), (2, 4))
    q, _ = prune_dominated(p)
    before = sum(len(o) for o in p.options.values())
    after = sum(len(o) for o in q.options.values())
    assert after < before
    got = solve_problem(p)
    assert p.objective(got) == pytest.approx(p.objective(_solve_whole(p)), rel=1e-9)


def _solve_whole(p):
    from unity_cli.search.solver import _solve_milp
    return _solve_milp(p)


def test_solving_both_ends_of_the_sync_price_finds_what_the_simulation_prefers(monkeypatch):
    """BERT-tiny on 8 A100s: charged the weight sync in full (the additive objective cannot
    see what the simulation runs side by side), the solver passes over data parallelism for
    a plan the simulation prices slower; solved at both ends it is no slower than data
    parallelism."""
    from pathlib import Path

    from unity_cli.cluster import load_cluster
    from unity_cli.onnx_import import import_model
    from unity_cli.search import solver
    from unity_cli.search.baselines import data_parallel

    repo = Path(__file__).resolve().parents[2]
    pcg = import_model(repo / "examples" / "bert_tiny.onnx", ImportOptions()).pcg
    c = load_cluster(repo / "cluster_specs" / "dgx-a100-8.yaml")
    dp = data_parallel(pcg, c).pcg
    dp_time = estimate(dp, default_views(dp), c, CostConfig()).step_time

    def simulated(weights):
        monkeypatch.setattr(solver, "SYNC_WEIGHTS", weights)
        sol = solve(pcg, c, CostConfig(), grouped=False)    # every operator on every device
        return estimate(sol.pcg, sol.views, c, CostConfig()).step_time

    both = solver.SYNC_WEIGHTS
    assert simulated((1.0,)) > dp_time * 1.005         # the mispricing this guards against
    assert simulated(both) <= dp_time * (1 + 1e-9)


def test_memory_that_cannot_fit_is_refused_before_any_search():
    """Memory adds up over operators, so when even each one's leanest option overflows,
    no assignment fits; one byte more room than that sum and one does."""
    pcg = mlp(8, [64, 64])
    p = build_problem(pcg, cluster(1, 2), CostConfig(), (1, 2))
    leanest = p.fixed + sum(min(p.node_memory[i]) for i in p.nodes)
    tight = dataclasses.replace(p, capacity=leanest - 1)
    assert solve_problem(tight) is None
    room = dataclasses.replace(p, capacity=leanest)
    choice = solve_problem(room)
    assert choice is not None and room.fits(choice)


def _whole_price(cl, config, source, target, kind, grad):
    """A resharding priced at its real sizes, as the cost model prices any graph: the oracle
    of the solver's pricing at unit sizes."""
    from unity_cli.cost.memory import outputs_held
    from unity_cli.cost.model import CostContext, node_cost
    from unity_cli.ir.ops.elementwise import UnaryAttrs
    from unity_cli.ir.ops.sources import InputAttrs, WeightAttrs
    from unity_cli.ir.pcg import GraphBuilder
    from unity_cli.search.reshard import reshard
    from unity_cli.search.solver import Tensor

    b = GraphBuilder()
    if kind is Tensor.ACTIVATION:
        op = WeightAttrs(source.logical, True) if grad else InputAttrs(source.logical)
        x = b.add1(UnaryAttrs("Identity"), [b.add(op, (), "x", outputs=[source])[0]], "producer")
    else:
        x = b.add1(WeightAttrs(source.logical, kind is Tensor.WEIGHT), (), "w")
    first = len(b.nodes)
    pcg = b.build([reshard(b, x, target)])
    ctx = CostContext.of(pcg, cl, config)
    views = default_views(pcg)
    costs = [node_cost(ctx, i, views) for i in range(first, len(pcg))]
    seconds = sum(c.compute_fwd + c.compute_bwd + c.comm_fwd + c.comm_bwd + c.grad_sync for c in costs)
    if kind is not Tensor.ACTIVATION:
        return seconds, 0.0
    devs = [views[i].devices(n.outputs[0]) for i, n in pcg]
    return seconds, float(outputs_held(pcg, devs, range(first, len(pcg)), config, cl.num_devices).max())


def _profile(per_node: int):
    """A profile of the test cluster's GPUs: measured links, collective fits at a node's
    group size (their alpha-beta not the links'), and a call overhead per phase."""
    from unity_cli.cost.profile import Profile

    fit = {"ranks": per_node, "alpha_s": 9e-6, "beta_s_per_byte": 3e-12, "samples": []}
    links = {kind: {"latency_s": lat, "bandwidth_Bps": bw, "samples": []}
             for kind, lat, bw in (("intra-node", 3e-6, 2e11), ("inter-node", 8e-6, 2e10))}
    return Profile.from_json({
        "format": "unity-profile/1", "machine": {}, "settings": {}, "compute": {},
        "comm": {"device_type": "gpu", "device_kind": "gpu", "ranks": per_node, "hosts": 1, "links": links,
                 "collectives": {k: {"intra-node": fit} for k in ("all-reduce", "all-gather", "broadcast")},
                 "call_overhead_s": {"fwd": 1e-5, "bwd": 2e-5, "sync": 4e-5}}})


@pytest.mark.parametrize("profiled", [False, True], ids=["roofline", "profiled"])
@pytest.mark.parametrize("nodes,per_node", [(1, 4), (2, 3), (1, 6)])
def test_a_resharding_priced_at_its_unit_sizes_costs_what_it_costs_whole(nodes, per_node, profiled):
    """The solver prices each resharding's moves once at the least sizes that keep its
    splits even and scales their bytes: on random layouts (dims split, partial sums,
    replicas; activations and weights), with the spec's links or a profile's (fits of the
    collectives, call overheads), the time and the memory equal the cost model's pricing
    of the whole-size graph, and the scaling did happen (the unit is smaller). The last
    dim is never split: the unit leaves it out, as it does every dim past the first that
    neither layout splits."""
    from unity_cli.ir.shapes import ParallelTensorShape
    from unity_cli.search.reshard import unit_layouts
    from unity_cli.search.solver import Tensor, _Pricer

    cl = cluster(nodes, per_node)
    config = CostConfig(profile=_profile(per_node)) if profiled else CostConfig()
    n = cl.num_devices
    rng = np.random.default_rng(nodes * 10 + per_node)
    sizes = (48, 36, 10, 5)

    def layout():
        while True:
            degrees = tuple(int(rng.choice([g for g in (1, 2, 3, 4, 6) if s % g == 0 and g <= n])) for s in sizes)
            rest = n // int(np.prod(degrees)) if n % int(np.prod(degrees)) == 0 else 0
            if rest:
                sums = int(rng.choice([g for g in (1, 2, 3) if rest % g == 0]))
                return ParallelTensorShape.of(sizes, degrees, sum_degree=sums, copy_degree=rest // sums)

    checked = differs = 0
    for _ in range(40):
        source, target = layout(), layout()
        kind = Tensor.ACTIVATION if rng.random() < 0.7 else Tensor.WEIGHT
        if kind is Tensor.WEIGHT:
            source = ParallelTensorShape.of(sizes, (1, 1, 1, 1))
            target = target.with_replicas(sum_degree=1, copy_degree=target.sum_degree * target.copy_degree)
        grad = bool(rng.random() < 0.8)
        got = _Pricer(cl, config).priced(source, target, kind, grad)
        try:
            want = _whole_price(cl, config, source, target, kind, grad)
        except ShapeError:    # no resharding reaches it (partial sums from none)
            assert got == (math.inf, math.inf)
            continue
        assert got[0] == pytest.approx(want[0], rel=1e-12, abs=0), (source, target, kind)
        assert got[1] == want[1], (source, target, kind)
        checked += unit_layouts(source, target)[2] > 1 and want[0] > 0
        if profiled:   # the profile's prices are the ones in play
            differs += got[0] != _Pricer(cl, CostConfig()).priced(source, target, kind, grad)[0]
    assert checked >= 10
    assert differs >= 10 if profiled else differs == 0


def test_a_rewrite_prices_only_what_it_touched():
    """The outer search's incremental re-solve: solving a rewritten graph with the run's
    shared tables (``Tables``) prices only the operator and edges the rewrite made, on each
    mesh; everything else is looked up. The answer is the one a solve from empty tables
    gives."""
    from unity_cli.ir.simplify import simplify
    from unity_cli.search.solver import Tables
    from unity_cli.substitutions.cache import load_cache
    from unity_cli.substitutions.match import apply_match, find_matches

    c = cluster(1, 4, flops="13.7 TFLOP/s")     # priced by no other test: its shared tables start empty
    pcg = mlp(16, [32, 40, 48, 56, 64, 72])
    t = Tables(c, CostConfig())
    t.nodes.clear(), t.edges.clear()
    solve(pcg, c, CostConfig(), tables=t, grouped=False)
    nodes, edges = len(t.nodes), len(t.edges)
    rule = next(r for r in load_cache().rules if r.name == "matmul-relu-fused")
    new = simplify(apply_match(pcg, find_matches(pcg, rule)[1]))
    got = solve(new, c, CostConfig(), tables=t, grouped=False)
    meshes = len(factorizations(c.num_devices))
    assert len(t.nodes) - nodes == meshes                 # the fused operator, once per mesh
    assert 0 < len(t.edges) - edges <= 2 * meshes        # the edges into and out of it
    assert nodes >= 8 * meshes                            # (the first solve priced every layer)
    t.nodes.clear(), t.edges.clear()
    fresh = solve(new, c, CostConfig(), tables=t, grouped=False)
    assert got.objective == fresh.objective and got.pcg.canonical_hash == fresh.pcg.canonical_hash
