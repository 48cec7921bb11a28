"""The int8-output epilogue's division (templates/sm90_scaled_mm.cu.j2, `QuantRn`; any faster replacement must pass
this too — a branch-free `QuantExact` was written and withheld because it never ran on a GPU) on the GPU: the
quantized values must equal the reference's ``round_half_even(y / out_scale)`` bit for bit, at the rounding
boundaries (y / s within a few ulp of every .5 in [-130, 130]) and on random GEMMs, per tensor and per row, on one
tile of each kernel structure (64-row ping-pong, 2x1-cluster ping-pong, 128x256 cooperative). The full tile set is
covered by tests/test_scaled_mm_gpu.py::test_quant_variants_bitwise.

Run: ``pytest -m gpu tests/test_scaled_mm_quant_exact_gpu.py`` (builds three kernels).
"""
from __future__ import annotations

import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402,F401  (registers the ops)
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402

smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
if current_arch_family() != "sm90":  # pragma: no cover
    pytest.skip("the sm90 lane's epilogue", allow_module_level=True)
LANE = get_lane("sm90_int8_wgmma")
TILES = ("t64x128x128_c1x1_pp", "t128x128x128_c2x1_pp", "t128x256x128_c1x1_coop")


@pytest.fixture(scope="module", autouse=True)
def _built():
    rep = build_many([JitSpec.for_kernel(LANE, LANE.get(c), "int8", "sm90") for c in TILES], jobs=16,
                     progress=False)
    assert not rep.failed, rep.summary()


def _poison(numel):
    t = torch.full((numel,), -128, dtype=torch.int8, device="cuda")
    del t


@pytest.mark.parametrize("s", (0.1, 1 / 3, 0.0371, 2.0 ** -90, 7.5e25))
@pytest.mark.parametrize("cfg", TILES)
def test_quant_division_at_rounding_boundaries(cfg, s):
    """y is the bias alone (w = 0), placed within a few ulp of each .5 boundary and each integer times s."""
    base = torch.arange(-130, 130, 0.5, dtype=torch.float64)  # 520 values: saturates at both ends
    n, m, k = 4 * base.numel(), 17, 16  # 2080, a multiple of 16
    y = (base * s).float()
    up, down = torch.full_like(y, float("inf")), torch.full_like(y, -float("inf"))
    y = torch.cat([y, torch.nextafter(y, up), torch.nextafter(y, down),
                   torch.nextafter(torch.nextafter(y, up), up)]).cuda().contiguous()
    a = torch.ones(m, k, dtype=torch.int8, device="cuda")
    w = torch.zeros(n, k, dtype=torch.int8, device="cuda")
    sa, sw = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
    out_scale = torch.tensor([s], device="cuda", dtype=torch.float32)
    ref = smm.reference_scaled_mm_quant(a, w, sa, sw, y, out_scale)
    assert (ref[0] == 127).any() and (ref[0] == -128).any()  # the range reaches saturation on both sides
    _poison(m * n)
    q = torch.ops.oasr.scaled_mm_quant(a, w, sa, sw, y, out_scale, cfg)
    assert torch.equal(q, ref), f"{cfg} s={s}: {(q != ref).nonzero()[:4].tolist()}"


@pytest.mark.parametrize("cfg", TILES)
def test_quant_random_gemms_bitwise(cfg):
    for m, n, k in ((17, 1024, 512), (1000, 2048, 512), (4096, 512, 2048)):
        g = torch.Generator(device="cuda").manual_seed(m + n)
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda", generator=g)
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
        sa = (torch.rand(m, device="cuda", generator=g) + 0.5) / (127 * k ** 0.5)
        sw = (torch.rand(n, device="cuda", generator=g) + 0.5) / 127
        bias = torch.randn(n, device="cuda", generator=g)
        y = smm.reference_scaled_mm(a, w, sa, sw, bias, torch.float16).float()
        for out_scale in (torch.tensor([y.abs().max().item() / 127], device="cuda"),
                          (y.abs().amax(1) / 100).float().contiguous()):  # per row, saturating some values
            ref = smm.reference_scaled_mm_quant(a, w, sa, sw, bias, out_scale)
            _poison(m * n)
            q = torch.ops.oasr.scaled_mm_quant(a, w, sa, sw, bias, out_scale, cfg)
            assert torch.equal(q, ref), f"{cfg} M={m} N={n} K={k} out_scale {tuple(out_scale.shape)}"
