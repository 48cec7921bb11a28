"""Fused LayerNorm -> per-token quantization (`torch.ops.oasr.layer_norm_quant`), the producer-side half of
low-precision inference: the quantizing consumer GEMM (`oasr::scaled_mm`) reads its int8 output and scale.

Not a tuned family of the DB (no FamilySpec): the kernel is a row reduction whose only config is the row mapping,
chosen per width from a small table measured by benchmarks/layer_norm_quant.py (`ops.AUTO_BY_WIDTH`).
"""
from __future__ import annotations

from . import ops  # noqa: F401  (registers torch.ops.oasr.layer_norm_quant)
from .ops import layer_norm_quant, reference_layer_norm_quant  # noqa: F401
