"""oasr_ops: per-shape, per-architecture CUTLASS GEMM selection from measured data, served as torch ops."""
from __future__ import annotations

__version__ = "0.1.0"

from . import library  # noqa: F401  (registers torch.ops.oasr.*)
from .configs import SENTINELS, Config, parse  # noqa: F401


def gemm(a, w, bias=None, activation: str | None = None, config: str = "auto"):
    """`a @ w.T + bias` then `activation`, on the kernel `config` names (`auto`: the tuning DB decides)."""
    import torch

    return torch.ops.oasr.gemm.default(a, w, bias, activation or "none", config)
