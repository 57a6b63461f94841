"""A one-line progress bar on stderr, shown only when stderr is a terminal."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.start = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int, note: object = "") -> None:
        if not self.enabled:
            return
        note = note if isinstance(note, str) else ""
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        width = 30
        filled = int(width * done / total) if total else width
        bar = "#" * filled + "-" * (width - filled)
        extra = f"  {note}" if note else ""
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total} {now - self.start:5.1f}s{extra}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
