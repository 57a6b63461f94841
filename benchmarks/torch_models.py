"""The BERT-like and ResNet-like models of ``vs_torch.py``, as torch modules: the benchmark
exports them to ONNX for unity and trains the same modules under DDP (torch only)."""
import torch
from torch import nn


class Encoder(nn.Module):
    """One BERT encoder layer: self-attention and a GELU feed-forward, each with a residual and LayerNorm."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.f1, self.f2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.act = nn.GELU()

    def forward(self, x):
        n, s, d = x.shape
        h = self.heads

        def split(t):
            return t.reshape(n, s, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(2, 3) / (d // h) ** 0.5, dim=-1) @ v
        x = self.n1(x + self.o(a.transpose(1, 2).reshape(n, s, d)))
        return self.n2(x + self.f2(self.act(self.f1(x))))


class BertLike(nn.Module):
    """Token ids [N, 32] -> 8 classes: an embedding, 2 encoder layers of width 128 (4 heads,
    feed-forward 512), mean over the sequence, a linear head."""

    def __init__(self, vocab=2000, d=128, layers=2, heads=4, ff=512, seq=32, classes=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.layers = nn.Sequential(*(Encoder(d, heads, ff) for _ in range(layers)))
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        return self.head(self.layers(self.emb(ids) + self.pos).mean(dim=1))


class Residual(nn.Module):
    """relu(x + conv(relu(conv(x))))."""

    def __init__(self, c):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(x + self.b(self.relu(self.a(x))))


class ResNetLike(nn.Module):
    """Images [N, 3, 32, 32] -> 10 classes: 3x3 convolutions of 16 then 32 channels with three
    residual blocks (no batch norm), global average pooling, a linear head."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), Residual(width), Residual(width),
                                  nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
                                  Residual(2 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        return self.head(self.body(x))


MODELS = {"bert-like": (BertLike, lambda n, g: torch.randint(0, 2000, (n, 32), generator=g), 8),
          "resnet-like": (ResNetLike, lambda n, g: torch.randn(n, 3, 32, 32, generator=g), 10)}
"""name -> (module class, a batch of n inputs from generator g, classes)."""
