"""The fp8 act-quant kernels on the GPU (H200): oasr::scaled_mm_fp8_act_quant (the ``fp8_gelu`` variant of every
data-parallel sm90 tile, ``fp8_silu`` of the lane default) vs the reference, odd M, bias / no bias, per-tensor /
per-row scales, poisoned outputs, the activations' tails and saturation; the bitwise rule of docs/kernels.md;
CUDA-graph capture; and the fused FFN block compiled with ``fuse_quantization="act"`` and ``True`` (the LayerNorm
on `layer_norm_quant`'s fp8 scheme) under reduce-overhead.

Two checks, because two things can differ from the reference (docs/kernels.md, "fp8 act-quant"):
* the epilogue's fast math (approximate exp2 / reciprocal, the polynomial erf): checked alone with operands whose
  accumulation is exact on every tile (e4m3 values in {-1, 0, 1}, K = 512: every partial sum is an integer the
  tensor core's accumulator holds exactly), so the kernel's y is the reference's bit for bit and only the fast math
  remains: at most one e4m3 step per element, >= 99.9 % equal; every tile of a summation-order group gives the same
  bits (the rule the fp8 suite checks for the plain ops);
* the accumulation (random normal operands): fp8 wgmma keeps ~13-14 bits within a promotion span (all bits of the
  running sum for FastAccum), so y differs from the float64 reference by up to ~1e-3 of max|y| (4e-3 FastAccum), as
  test_scaled_mm_fp8_gpu.test_quant_op allows for the plain quantizing op: near zero that is many e4m3 steps (the
  first run's "14 steps apart" at |q| ~ 0.3), so this check is in values, with that test's allowance.

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
from _act_envelope import assert_in_envelope, e4m3_envelope, kernel_error, log_envelope  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.families.scaled_mm.act_quant import apply_activation, epilogue_fma_fp32  # noqa: E402
from oasr_ops.families.scaled_mm_fp8 import act_quant as fp8_act_quant  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.act_quant import reference_scaled_mm_fp8_act_quant  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.lanes import SM89_FP8_MMA, SM90_FP8_WGMMA, summation_order  # noqa: E402
from oasr_ops.families.scaled_mm_fp8.reference import (FP8, acc64, e4m3_steps, quantize_per_token_fp8,  # noqa: E402
                                                       quantize_weight_fp8)
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402

DEV = torch.device("cuda")
if current_arch_family() != "sm90":  # pragma: no cover
    pytest.skip("the fp8 activation epilogue exists for the sm90 lane only", allow_module_level=True)
LANE = SM90_FP8_WGMMA
TILES = LANE.data_parallel()  # every tile the quantizing op can serve (no Stream-K for an e4m3 output)
DEFAULT = LANE.default.id
MS = (1, 7, 17, 127, 1000, 4000)
# What the fixture builds (and `device_run.sh fp8-fuse-gpu` prebuilds): GELU on every tile, SiLU on the default tile
# (the two activations share everything but the Act functor), the default tile's fp16 kernel (the block's fc2).
KERNELS = ([("gelu", c.id) for c in TILES] + [("silu", DEFAULT)])


@pytest.fixture(scope="module", autouse=True)
def _built():
    specs = [JitSpec.for_kernel(LANE, LANE.get(c), f"fp8_{a}", "sm90") for a, c in KERNELS]
    specs.append(JitSpec.for_kernel(LANE, LANE.default, "fp16", "sm90"))
    rep = build_many(specs, progress=False)
    print(rep.summary(), flush=True)
    assert not rep.failed, rep.summary()


def _poison():
    """Fill and free a block so the next allocations reuse memory holding 0x7F bytes (e4m3fn NaN, which the
    saturating epilogue never writes)."""
    small = [torch.full((1 << 19,), 0x7F, dtype=torch.uint8, device=DEV) for _ in range(64)]  # < 1 MB: small pool
    large = torch.full((64 << 20,), 0x7F, dtype=torch.uint8, device=DEV)
    del small, large


def _ternary(m, n, k, seed):
    """Operands whose accumulation is exact on every tile: e4m3 values in {-1, 0, 1} (|acc| <= K = 512), positive
    scales spreading y over about [-100, 100] (both activations' tails), a bias."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randint(-1, 2, (m, k), device=DEV, generator=g).float().to(FP8)
    w = torch.randint(-1, 2, (n, k), device=DEV, generator=g).float().to(FP8)
    sa = torch.rand(m, device=DEV, generator=g) + 0.5
    sw = torch.rand(n, device=DEV, generator=g) + 0.5
    return a, w, sa, sw, torch.randn(n, device=DEV, generator=g) * 4


def _scales(m):
    """(label, out_scale, with bias): per tensor next to no saturation, per tensor saturating most, per row."""
    return (("per-tensor 0.25", torch.tensor([0.25], device=DEV), True),
            ("per-tensor 0.02 (saturating)", torch.tensor([0.02], device=DEV), True),
            ("per-row, no bias", torch.rand(m, device=DEV) * 0.4 + 0.1, False))


def _check_exact(got, a, w, sa, sw, b, out_scale, act, where):
    """Exact accumulation (ternary operands): only the epilogue's fast math differs from the reference, whose
    formula is the kernel's with an exact tanh. So every value lies inside the envelope of tanh.approx.f32's error
    bound (tests/_act_envelope.py): equal to the reference wherever its unrounded value is not within that error of
    an e4m3 rounding boundary; one step apart at most wherever the bound is below a step, which fails only among
    the tiny outputs of the negative tails (the bound is absolute there, the e4m3 steps relative)."""
    assert not torch.isnan(got.float()).any(), f"{where}: unwritten (poisoned) or NaN output"
    want = reference_scaled_mm_fp8_act_quant(a, w, sa, sw, b, out_scale, act)
    y = epilogue_fma_fp32(acc64(a, w), sa, sw, b)
    s = out_scale.double().reshape(-1, 1)
    lo, hi = e4m3_envelope(apply_activation(y, act).double() / s, kernel_error(y, act) / s)
    info = assert_in_envelope(got.float(), lo, hi, where)
    d = e4m3_steps(got, want)
    log_envelope(where, moved=(d > 0).double().mean().item(), may_move=info["may_move"],
                 max_steps=d.max().item(), n=info["n"])


@pytest.mark.parametrize("act,config", [("gelu", "auto"), ("gelu", DEFAULT), ("silu", DEFAULT)])
@pytest.mark.parametrize("m", MS)
def test_fast_math_epilogue_matches_the_reference(act, config, m):
    n, k = 1040, 512  # a partial last N tile for every tile width
    a, w, sa, sw, bias = _ternary(m, n, k, m)
    for label, out_scale, with_bias in _scales(m):
        b = bias if with_bias else None
        _poison()
        got = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, act, bias=b, config=config)
        torch.cuda.synchronize()
        assert got.dtype == FP8 and got.shape == (m, n)
        _check_exact(got, a, w, sa, sw, b, out_scale, act, f"{act} config={config} M={m} {label}")


def test_every_tile_and_bitwise_within_order_groups():
    m, n, k = 1000, 1040, 512
    a, w, sa, sw, bias = _ternary(m, n, k, 7)
    scales = _scales(m)  # once: every tile quantizes with the same (random per-row) scales
    outs: dict[str, list[torch.Tensor]] = {}
    for cfg in TILES:
        for label, out_scale, with_bias in scales:
            b = bias if with_bias else None
            _poison()
            got = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, "gelu", bias=b, config=cfg.id)
            torch.cuda.synchronize()
            _check_exact(got, a, w, sa, sw, b, out_scale, "gelu", f"gelu {cfg.id} {label}")
            outs.setdefault(cfg.id, []).append(got.view(torch.uint8))
    groups: dict[str, list[str]] = {}
    for cfg in TILES:
        groups.setdefault(summation_order(cfg), []).append(cfg.id)
    for order, members in groups.items():
        for cid in members[1:]:
            for i, (label, _s, _b) in enumerate(scales):
                assert torch.equal(outs[cid][i], outs[members[0]][i]), \
                    f"{cid} differs from {members[0]} (order group {order}), {label}"
    # the accumulation is exact here, so every tile could agree across groups too: reported, not required
    first = TILES[0].id
    same = [cid for cid in outs if all(torch.equal(x, y) for x, y in zip(outs[cid], outs[first]))]
    print(f"tiles bitwise equal to {first} across groups: {len(same)} of {len(outs)}", flush=True)


def _operands(m, n, k, seed):
    """Unit-normal activations and weights quantized as a deployment does: y = x . w spreads over about sqrt(K)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    a, sa = quantize_per_token_fp8(torch.randn(m, k, device=DEV, generator=g))
    w, sw = quantize_weight_fp8(torch.randn(n, k, device=DEV, generator=g))
    return a, w, sa, sw, torch.randn(n, device=DEV, generator=g)


def _check_values(got, a, w, sa, sw, b, out_scale, act, cfg_id, where):
    """Within e4m3 rounding (half a step: 2**-4 relative, 2**-10 absolute among subnormals) of the exact value, plus
    the accumulation's error (test_scaled_mm_fp8_gpu.test_quant_op's allowance: 1e-3 of max|y|, 4e-3 FastAccum)
    through the activation (slope <= 1.13) and the scale."""
    assert not torch.isnan(got.float()).any(), f"{where}: unwritten (poisoned) or NaN output"
    y = (sa.double().reshape(-1, 1) * sw.double().reshape(1, -1)) * (a.double() @ w.double().t())
    if b is not None:
        y = y + b.double()
    s = out_scale.double().reshape(-1, 1)
    want = (apply_activation(y, act) / s).clamp(-448, 448)
    acc = (4e-3 if "_fa" in cfg_id else 1e-3) * float(y.abs().max()) * 1.13 / s
    tol = want.abs() * (2 ** -4 * 1.05) + 2 ** -9 + acc
    bad = (got.double() - want).abs() > tol
    assert not bad.any(), f"{where}: {int(bad.sum())} values off, e.g. {got.double()[bad][:3].tolist()} vs " \
                          f"{want[bad][:3].tolist()}"


@pytest.mark.parametrize("act,config", [("gelu", "auto"), ("silu", DEFAULT)])
@pytest.mark.parametrize("m", MS)
def test_random_operands_within_the_accumulation_allowance(act, config, m):
    n, k = 1024, 512
    a, w, sa, sw, bias = _operands(m, n, k, m)
    for label, out_scale, b in (("per-tensor", torch.tensor([0.2], device=DEV), bias),
                                ("per-row, no bias", torch.rand(m, device=DEV) * 0.2 + 0.1, None)):
        _poison()
        got = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, act, bias=b, config=config)
        torch.cuda.synchronize()
        plan = next(p for key, p in fp8_act_quant._PLANS.plans.items() if key[1:6] == (config, act, m, n, k))
        _check_values(got, a, w, sa, sw, b, out_scale, act, plan.config,
                      f"{act} config={config} ({plan.config}) M={m} {label}")


def test_every_tile_random_operands():
    m, n, k = 1000, 1040, 512
    a, w, sa, sw, bias = _operands(m, n, k, 11)
    for cfg in TILES:
        for label, out_scale, b in (("per-tensor", torch.tensor([0.2], device=DEV), bias),
                                    ("per-row, no bias", torch.rand(m, device=DEV) * 0.2 + 0.1, None)):
            _poison()
            got = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, out_scale, "gelu", bias=b, config=cfg.id)
            torch.cuda.synchronize()
            _check_values(got, a, w, sa, sw, b, out_scale, "gelu", cfg.id, f"gelu {cfg.id} {label}")


def test_under_cuda_graph_capture():
    m, n, k = 4000, 1024, 512
    a, w, sa, sw, _ = _ternary(m, n, k, 3)
    s = torch.tensor([0.25], device=DEV)
    oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, s, "silu", config=DEFAULT)  # plan + load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = oasr_ops.scaled_mm_fp8_act_quant(a, w, sa, sw, s, "silu", config=DEFAULT)
    a2, _w2, sa2, _sw2, _b2 = _ternary(m, n, k, 4)
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    torch.cuda.synchronize()
    _check_exact(out, a, w, sa, sw, None, s, "silu", "silu replay")


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


@pytest.mark.parametrize("mode", ("act", True))
@pytest.mark.parametrize("act", (nn.GELU, nn.SiLU))
def test_fused_block_compiled_with_cuda_graphs(act, mode):
    torch.manual_seed(0)
    ref = _Block(act=act).to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        want = ref(x)
    # the lane default tile everywhere: its fp8_<act> and fp16 kernels are the ones the module fixture built
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), oasr_ops.Fp8W8A8Config(kernel=DEFAULT))
    oasr_ops.calibrate(q, [x.half(), torch.randn_like(x).half()])
    torch.compiler.reset()
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_quant import fuse_log

    # torch.compile refuses mode= together with options=: the backend reads the mode from its options
    # (True also serves the LayerNorm with layer_norm_quant's fp8 scheme)
    fn = torch.compile(q, backend=oasr_backend, options={"mode": "reduce-overhead", "fuse_quantization": mode})
    with torch.no_grad():
        for _ in range(3):
            out = fn(x.half())
        torch.cuda.synchronize()
    rep = fuse_log()[-1]
    assert (rep.act_quant, rep.layer_norm_quant, rep.unfused) == (1, int(mode is True), [])
    err = ((out.float() - want).abs().max() / want.abs().max()).item()
    assert err < 3e-2, err
    with torch.no_grad():  # the same model unfused (dynamic per-token fc2 input): the fusion costs little accuracy
        torch.compiler.reset()
        unfused = torch.compile(q, backend=oasr_backend, options={"fuse_quantization": False})(x.half())
    err_unfused = ((unfused.float() - want).abs().max() / want.abs().max()).item()
    assert err < 2 * err_unfused + 1e-2, (err, err_unfused)
