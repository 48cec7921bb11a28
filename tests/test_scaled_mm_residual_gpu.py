"""`oasr::scaled_mm_residual` on the GPU (H200): the ``fp16_res`` / ``bf16_res`` epilogue variants of every
data-parallel sm90 int8 tile against the reference (bit for bit: the same rounding order) and float64,
odd M, partial N / K tiles, bias or not, alpha 0.5 / 1.0 / other, per-token / per-tensor scales, poisoned outputs,
an unaligned residual (served by torch), a Stream-K request, CUDA-graph capture, and a compiled FFN block with
the residual fused (reduce-overhead).

Run: ``pytest -m gpu tests/test_scaled_mm_residual_gpu.py`` (device step ``resid-gpu`` prebuilds the kernels).
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
from oasr_ops.families.scaled_mm.residual import reference_scaled_mm_residual, reset_plans, served  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402

DEV = torch.device("cuda")
ARCH = current_arch_family()
if ARCH != "sm90":  # pragma: no cover
    pytest.skip("the residual epilogue exists in the sm90 lane only", allow_module_level=True)
LANE = get_lane("sm90_int8_wgmma")
TILES = LANE.data_parallel()
MS = (1, 7, 17, 127, 1000, 4000)


@pytest.fixture(scope="module", autouse=True)
def _built():
    """fp16_res of every data-parallel tile; bf16_res, fp16 and int8_gelu of the lane default (the compiled block):
    the list `benchmarks/residual_gemm.py --prebuild-only` builds in parallel for the device step."""
    specs = [JitSpec.for_kernel(LANE, c, "fp16_res", ARCH) for c in TILES]
    specs += [JitSpec.for_kernel(LANE, LANE.default, v, ARCH) for v in ("bf16_res", "fp16", "int8_gelu")]
    rep = build_many(specs, progress=False)
    print(rep.summary(), flush=True)
    assert not rep.failed, rep.summary()


def _poison():
    """Fill and free blocks so the next allocations reuse memory holding 0xFF bytes (fp16/bf16 NaN)."""
    small = [torch.full((1 << 19,), 0xFF, dtype=torch.uint8, device=DEV) for _ in range(64)]
    large = torch.full((64 << 20,), 0xFF, dtype=torch.uint8, device=DEV)
    del small, large


def _inputs(m, n, k, dtype, seed, per_token=True, bias=True):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), device=DEV, dtype=torch.int8, generator=g)
    sa = torch.rand(m if per_token else 1, device=DEV, generator=g) * 2e-3 + 1e-4
    sw = torch.rand(n, device=DEV, generator=g) * 2e-3 + 1e-4
    b = (torch.randn(n, device=DEV, generator=g) * 0.5).to(dtype) if bias else None
    r = (torch.randn(m, n, device=DEV, generator=g) * 2).to(dtype)
    return a, w, sa, sw, b, r


def _check(a, w, sa, sw, b, r, alpha, dtype, config):
    _poison()
    got = oasr_ops.scaled_mm_residual(a, w, sa, sw, r, alpha=alpha, bias=b, out_dtype=dtype, config=config)
    torch.cuda.synchronize()
    assert not torch.isnan(got).any(), "unwritten output (poison left)"
    k = w.shape[1]
    y64 = sa.double().reshape(-1, 1) * sw.double().reshape(1, -1) * (a.double() @ w.double().t())  # exact acc
    if b is not None:
        y64 = y64 + b.double()
    ref64 = r.double() + alpha * y64
    tol = ref64.abs() * torch.finfo(dtype).eps / 2 + 8 * torch.finfo(torch.float32).eps * (r.double().abs()
                                                                                           + y64.abs() * abs(alpha))
    bad = (got.double() - ref64).abs() > tol + torch.finfo(dtype).tiny
    assert not bad.any(), f"{int(bad.sum())} elements off the float64 value beyond one rounding (K={k})"
    want = reference_scaled_mm_residual(a, w, sa, sw, b, r, alpha, dtype)
    diff = (got.float() - want.float()).abs().max().item()
    assert torch.equal(got, want), f"not bit-identical to the reference (max diff {diff})"


@pytest.mark.parametrize("cfg,dtype", [(c.id, torch.float16) for c in TILES] + [(LANE.default.id, torch.bfloat16)])
def test_every_tile_odd_m_bias_alpha(cfg, dtype):
    reset_plans()  # `served()` below: only this test's plans
    for i, m in enumerate(MS):
        for n, k in ((512, 2048), (520, 272)):  # the Conformer M fc2 shape; partial N and K tiles
            a, w, sa, sw, b, r = _inputs(m, n, k, dtype, seed=m + n, bias=i % 2 == 0)
            for alpha in (0.5, 1.0):
                _check(a, w, sa, sw, b, r, alpha, dtype, cfg)
    served_ids = {p.config for p in served()}
    assert cfg in served_ids, f"{cfg} was not the kernel that ran (served: {served_ids})"


@pytest.mark.parametrize("m", MS)
def test_auto_per_tensor_scale_and_an_inexact_alpha(m):
    a, w, sa, sw, b, r = _inputs(m, 768, 3072, torch.float16, seed=3 * m, per_token=False)
    _check(a, w, sa, sw, b, r, -0.3, torch.float16, "auto")


def test_unaligned_residual_is_served_by_torch_correctly():
    a, w, sa, sw, b, r = _inputs(127, 512, 256, torch.float16, seed=1)
    buf = torch.empty(r.numel() + 4, device=DEV, dtype=torch.float16)
    r_off = buf[4:].view(127, 512)  # contiguous, 8 bytes past a 16-byte boundary: TMA cannot read it
    r_off.copy_(r)
    assert r_off.data_ptr() % 16 != 0
    with pytest.warns(UserWarning, match="not aligned"):
        _check(a, w, sa, sw, b, r_off, 0.5, torch.float16, LANE.default.id)


def test_stream_k_tile_request_is_served_by_a_data_parallel_tile():
    a, w, sa, sw, b, r = _inputs(1000, 512, 2048, torch.float16, seed=5)
    _check(a, w, sa, sw, b, r, 0.5, torch.float16, "t128x128x128_c1x1_sk")


def test_under_cuda_graph_capture():
    m, n, k = 4000, 512, 2048
    a, w, sa, sw, b, r = _inputs(m, n, k, torch.float16, seed=9)
    cfg = LANE.default.id
    oasr_ops.scaled_mm_residual(a, w, sa, sw, r, alpha=0.5, bias=b, config=cfg)  # load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = oasr_ops.scaled_mm_residual(a, w, sa, sw, r, alpha=0.5, bias=b, config=cfg)
    a.copy_(torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8))
    r.copy_(torch.randn(m, n, device=DEV).half())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference_scaled_mm_residual(a, w, sa, sw, b, r, 0.5, torch.float16))


class _Block(nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + 0.5 * self.fc2(self.act(self.fc1(self.ln(x))))


def test_fused_block_compiled_with_cuda_graphs():
    torch.manual_seed(0)
    ref = _Block().to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        want = ref(x)
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), oasr_ops.Int8W8A8Config(kernel=LANE.default.id))
    oasr_ops.calibrate(q, [x.half()])
    torch.compiler.reset()
    reset_plans()  # so that `served()` below lists only what this compiled block ran
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_residual import residual_log

    fn = torch.compile(q, backend=oasr_backend, options={"mode": "reduce-overhead", "fuse_quantization": "act",
                                                         "fuse_residual": True})
    with torch.no_grad():
        for _ in range(3):
            out = fn(x.half())
        torch.cuda.synchronize()
    rep = residual_log()[-1]
    assert (rep.fused, rep.alphas, rep.unfused) == (1, [0.5], [])
    err = ((out.float() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-2, err
    assert any(p.config == LANE.default.id for p in served())  # the residual kernel ran, not the torch fallback
