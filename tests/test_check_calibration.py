"""`oasr_ops.check_calibration`: stored static input ranges checked against other data (CPU; the compiled graph
runs the ops' references, which clip as the kernels do), and the dequantized `weight` of the quantized layers."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import oasr_ops

from _fx_capture import compile_captured

pytestmark = pytest.mark.usefixtures("fresh_inductor")


class FFN(nn.Module):
    """fc1 -> GELU -> fc2 with a residual; no LayerNorm, so the layers' input ranges follow the input's."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


def _inputs_of(model: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """The input `model`'s layer `name` gets on `model(x)` (an independent hook, not check_calibration's)."""
    seen = []
    h = model.get_submodule(name).register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach().float()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        h.remove()
    return seen[0]


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8", None], ids=["int8", "fp8", "plain"])
def test_inputs_beyond_the_calibrated_range_are_measured_and_named_once(scheme):
    torch.manual_seed(0)
    model = FFN().half().eval()
    q = oasr_ops.quantize_(copy.deepcopy(model), scheme) if scheme else copy.deepcopy(model)
    small, big = torch.randn(2, 9, 64, dtype=torch.float16), 8 * torch.randn(2, 9, 64, dtype=torch.float16)
    oasr_ops.calibrate(q, [small * 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = oasr_ops.check_calibration(q, [small * 0.1])  # the calibration data itself: nothing clipped
    assert set(same) == {"fc1", "fc2"}
    for r in same.values():
        assert r.clipped_fraction == 0.0 and r.overshoot == pytest.approx(1.0, rel=1e-5)
    with pytest.warns(UserWarning, match=r"inputs of 2 layer\(s\) \(fc1, fc2\) exceeded their calibrated range") as got:
        report = oasr_ops.check_calibration(q, [small, big])
    assert len([w for w in got if "check_calibration" in str(w.message)]) == 1
    for name in ("fc1", "fc2"):
        seen = torch.cat([_inputs_of(q, name, small).flatten(), _inputs_of(q, name, big).flatten()]).abs()
        r = report[name]
        assert r.observed_amax == pytest.approx(float(seen.max()), rel=1e-6)
        assert r.clipped_fraction == pytest.approx(float((seen > r.calibrated_amax * (1 + 1e-6)).float().mean()))
        assert 0 < r.clipped_fraction < 1 and r.overshoot > 1.25
    # within the tolerance: quiet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        oasr_ops.check_calibration(q, [small * 0.1], warn_overshoot=1e9)


def test_clipping_the_check_flags_is_what_the_compiled_graph_does():
    """A compiled act-quant GEMM quantizes fc1's output with fc2's static scale: with a calibration on inputs much
    smaller than the traffic it departs from the eager model (per-token dynamic), and check_calibration says so.
    Calibrated on traffic like the checked one, the compiled output follows the eager one and the check is quiet."""
    torch.manual_seed(1)
    model = FFN().half().eval()
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    x = 4 * torch.randn(2, 9, 64, dtype=torch.float16)
    with torch.no_grad():
        eager = q(x).float()
    oasr_ops.calibrate(q, [x * 0.02])
    out, _ = compile_captured(q, x, fuse_quantization="act")
    bad = float((out.float() - eager).norm() / (eager - x.float()).norm())
    with pytest.warns(UserWarning, match=r"\(fc1, fc2\) exceeded"):
        oasr_ops.check_calibration(q, [x])
    torch._dynamo.reset()
    oasr_ops.calibrate(q, [x * 0.02, x])
    out, _ = compile_captured(q, x, fuse_quantization="act")
    good = float((out.float() - eager).norm() / (eager - x.float()).norm())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        oasr_ops.check_calibration(q, [x])
    assert good < 0.05 < bad, (good, bad)


def test_bad_calls_are_errors_naming_the_problem():
    model = FFN().half().eval()
    q = oasr_ops.quantize_(copy.deepcopy(model), "int8_w8a8")
    x = torch.randn(2, 9, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="no layer of this model has a calibrated input scale"):
        oasr_ops.check_calibration(q, [x])
    oasr_ops.calibrate(q, [x])
    with pytest.raises(ValueError, match="no batches"):
        oasr_ops.check_calibration(q, [])
    for bad in (0.5, float("nan"), "2"):
        with pytest.raises(ValueError, match="warn_overshoot must be a finite number >= 1"):
            oasr_ops.check_calibration(q, [x], warn_overshoot=bad)
    # compiled: checked through the module it wraps; filter_fn narrows the layers
    got = oasr_ops.check_calibration(torch.compile(q), [x], filter_fn=lambda _m, fqn: fqn == "fc1")
    assert set(got) == {"fc1"}


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
def test_a_quantized_linear_reads_back_a_dequantized_weight(scheme):
    """Code that reads `layer.weight` (its shape, dtype, values) broke on a quantized layer (no such attribute)."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 32).to(torch.bfloat16)
    layer = oasr_ops.quantize_(nn.Sequential(copy.deepcopy(lin)), scheme)[0]
    from oasr_ops.families.scaled_mm import quantize as q

    q._WARN_WEIGHT.clear()
    with pytest.warns(UserWarning, match=r"\.weight is a 16-bit copy dequantized on each read") as got:
        w = layer.weight
        layer.weight  # noqa: B018 - a second read: no second warning
    assert len([m for m in got if "dequantized on each read" in str(m.message)]) == 1
    assert w.shape == lin.weight.shape and w.dtype == torch.bfloat16 and not w.requires_grad
    # int8: within half a step of its channel's scale; e4m3: 3 mantissa bits (relative 2^-4, and subnormals'
    # absolute step); both plus the rounding of the result to bf16 (relative 2^-8)
    ref = lin.weight.float().abs()
    err = (w.float() - lin.weight.float()).abs()
    if scheme == "int8_w8a8":
        assert bool((err <= layer.scale_w[:, None] * 0.5 * 1.01 + 2 ** -8 * ref).all())
    else:
        assert bool((err <= ref * (2 ** -4 * 1.01 + 2 ** -8) + layer.scale_w[:, None] * 2 ** -9).all())
    torch.testing.assert_close(w.float(), layer.weight_q.float() * layer.scale_w[:, None], rtol=2 ** -8, atol=0)
    with pytest.raises(AttributeError, match="dequantized copy of weight_q"):
        layer.weight = torch.zeros(32, 64)
    assert "weight" not in layer.state_dict() and set(layer.state_dict()) == {"weight_q", "scales", "bias"}


def test_a_quantized_conv_reads_back_its_weight_in_conv2d_layout():
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 8, (3, 5), padding=1).half()
    layer = oasr_ops.quantize_(nn.Sequential(copy.deepcopy(conv)), "int8_w8a8")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the read's one warning (tested above)
        w = layer.weight
    assert w.shape == conv.weight.shape == (8, 16, 3, 5) and w.dtype == torch.float16
    err = (w.float() - conv.weight.float()).abs()
    assert bool((err <= layer.scale_w[:, None, None, None] * 0.5 * 1.01 + 2 ** -10 * conv.weight.float().abs()).all())
