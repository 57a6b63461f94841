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
    if not p.exists():
        raise error(f"{p}: no such file (expected a {what})")
    try:
        return json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{p}: not a JSON {what} ({e})") from None
    except RecursionError:
        raise error(f"{p}: nested too deeply to be a {what}") from None
