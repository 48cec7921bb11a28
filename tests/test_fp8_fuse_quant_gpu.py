"""The fp8 act-quant kernels on the GPU (H200): oasr::scaled_mm_fp8_act_quant (the ``fp8_gelu`` / ``fp8_silu``
variants of every data-parallel sm90 tile) vs the reference, odd M, bias / no bias, per-tensor / per-row scales,
poisoned outputs, the activations' tails and saturation; the bitwise rule of docs/kernels.md (tiles of one
summation-order group compute the same bits: the epilogue is elementwise on the same accumulator, so their
activation variants must agree bit for bit); CUDA-graph capture; and the fused FFN block compiled with
``fuse_quantization="act"`` under reduce-overhead.

Tolerance vs the reference (docs/kernels.md, "fp8 act-quant"): at most one e4m3 step per element (the fast-math
activation and reciprocal, and the fp32 accumulation against the reference's float64 one, move a value across a
rounding boundary only within a few ulp of it), and nearly all elements equal.

Run: ``pytest -m gpu tests/test_fp8_fuse_quant_gpu.py`` (device step fp8-fuse-gpu prebuilds the kernels first).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.act_quant import reference_scaled_mm_fp8_act_quant  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.lanes import SM89_FP8_MMA, SM90_FP8_WGMMA, summation_order  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.reference import (FP8, acc64, e4m3_steps, epilogue_fp32,  # noqa: E402
                                                       quantize_per_token_fp8, quantize_weight_fp8)
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

DEV = torch.device("cuda")
if current_arch_family() != "sm90":  # pragma: no cover
    pytest.skip("the fp8 activation epilogue exists for the sm90 lane only", allow_module_level=True)
LANE = SM90_FP8_WGMMA
TILES = LANE.data_parallel()  # every tile the quantizing op can serve (no Stream-K for an e4m3 output)
ACTS = ("gelu", "silu")


@pytest.fixture(scope="module", autouse=True)
def _built():
    specs = [JitSpec.for_kernel(LANE, c, f"fp8_{a}", "sm90") for a in ACTS for c in TILES]
    specs.append(JitSpec.for_kernel(LANE, LANE.default, "fp16", "sm90"))  # fc2 of the compiled block
    rep = build_many(specs, progress=False)
    print(rep.summary(), flush=True)
    assert not rep.failed, rep.summary()


def _poison():
    """Fill and free a block so the next allocations reuse memory holding 0x7F bytes (e4m3fn NaN, which the
    saturating epilogue never writes)."""
    small = [torch.full((1 << 19,), 0x7F, dtype=torch.uint8, device=DEV) for _ in range(64)]  # < 1 MB: small pool
    large = torch.full((64 << 20,), 0x7F, dtype=torch.uint8, device=DEV)
    del small, large


def _check(got, want, min_equal):
    assert not torch.isnan(got.float()).any(), "unwritten (poisoned) or NaN output"
    d = e4m3_steps(got, want)
    assert d.max().item() <= 1, f"{d.max().item()} e4m3 steps apart"
    assert (d == 0).float().mean().item() >= min_equal, (d == 0).float().mean().item()


def _operands(m, n, k, seed):
    """Unit-normal activations and weights quantized as a deployment does: y = x . w has a spread of about
    sqrt(K) (22 at K = 512)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    a, sa = quantize_per_token_fp8(torch.randn(m, k, device=DEV, generator=g))
    w, sw = quantize_weight_fp8(torch.randn(n, k, device=DEV, generator=g))
    return a, w, sa, sw, torch.randn(n, device=DEV, generator=g)


def _min_equal(cfg_id: str) -> float:
    # FastAccum keeps ~13-14 bits of the running sum: more values cross an e4m3 rounding boundary
    return 0.98 if cfg_id.endswith("_fa") or "_fa_" in cfg_id else 0.999


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("m", (1, 7, 17, 127, 1000, 4000))
def test_matches_the_reference(act, m):
    n, k = 1024, 512
    a, w, sa, sw, bias = _operands(m, n, k, m)
    for config in ("auto", LANE.default.id):
        for out_scale, b in ((torch.tensor([0.2], device=DEV), bias),  # 448 * 0.2 = 90: next to no saturation
                             (torch.rand(m, device=DEV) * 0.2 + 0.1, None)):
            _poison()
            got = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, act, bias=b, config=config)
            torch.cuda.synchronize()
            assert got.dtype == FP8 and got.shape == (m, n)
            _check(got, reference_scaled_mm_fp8_act_quant(a, w, sa, sw, b, out_scale, act), 0.999)


@pytest.mark.parametrize("act", ACTS)
def test_every_tile_over_the_activation_range_and_bitwise_within_order_groups(act):
    """y spans about [-100, 100]: both activations' tails (SiLU -> -0, GELU -> 0 far below 0, -> y far above),
    saturation at 448 with the small scale, partial last tiles in M and N, per-row scales."""
    m, n, k = 1000, 1040, 512
    a, w, sa, sw, bias = _operands(m, n, k, 7)
    y = epilogue_fp32(acc64(a, w), sa, sw, bias)
    assert y.min().item() < -30 and y.max().item() > 30  # the range the test means to cover
    scales = ((torch.tensor([0.5], device=DEV), bias), (torch.tensor([0.02], device=DEV), bias),
              (torch.rand(m, device=DEV) * 0.4 + 0.1, None))
    by_group: dict[tuple[str, int], torch.Tensor] = {}
    for cfg in TILES:
        for i, (out_scale, b) in enumerate(scales):
            _poison()
            got = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, act, bias=b, config=cfg.id)
            torch.cuda.synchronize()
            _check(got, reference_scaled_mm_fp8_act_quant(a, w, sa, sw, b, out_scale, act), _min_equal(cfg.id))
            first = by_group.setdefault((summation_order(cfg), i), got)
            assert torch.equal(first.view(torch.uint8), got.view(torch.uint8)), \
                f"{cfg.id} differs from its order group {summation_order(cfg)}"


def test_under_cuda_graph_capture():
    m, n, k = 4000, 1024, 512
    a, w, sa, sw, _ = _operands(m, n, k, 3)
    s = torch.tensor([0.05], device=DEV)
    oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, s, "silu")  # plan + load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, s, "silu")
    a2, sa2 = quantize_per_token_fp8(torch.randn(m, k, device=DEV))
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, reference_scaled_mm_fp8_act_quant(a, w, sa, sw, None, s, "silu"), 0.999)


def test_an_sm89_config_is_refused_with_a_clear_error():
    a, w, sa, sw, _ = _operands(64, 256, 128, 1)
    with pytest.raises(ValueError, match="without an activation epilogue"):
        oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, torch.ones(1, device=DEV), "gelu",
                                         config=SM89_FP8_MMA.default.id)


class _Block(nn.Module):
    def __init__(self, d=512, act=nn.GELU):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), act(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


@pytest.mark.parametrize("act", (nn.GELU, nn.SiLU))
def test_fused_block_compiled_with_cuda_graphs(act):
    torch.manual_seed(0)
    ref = _Block(act=act).to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        want = ref(x)
    # the lane default tile everywhere: its fp8_<act> and fp16 kernels are the ones the module fixture built
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), oasr_ops.Fp8W8A8Config(kernel=LANE.default.id))
    oasr_ops.calibrate(q, [x.half(), torch.randn_like(x).half()])
    torch.compiler.reset()
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_quant import fuse_log

    # torch.compile refuses mode= together with options=: the backend reads the mode from its options
    fn = torch.compile(q, backend=oasr_backend, options={"mode": "reduce-overhead", "fuse_quantization": "act"})
    with torch.no_grad():
        for _ in range(3):
            out = fn(x.half())
        torch.cuda.synchronize()
    rep = fuse_log()[-1]
    assert (rep.act_quant, rep.unfused) == (1, [])
    err = ((out.float() - want).abs().max() / want.abs().max()).item()
    assert err < 3e-2, err
    with torch.no_grad():  # the same model unfused (dynamic per-token fc2 input): the fusion costs little accuracy
        torch.compiler.reset()
        unfused = torch.compile(q, backend=oasr_backend, options={"fuse_quantization": False})(x.half())
    err_unfused = ((unfused.float() - want).abs().max() / want.abs().max()).item()
    assert err < 2 * err_unfused + 1e-2, (err, err_unfused)
