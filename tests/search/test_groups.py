"""Parallel branches on disjoint device groups (``search/groups.py``): the groupings split
the devices as described, each grouping's program is solved exactly, the solver keeps one
only where the step simulation finds it faster, and weight-heavy towers at a small batch
come out on their own devices, faster than every plan that puts every operator everywhere."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cost.test_moves import assert_bytes_equal
from onnx import TensorProto, helper, numpy_helper
from search.test_solver import _model, branches, cluster, mlp

from unity_cli.cluster import load_cluster
from unity_cli.cost.model import CostConfig, estimate
from unity_cli.ir.simplify import simplify
from unity_cli.search.baselines import STRATEGIES, hybrid, hybrid_degrees
from unity_cli.search.groups import group_ranges, groupings, rewritten_views
from unity_cli.search.mapping import Resources
from unity_cli.search.mesh import Mesh
from unity_cli.search.solver import brute_force, build_problem, factorizations, realize, solve, solve_problem
from unity_cli.search.views import default_views
from unity_cli.substitutions.cache import load_cache
from unity_cli.substitutions.match import apply_match, find_matches

REPO = Path(__file__).resolve().parents[2]


def towers(batch: int, width: int, count: int = 2, depth: int = 1, widths: tuple[int, ...] = (), relu: bool = False):
    """``count`` MLP towers of ``depth`` MatMuls (each with a Relu) on one input,
    concatenated, then a head."""
    rng = np.random.default_rng(3)
    widths = widths or (width,) * count
    nodes, inits, outs = [], [], []
    for t, w in enumerate(widths):
        x = "x"
        for k in range(depth):
            inits.append(numpy_helper.from_array(rng.standard_normal((width if k == 0 else w, w)).astype(np.float32),
                                                 f"w{t}_{k}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{t}_{k}"], [f"h{t}_{k}"], name=f"tower{t}.{k}"))
            x = f"h{t}_{k}"
            if relu:
                nodes.append(helper.make_node("Relu", [x], [f"r{t}_{k}"], name=f"tower{t}.relu{k}"))
                x = f"r{t}_{k}"
        outs.append(x)
    nodes.append(helper.make_node("Concat", outs, ["c"], axis=1, name="cat"))
    inits.append(numpy_helper.from_array(rng.standard_normal((sum(widths), 4)).astype(np.float32), "head"))
    nodes.append(helper.make_node("MatMul", ["c", "head"], ["y"], name="head"))
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])])


def _ranges(pcg, g) -> dict[str, Resources]:
    return {pcg.nodes[i].name: r for i, r in g.ranges}


def test_two_towers_split_the_devices_in_halves_and_by_work():
    pcg = towers(8, 64, widths=(64, 192))
    c = cluster(1, 8)
    gs = groupings(pcg, c)
    halves = next(g for g in gs if g.depth == 1 and not g.balanced)
    by_work = next(g for g in gs if g.depth == 1 and g.balanced)
    assert _ranges(pcg, halves) == {"tower0.0": Resources(0, 4), "tower1.0": Resources(4, 4)}
    assert _ranges(pcg, by_work) == {"tower0.0": Resources(0, 2), "tower1.0": Resources(2, 6)}   # 1 : 3
    # What is not a branch (the join, the head) keeps every device.
    assert all(pcg.nodes[i].name.startswith("tower") for g in gs for i, _ in g.ranges)


def test_four_towers_nest_and_a_split_keeps_node_boundaries():
    pcg = towers(12, 32, count=4)
    c = cluster(2, 6)
    gs = {(g.depth, g.balanced): _ranges(pcg, g) for g in groupings(pcg, c)}
    assert gs[(1, False)] == {"tower0.0": Resources(0, 6), "tower1.0": Resources(0, 6),
                              "tower2.0": Resources(6, 6), "tower3.0": Resources(6, 6)}
    assert gs[(2, False)] == {"tower0.0": Resources(0, 3), "tower1.0": Resources(3, 3),
                              "tower2.0": Resources(6, 3), "tower3.0": Resources(9, 3)}
    # Deeper than the graph nests gives nothing new: no grouping twice.
    assert len(groupings(pcg, c)) == len({tuple(g.ranges) for g in groupings(pcg, c)})


def test_a_chain_or_one_device_has_no_grouping():
    assert groupings(mlp(8, [16, 16, 16]), cluster(1, 4)) == []
    assert groupings(towers(8, 16), cluster(1, 1)) == []


@pytest.mark.parametrize("mesh,count,want", [((2, 4), 4, (2, 2)), ((1, 8), 4, (1, 4)), ((2, 3), 3, (1, 3)),
                                              ((6, 8), 24, (6, 4)), ((4, 4), 1, (1, 1))])
def test_a_group_keeps_what_it_can_of_the_first_mesh_axis(mesh, count, want):
    assert Mesh(*mesh).sub(count) == want


SMALL = [("towers", lambda: towers(6, 12)), ("towers2", lambda: towers(6, 6, depth=2)),
         ("towers3", lambda: towers(12, 6, count=3)), ("branches", lambda: branches(6, 12))]
CLUSTERS = [(1, 2), (1, 4), (1, 6), (2, 3), (2, 2)]


@pytest.mark.parametrize("name,make", SMALL, ids=[s[0] for s in SMALL])
@pytest.mark.parametrize("shape", CLUSTERS, ids=[f"{a}x{b}" for a, b in CLUSTERS])
def test_each_grouping_is_solved_exactly_and_its_memory_is_counted(name, make, shape):
    """Every grouping on every mesh (operators on their group's sub-mesh): the solver's
    optimum is brute force's, and its memory count is never below the busiest device's
    once the branches are on their groups."""
    pcg = make()
    c = cluster(*shape)
    gs = groupings(pcg, c)
    assert gs
    for g in gs:
        for mesh in factorizations(c.num_devices):
            meshes = {i: Mesh(*mesh).sub(r.count) for i, r in g.ranges}
            p = build_problem(pcg, c, CostConfig(), mesh, meshes=meshes)
            assert all(p.options[i][0].outputs[0].pieces <= r.count for i, r in g.ranges)
            want, got = brute_force(p), solve_problem(p)
            assert want is not None and got is not None
            assert p.objective(got) == pytest.approx(want[0], rel=1e-9, abs=1e-15), (g.name, mesh)
            solved = realize(p, got)
            ranges = group_ranges(pcg, g, solved)
            assert ranges is not None
            views = default_views(solved, ranges)
            rep = estimate(solved, views, c, CostConfig())
            assert p.memory(got) >= max(rep.memory)
            # every compute operator runs inside its range
            for i, n in solved:
                if ranges[i] is not None and not n.spec.is_parallel_op and not n.spec.is_source:
                    start, count = ranges[i]
                    assert all(start <= d < start + count for d in views[i].devices(n.outputs[0]))


@pytest.mark.parametrize("name,make", SMALL, ids=[s[0] for s in SMALL])
@pytest.mark.parametrize("shape", [(1, 4), (2, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_grouping_is_kept_only_where_faster(name, make, shape):
    pcg = make()
    c = cluster(*shape)
    flat = solve(pcg, c, CostConfig(), grouped=False)
    sol = solve(pcg, c, CostConfig())
    t_flat = estimate(flat.pcg, flat.views, c, CostConfig()).step_time
    t = estimate(sol.pcg, sol.views, c, CostConfig()).step_time
    assert t <= t_flat * (1 + 1e-12)
    if sol.grouping is None:
        assert sol.views == default_views(sol.pcg)
    else:
        assert t < t_flat


@pytest.mark.parametrize("shape", [(1, 2), (1, 6), (5, 6), (2, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_weight_heavy_towers_run_on_their_own_devices(shape):
    """Four 2048-wide towers at batch 24: every operator on every device syncs (or
    all-reduces the activations of) every tower's weights on every device; on their own
    groups each device handles one tower's. The solver finds it, and it beats every
    baseline and uniform tp x dp hybrid priced by the same model."""
    c = cluster(*shape)
    pcg = towers(24 * c.num_devices // 2, 2048, count=4, depth=2)
    sol = solve(pcg, c, CostConfig())
    assert sol.grouping is not None
    t = estimate(sol.pcg, sol.views, c, CostConfig()).step_time
    devices = {}
    for i, n in sol.pcg:
        if n.name.startswith("tower") and not n.spec.is_parallel_op:
            devices.setdefault(n.name.split(".")[0], set()).update(sol.views[i].devices(n.outputs[0]))
    assert len(devices) == 4
    sets = list(devices.values())
    assert any(a.isdisjoint(b) for k, a in enumerate(sets) for b in sets[k + 1:])
    flat = solve(pcg, c, CostConfig(), grouped=False)
    others = [estimate(flat.pcg, flat.views, c, CostConfig()).step_time]
    for build in STRATEGIES.values():
        g = build(pcg, c).pcg
        others.append(estimate(g, default_views(g), c, CostConfig()).step_time)
    for tp, dp in hybrid_degrees(c.num_devices, 24 * c.num_devices // 2):
        g = hybrid(pcg, tp, dp).pcg
        others.append(estimate(g, default_views(g), c, CostConfig()).step_time)
    assert t < min(others)


def _devices(pcg, views, i):
    return set(views[i].devices(pcg.nodes[i].outputs[0]))


@pytest.mark.parametrize("shape", [(1, 4), (2, 3)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_a_rewrite_of_a_grouped_plan_keeps_its_groups(shape):
    """An activation fused into its product after the solver put the towers on their own
    devices (as the search's polish and fuse_activations do): every operator the rewrite
    kept stays on its devices, the fused one runs inside its tower's group, and the bytes
    each device sends are still the bytes predicted. A plan on the default views gets the
    default views."""
    c = cluster(*shape)
    pcg = towers(24 * c.num_devices // 2, 2048, count=4, depth=2, relu=True)
    sol = solve(pcg, c, CostConfig())
    assert sol.grouping is not None
    (rule,) = [r for r in load_cache().rules if r.name == "matmul-relu-fused"]
    matches = find_matches(sol.pcg, rule)
    assert matches
    for m in matches:
        new = simplify(apply_match(sol.pcg, m, check=False))
        views = rewritten_views(new, sol.pcg, sol.views, c.num_devices)
        old = {n.name: _devices(sol.pcg, sol.views, i) for i, n in sol.pcg if n.name}
        for i, n in new:
            if n.spec.is_source or n.spec.is_parallel_op:
                continue
            if n.name:
                assert _devices(new, views, i) == old[n.name], n.name
            else:    # the fused product: in the group of the tower it belongs to
                tower = {d for name, devs in old.items() if name.startswith(sol.pcg.nodes[m.root].name.split(".")[0])
                         for d in devs}
                assert _devices(new, views, i) <= tower
        assert_bytes_equal(new, views, c.num_devices)
    flat = solve(pcg, c, CostConfig(), grouped=False)
    new = simplify(apply_match(flat.pcg, find_matches(flat.pcg, rule)[0], check=False))
    assert rewritten_views(new, flat.pcg, flat.views, c.num_devices) is None      # the default views, then


def test_the_search_keeps_its_best_on_the_default_views_apart():
    """Beside its best, the joint search keeps the fastest candidates it priced under the
    default views, distinct graphs, fastest first (optimize lays those out by the
    machine-mapping DP too, which can split a parallel region's devices as well): a
    grouped start is priced under the solver's views and never becomes one."""
    from unity_cli.search.joint import FINALISTS, JointSearch

    c = cluster(1, 4)
    pcg = towers(48, 2048, count=4, depth=2, relu=True)
    sol = solve(pcg, c, CostConfig())
    assert sol.grouping is not None
    flat = solve(pcg, c, CostConfig(), grouped=False)
    rules = [r for r in load_cache().rules if r.is_fusion]
    search = JointSearch(c, CostConfig(), rules, max_candidates=12, placed={sol.pcg.node_hashes: sol.views})
    best = search.run([("grouped", sol.pcg, ()), ("flat", flat.pcg, ())])
    kept = search.finalists
    assert best.views != default_views(best.pcg) and best.report.step_time <= sol.step_time
    assert 1 <= len(kept) <= FINALISTS and all(f.views == default_views(f.pcg) for f in kept)
    assert len({f.pcg.node_hashes for f in kept}) == len(kept)
    assert [f.report.step_time for f in kept] == sorted(f.report.step_time for f in kept)
    assert kept[0].report.step_time <= estimate(flat.pcg, default_views(flat.pcg), c, CostConfig()).step_time


def test_the_mapping_dp_lays_out_more_than_the_walks_best():
    """The walk prices graphs on the default views, where Inception-tiny's graph with its
    two 1x1 reductions fused and the unfused one are 0.00001 ms apart at 32 GPUs; laid out
    by the machine-mapping DP, with its branches on devices of their own, one of the
    fastest is 1.3x faster than data parallelism. Laying out only the walk's best left
    unity at data parallelism's 0.628 ms."""
    from unity_cli.onnx_import import ImportOptions, import_model
    from unity_cli.search.optimize import optimize

    pcg = import_model(REPO / "tests" / "models" / "exported" / "inception_tiny_dynamo.onnx", ImportOptions()).pcg
    c = load_cluster(REPO / "cluster_specs" / "dgx-a100-32.yaml")
    res = optimize(pcg, c, CostConfig(), "best", load_cache().rules)
    t = {k: v.report.step_time for k, v in res.candidates.items()}
    assert t["unity"] < t["data_parallel"] / 1.2


def test_every_strategy_counts_the_devices_it_uses(tiny_models):
    """The devices column (``Baseline.devices``) counts the devices a plan puts pieces on,
    after the machine-mapping DP has laid it out, not the highest device index reached:
    BERT-tiny at batch 6 on 30 devices of 6 per node puts its branches on a few of them."""
    from unity_cli.ir.machine_view import devices_used
    from unity_cli.onnx_import import ImportOptions, import_model
    from unity_cli.search.optimize import optimize

    pcg = import_model(tiny_models / "bert_tiny.onnx", ImportOptions(6)).pcg
    res = optimize(pcg, cluster(5, 6), CostConfig(), "best", load_cache().rules, max_candidates=40)
    spread = 0
    for cand in res.candidates.values():
        used = {d for i, n in cand.baseline.pcg for d in cand.views[i].devices(n.outputs[0])}
        assert cand.baseline.devices == len(used) == devices_used(cand.baseline.pcg, cand.views)
        spread += max(used) + 1 > len(used)
    assert spread      # some plan leaves devices between its groups idle (where max + 1 overcounted)
