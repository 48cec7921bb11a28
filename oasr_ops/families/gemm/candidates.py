"""The gemm family's candidates and operands (the tuners' interface, `oasr_ops.families.candidate`).

Arms of ``gemm|op=<gemm|gemm_activation>|dt=..|N|K``: ``torch`` (cuBLAS; the partition's fallback), the native
lane's default, then every other config of the native lane that is feasible for (N, K) — no cost model prunes
yet. Each is gated against the float64 product at 4x cuBLAS's own error. Prewarm times only the compiled
production set (default + coverage basis) and torch. Every arm is charged its eager host issue cost (``torch`` /
``oasr``).
"""
from __future__ import annotations

import math
from typing import Any

from ...runtime.registry import native_lane
from ..candidate import Candidate, Gate, Operands, lane_candidates

FAMILY = "gemm"
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "half": "float16"}


def activation(op: str) -> str:
    """The epilogue a DB op means: ``gemm_activation`` is the SiLU-fused GEMM the rewrite records."""
    return "silu" if op == "gemm_activation" else "none"


def _bind(act: str):
    def bind(ops: Operands, config: str, copy: int):
        import torch

        gemm = torch.ops.oasr.gemm
        a, bias, w = ops.acts["a"], ops.consts["bias"], ops.weights[copy % ops.copies]["w"]
        return lambda: gemm(a, w, bias, act, config)
    return bind


def candidates(parts: Any, arch: str) -> list[Candidate]:
    """torch, the lane default, then the rest of the native lane's space (statically feasible for N, K)."""
    return lane_candidates(native_lane(arch, FAMILY), _bind(activation(parts.op)), Gate("tolerance", baseline="torch"),
                           parts.n, parts.k, arch)


def operands(point: Any, device: Any, seed: int = 0, *, copies: int = 1, like: Operands | None = None) -> Operands:
    """a [M, K] ~ N(0, 1); w [N, K] ~ N(0, 1/K) (outputs of unit scale); bias [N]; in the point's dtype."""
    import torch

    dtype = getattr(torch, DTYPES.get(point.dtype, "float16"))
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    n, k = point.n, point.k
    if like is None:
        weights = [{"w": torch.randn(n, k, generator=g, device=device, dtype=dtype) / math.sqrt(k)}
                   for _ in range(copies)]
        consts = {"bias": torch.randn(n, generator=g, device=device, dtype=dtype)}
    else:
        weights, consts = like.weights, like.consts
    a = torch.randn(point.m, k, generator=g, device=device, dtype=dtype)
    act = activation(point.op)

    def reference() -> Any:
        y = torch.nn.functional.linear(a.double(), weights[0]["w"].double(), consts["bias"].double())
        return torch.nn.functional.silu(y) if act == "silu" else y

    return Operands(point, {"a": a}, consts, weights, reference)
