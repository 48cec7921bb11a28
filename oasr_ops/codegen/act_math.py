"""The activation math of the quantizing epilogues (int8 `oasr::scaled_mm_act_quant`, fp8
`oasr::scaled_mm_fp8_act_quant`): the constants rendered into templates/_act_fast.cuh.j2 and used by the CPU
reference (families/scaled_mm/act_quant.py `apply_activation`), defined once here.

Both activations are ``h * (1 + tanh(u))`` with one ``tanh.approx.f32`` (one MUFU) per element:

* SiLU: ``y * sigmoid(y) = h + h * tanh(h)``, ``h = y / 2`` — an identity, exact up to fp32 rounding.
* GELU (erf form, nn.GELU()'s default): ``0.5 * y * (1 + erf(y / sqrt 2))`` with
  ``erf(y / sqrt 2) ~= tanh(y * (A + B * x2 + C * x2**2))``, ``x2 = min(y**2, X2_MAX)``. The coefficients are a
  minimax fit of the GELU error relative to ``max(1, |y|)`` over ``|y| <= 6`` (benchmarks/fit_gelu_tanh_erf.py
  reproduces them, C to within an fp32 ulp): max ``|GELU_fit - GELU| <= GELU_FIT_ERROR * max(1, |y|)`` for every
  real y, in exact arithmetic (largest absolute error 4.5e-5, at |y| ~= 3). C < 0, so the polynomial would turn over at
  |y| ~= 10.6; the clamp keeps u monotone and |u| >= 10.2 beyond |y| = 6, where tanh is 1 in fp32. This is NOT the
  tanh-GELU (``approximate="tanh"``), whose error relative to max(1, |y|) is 1.8e-4 (4.7e-4 absolute).

On the device tanh.approx.f32 has a documented max relative error of about 2^-11 (PTX ISA; measured on sm_75
over all fp32 inputs: 1.1e-5, about 2^-16.5 — N. Juffa, NVIDIA developer forum, "Hardware-accelerated tanh() on
Turing"). The bounds below use the documented 2^-11, which dominates the fit: the activation
error is at most ``|y| * 2**-12 + GELU_FIT_ERROR * max(1, |y|)`` (|h * tanh * 2^-11| with |h| = |y| / 2), i.e. a
quantized value ``act(y) / out_scale`` moves by at most ``2.5e-4 * |y| / out_scale`` (+ fp32 rounding) of a step:
never more than one step while ``|y| < 4000 * out_scale`` (for a calibrated scale, amax / 127, that is |y| up to
~30x the largest activation output), and for an output q on the positive branch at most 0.03 of a step at
q = 127. Whether it moves at all depends on how close act(y) / out_scale lies to a rounding boundary:
tests/test_act_math.py measures the fraction on random inputs under the worst-case error model.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass


def _f32(x: float) -> float:
    """x rounded to the nearest fp32 (the kernel's literal and the reference's tensor hold the same value)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


GELU_A = _f32(0.797623872756958)
GELU_B = _f32(0.03687966242432594)
GELU_C = _f32(-0.00032878227648325264)
GELU_X2_MAX = 36.0
# max |GELU_fit(y) - GELU(y)| / max(1, |y|) over all y, exact arithmetic (measured: 1.5255e-05; asserted by
# tests/test_act_math.py on a dense fp64 grid)
GELU_FIT_ERROR = 1.53e-5
# documented max relative error of tanh.approx.f32
TANH_APPROX_REL_ERROR = 2.0 ** -11


@dataclass(frozen=True)
class ActMath:
    """The template's view (float literals printed exactly: repr of a float that is an fp32 value)."""
    gelu_a: str = repr(GELU_A)
    gelu_b: str = repr(GELU_B)
    gelu_c: str = repr(GELU_C)
    gelu_x2_max: str = repr(GELU_X2_MAX)
    gelu_fit_error: str = f"{GELU_FIT_ERROR:.3g}"


ACT_MATH = ActMath()
