"""unity: a command-line optimizer for distributed DNN training (Unity, OSDI'22, rebuilt)."""
from __future__ import annotations

__version__ = "0.1.0"
