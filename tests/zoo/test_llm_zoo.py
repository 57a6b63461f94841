"""The zoo's decoder LLMs (Llama 2 7B and 70B, GPT-3 175B): paper-scale parameter counts and
structure (grouped-query attention, tied head), constants that stay constants, small-scale
forwards held to onnxruntime and to a numpy transcription of Hugging Face's modules, and
small models that plan and train on two MPI ranks as one process does."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, numpy_helper
from runtime.mpirun import MPIEXEC, SPECS, run_json

from unity_cli import zoo
from unity_cli.cli import cli as main
from unity_cli.onnx_import import ImportOptions, import_model, import_model_proto
from unity_cli.runtime.backend import UnityBackend
from unity_cli.zoo.llm import GptConfig, LlamaConfig
from unity_cli.zoo.net import WeightMode, Weights

LLMS = ["llama2-7b", "llama2-70b", "gpt3-175b"]
# Llama 2's model card (6.74B and 68.98B, untied head), GPT-3's paper (175.0B, tied head).
PUBLISHED = {"llama2-7b": 6.74e9, "llama2-70b": 6.9e10, "gpt3-175b": 1.75e11}


@pytest.fixture(scope="module")
def paper() -> dict[str, zoo.Built]:
    return {n: zoo.build(n, "paper") for n in LLMS}


def _small(name: str) -> zoo.Built:
    return zoo.build(name, "small", weights=Weights(WeightMode.INLINE))


def _ids(cfg: LlamaConfig | GptConfig, batch: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab, (batch, cfg.seq)).astype(np.int64)


def _ort(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input_ids": ids})[0]


def _inits(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {t.name: list(t.dims) for t in model.graph.initializer}


# -- paper scale -------------------------------------------------------------------

@pytest.mark.parametrize("name", LLMS)
def test_parameter_counts_match_the_published_ones(paper, name):
    assert paper[name].params == pytest.approx(PUBLISHED[name], rel=0.02)


def test_exact_parameter_counts():
    """Hugging Face's counts for Llama 2 (LlamaForCausalLM.num_parameters()), and GPT-3's
    from its shapes: 12 h^2 + 13 h per layer, the tied embedding, positions, the final LN."""
    assert zoo.paper_parameters("llama2-7b") == 6_738_415_616
    assert zoo.paper_parameters("llama2-70b") == 68_976_648_192
    h, layers = 12288, 96
    assert zoo.paper_parameters("gpt3-175b") == layers * (12 * h * h + 13 * h) + (50257 + 2048) * h + 2 * h


def test_shapes_only_and_no_float_constant_in_the_file(paper):
    """Every float initializer with dims is an external reference (a trainable weight); the
    mask and rotary tables are computed from integer positions, so the file stays small."""
    for name, built in paper.items():
        floats = [t for t in built.model.graph.initializer if t.data_type == TensorProto.FLOAT and t.dims]
        assert all(t.data_location == TensorProto.EXTERNAL and not t.raw_data for t in floats), name
        assert sum(math.prod(t.dims) for t in floats) == built.params, name
        assert built.model.ByteSize() < 1 << 20, name


def test_llama2_70b_attention_is_grouped_query(paper):
    m = paper["llama2-70b"].model
    inits = _inits(m)
    assert inits["model.layers.79.self_attn.q_proj.weight"] == [8192, 8192]
    assert inits["model.layers.79.self_attn.k_proj.weight"] == [8192, 8 * 128]
    assert inits["model.layers.79.self_attn.v_proj.weight"] == [8192, 8 * 128]
    assert inits["model.layers.0.mlp.gate_proj.weight"] == [8192, 28672]
    splits = {t.name.split(".")[-2]: tuple(numpy_helper.to_array(t)) for t in m.graph.initializer
              if t.name.startswith("model.layers.0.") and t.name.endswith("split_heads")}
    assert splits == {"q_proj": (0, 0, 8, 8, 128), "k_proj": (0, 0, 8, 1, 128), "v_proj": (0, 0, 8, 1, 128)}
    ops = Counter(n.op_type for n in m.graph.node)
    assert not ops["Expand"] and not ops["Tile"]        # K and V are broadcast by the MatMul, never copied
    assert ops["Softmax"] == 80 and ops["Sigmoid"] == 80 and not ops["LayerNormalization"]


def test_llama2_70b_imports_with_a_broadcasting_attention_product(paper, tmp_path):
    path = tmp_path / "llama2-70b.onnx"
    onnx.save(paper["llama2-70b"].model, str(path))
    imported = import_model(path, ImportOptions(1))
    pcg = imported.pcg
    assert list(pcg.nodes[pcg.find("model.layers.0.self_attn.scores")].outputs[0].logical.dims) == [1, 8, 8, 2048, 2048]
    assert imported.constants["causal_mask"].shape == (2048, 2048)
    assert imported.constants["rotary.cos"].shape == (2048, 128)


def test_gpt3_has_a_tied_head_and_learned_positions(paper):
    m = paper["gpt3-175b"].model
    inits = _inits(m)
    assert inits["transformer.wte.weight"] == [50257, 12288] and inits["transformer.wpe.weight"] == [2048, 12288]
    assert inits["transformer.h.95.mlp.c_fc.weight"] == [12288, 49152]
    assert not any(k.startswith("lm_head") for k in inits)
    ops = Counter(n.op_type for n in m.graph.node)
    assert ops["Gelu"] == 96 and ops["LayerNormalization"] == 2 * 96 + 1 and ops["Softmax"] == 96
    assert [d.dim_value or d.dim_param for d in m.graph.output[0].type.tensor_type.shape.dim] == ["N", 2048, 50257]


# -- small scale -------------------------------------------------------------------

@pytest.mark.parametrize("name", LLMS)
def test_small_forward_matches_onnxruntime(name):
    built = _small(name)
    onnx.checker.check_model(built.model, full_check=True)
    ids = _ids(zoo.MODELS[name].small)
    expected = _ort(built.model, ids)
    got = UnityBackend.prepare(built.model).run({"input_ids": ids})[0]
    assert expected.shape == (3, 16, zoo.MODELS[name].small.vocab) and np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("name", LLMS)
def test_masks_and_tables_are_constants_not_weights(name):
    built = _small(name)
    imported = import_model_proto(built.model, ImportOptions(2))
    floats = {t.name for t in built.model.graph.initializer if t.data_type == TensorProto.FLOAT and t.dims}
    assert set(imported.weights) == floats
    assert "causal_mask" in imported.constants and "causal_mask" not in imported.weights
    mask = imported.constants["causal_mask"]
    assert np.array_equal(mask < 0, np.triu(np.ones_like(mask, dtype=bool), 1)) and mask.min() == -1e9
    if name.startswith("llama"):
        assert {"rotary.cos", "rotary.sin"} <= set(imported.constants)


@pytest.mark.parametrize("name", LLMS)
def test_small_models_are_causal(name):
    """Changing the last token changes the last position's logits and no earlier one's."""
    built = _small(name)
    ids = _ids(zoo.MODELS[name].small, batch=1)
    changed = ids.copy()
    changed[0, -1] = (changed[0, -1] + 1) % zoo.MODELS[name].small.vocab
    a, b = _ort(built.model, ids), _ort(built.model, changed)
    np.testing.assert_array_equal(a[:, :-1], b[:, :-1])
    assert np.abs(a[:, -1] - b[:, -1]).max() > 1e-3


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(d), causal) v on [B, H, S, d]."""
    s = q.shape[-2]
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]) + np.triu(np.full((s, s), -np.inf), 1)
    return _softmax(scores) @ v


def _llama_reference(w: dict[str, np.ndarray], cfg: LlamaConfig, ids: np.ndarray) -> np.ndarray:
    """Hugging Face's LlamaForCausalLM forward, in float64: repeat_kv copies each key/value
    head for its group of consecutive query heads; rotate_half splits the head in halves."""
    b, s = ids.shape
    d, group = cfg.hidden // cfg.heads, cfg.heads // cfg.kv_heads
    ang = np.arange(s)[:, None] * cfg.rope_base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(t):
        return t * cos + np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1) * sin

    def rms(t, name):
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + cfg.eps) * w[f"{name}.weight"]

    def heads(t, n):
        return t.reshape(b, s, n, d).transpose(0, 2, 1, 3)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg.layers):
        p = f"model.layers.{i}"
        y = rms(x, f"{p}.input_layernorm")
        q = rope(heads(y @ w[f"{p}.self_attn.q_proj.weight"], cfg.heads))
        k = rope(heads(y @ w[f"{p}.self_attn.k_proj.weight"], cfg.kv_heads)).repeat(group, axis=1)
        v = heads(y @ w[f"{p}.self_attn.v_proj.weight"], cfg.kv_heads).repeat(group, axis=1)
        a = _attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, s, cfg.hidden)
        x = x + a @ w[f"{p}.self_attn.o_proj.weight"]
        y = rms(x, f"{p}.post_attention_layernorm")
        gate = y @ w[f"{p}.mlp.gate_proj.weight"]
        x = x + (gate / (1 + np.exp(-gate)) * (y @ w[f"{p}.mlp.up_proj.weight"])) @ w[f"{p}.mlp.down_proj.weight"]
    return rms(x, "model.norm") @ w["lm_head.weight"]


def _gpt_reference(w: dict[str, np.ndarray], cfg: GptConfig, ids: np.ndarray) -> np.ndarray:
    """GPT-2's forward (GPT-3's architecture), in float64, with the head tied to wte."""
    b, s = ids.shape
    d = cfg.hidden // cfg.heads

    def ln(t, name):
        mu, var = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + cfg.eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def lin(t, name):
        return t @ w[f"{name}.weight"] + w[f"{name}.bias"]

    def heads(t):
        return t.reshape(b, s, cfg.heads, d).transpose(0, 2, 1, 3)

    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:s]
    for i in range(cfg.layers):
        p = f"transformer.h.{i}"
        y = ln(x, f"{p}.ln_1")
        q, k, v = (heads(lin(y, f"{p}.attn.{n}_proj")) for n in "qkv")
        x = x + lin(_attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, s, cfg.hidden), f"{p}.attn.o_proj")
        f = lin(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")
        f = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f ** 3)))
        x = x + lin(f, f"{p}.mlp.c_proj")
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


@pytest.mark.parametrize("name", LLMS)
def test_small_forward_matches_a_numpy_transcription(name):
    built = _small(name)
    cfg = zoo.MODELS[name].small
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in built.model.graph.initializer}
    ids = _ids(cfg)
    reference = (_gpt_reference if isinstance(cfg, GptConfig) else _llama_reference)(w, cfg, ids)
    got = _ort(built.model, ids)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * float(np.abs(reference).max()))


@pytest.mark.parametrize("name", LLMS)
def test_small_models_plan_and_train_on_two_ranks(name, tmp_path):
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec at {MPIEXEC}")
    model, plan = tmp_path / f"{name}.onnx", tmp_path / "plan.json"
    zoo.write(name, model, "small")
    r = CliRunner().invoke(main, ["optimize", str(model), "--cluster", str(SPECS / "local-cpu.yaml"),
                                  "--out", str(plan)])
    assert r.exit_code == 0, r.output
    doc = run_json(plan, "--check", "--steps", "2", ranks=2)
    assert doc["check"]["passed"] and doc["check"]["max_rel_err"] <= 1e-4, doc["check"]
    assert doc["steps"] == 2 and all(math.isfinite(x) and x > 0 for x in doc["loss"])


# -- the command -------------------------------------------------------------------

def test_list_shows_the_llms():
    r = CliRunner().invoke(main, ["zoo", "--list"])
    assert r.exit_code == 0, r.output
    rows = {ln.split()[0]: ln.split()[1] for ln in r.output.strip().splitlines()}
    assert rows["llama2-7b"] == "6738.4M" and rows["llama2-70b"] == "68976.6M" and rows["gpt3-175b"] == "174604.3M"


def test_the_zoo_is_the_papers_seven_and_the_llms():
    """The benchmarks of the paper iterate PAPER_MODELS, benchmarks/llm.py the LLMs: every zoo
    model is in exactly one of them."""
    assert set(zoo.PAPER_MODELS) | set(zoo.LLMS) == set(zoo.MODELS)
    assert not set(zoo.PAPER_MODELS) & set(zoo.LLMS) and len(zoo.PAPER_MODELS) == 7
