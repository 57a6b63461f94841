"""``MemoryTable`` reads its busiest moment two ways: by part (``at``, what the report shows)
and as sums for every count of segments recomputed at once (``totals``, what the search
checks a step's fit with). They must agree on every table, not only on the graphs tests build."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from unity_cli.cost.memory import MEMORY_PARTS, MemoryTable, Scratch

PARTS = len(MEMORY_PARTS)


def _bytes(draw, shape):
    return np.array(draw(st.lists(st.integers(0, 1000), min_size=int(np.prod(shape)),
                                  max_size=int(np.prod(shape)))), dtype=np.int64).reshape(shape)


@st.composite
def tables(draw) -> MemoryTable:
    n, d = draw(st.integers(0, 5)), draw(st.integers(1, 3))
    joint = []
    for _ in range(draw(st.integers(0, 2)) if n else 0):
        first = draw(st.integers(0, n - 1))
        joint.append((first, draw(st.integers(first, n - 1)), _bytes(draw, (d,))))
    maybe = st.booleans()
    scratch = Scratch(_bytes(draw, (d,)), _bytes(draw, (d,)), _bytes(draw, (n, d)),
                      np.array([draw(st.integers(1, 2000))] * d, dtype=np.int64)) if draw(maybe) else None
    return MemoryTable(
        fixed=_bytes(draw, (PARTS, d)), kept=_bytes(draw, (n, PARTS, d)), again=_bytes(draw, (n, PARTS, d)),
        workspace=_bytes(draw, (n, d)), joint=tuple(joint),
        transient=_bytes(draw, (d,)) if draw(maybe) else None,
        ahead=_bytes(draw, (d,)) if draw(maybe) else None,
        behind=_bytes(draw, (n, d)) if draw(maybe) else None,
        scratch=scratch, beside=draw(maybe))


@settings(max_examples=300, deadline=None)
@given(tables())
def test_the_busiest_moment_by_part_adds_up_to_its_total(table):
    totals = table.totals()
    assert totals.shape == (len(table.kept) + 1, table.fixed.shape[1])
    for limit in range(len(table.kept) + 1):
        assert (sum(table.at(limit).values()) == totals[limit]).all(), limit


def test_a_table_by_hand():
    """Two segments of 10 bytes of activations each, the last with a recompute workspace of
    50: recomputing both (limit 0 or 2), the busiest moment is backward recomputing the last
    (nothing after it to free), 10 + 10 + 50; recomputing the first only, the end of forward, 20."""
    fixed = np.zeros((PARTS, 1), dtype=np.int64)
    kept = np.zeros((2, PARTS, 1), dtype=np.int64)
    kept[:, MEMORY_PARTS.index("activations")] = 10
    table = MemoryTable(fixed, kept, kept.copy(), np.array([[0], [50]], dtype=np.int64))
    assert table.totals()[:, 0].tolist() == [70, 20, 70]
    assert table.at(2)["recompute workspace"].tolist() == [50]
    assert table.at(1)["recompute workspace"].tolist() == [0]
