"""``--check`` right both ways (#16): it compares what parallelization can get wrong (the
loss, each synced gradient before the optimizer, from identical weights every step, and
the update on its own in units of lr), so it passes every correct plan, Adam included,
and still catches a 1 % error in one rank's share of a gradient.

The yardstick of its tolerance: one process fed the batch with its rows permuted (float32
sums in another order, which is all a correct plan changes) must pass."""
from __future__ import annotations

import numpy as np
import pytest
from runtime.mpirun import run_json, unity_run

from unity_cli.onnx_import import ImportOptions, import_model
from unity_cli.runtime.check import GRAD_RTOL, CheckResult, Reference
from unity_cli.runtime.data import Data, gather_tables
from unity_cli.runtime.loss import choose_loss
from unity_cli.runtime.model_io import weight_values
from unity_cli.runtime.optim import OptimizerConfig


def _reference(path, optimizer: str = "adam"):
    imported = import_model(path, ImportOptions(batch_size=None if "dynamo" in path.name else 8))
    values = weight_values(path, imported, [imported.pcg], seed=0)
    loss = choose_loss("auto", None, imported.pcg)
    out_dims = imported.pcg.shape(imported.pcg.outputs[0]).sizes
    data = Data(imported.inputs, out_dims, loss, 0, gather_tables(imported.pcg))
    ref = Reference(imported.pcg, "numpy", np, values.trainable, values.constants, loss,
                    OptimizerConfig.of(optimizer, None))
    return ref, data, dict(values.trainable)


# Not the dynamo exports: they bake the batch into tensors the importer keeps as weights (an
# attention mask of [batch, 1, seq, seq]), whose rows a permuted batch permutes too.
@pytest.mark.parametrize("name", ["bert_tiny.onnx", "convnet_tiny.onnx"])
def test_the_batch_rows_permuted_pass_and_a_one_percent_error_does_not(tiny_models, name):
    ref, data, weights = _reference(tiny_models / name)
    check = CheckResult()
    lr = 1e-3
    for step in range(3):
        batch = data.batch(step)
        perm = np.random.default_rng(step).permutation(len(batch.labels))
        loss, grads = ref.gradients(weights, batch.inputs, batch.labels)
        p_loss, p_grads = ref.gradients(weights, {k: v[perm] for k, v in batch.inputs.items()},
                                        batch.labels[perm])
        after = ref.updated(weights, p_grads)
        check.compare(step, p_loss, loss, p_grads, grads, after, after, lr)
        weights = after
    assert check.passed, check.failure
    assert check.max_rel_err < GRAD_RTOL / 10          # far inside: the tolerance has headroom
    # A 1 % error in part of one gradient (one rank's share of it) is caught and named.
    name, g = max(grads.items(), key=lambda kv: kv[1].size)
    wrong = dict(grads)
    wrong[name] = g.copy()
    wrong[name][: max(1, g.shape[0] // 2)] *= 1.01
    bad = CheckResult()
    bad.compare(0, loss, loss, wrong, grads, {}, {}, lr, holder=lambda n, at: 1)
    assert not bad.passed and f"the gradient of weight {name!r}" in bad.failure and "held by rank 1" in bad.failure


def test_an_update_off_by_more_than_a_thousandth_of_lr_is_caught(tiny_models):
    ref, data, weights = _reference(tiny_models / "convnet_tiny.onnx", "sgd")
    batch = data.batch(0)
    loss, grads = ref.gradients(weights, batch.inputs, batch.labels)
    lr = 0.01
    expected = ref.updated(weights, grads)
    name = sorted(expected)[0]
    after = {k: v.copy() for k, v in expected.items()}
    after[name].flat[3] += 0.01 * lr                   # a hundredth of lr: 10x the tolerance
    check = CheckResult()
    check.compare(0, loss, loss, grads, grads, after, expected, lr)
    assert not check.passed and f"weight {name!r} after the update" in check.failure, check.failure
    fine = CheckResult()
    fine.compare(0, loss, loss, grads, grads, expected, expected, lr)
    assert fine.passed and fine.max_update_err == 0.0


@pytest.mark.parametrize("strategy", ["data_parallel", "tensor_parallel", "unity"])
def test_adam_on_an_export_passes(plans, strategy):
    """The audit's cry-wolf case: Adam, GPT-2 exported by torch, every kind of plan."""
    doc = run_json(plans.get("gpt2_tiny", strategy, 2), "--check", "--steps", "2", "--optimizer", "adam")
    assert doc["check"]["passed"], doc["check"]


def test_a_one_percent_error_on_one_rank_fails_the_check(plans):
    plan = plans.get("bert_tiny", "data_parallel", 2)
    r = unity_run(plan, "--check", "--steps", "2", env={"UNITY_FAULT_GRAD_RANK": "1"}, timeout=120)
    assert r.returncode != 0
    line = next(line for line in r.stderr.splitlines() if line.startswith("error:"))
    assert "--check failed" in line and "step 0: the gradient of weight" in line, line
