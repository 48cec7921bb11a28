"""The act-quant epilogue's activation math (codegen/act_math.py, families/scaled_mm/act_quant.py
`apply_activation`) against float64 GELU / SiLU: the fitted tanh-erf GELU's documented bound, the SiLU identity,
the fp32 evaluation, the tails, and what tanh.approx.f32's documented error does to the int8 quantization."""
from __future__ import annotations

import math
import struct

import pytest
import torch

from oasr_ops.codegen import act_math
from oasr_ops.codegen.act_math import GELU_FIT_ERROR, TANH_APPROX_REL_ERROR
from oasr_ops.families.scaled_mm.act_quant import apply_activation, tanh_error_bound


def _grid() -> torch.Tensor:
    """Dense where the fit bends (|y| <= 12, step 1e-4), log-spaced out to 1e4, both signs (float64)."""
    near = torch.linspace(0, 12, 120_001, dtype=torch.float64)
    far = torch.logspace(math.log10(12), 4, 20_001, dtype=torch.float64)
    pos = torch.cat([near, far])
    return torch.cat([-pos.flip(0), pos])


def _gelu(y):
    return 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))


def test_coefficients_are_fp32_values():
    for v in (act_math.GELU_A, act_math.GELU_B, act_math.GELU_C, act_math.GELU_X2_MAX):
        assert struct.unpack("<f", struct.pack("<f", v))[0] == v
        assert float(repr(v)) == v  # the template's literal (repr + 'f') parses back to the same fp32


def test_fitted_gelu_within_its_documented_bound():
    y = _grid()
    rel = (apply_activation(y, "gelu") - _gelu(y)).abs() / y.abs().clamp_min(1)  # the formula in float64
    assert rel.max().item() <= GELU_FIT_ERROR
    # a real fit, not the tanh-GELU (1.8e-4 on this measure) nor a loose bound
    tanh_gelu = 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    assert ((tanh_gelu - _gelu(y)).abs() / y.abs().clamp_min(1)).max().item() > 5 * GELU_FIT_ERROR


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_fp32_evaluation_adds_only_rounding(act):
    y = _grid()
    exact = _gelu(y) if act == "gelu" else y * torch.sigmoid(y)
    fit = GELU_FIT_ERROR * y.abs().clamp_min(1) if act == "gelu" else 0.0
    got = apply_activation(y.float(), act).double()
    # fp32: y itself rounded (through a slope <= 1.13), tanh and 3-4 rounded steps: a few 2^-24 of |y|
    assert ((got - exact).abs() - fit <= 2.0 ** -21 * y.abs() + 1e-30).all()
    if act == "silu":  # the identity h + h tanh(h) = y sigmoid(y) is exact in float64
        assert ((apply_activation(y, "silu") - exact).abs() <= 1e-15 * y.abs().clamp_min(1)).all()


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_tails_and_large_inputs(act):
    y = torch.tensor([-3e38, -1e30, -1e4, -60.0, 60.0, 1e4, 1e30, 3e38], dtype=torch.float32)
    got = apply_activation(y, act)
    assert torch.isfinite(got).all()  # y^2 overflows to inf: the clamp keeps the tanh argument finite-signed
    assert (got[:4] <= 0).all() and (got[:4] > -1e-20).all()  # the negative tails -> -0 / 0
    assert torch.equal(got[4:], y[4:])  # x * 1


def _quant_inputs(seed: int):
    """Pre-activations like an FFN's fc1 output (normal, sigma 1-3 per channel) and the calibrated per-tensor
    scale of its activation output (amax / 127)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2000, 512, generator=g, dtype=torch.float64) * (1 + 2 * torch.rand(512, generator=g,
                                                                                       dtype=torch.float64))


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_tanh_approx_error_moves_an_int8_value_by_at_most_one_step(act):
    """The device's tanh.approx.f32 (relative error <= 2^-11) against the reference's exact tanh, under the worst
    case: t scaled by (1 +- 2^-11), both signs. With a calibrated scale no value moves by more than one step, and
    the values that move are those `tanh_error_bound` allows to (the GPU tests' envelope)."""
    y = _quant_inputs(3 if act == "gelu" else 4)
    h = 0.5 * y
    if act == "gelu":
        x2 = (y * y).clamp_max(act_math.GELU_X2_MAX)
        t = torch.tanh(y * ((act_math.GELU_C * x2 + act_math.GELU_B) * x2 + act_math.GELU_A))
    else:
        t = torch.tanh(h)
    z = h + h * t
    s = z.abs().max() / 127
    q0 = torch.round(z / s).clamp(-128, 127)
    bound = tanh_error_bound(y, act) / s
    assert bound.max().item() < 0.1  # |y| << 4000 s: far below a step
    may = torch.round(z / s - bound).clamp(-128, 127) != torch.round(z / s + bound).clamp(-128, 127)
    moved_any = torch.zeros_like(may)
    for sign in (1, -1):
        q = torch.round((h + h * t * (1 + sign * TANH_APPROX_REL_ERROR)) / s).clamp(-128, 127)
        assert (q - q0).abs().max().item() <= 1
        moved_any |= q != q0
    assert not (moved_any & ~may).any()
    frac = moved_any.double().mean().item()
    print(f"{act}: worst-case tanh error moves {frac:.3%} of the int8 values by one step "
          f"(envelope: {may.double().mean().item():.3%}; max bound {bound.max().item():.3f} steps)")
    assert 0 < frac < 0.02  # the model does move some values (the test can see it), never many
