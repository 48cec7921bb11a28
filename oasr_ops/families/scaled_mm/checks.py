"""The int8 scaled GEMMs' argument checks, shared by every implementation (CPU, CUDA, fake) of `scaled_mm`,
`scaled_mm_quant`, `scaled_mm_act_quant` and `scaled_mm_residual` (ops.py documents the rules), and `fast_ok`, the
cheap subset the CUDA hot path runs once a plan exists for the call key (the C++ hot path, templates/hot_path.cpp,
mirrors it)."""
from __future__ import annotations

import torch

OUT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
K_ALIGN = 16
N_ALIGN = {"scaled_mm": 8, "scaled_mm_quant": 16, "scaled_mm_act_quant": 16, "scaled_mm_residual": 8}
QUANT_OPS = ("scaled_mm_quant", "scaled_mm_act_quant")  # int8 output, an out_scale, an fp32 bias


def _rows(a: torch.Tensor, k: int) -> int:
    return a.numel() // k if k else 0


def _check_vec(name: str, t: torch.Tensor, full: int, full_name: str, a: torch.Tensor, op: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"oasr.{op}: {name} must be a tensor")
    if t.dtype != torch.float32:
        raise ValueError(f"oasr.{op}: {name} must be float32, got {t.dtype}")
    if t.device != a.device:
        raise ValueError(f"oasr.{op}: {name} is on {t.device}, a on {a.device}")
    if t.dim() != 1 or t.shape[0] not in (1, full):
        raise ValueError(f"oasr.{op}: {name} must have shape [1] (per tensor) or [{full_name}={full}], "
                         f"got {tuple(t.shape)}")


def check_operand_shapes(op: str, a, w, element: str, k_align: int = K_ALIGN) -> tuple[int, int]:
    """w 2-D [N, K], a [..., K] on w's device, K a positive multiple of `k_align` (`element` operands are read 16 at
    a time by TMA / cp.async): a ValueError naming the problem, else (N, K). Shared with the fp8 family."""
    if w.dim() != 2:
        raise ValueError(f"oasr.{op}: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if a.dim() < 1:
        raise ValueError(f"oasr.{op}: a must have at least one dimension [..., K]")
    n, k = w.shape
    if a.shape[-1] != k:
        raise ValueError(f"oasr.{op}: K mismatch: a is {tuple(a.shape)}, w is {tuple(w.shape)} (w is [N, K])")
    if a.device != w.device:
        raise ValueError(f"oasr.{op}: a is on {a.device}, w on {w.device}")
    if k % k_align or k == 0:
        raise ValueError(f"oasr.{op}: K={k} is not a positive multiple of {k_align} ({element} operands are read 16 "
                         "at a time)")
    return n, k


def check_per_token_input(op: str, x: torch.Tensor) -> None:
    """A per-token quantizer's x is ``[..., K]`` with K > 0 (a row's scale is its amax): a ValueError otherwise, also
    under tracing (the quantizers are composite ops: this runs on the fake tensors too). Shared with the fp8 family."""
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"oasr.{op}: x must be [..., K] with K > 0, got shape {tuple(x.shape)}")


def _check(op: str, a, w, scale_a, scale_w, bias, out_dtype=None, out_scale=None) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"oasr.{op}: a and w must be tensors")
    if a.dtype != torch.int8 or w.dtype != torch.int8:
        raise ValueError(f"oasr.{op}: a and w must be int8 (quantize activations with "
                         f"torch.ops.oasr.quantize_per_token), got {a.dtype} and {w.dtype}")
    n, k = check_operand_shapes(op, a, w, "int8")
    if n % N_ALIGN[op]:
        raise ValueError(f"oasr.{op}: N={n} is not a multiple of {N_ALIGN[op]} (output rows are written "
                         "128 bits at a time)")
    m = _rows(a, k)
    _check_vec("scale_a", scale_a, m, "M", a, op)
    _check_vec("scale_w", scale_w, n, "N", a, op)
    if op not in QUANT_OPS:  # scaled_mm and scaled_mm_residual (residual.py): fp16/bf16 output
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"oasr.{op}: out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
        bias_dtype = out_dtype
    else:
        _check_vec("out_scale", out_scale, m, "M", a, op)
        bias_dtype = torch.float32
    check_bias(op, bias, bias_dtype, n, a)


def check_bias(op: str, bias, dtype: torch.dtype, n: int, a: torch.Tensor) -> None:
    """None, or a [N] tensor of `dtype` on a's device: a ValueError naming the problem. Shared with the fp8 family."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise ValueError(f"oasr.{op}: bias must be a tensor or None")
    if bias.dtype != dtype:
        raise ValueError(f"oasr.{op}: bias must have dtype {dtype}, got {bias.dtype}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"oasr.{op}: bias must have shape ({n},), got {tuple(bias.shape)}")
    if bias.device != a.device:
        raise ValueError(f"oasr.{op}: bias is on {bias.device}, a on {a.device}")


def _check_layout(op: str, *tensors: tuple[str, torch.Tensor | None]) -> None:
    for name, t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"oasr.{op}: {name} (shape {tuple(t.shape)}, stride {t.stride()}) is not contiguous; "
                             "call .contiguous() first")


def _vec_ok(t: torch.Tensor, full: int, device: torch.device) -> bool:
    return (t.dtype is torch.float32 and t.dim() == 1 and t.shape[0] in (1, full) and t.device == device
            and t.is_contiguous())


def fast_ok(a, w, scale_a, scale_w, bias, bias_dtype: torch.dtype, m: int, n: int,
            element: torch.dtype = torch.int8) -> bool:
    """The cheap subset of `_check` + `_check_layout` that, with a plan already made for the call key (op, config,
    out dtype, M, N, K, bias or not, device, DB epoch: N and K alignment, the out dtype and the config passed the full
    checks once), implies all of them — the family's CUDA hot path (docs/architecture.md, "How to add a kernel
    family", step 4). False sends the call through the full checks, which raise the precise error. `element`: the
    operands' dtype (the fp8 family's checks are these with float8_e4m3fn, scaled_mm_fp8/reference.py)."""
    dev = a.device
    return (a.dtype is element and w.dtype is element and w.device == dev and a.is_contiguous()
            and w.is_contiguous() and a.shape[-1] == w.shape[1] and _vec_ok(scale_a, m, dev)
            and _vec_ok(scale_w, n, dev)
            and (bias is None or (bias.dtype is bias_dtype and bias.dim() == 1 and bias.shape[0] == n
                                  and bias.device == dev and bias.is_contiguous())))
