"""`oasr::scaled_mm_fp8_residual` on the GPU (H200): the ``fp16_res`` / ``bf16_res`` epilogue variants of every
data-parallel sm90 fp8 tile (plain, FastAccum, swap-AB) over odd M, partial N / K tiles, bias or not, alpha 0.5 /
1.0 / an inexact one, per-token / per-tensor scales, poisoned outputs:

* exact: with a zero residual and alpha 1 the op is bit for bit the same tile's `scaled_mm_fp8` (0 + y and 1 * y
  are exact in fp32), so the epilogue adds nothing of its own;
* within bounds: against a float64 reference, each element is within half an output step, the fp32 steps of the
  epilogue, and |alpha| times the same tile's own GEMM error (`scaled_mm_fp8` on the same inputs: the same
  accumulator, rounded once more to the output), so a C operand read wrong (a transposed or shifted residual,
  the swap-AB tiles' column-major C) fails while the fp32 accumulation order of the tile does not;
* an unaligned residual is served by torch (warned), a Stream-K request by a data-parallel tile, CUDA-graph capture
  replays the same bits, and an fp8 FFN block compiled with the backend's defaults runs the residual kernel.

Run: ``pytest -m gpu tests/test_scaled_mm_fp8_residual_gpu.py`` (kernels built first, in parallel).
"""
from __future__ import annotations

import copy

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.reference import FP8, quantize_weight_fp8  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.residual import reset_plans, select_residual_config, served  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402
from test_scaled_mm_residual_gpu import _Block, _poison  # noqa: E402  (the int8 op's poison and FFN block)

DEV = torch.device("cuda")
ARCH = current_arch_family()
if ARCH != "sm90":  # pragma: no cover
    pytest.skip("the fp8 residual epilogue exists in the sm90 lane only", allow_module_level=True)
LANE = get_lane("sm90_fp8_wgmma")
TILES = LANE.data_parallel()
MS = (1, 7, 17, 127, 1000, 4000)
NK = ((512, 2048), (528, 272))  # the Conformer M fc2 shape; partial N and K tiles


@pytest.fixture(scope="module", autouse=True)
def _built():
    specs = [JitSpec.for_kernel(LANE, c, v, ARCH) for c in TILES for v in ("fp16_res", "fp16")]
    specs += [JitSpec.for_kernel(LANE, LANE.default, v, ARCH) for v in ("bf16_res", "bf16", "fp8_gelu")]
    rep = build_many(specs, jobs=16, progress=False)
    print(rep.summary(), flush=True)
    assert not rep.failed, rep.summary()


def _inputs(m, n, k, dtype, seed, per_token=True, bias=True):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a, sa = torch.ops.oasr.quantize_per_token_fp8(torch.randn(m, k, device=DEV, generator=g))
    w, sw = quantize_weight_fp8(torch.randn(n, k, device=DEV, generator=g))
    if not per_token:  # one scale for the tensor: requantize with it
        s = sa.max().reshape(1)
        a = (a.float() * sa[:, None] / s).clamp(-448, 448).to(FP8)
        sa = s
    b = (torch.randn(n, device=DEV, generator=g) * 0.5).to(dtype) if bias else None
    r = (torch.randn(m, n, device=DEV, generator=g) * 2).to(dtype)
    return a.contiguous(), w, sa.float().contiguous(), sw.float().contiguous(), b, r


def _check(a, w, sa, sw, b, r, alpha, dtype, config):
    _poison()
    got = oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, r, alpha=alpha, bias=b, out_dtype=dtype, config=config)
    tile = config if config != "auto" else select_residual_config(w.shape[0], w.shape[1], a.shape[0]).config
    plain = oasr_ops.scaled_mm_fp8(a, w, sa, sw, b, dtype, config=tile)  # the same tile: the same accumulator
    torch.cuda.synchronize()
    assert not torch.isnan(got).any(), "unwritten output (poison left)"
    y64 = sa.double().reshape(-1, 1) * sw.double().reshape(1, -1) * (a.double() @ w.double().t())
    if b is not None:
        y64 = y64 + b.double()
    ref64 = r.double() + alpha * y64
    # got = round(r + alpha * y_k), y_k the tile's fp32 value, plain = round(y_k): |y_k - y64| <= |plain - y64| +
    # half a step of plain
    gemm_err = (plain.double() - y64).abs() + plain.double().abs() * torch.finfo(dtype).eps / 2
    tol = (ref64.abs() * torch.finfo(dtype).eps / 2 + abs(alpha) * gemm_err
           + 8 * torch.finfo(torch.float32).eps * (r.double().abs() + y64.abs() * abs(alpha)) + torch.finfo(dtype).tiny)
    bad = (got.double() - ref64).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} elements beyond the bound (max {(got.double() - ref64).abs().max()})"
    zero = oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, torch.zeros_like(r), alpha=1.0, bias=b, out_dtype=dtype,
                                           config=config)
    assert torch.equal(zero, plain), "with residual 0 and alpha 1 not bit-identical to the tile's scaled_mm_fp8"


@pytest.mark.parametrize("cfg,dtype", [(c.id, torch.float16) for c in TILES] + [(LANE.default.id, torch.bfloat16)])
def test_every_tile_odd_m_bias_alpha(cfg, dtype):
    reset_plans()  # `served()` below: only this test's plans
    for i, m in enumerate(MS):
        for n, k in NK:
            a, w, sa, sw, b, r = _inputs(m, n, k, dtype, seed=m + n, bias=i % 2 == 0)
            for alpha in (0.5, 1.0):
                _check(a, w, sa, sw, b, r, alpha, dtype, cfg)
    served_ids = {p.config for p in served()}
    assert served_ids == {cfg}, f"{cfg} was not the kernel that ran (served: {served_ids})"


@pytest.mark.parametrize("m", MS)
def test_auto_per_tensor_scale_and_an_inexact_alpha(m):
    a, w, sa, sw, b, r = _inputs(m, 768, 3072, torch.float16, seed=3 * m, per_token=False)
    _check(a, w, sa, sw, b, r, -0.3, torch.float16, "auto")


def test_unaligned_residual_is_served_by_torch_correctly():
    a, w, sa, sw, b, r = _inputs(127, 512, 256, torch.float16, seed=1)
    buf = torch.empty(r.numel() + 4, device=DEV, dtype=torch.float16)
    r_off = buf[4:].view(127, 512)  # contiguous, 8 bytes past a 16-byte boundary: the epilogue cannot read it
    r_off.copy_(r)
    assert r_off.data_ptr() % 16 != 0
    with pytest.warns(UserWarning, match="not aligned"):
        got = oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, r_off, alpha=0.5, bias=b, out_dtype=torch.float16,
                                              config=LANE.default.id)
    want = oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, r, alpha=0.5, bias=b, out_dtype=torch.float16,
                                           config="torch")
    assert torch.equal(got, want)


def test_stream_k_tile_request_is_served_by_a_data_parallel_tile():
    a, w, sa, sw, b, r = _inputs(1000, 512, 2048, torch.float16, seed=5)
    reset_plans()
    oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, r, alpha=0.5, bias=b, out_dtype=torch.float16,
                                    config="t128x128x128_c1x1_sk")
    ran, = served()
    assert ran.config in {c.id for c in TILES}


def test_under_cuda_graph_capture():
    m, n, k = 4000, 512, 2048
    a, w, sa, sw, b, r = _inputs(m, n, k, torch.float16, seed=9)
    cfg = LANE.default.id

    def call():
        return oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, r, alpha=0.5, bias=b, out_dtype=torch.float16,
                                               config=cfg)
    call()  # load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    a2, _ = torch.ops.oasr.quantize_per_token_fp8(torch.randn(m, k, device=DEV))
    a.copy_(a2)
    r.copy_(torch.randn(m, n, device=DEV).half())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, call())


def test_fused_block_compiled_with_cuda_graphs():
    torch.manual_seed(0)
    ref = _Block().to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        want = ref(x)
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), oasr_ops.Fp8W8A8Config(kernel=LANE.default.id))
    oasr_ops.calibrate(q, [x.half()])
    torch.compiler.reset()
    reset_plans()  # so that `served()` below lists only what this compiled block ran
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_residual import RESIDUAL_LOG

    mark = RESIDUAL_LOG.mark()
    fn = torch.compile(q, backend=oasr_backend, options={"mode": "reduce-overhead"})  # the defaults fuse it
    with torch.no_grad():
        for _ in range(3):
            out = fn(x.half())
        torch.cuda.synchronize()
    rep, = RESIDUAL_LOG.since(mark)
    assert (rep.fused, rep.alphas, rep.unfused) == (1, [0.5], [])
    err = ((out.float() - want).abs().max() / want.abs().max()).item()
    assert err < 6e-2, err  # e4m3's own error (docs/perf/e2e.md: ~4x int8's)
    assert any(p.config == LANE.default.id for p in served())  # the residual kernel ran, not the torch fallback
