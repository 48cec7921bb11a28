"""fp8 GEMM with an fp16 output, and the quantizing fp8 GEMM, where the DB (or the untuned policy) answers ``torch``
(H200).

torch._scaled_mm's rowwise scaling writes bf16 only, so the ``torch`` arm writes fp16 through an fp32 GEMM output
and the epilogue in eager ops; the DB's torch regions were measured with a bf16 output. For an fp16 output the
half-wave heuristic's tile serves there instead (`ops._make_plan`); an explicit ``config="torch"`` and a bf16
output keep the torch arm. Checked: which plan serves, and the tile's result against a float64 reference within
4x of the torch arm's own error. Run: ``pytest -m gpu tests/test_scaled_mm_fp8_fp16_out_gpu.py`` (builds the one
fp16 kernel it needs on first use, about a minute).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.reference import quantize_per_token_fp8, quantize_weight_fp8  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402

fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
if current_arch_family() != "sm90":  # pragma: no cover
    pytest.skip("the fp8 tiles run on sm90", allow_module_level=True)
LANE = get_lane("sm90_fp8_wgmma")
DEV = torch.device("cuda")


def _a_torch_region() -> tuple[int, int, int]:
    """(N, K, M) of a shipped-DB signature whose region at M answers torch."""
    shipped = json.loads((Path(oasr_ops.__file__).resolve().parent.parent / "db/sm90/scaled_mm_fp8.json").read_text())
    for sig in sorted(shipped["entries"]):
        if "|op=scaled_mm_fp8|" not in sig:
            continue
        n, k = (int(part.split("=")[1]) for part in sig.split("|")[2:4])
        for m in (16384, 4096, 1000, 64):
            if fops.select_config(n, k, m, "sm90").config == "torch":
                return n, k, m
    pytest.fail("no shipped fp8 DB region answers torch: this test has nothing to check")


def _plan(cfg, dt, m, n, k, bias, device):
    return fops._PLANS.plans[("scaled_mm_fp8", cfg, dt, m, n, k, bias, device, fops._epoch())]


def test_fp16_output_is_served_by_a_tile_where_torch_was_chosen():
    n, k, m = _a_torch_region()
    g = torch.Generator(device=DEV).manual_seed(0)
    a, sa = quantize_per_token_fp8(torch.randn(m, k, device=DEV, generator=g))
    w, sw = quantize_weight_fp8(torch.randn(n, k, device=DEV, generator=g))
    bias = torch.randn(n, device=DEV, generator=g).half()
    ref = (a.double() @ w.double().t()) * sa.double()[:, None] * sw.double()[None, :] + bias.double()

    y = torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, bias, torch.float16, "auto")
    plan = _plan("auto", torch.float16, m, n, k, True, a.device)
    assert plan.config != "torch" and plan.config in LANE.ids(), plan.config
    y_torch = torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, bias, torch.float16, "torch")
    assert _plan("torch", torch.float16, m, n, k, True, a.device).config == "torch"  # asked by name: kept
    torch.cuda.synchronize()
    err, err_torch = [float((t.double() - ref).abs().max()) for t in (y, y_torch)]
    assert err <= 4 * max(err_torch, float(ref.abs().max()) * 2 ** -11), (plan.config, err, err_torch)

    torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, bias.bfloat16(), torch.bfloat16, "auto")
    assert _plan("auto", torch.bfloat16, m, n, k, True, a.device).config == "torch"  # bf16: the measured arm


@pytest.mark.parametrize("m", [1, 17, 1000])
def test_quantizing_op_is_served_by_a_tile_where_the_policy_says_torch(m):
    """`scaled_mm_fp8_quant` on a signature without a DB entry (the family's untuned policy answers ``torch``): the
    heuristic's tile serves (`ops.heuristic_where_torch`, session 39), its e4m3 output within the e4m3 tolerance
    (0.5 + 0.13 |ref| in q units, tests/test_hot_path_gpu.py) of the float64 reference and of the torch arm asked
    for by name. Output poisoned first."""
    n, k = 2304, 768  # no shipped entry of op scaled_mm_fp8_quant
    assert fops.select_quant_config(n, k, m, "sm90").config == "torch"
    g = torch.Generator(device=DEV).manual_seed(m)
    a, sa = quantize_per_token_fp8(torch.randn(m, k, device=DEV, generator=g))
    w, sw = quantize_weight_fp8(torch.randn(n, k, device=DEV, generator=g))
    bias = torch.randn(n, device=DEV, generator=g)
    out_scale = torch.rand(m, device=DEV, generator=g).add(0.5).mul(k ** 0.5 / 112)
    # poison: the output's block (e4m3 0x7F is NaN) freed just before the op allocates one of its size
    torch.empty(m * n, dtype=torch.uint8, device=DEV).fill_(0x7F)
    y = torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, bias, out_scale, "auto")
    plan = fops._PLANS.plans[("scaled_mm_fp8_quant", "auto", None, m, n, k, True, a.device, fops._epoch())]
    assert plan.config in LANE.ids() and plan.config == fops.heuristic_config(m, n, k, "sm90"), plan.config
    y_torch = torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, bias, out_scale, "torch")
    ref = fops.reference_scaled_mm_fp8_quant(a.cpu(), w.cpu(), sa.cpu(), sw.cpu(), bias.cpu(), out_scale.cpu())
    torch.cuda.synchronize()
    yf, tf, rf = y.float().cpu(), y_torch.float().cpu(), ref.float()
    assert not yf.isnan().any()
    assert ((yf - rf).abs() <= 0.5 + 0.13 * rf.abs()).all(), float((yf - rf).abs().max())
    assert ((yf - tf).abs() <= 0.5 + 0.13 * tf.abs()).all(), float((yf - tf).abs().max())
