"""The quantizing conv op: `oasr::conv2d_activation_quant(Tensor x, Tensor w, Tensor? bias, int[2] stride,
int[2] padding, str activation, Tensor out_scale, str config) -> Tensor`.

`conv2d_activation` whose output is quantized to int8 for the next layer's int8 conv (`conv2d_int8_activation`):
a speech frontend's first conv (Conv2d(1, C, 3, stride 2) + ReLU) writes the second conv's int8 input directly,
half the bytes of its fp16 output and no separate quantization pass (docs/perf/conv.md, session 10). x, w, bias,
stride, padding and activation are `conv2d_activation`'s; out_scale is fp32 ``[1]``, the per-tensor scale of the
next layer's input (`oasr_ops.calibrate`), finite and > 0: a ValueError otherwise, the int8 GEMMs' check
(`scaled_mm.out_scale.check_out_scale`: a scale's values are read once per version, not inside a CUDA-graph capture
nor while torch.compile traces; the fake function checks dtype, shape and device). Out: ``[B, Ho, Wo, Cout]`` packed
NHWC int8::

    q = clamp(rint(act(conv(x, w) + bias) * (1 / out_scale)), -127, 127)

with the conv in fp32 and ``1 / out_scale`` one IEEE fp32 reciprocal (`ops.quantize_output`; the CPU reference
computes exactly that from F.conv2d in fp32). The kernels round the exact product ``act(y) * (1 / out_scale)`` once
(an FMA with 1.5 * 2^23, `to_out` in templates/conv2d_direct.cu.j2: no conversion instruction) where the formula
rounds its fp32 value first: the same but at .5 ties of that value. With the conv's own summation order that puts a
kernel within one step of the reference (0.1 % of the elements at most, tests/test_conv2d_quant_gpu.py). Symmetric,
as every int8 activation of oasr_ops (-128 never occurs).

Config: as `conv2d_activation` (``auto`` resolves through the same DB signature and untuned rule, since the tile
that writes fp16 fastest is the one chosen for int8 too). Only the direct kernels (``dc...`` configs: the rule's
choice for a few input channels) have an int8-output variant; any other config — a CUTLASS tile, ``torch``,
``fused`` — runs its fp16 arm and quantizes that output (the fp16-rounded value: within one step of the kernel's),
with one warning for a kernel config.
"""
from __future__ import annotations

import torch

from ..autograd import register_inference_op
from ...runtime import database as _database
from ..scaled_mm.out_scale import check_out_scale
from .ops import (_PLANS, _make_plan, _pair, check, check_config_arg, operand_key, quantize_output,
                  reference_conv2d_fp32)

OP = "conv2d_activation_quant"

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define(f"{OP}(Tensor x, Tensor w, Tensor? bias, int[2] stride, int[2] padding, str activation, "
            "Tensor out_scale, str config) -> Tensor")


def check_quant(x, w, bias, stride, padding, activation, out_scale) -> tuple[int, int]:
    """`ops.check` plus the out_scale rules (ValueError naming the problem); returns (Ho, Wo)."""
    ho, wo = check(x, w, bias, stride, padding, activation)
    name = f"oasr.{OP}"
    if not isinstance(out_scale, torch.Tensor) or out_scale.dtype != torch.float32 or tuple(out_scale.shape) != (1,):
        got = f"{out_scale.dtype} {tuple(out_scale.shape)}" if isinstance(out_scale, torch.Tensor) else \
            type(out_scale).__name__
        raise ValueError(f"{name}: out_scale must be float32 [1] (per tensor), got {got}")
    if out_scale.device != x.device:
        raise ValueError(f"{name}: out_scale is on device {out_scale.device}, x on {x.device}")
    return ho, wo


def reference_conv2d_quant(x, w, bias, stride, padding, activation, out_scale) -> torch.Tensor:
    """The op's formula (module docstring) from fp32 F.conv2d; NHWC in, packed NHWC int8 out."""
    y = reference_conv2d_fp32(x, w, bias, stride, padding, activation)
    return quantize_output(y, out_scale).permute(0, 2, 3, 1).contiguous()


def _cpu(x, w, bias, stride, padding, activation, out_scale, config):
    check_quant(x, w, bias, stride, padding, activation, out_scale)
    check_out_scale(out_scale, OP)
    check_config_arg(config)
    return reference_conv2d_quant(x, w, bias, stride, padding, activation, out_scale)


def _fake(x, w, bias, stride, padding, activation, out_scale, config):
    ho, wo = check_quant(x, w, bias, stride, padding, activation, out_scale)
    check_config_arg(config)
    return x.new_empty((x.shape[0], ho, wo, w.shape[0]), dtype=torch.int8)


def _cuda(x, w, bias, stride, padding, activation, out_scale, config):
    key = ("quant", config, *operand_key(x, w, bias), tuple(stride), tuple(padding), activation,
           _database.epoch())
    plan = _PLANS.plans.get(key)
    if plan is None:
        ho, wo = check_quant(x, w, bias, stride, padding, activation, out_scale)
        check_out_scale(out_scale, OP)
        check_config_arg(config)
        out_shape = (int(x.shape[0]), ho, wo, int(w.shape[0]))
        if x.numel() == 0:
            return x.new_empty(out_shape, dtype=torch.int8)
        st, pd = _pair(stride, "stride", f"oasr.{OP}"), _pair(padding, "padding", f"oasr.{OP}")
        plan = _PLANS.get_or_make(key, lambda: _make_plan(config, x, w, st, pd, activation, out_shape, quant=True))
    else:
        if out_scale.device != x.device or out_scale.dtype != torch.float32 or out_scale.shape != (1,):
            check_quant(x, w, bias, stride, padding, activation, out_scale)  # the key does not hold out_scale: raise
        check_out_scale(out_scale, OP)  # its values: read once per tensor version, not per call
    plan.calls += 1
    return plan.run(x, w, bias, out_scale)


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)


def conv2d_activation_quant(x: torch.Tensor, w: torch.Tensor, out_scale: torch.Tensor,
                            bias: torch.Tensor | None = None, *, stride: tuple[int, int] = (1, 1),
                            padding: tuple[int, int] = (0, 0), activation: str = "none",
                            config: str = "auto") -> torch.Tensor:
    """NHWC conv + activation with a KRSC weight, quantized to int8 with `out_scale` (module docstring)."""
    return torch.ops.oasr.conv2d_activation_quant.default(
        x, w, bias, list(_pair(stride, "stride", f"oasr.{OP}")), list(_pair(padding, "padding", f"oasr.{OP}")),
        activation, out_scale, config)


__all__ = ["conv2d_activation_quant", "reference_conv2d_quant", "check_quant"]
