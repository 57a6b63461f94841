"""Tiny Hugging Face models of the families people train today, exported to ONNX.

Each model is built from a config with random weights (nothing is downloaded) and
exported by both of torch.onnx's exporters:

* TorchScript (``dynamo=False``), opset 17, a dynamic batch axis on every input;
* dynamo (``dynamo=True``), opset 18, static shapes, weights inside the file.

The files are committed under ``tests/models/hf/`` so that ``make test`` needs neither
torch nor transformers; ``tests/models/hf/catalog.json`` lists each file's inputs and
what its export needed. Re-make them with the optional ``export`` extra:

    make hf-corpus        # pip install torch==2.13.0 + '.[export]', then this script

An export that fails is reported and skipped; the others are still written.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
import transformers
from torch import nn

HERE = Path(__file__).resolve().parent
SEED = 20261201
BATCH = 2
SEQ = 10
VOCAB = 320


@dataclass(frozen=True)
class Family:
    """How to build one family's model and the example inputs it is exported with."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, torch.Tensor]]
    note: str


class FirstOutput(nn.Module):
    """An HF model reduced to its first output (logits or last hidden state), taking its
    inputs by name so that the ONNX inputs keep their names."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, args)))
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def _ids(*shape: int, high: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, high, shape, dtype=torch.int64)


def _text() -> dict[str, torch.Tensor]:
    mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    mask[1, SEQ - 3:] = 0                       # one padded sequence: the mask matters
    return {"input_ids": _ids(BATCH, SEQ), "attention_mask": mask}


def _decoder(config_cls: type, **kw) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        cfg = config_cls(vocab_size=VOCAB, max_position_embeddings=64, use_cache=False,
                         attn_implementation="sdpa", tie_word_embeddings=False, **kw)
        return transformers.AutoModelForCausalLM.from_config(cfg)
    return build


def _llama() -> nn.Module:
    return _decoder(transformers.LlamaConfig, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)()


def _mistral() -> nn.Module:
    return _decoder(transformers.MistralConfig, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=10, sliding_window=6)()


def _qwen2() -> nn.Module:
    return _decoder(transformers.Qwen2Config, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=2)()


def _phi() -> nn.Module:
    return _decoder(transformers.PhiConfig, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                    num_attention_heads=4, partial_rotary_factor=0.5)()


def _gpt_neox() -> nn.Module:
    return _decoder(transformers.GPTNeoXConfig, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, rotary_pct=0.5)()


def _mixtral() -> nn.Module:
    # "batched_mm" experts: gather each token's expert weights, then one batched MatMul.
    # The eager implementation loops over the experts a token picked (NonZero), whose
    # shapes depend on the routing: unity refuses it in one line.
    return _decoder(transformers.MixtralConfig, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    experts_implementation="batched_mm")()


def _mixtral_eager() -> nn.Module:
    """The same MoE with the experts HF runs by default: a loop over the experts hit."""
    return _decoder(transformers.MixtralConfig, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    experts_implementation="eager")()


def _t5() -> nn.Module:
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=1,
                                num_heads=4, relative_attention_num_buckets=8, use_cache=False,
                                decoder_start_token_id=0, attn_implementation="eager")
    return transformers.T5ForConditionalGeneration(cfg)


def _t5_inputs() -> dict[str, torch.Tensor]:
    return {**_text(), "decoder_input_ids": _ids(BATCH, 6)}


def _bert() -> nn.Module:
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=64, attn_implementation="sdpa")
    return transformers.BertModel(cfg, add_pooling_layer=False)


def _vit() -> nn.Module:
    cfg = transformers.ViTConfig(image_size=24, patch_size=6, num_channels=3, hidden_size=40, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=80, attn_implementation="sdpa")
    return transformers.ViTModel(cfg, add_pooling_layer=False)


def _convnext() -> nn.Module:
    cfg = transformers.ConvNextConfig(num_channels=3, patch_size=2, num_stages=2, hidden_sizes=[12, 24], depths=[1, 2],
                                      image_size=24, num_labels=7)
    return transformers.ConvNextForImageClassification(cfg)


def _swin() -> nn.Module:
    # 20x20 images in patches of 2 give a 10x10 map, which window 4 must pad to 12x12.
    cfg = transformers.SwinConfig(image_size=20, patch_size=2, num_channels=3, embed_dim=16, depths=[1, 1],
                                  num_heads=[2, 4], window_size=4, mlp_ratio=2.0, num_labels=5)
    return transformers.SwinForImageClassification(cfg)


def _images(size: int) -> Callable[[], dict[str, torch.Tensor]]:
    return lambda: {"pixel_values": torch.randn(BATCH, 3, size, size)}


def _whisper() -> nn.Module:
    cfg = transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=20, d_model=32, encoder_layers=1,
                                     decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=12,
                                     max_target_positions=16, use_cache=False, attn_implementation="sdpa",
                                     pad_token_id=0, decoder_start_token_id=1)
    return transformers.WhisperModel(cfg)


def _whisper_inputs() -> dict[str, torch.Tensor]:
    # With no decoder mask, transformers probes the positions with torch.diff, which the
    # TorchScript exporter cannot export: pass an all-ones one.
    return {"input_features": torch.randn(BATCH, 20, 24), "decoder_input_ids": _ids(BATCH, 5),
            "decoder_attention_mask": torch.ones(BATCH, 5, dtype=torch.int64)}


FAMILIES = [
    Family("llama", _llama, _text, "decoder LLM: RMSNorm, rotary embeddings, grouped-query SDPA, SwiGLU"),
    Family("mistral", _mistral, _text, "decoder LLM with a sliding-window causal mask, one KV head"),
    Family("qwen2", _qwen2, _text, "decoder LLM with biased Q/K/V projections"),
    Family("phi", _phi, _text, "decoder LLM: partial rotary, LayerNorm, parallel attention + MLP block"),
    Family("gpt_neox", _gpt_neox, _text, "decoder LLM: fused QKV projection, partial rotary"),
    Family("mixtral", _mixtral, _text, "mixture of experts: TopK router, softmax weights, experts as a batched MatMul"),
    Family("mixtral_eager", _mixtral_eager, _text,
           "mixture of experts, HF's default experts: NonZero picks each expert's tokens (refused)"),
    Family("t5", _t5, _t5_inputs, "encoder-decoder with relative position buckets"),
    Family("bert", _bert, _text, "encoder with a padding attention mask"),
    Family("vit", _vit, _images(24), "vision transformer"),
    Family("convnext", _convnext, _images(24), "CNN: depthwise 7x7 convolutions, LayerNorm over channels"),
    Family("swin", _swin, _images(20), "windowed vision transformer: Pad, window partition by Reshape/Transpose"),
    Family("whisper", _whisper, _whisper_inputs, "speech encoder-decoder: Conv1d front end over mel features"),
]


def export(family: Family, out: Path) -> list[dict]:
    """Both exports of one family; returns the catalog entries of the files written."""
    torch.manual_seed(SEED + sum(map(ord, family.name)))
    try:
        model = family.build().eval()
    except Exception as e:
        print(f"FAILED {family.name}: cannot build: {type(e).__name__}: {e}", file=sys.stderr)
        return []
    feeds = family.inputs()
    names = tuple(feeds)
    wrapped = FirstOutput(model, names).eval()
    args = tuple(feeds.values())
    entries = []
    for exporter in ("torchscript", "dynamo"):
        path = out / f"{family.name}_{exporter}.onnx"
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                if exporter == "torchscript":
                    torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=17,
                                      input_names=list(names), output_names=["output"],
                                      dynamic_axes={n: {0: "batch"} for n in names} | {"output": {0: "batch"}})
                else:
                    program = torch.onnx.export(wrapped, args, dynamo=True, opset_version=18,
                                                input_names=list(names), output_names=["output"])
                    program.save(str(path), external_data=False)
            onnx.checker.check_model(str(path), full_check=True)
        except Exception as e:  # report and go on with the other exports
            print(f"FAILED {path.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
            traceback.print_exc(limit=2)
            path.unlink(missing_ok=True)
            continue
        m = onnx.load(str(path))
        ops = sorted({n.op_type for n in m.graph.node})
        entries.append({"file": path.name, "family": family.name, "exporter": exporter,
                        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
                        "inputs": {k: list(v.shape) for k, v in feeds.items()},
                        "dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in feeds.items()},
                        "note": family.note, "ops": ops, "bytes": path.stat().st_size})
        print(f"wrote {path.name} ({path.stat().st_size // 1024} KB, {len(m.graph.node)} nodes)")
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "hf")
    parser.add_argument("families", nargs="*", help="families to export (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [f for f in FAMILIES if not args.families or f.name in args.families]
    catalog_path = args.out / "catalog.json"
    catalog = json.loads(catalog_path.read_text()) if catalog_path.exists() else {}
    catalog.setdefault("made_with", {})
    catalog["made_with"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                            "onnx": onnx.__version__, "seed": SEED}
    files = {e["file"]: e for e in catalog.get("files", [])}
    for family in chosen:
        for e in export(family, args.out):
            files[e["file"]] = e
    catalog["files"] = [files[k] for k in sorted(files)]
    catalog_path.write_text(json.dumps(catalog, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
