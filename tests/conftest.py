"""Shared fixtures: the model corpus and the shipped cluster specs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from models.catalog import SHARED_MODELS_DIR  # noqa: E402


@pytest.fixture(scope="session")
def shared_models() -> Path:
    if not SHARED_MODELS_DIR.exists():
        pytest.skip(f"{SHARED_MODELS_DIR} is not there")
    return SHARED_MODELS_DIR


@pytest.fixture(scope="session")
def cluster_dir() -> Path:
    return REPO / "cluster_specs"


@pytest.fixture(autouse=True)
def _no_home_profile(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile in the real ~/.cache/unity/profiles must not change what tests plan."""
    monkeypatch.setenv("UNITY_PROFILE_DIR", str(tmp_path_factory.mktemp("profiles")))
