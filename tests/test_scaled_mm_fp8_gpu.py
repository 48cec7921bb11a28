"""fp8 e4m3 scaled_mm_fp8 on the GPU (H200): every sm90 tile over M in {1, 7, 16, 17, 64, 127, 1000, 4096,
16384} x ASR (N, K) x per-token / per-tensor scales x bias x fp16 / bf16 output.

* Bitwise groups (`lanes.summation_order`): every tile of an order group computes exactly the bits of the
  group's first tile, on every input.
* Accuracy (the build's gate): against a float64 reference of the same dequantized product, every
  non-FastAccum tile's max error is within 4x of cuBLAS's own (the ``torch`` arm: torch._scaled_mm); FastAccum
  tiles are recorded separately (the ratio to cuBLAS's error, per K) and only bounded at 16x (a broken kernel,
  not a slow-accumulating one, fails that). Stream-K tiles are gated like the others.
* The quantizing op (e4m3 output): bitwise within groups and within e4m3 rounding of the reference.
* CUDA-graph capture replays the same bits as eager calls; `auto` / `heuristic` serve kernels; a quantized
  model (`quantize_(model, "fp8_w8a8")`) runs them.
* The candidate tiles (`lanes.SM90_CANDIDATES`: timed by benchmarks/scaled_mm_fp8_probe.py, not served yet) are
  checked like the lane's: same groups, same gates. The ops serve only the registered lane's configs, so a
  candidate runs through the op's own kernel path (`ops._kernel_run`) with the lane that holds it.

Writes `$OUT/fp8_gpu_numerics.json` (or ./fp8_gpu_numerics.json): per (K, dtype) the max error ratios of each
order group against cuBLAS, and whether the swap-AB groups happen to match the non-swapped bits.

Run: ``pytest -m gpu tests/test_scaled_mm_fp8_gpu.py`` (kernels built first, in parallel; a prebuilt
OASR_JIT_DIR makes that instant). Budget: under two minutes with the kernels built.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover - CPU CI never selects gpu tests
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import oasr_ops  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.configs import parse  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.lanes import sm90_with_candidates, summation_order  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.reference import FP8, quantize_weight_fp8  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402

fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
ARCH = current_arch_family()
if ARCH != "sm90":  # pragma: no cover
    pytest.skip("the fp8 GPU suite targets the sm90 lane (sm89 has no GPU here)", allow_module_level=True)
LANE = get_lane("sm90_fp8_wgmma")
TESTED = sm90_with_candidates()  # the lane's configs, then the candidates

MS = (1, 7, 16, 17, 64, 127, 1000, 4096, 16384)
# ASR widths (Conformer S/M/L FFN and attention projections, Whisper base), K <= 5120, chosen to keep this file
# under two minutes: a square, an FFN-1 (N = 4d), an FFN-2 (K = 4d) and the deepest ASR K (Conformer L's 4864).
NK = ((256, 256), (1024, 512), (512, 2048), (256, 4864))
SCALES = ((True, True, False), (True, True, True), (False, False, True), (True, False, False))
DTYPES = (torch.float16, torch.bfloat16)
FAST_BOUND = 16.0
_REPORT: dict = {"groups": {}, "swab_matches_unswapped": {}, "max_ratio": {}}


def _ids(quant=False):
    return [c.id for c in TESTED.space if not (quant and c.kernel_schedule == "streamk")]


def _groups(ids):
    out: dict[str, list[str]] = {}
    for cid in ids:
        out.setdefault(summation_order(parse(cid)), []).append(cid)
    return out


@pytest.fixture(scope="module", autouse=True)
def built():
    specs = [JitSpec.for_kernel(TESTED, c, dt, ARCH) for c in TESTED.space for dt in ("fp16", "bf16")]
    specs += [JitSpec.for_kernel(TESTED, c, "fp8", ARCH) for c in TESTED.space if c.kernel_schedule != "streamk"]
    report = build_many(specs, jobs=16, progress=False)
    assert not report.failed, report.summary()
    fops.reset_plans()
    yield
    out = Path(os.environ.get("OUT", ".")) / "fp8_gpu_numerics.json"
    out.write_text(json.dumps(_REPORT, indent=1, sort_keys=True))
    print(f"\nfp8 numerics report: {out}")


def _inputs(m, n, k, per_token, per_channel, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g)
    a, sa = torch.ops.oasr.quantize_per_token_fp8(x)
    wq, sw = quantize_weight_fp8(torch.randn(n, k, device="cuda", generator=g))
    if not per_token:  # one scale for the tensor: requantize with it
        s = sa.max().reshape(1)
        a = (a.float() * sa[:, None] / s).clamp(-448, 448).to(FP8)
        sa = s.contiguous()
    if not per_channel:
        s = sw.max().reshape(1)
        wq = (wq.float() * sw[:, None] / s).clamp(-448, 448).to(FP8)
        sw = s.contiguous()
    return a.contiguous(), wq.contiguous(), sa.float().contiguous(), sw.float().contiguous()


def _ref64(a, w, sa, sw, bias):
    y = (a.double() @ w.double().t()) * sa.double().reshape(-1, 1) * sw.double().reshape(1, -1)
    return y if bias is None else y + bias.double()


def _poison(numel, dtype):
    t = torch.full((numel,), float("nan"), dtype=torch.float16, device="cuda") if dtype != FP8 else \
        torch.full((numel,), 0x7F, dtype=torch.uint8, device="cuda")
    del t


def _candidate(op, cfg, a, w, sa, sw, bias, dt, out_scale=None):
    """A candidate tile (not in the registered lane) through the op's kernel path."""
    m, (n, k) = a.shape[0], w.shape
    run = fops._kernel_run(op, parse(cfg), dt, m, n, k, ARCH, fops.signature(op, n, k), lane=TESTED)
    assert run is not None, f"{cfg} cannot run M={m} N={n} K={k}"
    return run(a, w, sa, sw, bias, out_scale)


def _run(cfg, a, w, sa, sw, bias, dt):
    _poison(a.shape[0] * w.shape[0], dt)
    if cfg != "torch" and parse(cfg) not in LANE.space:
        return _candidate("scaled_mm_fp8", cfg, a, w, sa, sw, bias, dt)
    y = torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, bias, dt, cfg)
    plan = fops._PLANS.plans.get(("scaled_mm_fp8", cfg, dt, a.shape[0], w.shape[0], w.shape[1], bias is not None,
                                  a.device, fops._epoch()))
    assert plan is not None and plan.config == (cfg if cfg != "torch" else "torch"), \
        f"{cfg} fell back to {plan.config if plan else None}"
    return y


def _err(y, ref):
    return float((y.double() - ref).abs().max())


@pytest.mark.parametrize("n,k", NK, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", DTYPES, ids=("fp16", "bf16"))
def test_every_tile_bitwise_groups_and_gate(n, k, dt):
    ids = _ids()
    groups = _groups(ids)
    worst: dict[str, float] = {}
    for m in MS:
        for per_token, per_channel, with_bias in SCALES:
            a, w, sa, sw = _inputs(m, n, k, per_token, per_channel, seed=m * 7 + n + k)
            bias = (torch.randn(n, device="cuda")).to(dt) if with_bias else None
            ref = _ref64(a, w, sa, sw, bias)
            cub = _run("torch", a, w, sa, sw, bias, dt)
            floor = torch.finfo(dt).eps * float(ref.abs().max()) + 1e-6
            base = max(_err(cub, ref), floor)
            outs = {cid: _run(cid, a, w, sa, sw, bias, dt) for cid in ids}
            where = f"M={m} N={n} K={k} {dt} per_token={per_token} per_channel={per_channel} bias={with_bias}"
            for order, members in groups.items():
                rep = outs[members[0]]
                for cid in members[1:]:
                    if not torch.equal(outs[cid], rep):
                        bad = (outs[cid] != rep).nonzero()[:5].tolist()
                        pytest.fail(f"{cid} differs from {members[0]} (order {order}) at {bad}: {where}")
                ratio = _err(rep, ref) / base
                worst[order] = max(worst.get(order, 0.0), ratio)
                assert torch.isfinite(rep.float()).all(), f"{members[0]} not finite: {where}"
                bound = FAST_BOUND if order.startswith("fast") else 4.0
                assert ratio <= bound, f"{members[0]} error {ratio:.2f}x cuBLAS's (> {bound}): {where}"
            for sw_order, plain in (("promote256|swab", "promote128"), ("fast|swab", "fast")):
                key = f"{sw_order} vs {plain} {dt} K={k}"
                same = torch.equal(outs[groups[sw_order][0]], outs[groups[plain][0]])
                _REPORT["swab_matches_unswapped"][key] = _REPORT["swab_matches_unswapped"].get(key, True) and same
    _REPORT["max_ratio"][f"N={n} K={k} {dt}"] = worst
    _REPORT["groups"] = groups


@pytest.mark.parametrize("n,k", ((256, 256), (1024, 512), (512, 2048)), ids=lambda v: str(v))
def test_quant_op(n, k):
    ids = _ids(quant=True)
    groups = _groups(ids)
    for m in (1, 17, 127, 1000, 4096):
        a, w, sa, sw = _inputs(m, n, k, True, True, seed=m + n)
        bias = torch.randn(n, device="cuda")
        y = _ref64(a, w, sa, sw, bias)
        for out_scale in (torch.tensor([float(y.abs().max()) / 448], device="cuda"),
                          (y.abs().amax(1) / 300).float().contiguous()):  # per row, saturating some values
            want = (y / out_scale.double().reshape(-1, 1)).clamp(-448, 448)
            outs = {}
            for cid in ids:
                _poison(m * n, FP8)
                outs[cid] = (torch.ops.oasr.scaled_mm_fp8_quant(a, w, sa, sw, bias, out_scale, cid)
                             if parse(cid) in LANE.space else
                             _candidate("scaled_mm_fp8_quant", cid, a, w, sa, sw, bias, None, out_scale))
                q = outs[cid].double()
                # within e4m3 rounding (half an ulp: 2**-4 relative) plus the accumulation's own error; FastAccum
                # never promotes its accumulator: measured on the H200 up to 1.6e-3 of the output's max at K=2048
                # (t64x128x128_fa, M=4096, N=512), so its allowance is 4x the promoting kernels' (as FAST_BOUND is)
                acc = (4e-3 if "_fa" in cid else 1e-3) * float(want.abs().max())
                tol = want.abs() * (2 ** -4 * 1.05) + 2 ** -9 + acc
                bad = (q - want).abs() > tol
                assert not bad.any(), f"{cid} M={m} N={n} K={k}: {int(bad.sum())} values off, e.g. " \
                                      f"{q[bad][:3].tolist()} vs {want[bad][:3].tolist()}"
            for order, members in groups.items():
                for cid in members[1:]:
                    assert torch.equal(outs[cid].view(torch.uint8), outs[members[0]].view(torch.uint8)), \
                        f"{cid} differs from {members[0]} (order {order}) M={m} N={n} K={k}"


def test_auto_and_heuristic_serve_kernels():
    for m in (7, 1000):
        a, w, sa, sw = _inputs(m, 1024, 1024, True, True, 1)
        for cfg in ("auto", "heuristic"):
            torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, None, torch.bfloat16, cfg)
            plan = fops._PLANS.plans[("scaled_mm_fp8", cfg, torch.bfloat16, m, 1024, 1024, False, a.device,
                                      fops._epoch())]
            assert plan.config in LANE.ids(), plan.config


def test_cuda_graph_capture():
    n, k = 1024, 1024
    wq, sw = quantize_weight_fp8(torch.randn(n, k, device="cuda"))
    bias = torch.randn(n, device="cuda").bfloat16()
    x = torch.randn(256, k, device="cuda")
    cfgs = ("auto", "torch", LANE.default.id, "t64x16x256_c1x1_pp_swab", "t128x128x128_c1x1_sk",
            "t128x128x128_c2x1_pp_fa")

    def step():
        outs = []
        for cfg in cfgs:
            q, s = torch.ops.oasr.quantize_per_token_fp8(x)
            outs.append(torch.ops.oasr.scaled_mm_fp8(q, wq, s, sw, bias, torch.bfloat16, cfg))
        return outs

    eager = step()  # plans resolved (and kernels loaded) before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [step() for _ in range(4)]
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    expect = step()
    for rep in outs:
        for cfg, y, e in zip(cfgs, rep, expect):
            assert torch.equal(y, e), cfg
    assert not torch.equal(eager[0], expect[0])


def test_quantized_model_runs_kernels():
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                                torch.nn.Linear(2048, 512)).bfloat16().cuda()
    # M=200: the shipped DB serves swap-AB tiles there for both widths (above M=256 it answers torch._scaled_mm)
    x = torch.randn(2, 100, 512, device="cuda").bfloat16()
    with torch.no_grad():
        ref = model(x).float()
        oasr_ops.quantize_(model, "fp8_w8a8")
        out = model(x).float()
    assert (out - ref).norm() / ref.norm() < 0.06
    assert any(p.config in LANE.ids() for p in fops.served())
