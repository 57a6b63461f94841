"""Physical quantities with units, as written in cluster YAMLs.

A quantity is either a plain number in SI base units (FLOP/s, bytes/s, bytes, seconds)
or a string such as ``"19.5 TFLOP/s"``, ``"200 Gb/s"`` (bits: 25e9 bytes/s),
``"40 GiB"`` or ``"2 µs"``. Decimal prefixes (k, M, G, T, P) scale bytes, bits and
FLOPs by powers of 1000; binary ones (Ki, Mi, Gi, Ti, Pi) by powers of 1024. Parsing
never guesses: an unknown unit, or a unit of the wrong kind, is an error whose
message says what was expected. The parser raises ``ValueError`` carrying only the
reason; callers (``spec.py``) add the file and field path.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal
from enum import Enum

__all__ = [
    "Dimension",
    "format_quantity",
    "parse_bandwidth",
    "parse_bytes",
    "parse_duration",
    "parse_flops",
    "parse_quantity",
]


class Dimension(Enum):
    """What a quantity measures; the value is its SI base unit."""

    FLOPS = "FLOP/s"
    BANDWIDTH = "B/s"
    BYTES = "B"
    TIME = "s"

    @property
    def noun(self) -> str:
        """How error messages name this kind of quantity."""
        return _NOUNS[self]


_NOUNS = {
    Dimension.FLOPS: "compute rate",
    Dimension.BANDWIDTH: "bandwidth",
    Dimension.BYTES: "size",
    Dimension.TIME: "duration",
}
_EXAMPLES = {
    Dimension.FLOPS: "'19.5 TFLOP/s'",
    Dimension.BANDWIDTH: "'300 GB/s' or '200 Gb/s'",
    Dimension.BYTES: "'40 GiB' or '16 GB'",
    Dimension.TIME: "'2 us' or '1.5 ms'",
}

# Scales are exact decimals, so "5 us" is the float nearest 5e-6 (not 5 * 1e-6).
_DECIMAL = {p: Decimal(f"1e{e}") for p, e in
            (("", 0), ("k", 3), ("K", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15))}
_BINARY = {p: Decimal(2**e) for p, e in
           (("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40), ("Pi", 50))}


def _unit_table() -> dict[str, tuple[Dimension, Decimal]]:
    """Every accepted unit spelling, mapped to its dimension and SI factor."""
    table: dict[str, tuple[Dimension, Decimal]] = {}
    for prefix, scale in _DECIMAL.items():
        for flop in ("FLOP/s", "FLOPS", "FLOPs", "flop/s", "flops"):
            table[prefix + flop] = (Dimension.FLOPS, scale)
        for per_second in ("B/s", "Bps"):
            table[prefix + per_second] = (Dimension.BANDWIDTH, scale)
        for bits in ("b/s", "bit/s", "bps"):
            table[prefix + bits] = (Dimension.BANDWIDTH, scale / 8)
        table[prefix + "B"] = (Dimension.BYTES, scale)
    for prefix, scale in _BINARY.items():
        table[prefix + "B/s"] = (Dimension.BANDWIDTH, scale)
        table[prefix + "B"] = (Dimension.BYTES, scale)
    # Both the micro sign (U+00B5) and the Greek mu (U+03BC) are typed in the wild.
    for unit, exponent in (("s", 0), ("ms", -3), ("us", -6), ("\u00b5s", -6),
                           ("\u03bcs", -6), ("ns", -9)):
        table[unit] = (Dimension.TIME, Decimal(f"1e{exponent}"))
    return table


_UNITS = _unit_table()
_QUANTITY = re.compile(
    r"^\s*(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>\S.*?)?\s*$"
)


def parse_quantity(value: object, dimension: Dimension) -> float:
    """Return ``value`` in SI base units of ``dimension``.

    Plain numbers (and unitless numeric strings: YAML 1.1 reads ``1e9`` as a string)
    are taken as base units. Raises ``ValueError`` with the reason on anything else.
    The sign is kept; range checks belong to the caller, which knows the field.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(
            f"must be a number or a string with a unit such as {_EXAMPLES[dimension]}, "
            f"got {type(value).__name__} {value!r}"
        )
    if isinstance(value, str):
        number = _parse_text(value, dimension)
    else:
        number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"must be a finite {dimension.noun}, got {value}")
    return number


def _parse_text(text: str, dimension: Dimension) -> float:
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(
            f"cannot read {text!r} as a {dimension.noun}; write e.g. {_EXAMPLES[dimension]}"
        )
    unit = match["unit"]
    if unit is None:
        return float(match["number"])
    known = _UNITS.get(unit)
    if known is None:
        raise ValueError(
            f"unknown unit {unit!r} in {text!r}; a {dimension.noun} is written "
            f"e.g. {_EXAMPLES[dimension]}"
        )
    unit_dimension, scale = known
    if unit_dimension is not dimension:
        raise ValueError(
            f"{text!r} is a {unit_dimension.noun}, but a {dimension.noun} is expected "
            f"(e.g. {_EXAMPLES[dimension]})"
        )
    try:
        return float(Decimal(match["number"]) * scale)
    except ArithmeticError:     # decimal.Overflow: "1e1000000 GB/s"
        raise ValueError(f"{text!r} is out of range") from None


def parse_flops(value: object) -> float:
    """A compute rate in FLOP/s (``"312 TFLOP/s"``, ``"312 TFLOPS"``, ``3.12e14``)."""
    return parse_quantity(value, Dimension.FLOPS)


def parse_bandwidth(value: object) -> float:
    """A bandwidth in bytes/s; ``b``/``bit`` units are bits (``"200 Gb/s"`` = 25e9)."""
    return parse_quantity(value, Dimension.BANDWIDTH)


def parse_bytes(value: object) -> int:
    """A size in whole bytes (``"40 GiB"``, ``"16 GB"``), rounded to the nearest byte."""
    return round(parse_quantity(value, Dimension.BYTES))


def parse_duration(value: object) -> float:
    """A duration in seconds (``"5 us"``, ``"2 µs"``, ``"1.5 ms"``)."""
    return parse_quantity(value, Dimension.TIME)


def format_bytes(n: float, digits: int = 1) -> str:
    """A size in binary units, the one unit family unity prints memory in (``"1.5 GiB"``,
    ``"640.0 KiB"``, ``"12 B"``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{int(n)} B"


def format_quantity(value: float, dimension: Dimension) -> str:
    """A short human-readable form (``"19.5 TFLOP/s"``, ``"40 GiB"``, ``"2 us"``).

    Sizes use binary prefixes when they divide evenly (memory is sold that way), and
    decimal ones otherwise; four significant digits are kept.
    """
    if not math.isfinite(value) or value == 0:
        return f"{value:g} {dimension.value}"
    magnitude = abs(value)
    if dimension is Dimension.TIME:
        for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
            if magnitude >= scale:
                return f"{value / scale:.4g} {unit}"
        return f"{value / 1e-9:.4g} ns"
    if dimension is Dimension.BYTES:
        for prefix, exact in reversed(_BINARY.items()):
            binary = float(exact)
            if magnitude >= binary and value % binary == 0:
                return f"{value / binary:.4g} {prefix}B"
    for prefix in ("P", "T", "G", "M", "k"):
        scale = float(_DECIMAL[prefix])
        if magnitude >= scale:
            return f"{value / scale:.4g} {prefix}{dimension.value}"
    return f"{value:.4g} {dimension.value}"
