"""The fp8 family's argument checks (shared by every implementation and the fake functions), the CPU reference
of the formula every kernel computes, and the fp8 quantizers (per-token activations, per-channel weights).

The formula (``acc`` = the dot product of the e4m3 operands, accumulated in fp32 by the kernels)::

    y = scale_a[:, None] * (scale_w[None, :] * acc)     # two fp32 multiplies, each rounded
    y = y + float32(bias)                               # if bias (rounded add, never an FMA)
    out = round_to_nearest_even(y -> out_dtype)         # scaled_mm_fp8: fp16 / bf16
    q = e4m3(clamp(y / out_scale, -448, 448))           # scaled_mm_fp8_quant: rn, saturated to e4m3's range

The reference accumulates in float64 and rounds ``acc`` to fp32 once: an e4m3 product is exact in float64 (4
significant bits each) and spans 2**-18 .. 2**17.6, so a sum of K products is exact for K < 2**15 and within one
float64 rounding beyond. The kernels' fp32 accumulation (and FastAccum's ~13-14 bits) differ from it by their
own rounding, which the GPU suite bounds against cuBLAS's (docs/perf/scaled_mm_fp8.md).
"""
from __future__ import annotations

import torch

# the row count and the scale-vector check are the int8 family's: the same rules, the same messages
from ..scaled_mm.checks import (_check_vec, _rows as rows, check_bias, check_operand_shapes,  # noqa: F401  (rows)
                                check_per_token_input)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
OUT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
K_ALIGN = 16
N_ALIGN = 16  # 128-bit output rows and torch._scaled_mm's own N % 16 rule, for every op
FP16_OUT_OPS = ("scaled_mm_fp8", "scaled_mm_fp8_residual")  # the others write e4m3 with an out_scale


def check(op: str, a, w, scale_a, scale_w, bias, out_dtype=None, out_scale=None) -> None:
    """ValueError naming the problem (dtypes, shapes, K % 16, N % 16, scales, bias, out_dtype, devices)."""
    if not isinstance(a, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"oasr.{op}: a and w must be tensors")
    if a.dtype != FP8 or w.dtype != FP8:
        raise ValueError(f"oasr.{op}: a and w must be float8_e4m3fn (quantize activations with "
                         f"torch.ops.oasr.quantize_per_token_fp8), got {a.dtype} and {w.dtype}")
    n, k = check_operand_shapes(op, a, w, "fp8", K_ALIGN)
    if n % N_ALIGN or n == 0:
        raise ValueError(f"oasr.{op}: N={n} is not a positive multiple of {N_ALIGN} (output rows are written "
                         "128 bits at a time; torch._scaled_mm needs it too)")
    m = rows(a, k)
    _check_vec("scale_a", scale_a, m, "M", a, op)
    _check_vec("scale_w", scale_w, n, "N", a, op)
    if op in FP16_OUT_OPS:
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"oasr.{op}: out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
        bias_dtype = out_dtype
    else:
        _check_vec("out_scale", out_scale, m, "M", a, op)
        bias_dtype = torch.float32
    check_bias(op, bias, bias_dtype, n, a)


def acc64(a2: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a2 @ w.T`` of e4m3 operands accumulated in float64 ([M, K] x [N, K] -> [M, N] float64), on a's device."""
    return a2.double() @ w.double().t()


def epilogue_fp32(acc: torch.Tensor, scale_a, scale_w, bias) -> torch.Tensor:
    y = scale_a.reshape(-1, 1) * (scale_w.reshape(1, -1) * acc.float())
    if bias is not None:
        y = y + bias.float()
    return y


def to_fp8(y: torch.Tensor, out_scale: torch.Tensor) -> torch.Tensor:
    """``e4m3(clamp(y / out_scale, -448, 448))`` (the quantizing epilogue; torch's cast alone maps overflow to
    NaN, CUTLASS's satfinite conversion saturates)."""
    return (y / out_scale.reshape(-1, 1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def reference_scaled_mm_fp8(a, w, scale_a, scale_w, bias, out_dtype) -> torch.Tensor:
    n, k = w.shape
    y = epilogue_fp32(acc64(a.reshape(-1, k), w), scale_a, scale_w, bias)
    return y.to(out_dtype).reshape(*a.shape[:-1], n)


def reference_scaled_mm_fp8_quant(a, w, scale_a, scale_w, bias, out_scale) -> torch.Tensor:
    n, k = w.shape
    y = epilogue_fp32(acc64(a.reshape(-1, k), w), scale_a, scale_w, bias)
    return to_fp8(y, out_scale).reshape(*a.shape[:-1], n)


def quantize_per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric e4m3: ``scale = max(amax(|x|, -1), tiny) / 448`` (fp32 [M]), ``q = e4m3(x / scale)``
    (x's shape). Composite: it decomposes into aten ops under tracing, so Inductor fuses it with x's producer."""
    check_per_token_input("quantize_per_token_fp8", x)
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp_min(1e-12) / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.reshape(-1)


def quantize_weight_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric e4m3: (w_q [N, K], scale_w fp32 [N]) with w ≈ w_q * scale_w[:, None]."""
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1).clamp_min(1e-12) / FP8_MAX
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.contiguous(), scale.contiguous()


def e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable e4m3fn values apart `a` and `b` are, elementwise (int32; +0 and -0 count as one
    value): the unit of the act-quant kernels' tolerance against the reference (tests, docs/kernels.md)."""
    def ordinal(q: torch.Tensor) -> torch.Tensor:  # sign-magnitude bits -> consecutive integers
        bits = q.view(torch.uint8).to(torch.int32)
        mag = bits & 0x7F
        return torch.where(bits & 0x80 != 0, -mag, mag)
    return (ordinal(a) - ordinal(b)).abs()
