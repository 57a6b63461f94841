"""The adversarial suite (#13): one case or more per class of bad input, each run in a
sandbox (its own folder and HOME) and held to the same five properties:

* the exit status is 1 (2 for a command line click cannot read);
* stderr is one line, ``error: ...``, naming the culprit (file, field, option, node);
* no traceback;
* nothing is written anywhere in the sandbox (HOME included): no partial output;
* every input file is byte-identical afterwards.

The classes follow the issue: wrong plans, the user's own files, hangs and blow-ups, ONNX
that breaks the format, faults (run under mpiexec: ``runtime/test_run_failures.py``), and
newcomer friction. Numeric options have their own hypothesis suite
(``cli/test_numeric_options.py``); here one case each stands for them.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from models.catalog import mlp_model
from onnx import TensorProto, helper

from unity_cli.cli import cli, main
from unity_cli.plan.plan import seal
from unity_cli.substitutions.cache import default_rules_path

REPO = Path(__file__).resolve().parents[2]
DGX8 = (REPO / "cluster_specs" / "dgx-a100-8.yaml").read_text()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """What the cases start from: a model, two plans of it, a run report of the first."""
    root = tmp_path_factory.mktemp("adversarial")
    model = mlp_model(root / "mlp.onnx")
    out = {"mlp.onnx": model}
    for strategy in ("data_parallel", "tensor_parallel"):
        plan = root / f"{strategy}.json"
        r = CliRunner().invoke(cli, ["optimize", str(model), "--cluster", "dgx-a100-8", "--strategy", strategy,
                                     "--out", str(plan)])
        assert r.exit_code == 0, r.output
        out[f"{strategy}.json"] = plan
    return out


def _snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@dataclass
class Case:
    name: str
    args: list[str]                                   # "{x}" stands for sandbox file x
    needles: list[str]
    files: Callable[[Path, dict[str, Path]], None] = lambda work, made: None
    code: int = 1
    env: dict[str, str] = field(default_factory=dict)


def _copy(*names: str) -> Callable[[Path, dict[str, Path]], None]:
    def go(work: Path, made: dict[str, Path]) -> None:
        for n in names:
            (work / n).write_bytes(made[n].read_bytes())
    return go


def _write(name: str, make: Callable[[dict[str, Path]], bytes | str], *also: str
           ) -> Callable[[Path, dict[str, Path]], None]:
    def go(work: Path, made: dict[str, Path]) -> None:
        _copy(*also)(work, made)
        data = make(made)
        (work / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return go


def _plan_edited(made, edit: Callable[[dict], None], reseal: bool = False) -> str:
    doc = json.loads(made["data_parallel.json"].read_text())
    edit(doc)
    return json.dumps(seal(doc) if reseal else doc)


def _onnx(nodes, inputs, outputs, inits=(), opset=17) -> bytes:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _bomb() -> str:
    items = ['&a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    items += [f"&a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    return "[" + ", ".join(items) + "]"


def _no_hashes(made) -> str:
    doc = json.loads(default_rules_path().read_text())
    del doc["content_hash"]
    return json.dumps(doc)


RELU = helper.make_node("Relu", ["x"], ["h"], name="a")
OUT = helper.make_node("Relu", ["h"], ["y"], name="c")
BAKED = helper.make_tensor("shape", TensorProto.INT64, [3], [2, 2, 4])

CASES = [
    # 1. Wrong plans and wrong training.
    Case("plan edited after optimize", ["explain", "{plan.json}"], ["{plan.json}", "content_sha256", "edited"],
         _write("plan.json", lambda m: _plan_edited(m, lambda d: d["predicted"].update(step_time_ms=0.001)))),
    Case("plan holding NaN", ["report", "{plan.json}", "-o", "{r.html}"], ["{plan.json}", "NaN"],
         _write("plan.json", lambda m: _plan_edited(m, lambda d: d["predicted"].update(step_time_ms=float("nan"))))),
    Case("plan without its hash", ["explain", "{plan.json}"], ["{plan.json}", "content_sha256: missing"],
         _write("plan.json", lambda m: _plan_edited(m, lambda d: d.pop("content_sha256")))),
    Case("plan whose graph breaks, sealed again", ["explain", "{plan.json}"], ["{plan.json}", "pcg"],
         _write("plan.json", lambda m: _plan_edited(
             m, lambda d: d["pcg"]["nodes"][-1]["outputs"][0]["sizes"].append(3), reseal=True))),
    Case("plan whose inputs are not its graph's, sealed again", ["explain", "{plan.json}"],
         ["{plan.json}", "model.inputs.x", "[64, 16]"],
         _write("plan.json", lambda m: _plan_edited(
             m, lambda d: d["model"]["inputs"]["x"].update(dims=[64, 16]), reseal=True))),
    Case("plan whose input node was renamed, sealed again", ["explain", "{plan.json}"],
         ["{plan.json}", "input node 'q'"],
         _write("plan.json", lambda m: _plan_edited(m, lambda d: d["pcg"]["nodes"][0].update(name="q"), reseal=True))),
    Case("plan with an unknown strategy, sealed again", ["explain", "{plan.json}"], ["{plan.json}", "'bogus'"],
         _write("plan.json", lambda m: _plan_edited(m, lambda d: d.update(strategy="bogus"), reseal=True))),
    Case("plan whose step time is not its row's, sealed again", ["report", "{plan.json}", "-o", "{r.html}"],
         ["{plan.json}", "predicted.step_time_ms"],
         _write("plan.json", lambda m: _plan_edited(
             m, lambda d: d["predicted"].update(step_time_ms=0.001), reseal=True))),
    Case("plan with a negative sync bucket, sealed again", ["explain", "{plan.json}"],
         ["{plan.json}", "config.sync_bucket_bytes", "-5"],
         _write("plan.json", lambda m: _plan_edited(
             m, lambda d: d["config"].update(sync_bucket_bytes=-5), reseal=True))),
    Case("optimize with a sync bucket that is no size", ["optimize", "{mlp.onnx}", "--sync-bucket", "lots", "--out",
                                                          "{p.json}"], ["--sync-bucket", "'lots'"], _copy("mlp.onnx")),
    Case("rule cache without its hashes", ["optimize", "{mlp.onnx}", "--rules", "{rules.json}", "--out",
                                           "{p.json}"], ["{rules.json}", "content_hash"],
         _write("rules.json", _no_hashes, "mlp.onnx")),
    Case("--budget nan", ["optimize", "{mlp.onnx}", "--budget", "nan", "--out", "{p.json}"], ["--budget", "nan"],
         _copy("mlp.onnx")),
    Case("--operators -3", ["explain", "{data_parallel.json}", "--operators", "-3"], ["--operators", "-3"],
         _copy("data_parallel.json")),
    # 2. Never destroy a user's file.
    Case("plan over its model", ["optimize", "{mlp.onnx}", "--out", "{mlp.onnx}"], ["--out", "{mlp.onnx}", "model"],
         _copy("mlp.onnx")),
    Case("report over its plan", ["report", "{data_parallel.json}", "-o", "{data_parallel.json}"],
         ["--out", "plan"], _copy("data_parallel.json")),
    Case("output in a missing folder", ["optimize", "{mlp.onnx}", "--out", "{nowhere/p.json}"],
         ["--out", "does not exist"], _copy("mlp.onnx")),
    # 3. Never hang, never blow up.
    Case("YAML alias bomb in a typed field", ["optimize", "{mlp.onnx}", "--cluster", "{c.yaml}", "--out",
                                              "{p.json}"], ["{c.yaml}", "expands to more than"],
         _write("c.yaml", lambda m: DGX8.replace("count: 1", f"count: {_bomb()}", 1), "mlp.onnx")),
    Case("a billion nodes", ["optimize", "{mlp.onnx}", "--cluster", "{c.yaml}", "--out", "{p.json}"],
         ["{c.yaml}", "nodes", "65536"],
         _write("c.yaml", lambda m: DGX8.replace("count: 1", "count: 1000000000", 1), "mlp.onnx")),
    Case("JSON nested 200,000 deep", ["explain", "{deep.json}"], ["{deep.json}", "nested too deeply"],
         _write("deep.json", lambda m: "[" * 200_000 + "]" * 200_000)),
    Case("a graph without outputs", ["optimize", "{none.onnx}", "--out", "{p.json}"], ["{none.onnx}", "no outputs"],
         _write("none.onnx", lambda m: _onnx([RELU], [_vi("x", [2, 3])], []))),
    # 4. ONNX that breaks the format.
    Case("a tensor written twice", ["optimize", "{two.onnx}", "--out", "{p.json}"], ["{two.onnx}", "tensor 'h'"],
         _write("two.onnx", lambda m: _onnx([RELU, helper.make_node("Sigmoid", ["x"], ["h"], name="b"), OUT],
                                            [_vi("x", [2, 3])], [_vi("y", [2, 3])]))),
    Case("opset 99", ["optimize", "{new.onnx}", "--out", "{p.json}"], ["{new.onnx}", "opset 99"],
         _write("new.onnx", lambda m: _onnx([RELU, OUT], [_vi("x", [2, 3])], [_vi("y", [2, 3])], opset=99))),
    Case("a dim of -3", ["optimize", "{neg.onnx}", "--out", "{p.json}"], ["{neg.onnx}", "dim 1 is -3"],
         _write("neg.onnx", lambda m: _onnx([RELU, OUT], [_vi("x", [2, -3])], [_vi("y", [2, 3])]))),
    Case("--input against a baked Reshape", ["optimize", "{baked.onnx}", "--input", "x=4,8", "--out", "{p.json}"],
         ["{baked.onnx}", "--input x=4,8 changes input 'x'", "node 'r' (Reshape)"],
         _write("baked.onnx", lambda m: _onnx([helper.make_node("Reshape", ["x", "shape"], ["y"], name="r")],
                                              [_vi("x", [2, 8])], [_vi("y", [2, 2, 4])], [BAKED]))),
    # 6. Newcomer friction.
    Case("a cluster name that is not bundled", ["optimize", "{mlp.onnx}", "--cluster", "dgx-a100-9", "--out",
                                                "{p.json}"], ["dgx-a100-9", "dgx-a100-8", "unity clusters"],
         _copy("mlp.onnx")),
    Case("a run of another plan", ["report", "{data_parallel.json}", "-o", "{r.html}", "--measured", "{run.json}"],
         ["{run.json}", "another plan"],
         _write("run.json", lambda m: json.dumps(
             {"measured_step_time_ms": 1.0, "predicted_step_time_ms": 1.0, "ratio": 1.0, "loss": [1.0], "steps": 1,
              "plan_sha256": json.loads(m["tensor_parallel.json"].read_text())["content_sha256"]}),
             "data_parallel.json")),
    Case("a memory limit that is not a size", ["optimize", "{mlp.onnx}", "--memory-limit", "12 GiB/s", "--out",
                                               "{p.json}"], ["--memory-limit", "12 GiB/s"], _copy("mlp.onnx")),
    Case("an option click cannot read", ["explain", "{data_parallel.json}", "--operators", "many"],
         ["--operators", "many"], _copy("data_parallel.json"), code=2),
]


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []})
@click.pass_context
def unity(ctx: click.Context) -> None:
    """The console entry point (``unity ...``), as CliRunner can invoke it."""
    main(ctx.args)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_refused_in_one_line_and_nothing_touched(case, made, tmp_path, monkeypatch):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    case.files(work, made)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    fill = {f"{{{name}}}": str(work / name) for name in
            {a[1:-1] for a in case.args + case.needles if a.startswith("{") and a.endswith("}")}}
    before = _snapshot(tmp_path)
    r = CliRunner().invoke(unity, [fill.get(a, a) for a in case.args])
    assert r.exit_code == case.code, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and r.stdout == ""
    for needle in case.needles:
        for key, value in fill.items():
            needle = needle.replace(key, value)
        assert needle in lines[0], (needle, lines[0])
    assert _snapshot(tmp_path) == before      # no output, no partial file, inputs byte-identical
