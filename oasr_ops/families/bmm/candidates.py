"""The bmm family's candidates and operands (the tuners' interface, `oasr_ops.families.candidate`).

Arms of ``bmm|op=<bmm|bmm_nn>|dt=..|N|K``: ``torch`` (cuBLAS: the family's untuned answer and the partition's
fallback), the native lane's default, then the rest of its space feasible for (N, K); each gated against the
float64 product at 4x cuBLAS's own error. Prewarm times the production set (default + coverage basis) and torch.

Operands: the DB's M axis is rows = L * M; a point is measured as one batch (L = 1, M = rows). ``b`` is the
rotated operand (K-contiguous for op ``bmm``, N-contiguous for ``bmm_nn``), the way the rewrite sees it.
"""
from __future__ import annotations

from typing import Any

from ...runtime.registry import native_lane
from ..candidate import Candidate, Gate, Operands, lane_candidates

FAMILY = "bmm"
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "half": "float16"}


def _bind(o: Operands, config: str, copy: int):
    import torch

    fn, a, b = torch.ops.oasr.bmm, o.acts["a"], o.weights[copy % o.copies]["b"]
    return lambda: fn(a, b, config)


def candidates(parts: Any, arch: str) -> list[Candidate]:
    """torch, the lane default, then the rest of the bmm lane's space (statically feasible for N, K)."""
    return lane_candidates(native_lane(arch, FAMILY), _bind, Gate("tolerance", baseline="torch"), parts.n, parts.k,
                           arch)


def operands(point: Any, device: Any, seed: int = 0, *, copies: int = 1, like: Operands | None = None) -> Operands:
    """a [1, M, K] ~ N(0, 1); b [1, K, N] ~ N(0, 1/K) in the op's layout; in the point's dtype."""
    import torch

    dtype = getattr(torch, DTYPES.get(point.dtype, "float16"))
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    n, k = point.n, point.k

    def make_b():
        if point.op == "bmm_nn":
            return torch.randn(1, k, n, generator=g, device=device, dtype=dtype) / k ** 0.5
        return (torch.randn(1, n, k, generator=g, device=device, dtype=dtype) / k ** 0.5).transpose(1, 2)

    weights = like.weights if like is not None else [{"b": make_b()} for _ in range(copies)]
    a = torch.randn(1, point.m, k, generator=g, device=device, dtype=dtype)
    return Operands(point, {"a": a}, {}, weights,
                    lambda: torch.bmm(a.double(), weights[0]["b"].double()))
