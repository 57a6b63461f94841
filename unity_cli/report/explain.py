"""``unity explain``: the summary of a saved plan, its costliest operators, and how each
compares with the same operator in the data-parallel plan of the same model."""
from __future__ import annotations

from pathlib import Path

from ..onnx_import import ImportOptions, import_model
from ..onnx_import.load import file_sha256
from ..plan.config import plan_config
from ..plan.plan import Plan
from ..search.baselines import data_parallel
from ..search.optimize import evaluate
from .operators import OperatorRow, operator_rows


def data_parallel_rows(plan: Plan) -> tuple[dict[str, OperatorRow] | None, str | None]:
    """Rows of the data-parallel plan of the plan's model, by operator name; or why not."""
    path = Path(plan.model["path"])
    if not path.exists():
        return None, f"the model {path} is not here, so there is no data-parallel comparison"
    if file_sha256(path) != plan.model["sha256"]:
        return None, f"{path} has changed since the plan was made, so there is no data-parallel comparison"
    shapes = {k: tuple(v["dims"]) for k, v in plan.model["inputs"].items()}
    imported = import_model(path, ImportOptions(None, shapes))
    config = plan_config(plan)
    dp = evaluate(data_parallel(imported.pcg, plan.cluster), plan.cluster, config)
    rows = operator_rows(dp.baseline.pcg, dp.views, plan.cluster, config)
    return {r.name: r for r in rows}, None
