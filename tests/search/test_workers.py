"""The search's lists on the machine's cores (``search/workers.py``): the answer is the serial
one, item for item, whatever runs where; the solver's tables come back to the parent; errors
come back as themselves."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
from ir.test_blocks import deep

from unity_cli.cluster import load_cluster
from unity_cli.cost import model as cost_model
from unity_cli.cost.model import CostConfig, Optimizer
from unity_cli.errors import ShapeError
from unity_cli.ir import DType
from unity_cli.ir.recompute import Recompute
from unity_cli.search import workers
from unity_cli.search.solver import Tables, solve
from unity_cli.search.step import optimize_step
from unity_cli.search.uniform import best_uniform
from unity_cli.search.workers import fork_map

CONFIG = CostConfig(DType.FLOAT32, Optimizer.ADAM)
forks = pytest.mark.skipif(workers.workers() < 2, reason="one core: every list runs in the calling process")


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


@forks
def test_items_come_back_in_order_from_other_processes():
    got = fork_map(_square_and_pid, list(range(12)))
    assert [v for v, _ in got] == [x * x for x in range(12)]
    assert any(pid != os.getpid() for _, pid in got)
    assert all(pid == os.getpid() for _, pid in fork_map(_square_and_pid, list(range(4)), worth=False))


def test_the_cap_and_a_worker_run_the_list_here(monkeypatch):
    monkeypatch.setenv(workers.WORKERS_ENV, "1")
    assert workers.workers() == 1
    assert all(pid == os.getpid() for _, pid in fork_map(_square_and_pid, list(range(4))))
    monkeypatch.setenv(workers.WORKERS_ENV, "not a number")       # ignored, as unset
    assert workers.workers() >= 1


@forks
def test_a_worker_does_not_fork_again():
    def inner(x: int) -> tuple[int, list[int]]:
        return os.getpid(), [pid for _, pid in fork_map(_square_and_pid, [x, x + 1])]
    for pid, inner_pids in fork_map(inner, [1, 2, 3]):
        assert inner_pids == [pid, pid]


def _fails(x: int) -> int:
    if x == 2:
        raise ShapeError(f"item {x} has no shape")
    return x


@forks
def test_an_error_in_a_worker_is_raised_here_as_itself():
    with pytest.raises(ShapeError, match="item 2 has no shape"):
        fork_map(_fails, [0, 1, 2, 3])


def _same_solution(a, b) -> None:
    assert (a is None) == (b is None)
    if a is None:
        return
    assert a.pcg.node_hashes == b.pcg.node_hashes and a.mesh == b.mesh and a.views == b.views
    assert a.objective == b.objective and a.step_time == b.step_time and a.choice == b.choice


@forks
@pytest.mark.parametrize("family,cluster", [("llama", "local-cpu:4"), ("gpt", "summit-192:12")])
def test_the_meshes_solved_side_by_side_are_the_serial_solution(tmp_path, monkeypatch, family, cluster):
    pcg, c = deep(tmp_path, family, 2, 4), load_cluster(cluster)
    config = replace(CONFIG, memory_limit=10**12)
    cost_model._tables.cache_clear()        # cold tables (they are shared by every solve of a config)
    serial_tables = Tables(c, config)
    serial = solve(pcg, c, config, tables=serial_tables)
    monkeypatch.setattr(workers, "PARALLEL_DEVICES", 2)
    cost_model._tables.cache_clear()
    tables = Tables(c, config)
    assert not tables.edges and tables.edges is not serial_tables.edges
    got = solve(pcg, c, config, tables=tables)
    _same_solution(serial, got)
    # what the workers priced came back: the run's tables hold what the serial run's do
    for mine, theirs in zip(tables._shared(), serial_tables._shared(), strict=True):
        assert set(mine) == set(theirs) and mine
    assert all((tables.edges[k][0] == v[0]).all() for k, v in serial_tables.edges.items())


@forks
def test_the_uniform_configurations_priced_side_by_side_are_the_serial_row(tmp_path, monkeypatch):
    batch = 4
    made = {k: deep(tmp_path, "llama", 6, batch // k) for k in (1, 2, 4)}
    c = load_cluster("local-cpu:4")
    modes = ((Recompute.NONE, 0), (Recompute.FULL, None))
    serial = best_uniform(made.__getitem__, batch, c, CONFIG, (0, 3), modes=modes)
    monkeypatch.setattr(workers, "PARALLEL_DEVICES", 2)
    got = best_uniform(made.__getitem__, batch, c, CONFIG, (0, 3), modes=modes)
    assert serial is not None and got is not None
    assert "shortened graph" in got.row.baseline.description
    assert got.training == serial.training and got.row.baseline.description == serial.row.baseline.description
    assert [t.report.step_time for t in got.tried] == [t.report.step_time for t in serial.tried]
    assert got.row.report.step_time == serial.row.report.step_time


@forks
def test_the_step_search_side_by_side_is_the_serial_plan(tmp_path, monkeypatch):
    """The whole search of a graph of repeated blocks (the uniform configurations, the
    meshes, the groupings, the rows lengthened and priced whole) spread over workers gives
    the serial run's plan and rows."""
    batch = 4
    made = {k: deep(tmp_path, "llama", 6, batch // k) for k in (1, 2, 4)}
    c = load_cluster("local-cpu:4")

    def search():
        cost_model._tables.cache_clear()
        result, k = optimize_step(made.__getitem__, batch, c, CONFIG, max_candidates=5)
        rows = {name: (cand.baseline.pcg.node_hashes, cand.views, cand.report.step_time)
                for name, cand in result.candidates.items()}
        return k, result.chosen.baseline.pcg.node_hashes, result.chosen.views, result.chosen.report.step_time, rows

    serial = search()
    monkeypatch.setattr(workers, "PARALLEL_DEVICES", 2)
    assert search() == serial
