"""The fp8 e4m3 W8A8 model transform (scheme ``fp8_w8a8``): `Fp8QuantLinear`, the quantized linear both it and
the backend's in-graph quantization run, and the in-place module swap (this family's ``quantize_schemes``).

A layer qualifies when its GEMM fits the fp8 kernels: K (in_features) % 16 == 0 and N (out_features) % 16 == 0.
Weights: symmetric per output channel, e4m3, quantized once. Activations: symmetric per token, quantized at every
call (`torch.ops.oasr.quantize_per_token_fp8`, a composite op Inductor fuses), then `torch.ops.oasr.scaled_mm_fp8`
with config ``auto`` (the tuning DB's scaled_mm_fp8 entry, else the half-wave heuristic). Output dtype: the
layer's own when fp16/bf16; an fp32 layer computes in bf16 and casts back (to autocast's dtype under
torch.autocast, as `F.linear` would).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..scaled_mm.quantize import CalibratedInput, check_input_width, check_model, linear_result_dtype, swaps
from .reference import FP8_MAX, quantize_weight_fp8

SCHEME = "fp8_w8a8"


def quantized_linear_fp8(x: torch.Tensor, weight_q: torch.Tensor, scale_w: torch.Tensor,
                         bias: torch.Tensor | None, out_dtype: torch.dtype, config: str = "auto",
                         input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` of an fp8 W8A8 layer: per-token e4m3 activations, then `oasr::scaled_mm_fp8`. Shared by
    `Fp8QuantLinear` and the backend's `options={"quantization": "fp8_w8a8"}` rewrite. A calibrated `input_scale`
    ([1], `oasr_ops.calibrate`: amax / 448) rides along for the fusion pass (the op still quantizes per token)."""
    check_input_width(x, weight_q)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, weight_q.shape[1]).contiguous()
    if input_scale is None:
        q, scale_a = torch.ops.oasr.quantize_per_token_fp8(x2)
    else:
        q, scale_a = torch.ops.oasr.quantize_per_token_fp8_calibrated(x2, input_scale)
    y = torch.ops.oasr.scaled_mm_fp8(q, weight_q, scale_a, scale_w, bias, out_dtype, config)
    y = y.reshape(*lead, weight_q.shape[0])
    want = linear_result_dtype(x)
    return y if y.dtype == want else y.to(want)


def qualifies(linear: nn.Linear) -> bool:
    return linear.in_features % 16 == 0 and linear.out_features % 16 == 0 and linear.in_features > 0


class Fp8QuantLinear(CalibratedInput):
    """An fp8 W8A8 linear layer: e4m3 weight + fp32 per-channel scale (buffers), dynamic per-token activations;
    ``input_scale`` (amax / 448) once calibrated (`oasr_ops.calibrate`), saved in the state dict."""

    input_qmax = FP8_MAX
    scheme = SCHEME
    linear_fn = staticmethod(quantized_linear_fp8)  # what `rows` calls (forward calls it directly)

    def __init__(self, weight_q: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, config: str = "auto") -> None:
        super().__init__()
        self._init_buffers(weight_q, scale_w, bias, out_dtype, config)

    @classmethod
    def from_linear(cls, linear: nn.Linear, config: str = "auto") -> "Fp8QuantLinear":
        wq, sw = quantize_weight_fp8(linear.weight)
        dt = linear.weight.dtype
        out_dtype = dt if dt in (torch.float16, torch.bfloat16) else torch.bfloat16
        return cls(wq, sw, linear.bias, out_dtype, config)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # nn.Linear's name: `layer(input=x)` keeps working
        return quantized_linear_fp8(input, *self._linear_args())


def quantize_module(model: nn.Module, config: str = "auto",
                    filter_fn: Callable[[nn.Module, str], bool] | None = None) -> nn.Module:
    """Replace every qualifying `nn.Linear` of `model` (the model itself included) by an `Fp8QuantLinear`."""

    def wanted(linear: nn.Module, fqn: str) -> bool:
        return isinstance(linear, nn.Linear) and qualifies(linear) and (filter_fn is None or filter_fn(linear, fqn))

    check_model(model)
    if isinstance(model, nn.Linear):
        return Fp8QuantLinear.from_linear(model, config) if wanted(model, "") else model
    for parent, name, child in swaps(model, wanted):  # every filter_fn call first: no half-quantized model
        setattr(parent, name, Fp8QuantLinear.from_linear(child, config))
    return model


def schemes() -> dict[str, Callable[..., nn.Module]]:
    """The `quantize_schemes` handler: scheme name -> ``fn(model, config, filter_fn) -> model``."""
    return {SCHEME: quantize_module}
