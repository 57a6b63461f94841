"""Fixtures of the profile tests: this machine as ``cluster_specs/local-cpu.yaml`` says it,
and the small MLP they profile and plan."""
from __future__ import annotations

from pathlib import Path

import pytest
from models.catalog import mlp_model

from unity_cli.cluster import load_cluster

LOCAL = Path(__file__).resolve().parents[2] / "cluster_specs" / "local-cpu.yaml"


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(LOCAL)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return mlp_model(tmp_path_factory.mktemp("mlp") / "mlp.onnx")
