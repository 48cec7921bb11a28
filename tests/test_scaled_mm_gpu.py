"""int8 scaled_mm on the GPU (H200): every variant computes the same bits as every other and as the torch reference
of the same formula (`torch._int_mm` exact int32 accumulator + the fp32 epilogue), over ASR shapes, per-token and
per-tensor scales, with and without bias, fp16 and bf16; the quantizing op; CUDA-graph capture.

Run: ``pytest -m gpu tests/test_scaled_mm_gpu.py``. The kernels are built first, in parallel (``OASR_JIT_DIR``
shared with a CPU prebuild finds them already built).
"""
from __future__ import annotations

import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
ARCH = current_arch_family()
SM90 = get_lane("sm90_int8_wgmma")
SM80 = get_lane("sm80_int8_mma")

MS = (1, 7, 16, 17, 64, 127, 1000, 4096, 16384)
NK = ((256, 256), (1024, 256), (256, 1024), (512, 512), (2048, 512), (512, 2048), (1024, 1024), (4096, 1024),
      (1024, 4096))
DTYPES = (torch.float16, torch.bfloat16)


def _lane():
    return SM90 if ARCH == "sm90" else SM80


def _configs(quant=False):
    lane = _lane()
    return [c.id for c in lane.space if not (quant and c.kernel_schedule == "streamk")]


@pytest.fixture(scope="module", autouse=True)
def built():
    lane = _lane()
    specs = [JitSpec.for_kernel(lane, c, dt, ARCH) for c in lane.space for dt in ("fp16", "bf16")]
    specs += [JitSpec.for_kernel(lane, c, "int8", ARCH) for c in lane.space if c.kernel_schedule != "streamk"]
    if ARCH == "sm90":  # the 2.x lane also runs on Hopper: check its kernels too
        specs += [JitSpec.for_kernel(SM80, c, dt, ARCH) for c in SM80.space[:3] for dt in ("fp16", "int8")]
    report = build_many(specs, jobs=16, progress=False)
    assert not report.failed, report.summary()
    smm.reset_plans()
    yield


def _inputs(m, n, k, per_token, per_channel, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda", generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
    # scales of a realistic magnitude (outputs O(1..100)), never exactly representable products
    sa = (torch.rand(m if per_token else 1, device="cuda", generator=g) + 0.5) / (127 * k ** 0.5)
    sw = (torch.rand(n if per_channel else 1, device="cuda", generator=g) + 0.5) / 127
    return a, w, sa.float(), sw.float()


def _poison(numel, dtype):
    # a freed block of NaN / 0x7f bytes that the caching allocator hands to the next allocation of this size
    t = torch.full((numel,), 0x7F, dtype=torch.int8, device="cuda") if dtype == torch.int8 else \
        torch.full((numel,), float("nan"), dtype=dtype, device="cuda")
    del t


def _run(cfg, a, w, sa, sw, bias, dt):
    _poison(a.shape[0] * w.shape[0], dt)
    y = torch.ops.oasr.scaled_mm(a, w, sa, sw, bias, dt, cfg)
    plan = smm.get_plan("scaled_mm", a, w, bias, cfg, dt)
    assert plan.config == cfg, f"{cfg} fell back to {plan.config}"
    return y


@pytest.mark.parametrize("n,k", NK, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", DTYPES, ids=("fp16", "bf16"))
def test_all_variants_bitwise(n, k, dt):
    cfgs = _configs()
    for m in MS:
        for per_token, per_channel, with_bias in ((True, True, False), (True, True, True), (False, False, True),
                                                  (False, True, False), (True, False, True)):
            a, w, sa, sw = _inputs(m, n, k, per_token, per_channel, seed=m * 7 + n + k)
            bias = (torch.randn(n, device="cuda") * 4).to(dt) if with_bias else None
            ref = smm.reference_scaled_mm(a, w, sa, sw, bias, dt)
            assert torch.isfinite(ref.float()).all()
            for cfg in cfgs:
                y = _run(cfg, a, w, sa, sw, bias, dt)
                if not torch.equal(y, ref):
                    bad = (y != ref).nonzero()[:5].tolist()
                    pytest.fail(f"{cfg} M={m} N={n} K={k} {dt} per_token={per_token} per_channel={per_channel} "
                                f"bias={with_bias}: differs from the reference at {bad}")


@pytest.mark.parametrize("n,k", ((256, 256), (1024, 4096), (4096, 1024)), ids=lambda v: str(v))
def test_quant_variants_bitwise(n, k):
    for m in (1, 17, 127, 1000, 4096):
        a, w, sa, sw = _inputs(m, n, k, True, True, seed=m + n)
        bias = torch.randn(n, device="cuda")
        y = smm.reference_scaled_mm(a, w, sa, sw, bias, torch.float16).float()
        for out_scale in (torch.tensor([y.abs().max().item() / 127], device="cuda"),
                          (y.abs().amax(1) / 100).float().contiguous()):  # per row, saturating some values
            ref = smm.reference_scaled_mm_quant(a, w, sa, sw, bias, out_scale)
            for cfg in _configs(quant=True):
                _poison(m * n, torch.int8)
                q = torch.ops.oasr.scaled_mm_quant(a, w, sa, sw, bias, out_scale, cfg)
                assert smm.get_plan("scaled_mm_quant", a, w, bias, cfg, None).config == cfg
                assert torch.equal(q, ref), f"{cfg} M={m} N={n} K={k} out_scale {tuple(out_scale.shape)}"


@pytest.mark.skipif(ARCH != "sm90", reason="the 2.x lane on Hopper")
def test_sm80_lane_on_hopper_bitwise():
    for cid in [c.id for c in SM80.space[:3]]:
        for m, n, k in ((17, 256, 256), (1000, 1024, 512), (4096, 512, 2048)):
            a, w, sa, sw = _inputs(m, n, k, True, False, seed=m)  # a per-tensor scale_w: expanded for 2.x
            bias = torch.randn(n, device="cuda").half()
            assert torch.equal(_run(cid, a, w, sa, sw, bias, torch.float16),
                               smm.reference_scaled_mm(a, w, sa, sw, bias, torch.float16))


def test_auto_and_heuristic_serve_kernels():
    a, w, sa, sw = _inputs(1000, 1024, 1024, True, True, 1)
    ref = smm.reference_scaled_mm(a, w, sa, sw, None, torch.bfloat16)
    for cfg in ("auto", "heuristic"):
        y = torch.ops.oasr.scaled_mm(a, w, sa, sw, None, torch.bfloat16, cfg)
        assert torch.equal(y, ref)
        assert smm.get_plan("scaled_mm", a, w, None, cfg, torch.bfloat16).config in _configs()


def test_cuda_graph_capture():
    n, k = 1024, 1024
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    sw = torch.rand(n, device="cuda") / 127
    bias = torch.randn(n, device="cuda").half()
    x = torch.randn(256, k, device="cuda")
    cfgs = ("auto", SM90.default.id if ARCH == "sm90" else SM80.default.id) + \
        (("t128x128x128_c1x1_sk",) if ARCH == "sm90" else ())

    def step():
        outs = []
        for cfg in cfgs:
            q, s = torch.ops.oasr.quantize_per_token(x)
            outs.append(torch.ops.oasr.scaled_mm(q, w, s, sw, bias, torch.float16, cfg))
        return outs

    eager = step()  # plans resolved (and kernels loaded) before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [step() for _ in range(8)]
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    expect = step()
    for rep in outs:
        for y, e in zip(rep, expect):
            assert torch.equal(y, e)
    assert not torch.equal(eager[0], expect[0])


def test_quantized_model_runs_kernels():
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).half().cuda()
    x = torch.randn(4, 100, 512, device="cuda").half()
    with torch.no_grad():
        ref = model(x).float()
        oasr_ops.quantize_(model)
        out = model(x).float()
    assert (out - ref).norm() / ref.norm() < 0.03
    assert any(p.config != "torch" for p in smm.served())
