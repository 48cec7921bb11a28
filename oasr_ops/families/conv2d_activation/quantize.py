"""int8 W8A8 for 2-D convs (scheme ``int8_w8a8``, `oasr_ops.quantize_`): `QuantConv2d`, its per-tensor activation
quantizer (`oasr::quantize_per_tensor`) and the in-place module swap.

Which convs: `qualifies` — groups 1, dilation 1, zero padding mode, fp16/bf16/fp32 weights, Cin % 16 == 0 and
Cout % 8 == 0 (the int8 implicit GEMM's 16-byte TMA accesses): a speech frontend's second conv (Conv2d(C, C, 3,
stride 2), C = 144..512); its first (Cin = 1) does not qualify and stays a `conv2d_activation` (the direct kernel).

The layer: int8 KRSC filter quantized per output channel (`ops_int8.quantize_conv_weight`), the input quantized per
tensor — with the calibrated scale (`oasr_ops.calibrate`: amax / 127) when there is one, else a dynamic scale from
the input's amax at every call (a full reduction pass: calibrate) — then `oasr::conv2d_int8_activation`. Per tensor,
not per token: the conv's implicit GEMM reads each input pixel under several output positions, so its epilogue has no
single row scale to apply.

Where it pays (docs/perf/conv.md, session 10): only with the quantization fused into the producer — the backend's
``fuse_quantization`` turns the first conv + ReLU + this layer's quantization into `oasr::conv2d_activation_quant`,
which writes the int8 input directly (`inductor/fuse_conv_quant.py`); `oasr_ops.fusable_filter` selects the convs
where that happens. Elsewhere the quantization is a separate memory pass.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..scaled_mm.quantize import CalibratedInput, check_model, swaps
from .ops import quantize_output
from .ops_int8 import quantize_conv_weight

_lib = torch.library.Library("oasr", "FRAGMENT")
# Composite (decomposes under tracing; Inductor fuses it into one pass or the fusion pass into the producer).
_lib.define("quantize_per_tensor(Tensor x, Tensor scale) -> Tensor")


def _quantize_per_tensor(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`quantize_output` with one scale for the whole tensor (ValueError naming the shape otherwise; its values are
    not read here: a dynamic scale is a fresh tensor each call, and amax / 127 clamped is > 0 anyway)."""
    if scale.numel() != 1:
        raise ValueError(f"oasr.quantize_per_tensor: scale must hold one value (per tensor, shape [1]), got shape "
                         f"{tuple(scale.shape)}")
    return quantize_output(x, scale)


_lib.impl("quantize_per_tensor", _quantize_per_tensor, "CompositeImplicitAutograd")


def dynamic_input_scale(x: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale of an uncalibrated input: amax(|x|) / 127 (fp32 [1]; a full reduction per call)."""
    return (x.abs().amax().float().clamp_min(1e-12) / 127.0).reshape(1)


def qualifies(conv: nn.Module) -> bool:
    """`conv` is an `nn.Conv2d` the int8 conv kernels can run (module docstring)."""
    return (type(conv) is nn.Conv2d and conv.groups == 1 and tuple(conv.dilation) == (1, 1)
            and conv.padding_mode == "zeros" and not isinstance(conv.padding, str)
            and conv.in_channels % 16 == 0 and conv.out_channels % 8 == 0
            and conv.weight.dtype in (torch.float16, torch.bfloat16, torch.float32))


class QuantConv2d(CalibratedInput):
    """An int8 W8A8 `nn.Conv2d` (NCHW in and out, as the layer it replaces; NHWC inside).

    Buffers as `CalibratedInput`'s: ``weight_q`` int8 ``[Cout, KH, KW, Cin]`` (KRSC), ``scales`` (the Cout filter
    scales, then once calibrated the input's scale), ``bias`` (out dtype, [0] when none). stride and padding are
    plain attributes (two ints each)."""

    def __init__(self, weight_q: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, stride: tuple[int, int], padding: tuple[int, int]) -> None:
        super().__init__()
        if weight_q.dim() != 4 or weight_q.dtype != torch.int8:
            raise ValueError(f"QuantConv2d: weight_q must be int8 KRSC [Cout, KH, KW, Cin], got {weight_q.dtype} "
                             f"{tuple(weight_q.shape)}")
        self._init_buffers(weight_q, scale_w, bias, out_dtype, "auto")
        self.stride = tuple(int(s) for s in stride)
        self.padding = tuple(int(p) for p in padding)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> "QuantConv2d":
        if not qualifies(conv):
            raise ValueError(f"QuantConv2d.from_conv: {conv} does not qualify (groups 1, dilation 1, zero padding, "
                             "Cin % 16 == 0, Cout % 8 == 0)")
        wq, sw = quantize_conv_weight(conv.weight.detach().permute(0, 2, 3, 1))
        dt = conv.weight.dtype
        out_dtype = dt if dt in (torch.float16, torch.bfloat16) else torch.float16
        return cls(wq.contiguous(), sw, conv.bias, out_dtype, tuple(conv.stride), tuple(conv.padding))

    @staticmethod
    def _weight_layout(w: torch.Tensor) -> torch.Tensor:
        """KRSC [Cout, KH, KW, Cin] -> nn.Conv2d's [Cout, Cin, KH, KW]."""
        return w.permute(0, 3, 1, 2).contiguous()

    @property
    def in_features(self) -> int:  # CalibratedInput's name; for a conv the input channels
        return self.weight_q.shape[3]

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Conv2d's name: `conv(input=x)` keeps working
        x = input
        if x.dim() == 3:  # unbatched [C, H, W], as nn.Conv2d accepts
            return self.forward(x.unsqueeze(0)).squeeze(0)
        if x.dim() != 4 or x.shape[1] != self.in_features:
            raise ValueError(f"QuantConv2d: input must be [B, {self.in_features}, H, W] (or unbatched), got "
                             f"{tuple(x.shape)}")
        bias, out_dtype = self.bias, self.bias.dtype
        xh = x if x.dtype == out_dtype else x.to(out_dtype)
        x_nhwc = xh.permute(0, 2, 3, 1)
        scale = self.input_scale
        if scale is None:  # dynamic per tensor: one reduction over the input per call (calibrate to avoid it)
            scale = dynamic_input_scale(x_nhwc)
        # (inductor/quantize_pass.py spells out these same nodes for options={"quantization": ...})
        q = torch.ops.oasr.quantize_per_tensor(x_nhwc, scale).contiguous()
        y = torch.ops.oasr.conv2d_int8_activation(q, self.weight_q, scale, self.scale_w,
                                                  bias if bias.shape[0] else None, self.stride, self.padding,
                                                  "none", out_dtype, "auto")
        y = y.permute(0, 3, 1, 2)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def extra_repr(self) -> str:
        cout, kh, kw, cin = self.weight_q.shape
        return (f"{cin}, {cout}, kernel_size=({kh}, {kw}), stride={tuple(self.stride)}, "
                f"padding={tuple(self.padding)}, bias={self.bias.shape[0] > 0}, out_dtype={self.out_dtype}, "
                f"scheme={self.scheme}, calibrated={self.calibrated}")


def quantize_convs(model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None) -> nn.Module:
    """Replace every qualifying `nn.Conv2d` of `model` (the model itself included) by a `QuantConv2d`, in place;
    `filter_fn(conv, fqn)` narrows the set. Returns `model`."""

    def wanted(conv: nn.Module, fqn: str) -> bool:
        return qualifies(conv) and (filter_fn is None or filter_fn(conv, fqn))

    check_model(model)
    if isinstance(model, nn.Conv2d):
        return QuantConv2d.from_conv(model) if wanted(model, "") else model
    for parent, name, child in swaps(model, wanted):  # every filter_fn call first: no half-quantized model
        setattr(parent, name, QuantConv2d.from_conv(child))
    return model


__all__ = ["QuantConv2d", "dynamic_input_scale", "qualifies", "quantize_convs"]
