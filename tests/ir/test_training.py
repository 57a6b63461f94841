"""The step's shape (``ir/training.py``): which ZeRO stage each weight is kept at."""
from __future__ import annotations

import random
from fnmatch import fnmatchcase

import pytest

from unity_cli.ir.training import Training, literal, weight_stages

NAMES = ["m.embed.weight", "layers.0.wq", "layers.1.wq", "layers.10.wq", "a[1]", "a1", "b*", "bx", "q?", "qz", "x"]
PATTERNS = ["*", "*.wq", "layers.1*", "a[1]", "b*", "q?", "*embed*", "[ab]*", "nothing"] + [literal(n) for n in NAMES]


def _naive(name: str, zero: int, by_weight) -> int:
    """The definition: the stage of the last pattern that matches, else ``zero``."""
    stage = zero
    for pattern, z in by_weight:
        if fnmatchcase(name, pattern):
            stage = z
    return stage


def test_a_weight_takes_the_stage_of_the_last_pattern_that_names_it():
    """Against the definition, on random lists of globs and of single names (looked up, not
    matched): ``literal`` names one weight alone, even one whose name holds ``*``, ``?`` or
    ``[``, and another weight that the same text would match as a glob keeps its stage."""
    rng = random.Random(3)
    for _ in range(300):
        by_weight = tuple((rng.choice(PATTERNS), rng.randrange(4)) for _ in range(rng.randrange(1, 6)))
        zero = rng.randrange(4)
        got = weight_stages(enumerate(NAMES), zero, by_weight)
        assert got == {k: _naive(n, zero, by_weight) for k, n in enumerate(NAMES)}, by_weight
    for name in NAMES:
        assert [n for n in NAMES if fnmatchcase(n, literal(name))] == [name]
    assert weight_stages(enumerate(NAMES), 1, ((literal("a[1]"), 3),))[NAMES.index("a1")] == 1


def test_stages_are_checked_and_written_only_where_given():
    t = Training(1, 2, zero_by_weight=[("*embed*", 3)])
    assert t.zero_by_weight == (("*embed*", 3),) and t.mixed and t.sharded
    assert t.to_json() == {"zero": 1, "micro_batches": 2, "zero_by_weight": [["*embed*", 3]]}
    assert t.describe() == "ZeRO-1, ZeRO-3 for *embed*, 2 micro-batches"
    assert not Training(2, zero_by_weight=(("*", 2),)).mixed
    assert Training(0, zero_by_weight=(("w", 1),)).sharded and not Training(0, zero_by_weight=(("w", 0),)).sharded
    assert "zero_by_weight" not in Training(1).to_json()
    many = Training(1, zero_by_weight=tuple((f"w{k}", 3) for k in range(5)))
    assert many.zero_text == "ZeRO-1, ZeRO-3 for 5 name patterns"
    with pytest.raises(ValueError, match=r"zero\[w\]=4"):
        Training(1, zero_by_weight=(("w", 4),))
    with pytest.raises(ValueError, match="empty"):
        Training(1, zero_by_weight=(("", 1),))
