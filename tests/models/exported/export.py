"""How the ONNX files beside this script were made: small PyTorch / HF-transformers
models with random weights (built from configs, never downloaded), exported by
both of torch.onnx's exporters: the TorchScript one (opset 17, dynamic batch
axis ``batch`` on every input) and the dynamo one (opset 18, static shapes,
weights in ``<name>_dynamo.onnx.data`` beside the model).

The tiny models of ../tiny/ were exported the same way.  PyTorch is not a dependency of unity; use
a throwaway venv:

    python3 -m venv /tmp/exportenv
    /tmp/exportenv/bin/pip install torch==2.13.0 transformers onnxscript onnx
    /tmp/exportenv/bin/python tests/models/exported/export.py tests/models/exported

(made with torch 2.13.0+cpu, transformers 5.24.0, onnxscript 0.7.2, onnx 1.23.2).
An export that fails is reported and skipped; the others still get written.
"""
import os
import sys
import traceback

import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig, ViTModel

out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(1)


class FirstOutput(nn.Module):
    """Keep only the first output of an HF model (logits / last hidden state)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *args):
        return self.m(*args)[0]


class GPT2Logits(nn.Module):
    """LM logits of a GPT-2 from ``input_ids`` alone, with an all-ones attention
    mask built inside the graph.  Without an explicit mask, transformers 5 probes
    the position ids for packed sequences with ``torch.diff``, which the
    TorchScript exporter cannot export (``aten::diff`` is unsupported at opset 17)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids, attention_mask=torch.ones_like(input_ids))[0]


class DLRM(nn.Module):
    """DLRM-like recommender: bottom MLP on the dense features, one embedding
    lookup per sparse feature, pairwise dot-product interaction of the 4 vectors
    (bmm of the stacked features, strictly-upper-triangle selection), concat with
    the dense vector, top MLP and a sigmoid click probability."""

    def __init__(self, n_dense=13, n_tables=3, rows=1000, dim=16):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(n_tables))
        self.bot = nn.Sequential(nn.Linear(n_dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        n = n_tables + 1
        iu = torch.triu_indices(n, n, offset=1)
        self.register_buffer("li", iu[0], persistent=False)
        self.register_buffer("lj", iu[1], persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 64), nn.ReLU(),
                                 nn.Linear(64, 1), nn.Sigmoid())

    def forward(self, dense, sparse):
        x = self.bot(dense)                                           # [B, 16]
        feats = [x] + [e(sparse[:, i]) for i, e in enumerate(self.emb)]
        t = torch.stack(feats, dim=1)                                 # [B, 4, 16]
        z = torch.bmm(t, t.transpose(1, 2))                           # [B, 4, 4]
        inter = z[:, self.li, self.lj]                                # [B, 6]
        return self.top(torch.cat([x, inter], dim=1))                 # [B, 1]


class BasicConv(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1):
        super().__init__(nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class InceptionBlock(nn.Module):
    """1x1 | 1x1->3x3 | 1x1->3x3->3x3 (the factorised 5x5) | maxpool->1x1, Concat."""

    def __init__(self, cin, c1, r3, c3, r5, c5, pp):
        super().__init__()
        self.b1 = BasicConv(cin, c1, 1)
        self.b2 = nn.Sequential(BasicConv(cin, r3, 1), BasicConv(r3, c3, 3))
        self.b3 = nn.Sequential(BasicConv(cin, r5, 1), BasicConv(r5, c5, 3), BasicConv(c5, c5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), BasicConv(cin, pp, 1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)


class InceptionTiny(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.stem = nn.Sequential(BasicConv(3, 32, 3), nn.MaxPool2d(2))          # 16x16
        self.block1 = InceptionBlock(32, 16, 16, 24, 8, 8, 8)                   # 56 ch
        self.pool = nn.MaxPool2d(2)                                              # 8x8
        self.block2 = InceptionBlock(56, 32, 24, 48, 8, 16, 16)                 # 112 ch
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(112, n_classes)

    def forward(self, x):
        x = self.block2(self.pool(self.block1(self.stem(x))))
        return self.fc(torch.flatten(self.gap(x), 1))


def export(name, model, args, names, dynamo):
    path = os.path.join(out, f"{name}{'_dynamo' if dynamo else ''}.onnx")
    model.eval()
    kw = dict(input_names=names, dynamo=dynamo, opset_version=18 if dynamo else 17)
    if not dynamo:
        kw["dynamic_axes"] = {n: {0: "batch"} for n in names}
    try:
        with torch.no_grad():
            torch.onnx.export(model, args, path, **kw)
    except Exception:  # keep going: the README says which export failed and why
        print(f"FAILED {path}", file=sys.stderr)
        traceback.print_exc()
        return
    print(path)


gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager"))
vit = ViTModel(ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=128,
                         attn_implementation="eager"))
dlrm = DLRM()
inception = InceptionTiny()

for dynamo in (False, True):
    export("gpt2_tiny", GPT2Logits(gpt2), (torch.randint(0, 500, (2, 16)),), ["input_ids"], dynamo)
    export("vit_tiny", FirstOutput(vit), (torch.randn(2, 3, 32, 32),), ["pixel_values"], dynamo)
    export("dlrm_tiny", dlrm, (torch.randn(2, 13), torch.randint(0, 1000, (2, 3))),
           ["dense", "sparse"], dynamo)
    export("inception_tiny", inception, (torch.randn(2, 3, 32, 32),), ["x"], dynamo)
