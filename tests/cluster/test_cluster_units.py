"""Quantities with units: every spelling the README promises, and clear refusals."""
from __future__ import annotations

import pytest

from unity_cli.cluster.units import (
    Dimension,
    format_quantity,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_flops,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("19.5 TFLOP/s", 19.5e12),
        ("312 TFLOPS", 312e12),
        ("312TFLOPS", 312e12),
        ("50 GFLOP/s", 50e9),
        ("1 PFLOP/s", 1e15),
        ("3 kflops", 3e3),
        (3.12e14, 3.12e14),
        ("1e9", 1e9),
    ],
)
def test_flops(text: object, expected: float) -> None:
    assert parse_flops(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.555 TB/s", 1.555e12),
        ("300 GB/s", 300e9),
        ("200 Gb/s", 25e9),
        ("100 Gbit/s", 12.5e9),
        ("100 Gbps", 12.5e9),
        ("10 GiB/s", 10 * 2**30),
        ("5 MB/s", 5e6),
        (25_000_000_000, 25e9),
    ],
)
def test_bandwidth(text: object, expected: float) -> None:
    assert parse_bandwidth(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40 GiB", 40 * 2**30),
        ("16 GB", 16 * 10**9),
        ("141 GB", 141 * 10**9),
        ("512 MiB", 512 * 2**20),
        ("1 TiB", 2**40),
        ("2 KiB", 2048),
        ("2 kB", 2000),
        (1024, 1024),
    ],
)
def test_bytes(text: object, expected: int) -> None:
    value = parse_bytes(text)
    assert value == expected
    assert isinstance(value, int)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5 us", 5e-6),
        ("2 \u00b5s", 2e-6),  # micro sign
        ("2 \u03bcs", 2e-6),  # Greek mu
        ("1.5 ms", 1.5e-3),
        ("100 ns", 100e-9),
        ("0.25 s", 0.25),
        (0, 0.0),
    ],
)
def test_duration(text: object, expected: float) -> None:
    # Exact: scales are applied as decimals, so "5 us" is the float 5e-6.
    assert parse_duration(text) == expected


def test_sign_is_kept_for_the_caller_to_judge() -> None:
    assert parse_bandwidth("-5 GB/s") == -5e9


@pytest.mark.parametrize(
    ("value", "dimension", "fragment"),
    [
        ("300 GBs", Dimension.BANDWIDTH, "unknown unit 'GBs'"),
        ("40 GiB", Dimension.BANDWIDTH, "is a size, but a bandwidth is expected"),
        ("2 us", Dimension.FLOPS, "is a duration"),
        ("fast", Dimension.BANDWIDTH, "cannot read 'fast'"),
        ("", Dimension.TIME, "cannot read"),
        (True, Dimension.BYTES, "must be a number or a string"),
        ([1], Dimension.BYTES, "must be a number or a string"),
        (float("inf"), Dimension.TIME, "finite"),
        (float("nan"), Dimension.FLOPS, "finite"),
    ],
)
def test_bad_quantities(value: object, dimension: Dimension, fragment: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        parse_quantity(value, dimension)
    assert fragment in str(caught.value)


def test_bits_are_not_bytes() -> None:
    assert parse_bandwidth("8 Gb/s") * 8 == parse_bandwidth("8 GB/s")


@pytest.mark.parametrize(
    ("value", "dimension", "text"),
    [
        (40 * 2**30, Dimension.BYTES, "40 GiB"),
        (141e9, Dimension.BYTES, "141 GB"),
        (19.5e12, Dimension.FLOPS, "19.5 TFLOP/s"),
        (25e9, Dimension.BANDWIDTH, "25 GB/s"),
        (2e-6, Dimension.TIME, "2 us"),
        (1.5e-3, Dimension.TIME, "1.5 ms"),
    ],
)
def test_format_round_trips(value: float, dimension: Dimension, text: str) -> None:
    assert format_quantity(value, dimension) == text
    assert parse_quantity(text, dimension) == value
