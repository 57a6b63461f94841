"""Writing a user's files: never over a file the command reads, never half a file.

Every output goes to a fresh temporary file in the destination's folder
(``tempfile.mkstemp``: a name nobody can plant a symlink at) and is then renamed over the
destination, so a reader sees the old file or the new one, never a mix, and an error
midway leaves the old file as it was. Before the expensive work, a command checks that
each output is not one of its inputs (after resolving symlinks) and that its folder exists
and is writable: a mistake costs a one-line error, not a training run.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .errors import UsageError


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to ``path`` whole (see the module docstring). Raises ``OSError``."""
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o666 & ~_umask())   # as a plain open() would have made it
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_output(option: str, path: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None]) -> None:
    """A one-line :class:`UsageError` when ``path`` (given by ``option``) is one of the
    command's ``inputs`` (what each is -> its path), resolving symlinks, or when its folder
    is missing or not writable, or it names a folder."""
    out = Path(path)
    target = out.resolve()
    for what, given in inputs.items():
        if given is None:
            continue
        src = Path(given)
        if src.resolve() == target or (src.exists() and out.exists() and os.path.samefile(src, out)):
            raise UsageError(f"{option} {path}: that is the {what} this command reads; write to another file")
    if out.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"{option} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: folder {folder} is not writable")
