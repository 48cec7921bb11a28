"""The conv1d family's candidates and operands (the tuners' interface, `oasr_ops.families.candidate`).

Arms of ``conv1d|op=<conv1d|conv1d_btc>|dt=..|N=<C>|K=<Kw>``: ``torch`` (cuDNN through `F.conv1d`, with the
layout conversions a [B, T, C] caller pays), the lane default (the partition's fallback: the untuned answer, never
slower than cuDNN where measured, so a region names another arm only where it beats it), then the rest of the
depthwise space (tiles over
frames x channels, vector width, threads); each gated against the float64 conv at 4x cuDNN's own error. Prewarm
times the production set (default + coverage basis) and torch.

Operands: the DB's M axis is M = B * T_out (stride 1: T); a point is measured as one utterance (B = 1, T = M) in
the op's layout — what the spec's regions over B * T_out assume. Weights and bias are fp32, as the rewrite's
BatchNorm fold produces them; the activation is SiLU, as in the Conformer's conv module (its cost is in the
noise of a memory-bound kernel, and the DB key has no activation).
"""
from __future__ import annotations

from typing import Any

from ...runtime.registry import native_lane
from ..candidate import Candidate, Gate, Operands, lane_candidates

FAMILY = "conv1d"
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "half": "float16"}
LAYOUT = {"conv1d": "bct", "conv1d_btc": "btc"}
ACTIVATION = "silu"


def _bind(o: Operands, config: str, copy: int):
    import torch

    fn = torch.ops.oasr.conv1d_depthwise.default
    x, layout = o.acts["x"], o.consts["layout"]
    w = o.weights[copy % o.copies]
    pad = int(w["w"].shape[-1]) // 2
    return lambda: fn(x, w["w"], w["b"], pad, layout, ACTIVATION, config)


def host_probe() -> tuple[int, int]:
    """(N, K) of the signature the build prices host issue cost on: C = 256, Kw = 15 (K is a kernel width)."""
    return 256, 15


def candidates(parts: Any, arch: str) -> list[Candidate]:
    """torch (cuDNN), the lane default (the fallback), then the rest of the depthwise lane's space feasible for
    (C, Kw) on `arch`."""
    # The partition's fallback is the lane default, the family's untuned answer (measured faster than cuDNN at
    # every shape of docs/perf/conv.md): above the largest measured M, and wherever no config beats it by the
    # gate's margin, a built DB then answers what an untuned shape gets, never cuDNN's 3-8x slower conv.
    return lane_candidates(native_lane(arch, FAMILY), _bind, Gate("tolerance", baseline="torch"), parts.n, parts.k,
                           arch, fallback="default")


def operands(point: Any, device: Any, seed: int = 0, *, copies: int = 1, like: Operands | None = None) -> Operands:
    """x [1, C, M] or [1, M, C] ~ N(0, 1) in the point's dtype; w [C, 1, Kw] ~ N(0, 1/Kw), bias ~ N(0, 1), fp32."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, DTYPES.get(point.dtype, "float16"))
    layout = LAYOUT[point.op]
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    c, kw, t = point.n, point.k, point.m

    def make_w():
        return {"w": torch.randn(c, 1, kw, generator=g, device=device) / kw ** 0.5,
                "b": torch.randn(c, generator=g, device=device)}

    shape = (1, c, t) if layout == "bct" else (1, t, c)
    x = torch.randn(*shape, generator=g, device=device, dtype=dtype)  # first: the same seed, the same x
    weights = like.weights if like is not None else [make_w() for _ in range(copies)]

    def reference():
        w0 = weights[0]
        xc = x.double() if layout == "bct" else x.double().transpose(1, 2)
        y = F.silu(F.conv1d(xc, w0["w"].double(), w0["b"].double(), padding=kw // 2, groups=c))
        return y if layout == "bct" else y.transpose(1, 2)

    return Operands(point, {"x": x}, {"layout": layout}, weights, reference)
