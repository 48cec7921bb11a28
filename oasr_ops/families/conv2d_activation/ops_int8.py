"""The int8 conv op: `oasr::conv2d_int8_activation(Tensor x, Tensor w, Tensor scale_x, Tensor scale_w, Tensor? bias,
int[2] stride, int[2] padding, str activation, ScalarType out_dtype, str config) -> Tensor`.

The int8 W8A8 counterpart of `conv2d_activation`, for a speech frontend's second conv (docs/perf/conv.md, session 9:
an int8 implicit GEMM runs the Conformer M one 1.57-1.68x faster than cuDNN's fp16 conv):

* x: ``[B, H, W, Cin]`` int8 NHWC, quantized per tensor: the real input is ``x * scale_x``;
* w: ``[Cout, KH, KW, Cin]`` int8 KRSC, quantized per output channel: the real filter is ``w * scale_w[k]``
  (`quantize_conv_weight`);
* scale_x: fp32 ``[1]``; scale_w: fp32 ``[Cout]``; both finite and > 0 (not checked on the device: a graph-safe op
  reads no value on the host);
* bias: ``[Cout]`` of out_dtype, or None; out_dtype float16 | bfloat16; activation ``none|relu|silu|gelu``;
* out: ``[B, Ho, Wo, Cout]`` packed NHWC of out_dtype.

Numerics: the int32 sum of the int8 products (exact), converted to fp32, then in fp32 ``act(scale_x * (scale_w[k]
* acc) + bias[k])`` and one rounding to out_dtype (`reference_conv2d_int8` computes exactly that with the sum in
float64; the kernel may contract the last multiply and add into one FMA: within one output step).

Kernels (sm90): the `lanes.SM90_INT8_CONV2D` tiles, int8 variants of the family's CUTLASS 3.x implicit-GEMM template
(TMA im2col, int8 wgmma, the scales and bias in the EVT epilogue). Cin must be a multiple of 16 (16-byte TMA
accesses) and Cout of 8. ``config``: ``auto`` (`untuned_tile`: nothing tunes this op yet), a tile id of
that lane, or ``torch``: the reference formula on the device (float64 conv), which is also what runs, with one
warning, where no kernel can (another GPU, Cin % 16, an unaligned view). Not served by any graph rewrite yet.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..autograd import register_inference_op
from ...runtime.plans import WarnOnce
from .lanes import INT8_UNTUNED_TILES as UNTUNED_TILES
from .lanes import SM90_INT8_CONV2D
from .ops import ACTIVATIONS, _activate, _pair, check_geometry, check_layouts, packed_operands

OP = "conv2d_int8_activation"
OUT_DTYPES = {torch.float16: "int8_fp16", torch.bfloat16: "int8_bf16"}  # out dtype -> kernel variant

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define(f"{OP}(Tensor x, Tensor w, Tensor scale_x, Tensor scale_w, Tensor? bias, int[2] stride, int[2] padding, "
            "str activation, ScalarType out_dtype, str config) -> Tensor")


def check(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype) -> tuple[int, int]:
    """ValueError naming the problem; returns (Ho, Wo)."""
    name = f"oasr.{OP}"
    for label, t in (("x", x), ("w", w), ("scale_x", scale_x), ("scale_w", scale_w)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: {label} must be a tensor")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ValueError(f"{name}: bias must be a tensor or None")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"{name}: out_dtype must be float16 or bfloat16, got {out_dtype}")
    if x.dtype != torch.int8 or w.dtype != torch.int8:
        raise ValueError(f"{name}: x and w must be int8, got {x.dtype} and {w.dtype}")
    check_layouts(name, x, w)
    cout = w.shape[0]
    if scale_x.dtype != torch.float32 or tuple(scale_x.shape) != (1,):
        raise ValueError(f"{name}: scale_x must be float32 [1] (per tensor), got {scale_x.dtype} "
                         f"{tuple(scale_x.shape)}")
    if scale_w.dtype != torch.float32 or tuple(scale_w.shape) != (cout,):
        raise ValueError(f"{name}: scale_w must be float32 [Cout] = [{cout}] (per output channel), got "
                         f"{scale_w.dtype} {tuple(scale_w.shape)}")
    if bias is not None and (bias.dtype != out_dtype or tuple(bias.shape) != (cout,)):
        raise ValueError(f"{name}: bias must be [Cout] = [{cout}] of out_dtype {out_dtype}, got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    for label, t in (("w", w), ("scale_x", scale_x), ("scale_w", scale_w), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name}: {label} is on device {t.device}, x on {x.device}")
    return check_geometry(name, x, w, stride, padding)


def untuned_tile(cout: int) -> str:
    """``auto``'s tile: the lane default (64 x 256) where Cout fills its 256 columns as well as a 128-wide tile's,
    else the 128 x 128 tile (Cout = 384: 64 x 256 computes 512 columns, a third of them wasted; docs/perf/conv.md,
    session 10, measured both at Cout 384 and 512 on the H200)."""
    waste = lambda n: -(-cout // n) * n - cout  # noqa: E731  (columns computed beyond Cout)
    wide, square = UNTUNED_TILES
    return wide if waste(256) <= waste(128) else square


def check_config_arg(config: str) -> None:
    if config in ("auto", "torch") or config in SM90_INT8_CONV2D.ids():
        return
    raise ValueError(f"oasr.{OP}: config must be 'auto', 'torch' or one of {list(SM90_INT8_CONV2D.ids())}, "
                     f"got {config!r}")


def quantize_conv_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A KRSC float filter -> (int8 KRSC filter, fp32 scale per output channel): symmetric, amax / 127."""
    if w.dim() != 4 or not w.is_floating_point():
        raise ValueError(f"quantize_conv_weight: w must be a 4-D float KRSC filter, got {w.dtype} {tuple(w.shape)}")
    wf = w.float()
    scale = wf.abs().amax(dim=(1, 2, 3)).clamp_min(1e-12) / 127.0
    q = torch.round(wf / scale.reshape(-1, 1, 1, 1)).clamp(-127, 127).to(torch.int8)
    return q, scale


def reference_conv2d_int8(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype):
    """The op's formula (module docstring): the int8 sum in float64 (exact), its fp32 value, the fp32 epilogue,
    one rounding to out_dtype; NHWC in, packed NHWC out. Runs on x's device."""
    acc = F.conv2d(x.permute(0, 3, 1, 2).double(), w.permute(0, 3, 1, 2).double(), stride=tuple(stride),
                   padding=tuple(padding)).float()
    y = scale_x.reshape(()) * (scale_w.reshape(1, -1, 1, 1) * acc)
    if bias is not None:
        y = y + bias.float().reshape(1, -1, 1, 1)
    return _activate(y, activation).to(out_dtype).permute(0, 2, 3, 1).contiguous()


def _cpu(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype, config):
    check(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype)
    check_config_arg(config)
    return reference_conv2d_int8(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype)


def _fake(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype, config):
    ho, wo = check(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype)
    check_config_arg(config)
    return x.new_empty((x.shape[0], ho, wo, w.shape[0]), dtype=out_dtype)


# ----------------------------------------------------------------------------------------------------------
# CUDA

_warn = WarnOnce()
_KERNEL_PLANS: dict = {}  # (config id, variant, shape, device) -> (launcher, workspace bytes) or None


def _kernel_plan(cfg_id: str, variant: str, shape: tuple, device: torch.device):
    from ...codegen.jit import BuildError, LoadError
    from ...runtime.arch import current_arch_family
    from .kernels import get_kernel

    key = (cfg_id, variant, shape, device)
    if key in _KERNEL_PLANS:
        return _KERNEL_PLANS[key]
    plan = None
    arch = current_arch_family()
    if arch not in SM90_INT8_CONV2D.arch_families:
        _warn(f"oasr.{OP}: no int8 conv kernel runs on {arch}; the reference formula (float64 conv) serves it")
    else:
        try:
            kern = get_kernel(SM90_INT8_CONV2D, SM90_INT8_CONV2D.get(cfg_id), variant, arch)
        except (BuildError, LoadError) as e:
            _warn(f"oasr.{OP}: kernel {cfg_id} ({variant}) unavailable, using the reference formula: {e}")
        else:
            status = kern.can_implement(*shape)
            if status != 0:
                _warn(f"oasr.{OP}: {cfg_id} rejects x/w {shape[:7]} (Cin must be a multiple of 16, Cout of 8; "
                      f"status {status}); using the reference formula")
            else:
                plan = (kern, int(kern.workspace_size(*shape)))
    _KERNEL_PLANS[key] = plan
    return plan


def _cuda(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype, config):
    ho, wo = check(x, w, scale_x, scale_w, bias, stride, padding, activation, out_dtype)
    check_config_arg(config)
    (sh, sw), (ph, pw) = _pair(stride, "stride", f"oasr.{OP}"), _pair(padding, "padding", f"oasr.{OP}")
    out_shape = (int(x.shape[0]), ho, wo, int(w.shape[0]))
    if x.numel() == 0:
        return torch.empty(out_shape, dtype=out_dtype, device=x.device)
    reference = lambda: reference_conv2d_int8(x, w, scale_x, scale_w, bias, (sh, sw), (ph, pw), activation,  # noqa
                                              out_dtype)
    if config == "torch":
        return reference()
    cfg_id = untuned_tile(out_shape[3]) if config == "auto" else config
    shape = (out_shape[0], int(x.shape[1]), int(x.shape[2]), int(x.shape[3]), out_shape[3], int(w.shape[1]),
             int(w.shape[2]), sh, sw, ph, pw, ACTIVATIONS[activation])
    plan = _kernel_plan(cfg_id, OUT_DTYPES[out_dtype], shape, x.device)
    if plan is None:
        return reference()
    x, w, bias, aligned = packed_operands(x, w, bias)
    scale_w = scale_w if scale_w.is_contiguous() else scale_w.contiguous()
    if not aligned or scale_w.data_ptr() % 4:
        _warn(f"oasr.{OP}: an operand is not 16-byte aligned (a view at an odd offset); using the reference formula")
        return reference()
    kern, ws_bytes = plan
    out = torch.empty(out_shape, dtype=out_dtype, device=x.device)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=x.device) if ws_bytes else None
    rc = kern.run(x.data_ptr(), w.data_ptr(), scale_x.data_ptr(), scale_w.data_ptr(),
                  None if bias is None else bias.data_ptr(), out.data_ptr(), *shape,
                  None if ws is None else ws.data_ptr(), ws_bytes, torch._C._cuda_getCurrentRawStream(x.get_device()))
    if rc != 0:
        raise RuntimeError(f"oasr.{OP}: kernel {cfg_id} failed with status {rc} on x={tuple(x.shape)} "
                           f"w={tuple(w.shape)} stride={(sh, sw)} padding={(ph, pw)}")
    return out


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)


def conv2d_int8_activation(x: torch.Tensor, w: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor,
                           bias: torch.Tensor | None = None, *, stride: tuple[int, int] = (1, 1),
                           padding: tuple[int, int] = (0, 0), activation: str = "none",
                           out_dtype: torch.dtype = torch.float16, config: str = "auto") -> torch.Tensor:
    """NHWC int8 conv + scales + bias + activation with an int8 KRSC filter (module docstring)."""
    return torch.ops.oasr.conv2d_int8_activation.default(
        x, w, scale_x, scale_w, bias, list(_pair(stride, "stride", f"oasr.{OP}")),
        list(_pair(padding, "padding", f"oasr.{OP}")), activation, out_dtype, config)
