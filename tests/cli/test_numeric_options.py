"""Every numeric option is checked for range and finiteness before any work: NaN, infinity,
out-of-range and overflowing values get one line naming the option and exit 1; values in
range are never refused (#13)."""
from __future__ import annotations

import contextlib
import math
import tempfile

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unity_cli.cli import MAX_BATCH, cli

# (command and what it needs before the option, option, kind, low, high, low_open)
OPTIONS = [
    (["optimize", "missing.onnx"], "--batch-size", int, 1, MAX_BATCH, False),
    (["optimize", "missing.onnx"], "--budget", float, 0, None, True),
    (["optimize", "missing.onnx"], "--max-candidates", int, 1, 2**31 - 1, False),
    (["optimize", "missing.onnx"], "--memory-limit", float, 0, None, True),
    (["optimize", "missing.onnx"], "--alpha", float, 1, None, False),
    (["zoo", "mlp", "--out", "unused.onnx"], "--batch-size", int, 1, MAX_BATCH, False),
    (["explain", "missing.json"], "--operators", int, 0, 2**31 - 1, False),
    (["verify-rules", "--check", "missing.json"], "--jobs", int, 0, 4096, False),
    (["verify-rules", "--check", "missing.json"], "--max-ops", int, 1, 8, False),
    (["verify-rules", "--check", "missing.json"], "--timeout-ms", int, 1, 2**31 - 1, False),
    (["run", "missing.json"], "--steps", int, 1, 2**31 - 1, False),
    (["run", "missing.json"], "--lr", float, 0, None, False),
    (["run", "missing.json"], "--seed", int, 0, 2**63 - 1, False),
]
IDS = [f"{o[0][0]} {o[1]}" for o in OPTIONS]


def _invoke(args: list[str]):
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):   # whatever passes writes nothing here
        return CliRunner().invoke(cli, args)


def _inside(kind, low, high, low_open, v) -> bool:
    if not math.isfinite(v):
        return False
    if low is not None and (v <= low if low_open else v < low):
        return False
    return high is None or v <= high


def _bad_values(kind, low, high, low_open):
    if kind is float:
        return st.one_of(st.sampled_from(["nan", "inf", "-inf", "1e400", "-1e400"]),
                         st.floats(allow_nan=False).filter(lambda v: not _inside(kind, low, high, low_open, v))
                         .map(repr))
    below = st.integers(max_value=low - 1) if low is not None else st.nothing()
    above = st.integers(min_value=high + 1, max_value=2**80) if high is not None else st.nothing()
    return st.one_of(below, above, st.just(2**70)).filter(lambda v: not _inside(kind, low, high, low_open, v)) \
        .map(str)


@pytest.mark.parametrize("prefix, option, kind, low, high, low_open", OPTIONS, ids=IDS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_out_of_range_or_not_finite_is_one_line_naming_the_option(prefix, option, kind, low, high, low_open, data):
    value = data.draw(_bad_values(kind, low, high, low_open))
    r = _invoke(prefix + [f"{option}={value}"])
    assert r.exit_code == 1, (value, r.output)
    assert r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
    assert option in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("prefix, option, kind, low, high, low_open", OPTIONS, ids=IDS)
def test_values_in_range_are_never_refused(prefix, option, kind, low, high, low_open):
    """The command fails for its missing file, never for the option."""
    edge = low if not low_open else (low + 1e-9 if kind is float else low + 1)
    for value in {edge, high if high is not None else edge * 10 + 5}:
        r = _invoke(prefix + [f"{option}={value}"])
        assert option not in r.output, r.output


def test_memory_limit_takes_a_size_or_gb():
    from unity_cli.cli import _memory_limit

    assert _memory_limit("12GiB") == 12 * 2**30 and _memory_limit("12 GiB") == 12 * 2**30
    assert _memory_limit("16GB") == _memory_limit("16") == 16 * 10**9          # a bare number is GB
    assert _memory_limit("512 MiB") == 512 * 2**20 and _memory_limit(None) is None
    for bad, word in (("0.4 B", "1 byte"), ("12 GiB/s", "12 GiB/s"), ("-1 GiB", "1 byte"), ("lots", "lots")):
        r = _invoke(["optimize", "missing.onnx", "--memory-limit", bad])
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert r.output.startswith("error: --memory-limit") and word in r.output, r.output
