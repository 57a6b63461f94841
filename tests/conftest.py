"""Shared fixtures: the model corpus and the shipped cluster specs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from models.catalog import TINY_MODELS_DIR  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models() -> Path:
    """The tiny models the tests train: part of the repo, so never skipped."""
    assert TINY_MODELS_DIR.is_dir(), f"{TINY_MODELS_DIR} is missing from the checkout"
    return TINY_MODELS_DIR


@pytest.fixture(scope="session")
def cluster_dir() -> Path:
    return REPO / "cluster_specs"


@pytest.fixture(autouse=True)
def _no_home_profile(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile in the real ~/.cache/unity/profiles must not change what tests plan."""
    monkeypatch.setenv("UNITY_PROFILE_DIR", str(tmp_path_factory.mktemp("profiles")))
