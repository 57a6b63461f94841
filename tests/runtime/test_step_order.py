"""The step is one value: the cost model's simulation walks the same order of actions that
every rank's executor runs (``ir/recompute.node_order``; ``runtime/program.StepOrder``),
over plans drawn at random: models, ranks, tensor and data parallelism, ZeRO stages,
micro-batches and recomputation modes, and searched plans."""
from __future__ import annotations

import random

import pytest
from runtime.mpirun import small_model
from runtime.test_training_steps import cpu_spec, optimize

from unity_cli.cost.model import simulated_order
from unity_cli.ir.recompute import Action
from unity_cli.ir.schedule import layout_sources
from unity_cli.plan.config import plan_config
from unity_cli.plan.plan import load_plan
from unity_cli.runtime.program import StepOrder, build_program

MODELS = ["mlp", "bert_tiny", "convnet_tiny", "llama2-7b", "gpt3-175b"]


def _draws(n: int) -> list[tuple[str, int, str]]:
    rng = random.Random(36)
    out = []
    for _ in range(n):
        name, ranks = rng.choice(MODELS), rng.choice([2, 3, 4])
        if rng.random() < 0.25:
            strategy = "unity"
        else:
            tp = rng.choice([t for t in (1, 2, 4) if ranks % t == 0])
            strategy = (f"tp={tp},dp={ranks // tp},zero={rng.choice([0, 1, 2, 3])},mb={rng.choice([1, 2])},"
                        f"recompute={rng.choice(['none', 'selective', 'full', 'full:1', 'selective:2'])}")
        out.append((name, ranks, strategy))
    return out


def _in_steps(trace, program) -> list[tuple[Action, object]]:
    """The simulated order restricted to the program's steps (``DROP``: the steps of its segment)."""
    at = {s.node: k for k, s in enumerate(program.steps)}
    segments = [tuple(at[i] for i in seg if i in at) for seg in _segments(trace)]
    out = []
    for act, i in trace:
        if act is Action.LOSS:
            out.append((act, -1))
        elif act is Action.DROP:
            if segments[i]:
                out.append((act, segments[i]))
        elif i in at:
            out.append((act, at[i]))
    return out


def _segments(trace) -> list[tuple[int, ...]]:
    """Each segment's recomputed nodes, in node order (backward recomputes the last first)."""
    segs, run, last = [], [], None
    for act, i in trace:
        if act is Action.RECOMPUTE:
            if last is not Action.RECOMPUTE:
                run = []
                segs.append(run)
            run.append(i)
        last = act
    return [tuple(s) for s in reversed(segs)]


@pytest.mark.parametrize("name,ranks,strategy", _draws(10), ids=lambda v: str(v))
def test_the_simulation_walks_the_order_the_ranks_run(plans, tmp_path, name, ranks, strategy):
    model = small_model(plans, tmp_path, name)
    plan_path = tmp_path / "plan.json"
    optimize(model, cpu_spec(tmp_path, ranks), plan_path, 2 * ranks, "--strategy", strategy)
    plan = load_plan(plan_path)
    trace = simulated_order(plan.pcg, plan.views, plan.cluster, plan_config(plan))
    assert sum(a is Action.FORWARD for a, _ in trace) == sum(a is Action.BACKWARD for a, _ in trace) == len(plan.pcg)
    program = build_program(plan.pcg, plan.views, None)
    order = StepOrder.of(program, plan.training.recompute, plan.training.recompute_segments)
    ran = [(act, tuple(order.segments[k]) if act is Action.DROP else k) for act, k in order.actions]
    assert _in_steps(trace, program) == ran
    recomputes = [k for act, k in order.actions if act is Action.RECOMPUTE]
    assert sorted(recomputes) == sorted(k for seg in order.segments for k in seg)


def test_a_simulation_that_folds_the_recompute_into_backward_is_caught(plans, tmp_path):
    """The comparison above is not vacuous: the order without its recomputes differs."""
    model = small_model(plans, tmp_path, "llama2-7b")
    plan_path = tmp_path / "plan.json"
    optimize(model, cpu_spec(tmp_path, 2), plan_path, 4, "--strategy", "tp=2,dp=1,recompute=full")
    plan = load_plan(plan_path)
    trace = simulated_order(plan.pcg, plan.views, plan.cluster, plan_config(plan))
    program = build_program(plan.pcg, plan.views, None)
    order = StepOrder.of(program, plan.training.recompute, plan.training.recompute_segments)
    ran = [(act, tuple(order.segments[k]) if act is Action.DROP else k) for act, k in order.actions]
    folded = [(a, i) for a, i in trace if a not in (Action.RECOMPUTE, Action.DROP)]
    assert any(a is Action.RECOMPUTE for a, _ in trace)
    assert _in_steps(folded, program) != ran


@pytest.mark.parametrize("name,ranks,strategy", [("gpt3-175b", 3, "tp=1,dp=3,zero=3,mb=2,recompute=full"),
                                                 ("llama2-7b", 4, "tp=2,dp=2,zero=3,recompute=selective:1"),
                                                 ("mlp", 2, "tp=1,dp=2,zero=3")])
def test_each_zero3_gather_starts_where_the_one_before_it_is_needed(plans, tmp_path, name, ranks, strategy):
    """ZeRO-3's prefetch over the program's steps: the weights' passes gathered in the order
    they are needed, each started at the action where the one before it is needed (after
    that one's gather), none before the first; a weight gathered once for the forward pass,
    once for each segment whose recompute reads it, and once for the backward of its readers
    that are not recomputed (FSDP's)."""
    model = small_model(plans, tmp_path, name)
    plan_path = tmp_path / "plan.json"
    optimize(model, cpu_spec(tmp_path, ranks), plan_path, 2 * ranks, "--strategy", strategy)
    plan = load_plan(plan_path)
    program = build_program(plan.pcg, plan.views, None)
    order = StepOrder.of(program, plan.training.recompute, plan.training.recompute_segments)
    uses = sorted((j, n, w) for j, ws in order.first_use.items() for n, w in enumerate(ws))
    assert len(uses) >= 2
    want = {(a, w) for (a, _, _), (b, _, w) in zip(uses, uses[1:], strict=False) if a < b}
    assert {(j, w) for j, ws in order.prefetch.items() for w in ws} == want
    layout = layout_sources(plan.pcg)
    for w in {w for _, _, w in uses}:
        readers = {i for i, n in plan.pcg if layout[i] is None and any(layout[r.node] == w for r in n.inputs)}
        again = [s for s, seg in enumerate(order.segments) if readers & {program.steps[k].node for k in seg}]
        kept = readers - {program.steps[k].node for seg in order.segments for k in seg}
        assert sum(w in ws for ws in order.first_use.values()) == 1 + len(again) + bool(kept), w
        # a reader not recomputed gives the weight up after the forward pass and takes it back
        # from the backward pass's gather, where backward first reads it
        assert {program.steps[k].node for k in order.stashed.get(w, ())} == kept
        if kept:
            regain = [j for j, ws in order.regain.items() if w in ws]
            assert len(regain) == 1 and w in order.first_use[regain[0]]
            assert order.actions[regain[0]] == (Action.BACKWARD, max(order.stashed[w]))
