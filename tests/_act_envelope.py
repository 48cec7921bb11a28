"""The act-quant kernels' tolerance as an envelope (tests of oasr::scaled_mm_act_quant and its fp8 twin): a value
computed with an error of at most `err` (in quantization units) from an unrounded value `v` rounds, by the
monotonicity of round-to-nearest and saturation, to something between round(v - err) and round(v + err). So a
kernel within its documented error bound (codegen/act_math.py) lands inside [lo, hi]; where lo == hi (v not within
err of a rounding boundary) it must equal the reference exactly, and it may differ by more than one step only
where err itself exceeds a step."""
from __future__ import annotations

import torch

from oasr_ops.codegen.act_math import GELU_FIT_ERROR
from oasr_ops.families.scaled_mm.act_quant import tanh_error_bound

FP8 = torch.float8_e4m3fn
# the fp32 rounding of the epilogue's steps (FMAs, the approximate 1 / out_scale, the reference's own fp32 steps):
# a few ulp of the quantized value, relative
ROUNDING = 2.0 ** -20


def int8_envelope(v: torch.Tensor, err: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v, err = v.double(), err.double() + ROUNDING * v.double().abs()
    return torch.round(v - err).clamp(-128, 127), torch.round(v + err).clamp(-128, 127)


def e4m3_envelope(v: torch.Tensor, err: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    v, err = v.double(), err.double() + ROUNDING * v.double().abs()
    lo = (v - err).clamp(-448, 448).float().to(FP8).double()  # float first: the fp32 -> e4m3 cast rounds once
    hi = (v + err).clamp(-448, 448).float().to(FP8).double()
    return lo, hi


def fit_error(y: torch.Tensor, act: str) -> torch.Tensor:
    """|apply_activation(y) - act(y)| bound (the fitted GELU; SiLU's identity is exact), float64."""
    if act != "gelu":
        return torch.zeros_like(y, dtype=torch.float64)
    return GELU_FIT_ERROR * y.double().abs().clamp_min(1.0)


def kernel_error(y: torch.Tensor, act: str) -> torch.Tensor:
    """|sm90 kernel act(y) - apply_activation(y)| bound: tanh.approx.f32's relative error (plus rounding)."""
    return tanh_error_bound(y, act)


def assert_in_envelope(got: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, where: str) -> dict[str, float]:
    """got within [lo, hi] everywhere; returns the fraction of values the envelope lets move (lo != hi), for the
    log and for comparing with the fraction that did move."""
    g = got.double()
    bad = (g < lo) | (g > hi)
    assert not bad.any(), (f"{where}: {int(bad.sum())} values outside the error envelope, e.g. "
                           f"{g[bad][:4].tolist()} not in {list(zip(lo[bad][:4].tolist(), hi[bad][:4].tolist()))}")
    may = lo != hi
    return {"may_move": may.double().mean().item(), "n": g.numel()}


def log_envelope(where: str, **numbers: float) -> None:
    """One JSON line per check to $OASR_ENVELOPE_LOG (the GPU steps set it under $OUT): how many values moved
    against the reference and how many the error bound allowed to, measured on the device's tanh.approx."""
    import json
    import os

    path = os.environ.get("OASR_ENVELOPE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"where": where, **numbers}) + "\n")
