"""Variable elimination (the solver's dynamic program) and its Lagrangian memory search,
against brute force over every assignment."""
import itertools
from dataclasses import replace

import numpy as np
import pytest

from unity_cli.search import solver
from unity_cli.search.elimination import Elimination, TooWide, minimize
from unity_cli.search.solver import Problem, brute_force, solve_problem


def _random(seed: int, n_max: int = 7):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, n_max))
    sizes = {v: int(rng.integers(1, 5)) for v in range(n)}
    unary = {v: rng.integers(0, 6, size=sizes[v]).astype(float) for v in range(n)}
    pairs = []
    for _ in range(int(rng.integers(0, 2 * n + 2))):
        u, v = int(rng.integers(n)), int(rng.integers(n))    # self-loops and parallel edges too
        t = rng.integers(0, 6, size=(sizes[u], sizes[v])).astype(float)
        if rng.random() < 0.2:
            t[0, 0] = np.inf
        pairs.append((u, v, t))
    return sizes, unary, pairs


def _objective(unary, pairs, x):
    return sum(unary[v][x[v]] for v in unary) + sum(t[x[u], x[v]] for u, v, t in pairs)


@pytest.mark.parametrize("seed", range(80))
def test_elimination_equals_brute_force(seed):
    sizes, unary, pairs = _random(seed)
    want = min(_objective(unary, pairs, dict(enumerate(x)))
               for x in itertools.product(*(range(sizes[v]) for v in sorted(sizes))))
    value, x = minimize(sizes, unary, pairs)
    assert value == want
    assert set(x) == set(sizes) and all(0 <= x[v] < sizes[v] for v in sizes)
    assert _objective(unary, pairs, x) == value


def test_elimination_refuses_a_table_past_its_limit():
    """A clique of five with three options each: eliminating any variable needs a table over
    the other four (81 entries)."""
    sizes = {v: 3 for v in range(5)}
    pairs = [(u, v, np.zeros((3, 3))) for u, v in itertools.combinations(range(5), 2)]
    unary = {v: np.zeros(3) for v in sizes}
    with pytest.raises(TooWide):
        minimize(sizes, unary, pairs, limit=80)
    assert minimize(sizes, unary, pairs, limit=81)[0] == 0.0


def test_elimination_of_a_long_chain_is_linear():
    """A chain of 2000 variables of 20 options (Viterbi): tables never exceed 20 x 20."""
    rng = np.random.default_rng(0)
    n, k = 2000, 20
    sizes = {v: k for v in range(n)}
    unary = {v: rng.random(k) for v in range(n)}
    pairs = [(v, v + 1, rng.random((k, k))) for v in range(n - 1)]
    value, x = minimize(sizes, unary, pairs, limit=k)
    assert value == pytest.approx(_objective(unary, pairs, x))


def _memory_problem(seed: int) -> Problem:
    rng = np.random.default_rng(1000 + seed)
    nodes = tuple(range(6))
    k = {i: int(rng.integers(1, 5)) for i in nodes}
    pairs = [(0, 1), (1, 2), (2, 3), (0, 4), (4, 5), (3, 5)] + ([(1, 5)] if seed % 2 else [])
    edges = tuple((u, v, rng.integers(0, 5, size=(k[u], k[v])).astype(float)) for u, v in pairs)
    # Memory against cost: the cheap options are the big ones, so the bound binds.
    cost = {i: tuple(float(x) for x in rng.integers(0, 6, size=k[i])) for i in nodes}
    mem = {i: tuple(float(6 - c + rng.integers(0, 3)) for c in cost[i]) for i in nodes}
    # Half of them hold resharding buffers on their edges too (the solver's edge memory).
    held = tuple(rng.integers(0, 3, size=t.shape).astype(float) for _, _, t in edges) if seed % 4 in (1, 2) else None
    p = Problem(None, 4, nodes, {i: (None,) * k[i] for i in nodes}, cost, mem, edges, capacity=np.inf,
                edge_memory=held)
    _, free = minimize(k, cost, edges)
    least = sum(min(mem[i]) for i in nodes)
    used = p.memory(free)
    # Between the least memory any assignment needs and what the free optimum uses (one in
    # eight below the least: none fits).
    capacity = least - 1 if seed % 8 == 7 else least + float(rng.random()) * (used - least)
    return replace(p, capacity=capacity)


@pytest.mark.parametrize("seed", range(40))
def test_priced_memory_fits_and_is_right_when_it_says_so(seed):
    """The Lagrangian search returns an assignment that fits whenever one exists; when it
    claims optimality (its bound met), it equals brute force."""
    p = _memory_problem(seed)
    want = brute_force(p)
    plan = Elimination({i: len(p.options[i]) for i in p.nodes}, [(u, v) for u, v, _ in p.edges])
    got, proved = solver._priced_memory(p, plan)
    if want is None:
        assert got is None
        return
    assert got is not None and p.fits(got)
    assert p.objective(got) >= want[0] - 1e-9
    if proved:
        assert p.objective(got) == pytest.approx(want[0])


@pytest.mark.parametrize("seed", range(40))
def test_solve_problem_is_exact_when_memory_binds(seed, monkeypatch):
    """Small programs go to the integer program when the Lagrangian bound does not close:
    exact. With the integer program switched off, the answer still fits and is never
    below the optimum."""
    p = _memory_problem(seed)
    want = brute_force(p)
    got = solve_problem(p)
    if want is None:
        assert got is None
        return
    assert p.fits(got) and p.objective(got) == pytest.approx(want[0])
    monkeypatch.setattr(solver, "MILP_VARIABLES", 0)
    got = solve_problem(p)
    assert got is not None and p.fits(got) and p.objective(got) >= want[0] - 1e-9
