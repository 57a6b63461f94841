"""Small helpers for writing the report's HTML and SVG by hand, deterministically."""
from __future__ import annotations

import html
from collections.abc import Iterable


def esc(text: object) -> str:
    """Text safe inside an element or a double-quoted attribute."""
    return html.escape(str(text), quote=True)


def num(x: float) -> str:
    """A coordinate: one decimal, no trailing ``.0``, never ``-0``."""
    s = f"{x:.1f}"
    s = s[:-2] if s.endswith(".0") else s
    return "0" if s == "-0" else s


def ms(x: float) -> str:
    """Milliseconds with enough digits for sub-microsecond events."""
    if x >= 100:
        return f"{x:.1f} ms"
    if x >= 1:
        return f"{x:.3f} ms"
    return f"{x:.4f} ms"


def ranges(values: Iterable[int]) -> str:
    """``0–7, 16, 18–20``: sorted integers as runs."""
    out: list[str] = []
    vs = sorted(set(values))
    k = 0
    while k < len(vs):
        j = k
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        out.append(str(vs[k]) if j == k else f"{vs[k]}–{vs[j]}")
        k = j + 1
    return ", ".join(out)


def devices_label(devices: Iterable[int]) -> str:
    ds = sorted(set(devices))
    return f"device {ds[0]}" if len(ds) == 1 else f"devices {ranges(ds)}"


def clip(text: str, width: int) -> str:
    """At most ``width`` characters; the front is cut, since the end of an operator's name
    says the most."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick interval (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    p = 10.0 ** _floor_log10(raw)
    for m in (1, 2, 5, 10):
        if raw <= m * p:
            return m * p
    return 10 * p


def _floor_log10(x: float) -> int:
    e = 0
    while x >= 10:
        x /= 10
        e += 1
    while x < 1:
        x *= 10
        e -= 1
    return e
