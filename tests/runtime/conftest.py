"""Fixtures for `unity run` tests (see ``runtime/mpirun.py``)."""
from __future__ import annotations

import sys

import pytest
from runtime.mpirun import MPIEXEC, Plans


@pytest.fixture(scope="session")
def plans(tmp_path_factory, tiny_models) -> Plans:
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec next to {sys.executable}")
    return Plans(tmp_path_factory.mktemp("plans"), tiny_models)
