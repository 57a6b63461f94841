"""ONNX's node tests, run through unity's importer and kernels, for the op types unity imports.

    python benchmarks/onnx_backend.py [--failures] [--expanded]

A test is one ONNX node (plus Constants) with reference inputs and outputs; it passes if
:class:`unity_cli.runtime.backend.UnityBackend` reproduces every output within the
test's tolerances (as ``onnx.backend.test`` checks). The test data is read from onnx's
installed ``backend/test/data/node`` where the wheel ships it, otherwise generated in
memory by onnx's test-case modules (the same cases). ``--expanded`` adds the tests of
function ops expanded into primitives (``*_expanded``), grouped under their function op.
Prints a Markdown table: op type, passed / total, and the overall pass rate.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from unity_cli.ir.opspec import all_specs  # noqa: E402
from unity_cli.runtime.backend import UnityBackend  # noqa: E402

TestData = tuple[str, onnx.ModelProto, list[tuple[list[np.ndarray], list[np.ndarray]]], float, float]


def supported_ops() -> set[str]:
    return {op for s in all_specs().values() for op in s.onnx_ops}


def node_tests() -> Iterator[TestData]:
    """(name, model, data sets, rtol, atol) of every ONNX node test."""
    import onnx.backend.test.loader as loader  # noqa: PLC0415

    node_dir = Path(loader.DATA_DIR) / "node"
    if node_dir.is_dir():
        for case in sorted(node_dir.iterdir()):
            if not (case / "model.onnx").exists():
                continue
            model = onnx.load(str(case / "model.onnx"))
            sets = []
            for ds in sorted(glob.glob(str(case / "test_data_set_*"))):
                ins = [_read(p) for p in sorted(glob.glob(os.path.join(ds, "input_*.pb")))]
                outs = [_read(p) for p in sorted(glob.glob(os.path.join(ds, "output_*.pb")))]
                sets.append((ins, outs))
            yield case.name, model, sets, 1e-3, 1e-7
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_model_tests(kind="node")
    for c in sorted(cases, key=lambda c: c.name):
        yield c.name, c.model, [(list(i), list(o)) for i, o in c.data_sets], c.rtol, c.atol


def _read(path: str) -> np.ndarray:
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def main_op(model: onnx.ModelProto) -> str | None:
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    return ops[0] if len(ops) == 1 else None


def run_test(model: onnx.ModelProto, sets, rtol: float, atol: float) -> str | None:
    """None if the test passes, else a one-line reason."""
    from onnx.backend.test.runner import Runner  # noqa: PLC0415

    try:
        rep = UnityBackend.prepare(model, "CPU")
        for ins, refs in sets:
            ins = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in ins]
            refs = [numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in refs]
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                outs = rep.run(ins)
            Runner.assert_similar_outputs(refs, list(outs), rtol=rtol, atol=atol, model_dir=None)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return "wrong output: " + (lines[0] if lines else "mismatch")[:150]
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", action="store_true", help="list every failing test with its reason")
    ap.add_argument("--expanded", action="store_true", help="also run the *_expanded function tests")
    ap.add_argument("--only", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    ops = supported_ops()
    tests = list(node_tests())
    single = {name: main_op(model) for name, model, *_ in tests}
    results: dict[str, list[tuple[str, str | None]]] = collections.defaultdict(list)
    for name, model, sets, rtol, atol in tests:
        if args.only and args.only not in name:
            continue
        if "_expanded" in name:
            if not args.expanded:
                continue
            base = single.get(name[:name.index("_expanded")])
            op = f"{base} (expanded)" if base else None
        else:
            op = single[name]
        if op is None or op.split(" ")[0] not in ops:
            continue
        results[op].append((name, run_test(model, sets, rtol, atol)))
    total = sum(len(v) for v in results.values())
    passed = sum(r is None for v in results.values() for _, r in v)
    print("| ONNX op | passed / total |")
    print("|---|---|")
    for op in sorted(results):
        v = results[op]
        print(f"| {op} | {sum(r is None for _, r in v)} / {len(v)} |")
    print(f"| **all** | **{passed} / {total} ({100 * passed / max(total, 1):.1f}%)** |")
    if args.failures:
        print()
        for op in sorted(results):
            for name, reason in results[op]:
                if reason is not None:
                    print(f"- {name}: {reason}")


if __name__ == "__main__":
    main()
