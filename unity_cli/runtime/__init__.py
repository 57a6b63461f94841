"""The runtime: kernels, the per-rank executor, collectives and training."""
from __future__ import annotations
