"""The package's layers (DESIGN.md, "Data flow") hold: the import-linter contract in
setup.cfg, and no function-local import hides an upward edge from it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "unity_cli"

LAZY = {
    "cupy": "optional (the gpu extra)",
    "cupyx": "optional (the gpu extra)",
    "matplotlib": "optional (the bench extra)",
    "mpi4py": "importing it initializes MPI, a side effect only `unity run` and `unity profile` want",
    "onnxruntime": "imported under a temporary cache folder, so that it writes nothing outside --out",
    "scipy.optimize": "0.6 s to import; only problems whose bound does not close reach HiGHS",
    "scipy.sparse": "imported beside scipy.optimize",
}
"""The only modules imported inside a function (outside the CLI, which loads its commands
lazily), and why."""


def test_the_layers_contract_holds():
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.is_file():
        pytest.skip("import-linter is not installed (the test extra has it)")
    r = subprocess.run([str(exe), "--config", str(REPO / "setup.cfg")], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def _local_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if in_function and isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                out.append((child.lineno, "." * child.level + (child.module or "")))
            visit(child, inside)

    visit(tree, False)
    return out


def test_no_function_local_imports_but_the_stated_ones():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "cli.py" and path.parent == PACKAGE:
            continue
        for line, module in _local_imports(path):
            if not any(module == m or module.startswith(m + ".") for m in LAZY):
                found.append(f"{path.relative_to(REPO)}:{line}: {module}")
    assert not found, "function-local imports (move them to the top, or state why in LAZY):\n" + "\n".join(found)


def test_the_local_import_check_sees_one(tmp_path):
    """The walk above finds an import inside a function, nested or not (it can fail)."""
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    def g():\n        from .x import y\n    import json\n")
    assert sorted(m for _, m in _local_imports(f)) == [".x", "json"]
