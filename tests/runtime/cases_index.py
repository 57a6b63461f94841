"""(being written)"""
from __future__ import annotations


def cases() -> list:
    return []
