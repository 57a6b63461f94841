"""Reading the project's JSON documents (plans, rule files) with one-line errors."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import UnityError


def read_json(path: str | os.PathLike, error: type[UnityError], what: str) -> Any:
    """The parsed document; ``error`` naming the file if it is missing or not JSON."""
    p = Path(path)
    return parse_json(read_bytes(p, error, what), p, error, what)


def read_bytes(path: Path, error: type[UnityError], what: str) -> bytes:
    """The file's bytes; ``error`` naming it if it is missing or unreadable."""
    if not path.exists():
        raise error(f"{path}: no such file (expected a {what})")
    try:
        return path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None


def parse_json(raw: bytes, path: Path, error: type[UnityError], what: str) -> Any:
    """The document in ``raw`` (read from ``path``); ``error`` naming the file if it is not JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{path}: not a JSON {what} ({e})") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply to be a {what}") from None
