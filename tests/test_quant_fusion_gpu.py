"""The quantization-fusion kernels on the GPU (H200): oasr::layer_norm_quant (every config, widths, odd M,
fp16/bf16, weight/bias dtypes, the normalized output, unaligned operands, poisoned outputs, CUDA-graph capture)
and oasr::scaled_mm_act_quant (gelu/silu variants of the int8 lanes vs the reference), plus the fused FFN block and
a quantized stock nn.TransformerEncoder compiled with reduce-overhead.

Run: ``pytest -m gpu tests/test_quant_fusion_gpu.py``. Kernels are built first, in parallel.
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
from _act_envelope import assert_in_envelope, int8_envelope, kernel_error, log_envelope  # noqa: E402
from oasr_ops.codegen.jit import JitSpec, build_many  # noqa: E402
from oasr_ops.codegen.render_layer_norm_quant import SPACE  # noqa: E402
from oasr_ops.codegen.variants import act_variant  # noqa: E402
from oasr_ops.families.layer_norm_quant.kernels import cuda_arch_of, spec_for  # noqa: E402
from oasr_ops.families.layer_norm_quant.ops import reference_layer_norm_quant  # noqa: E402
from oasr_ops.families.scaled_mm.act_quant import (apply_activation, epilogue_fma_fp32,  # noqa: E402
                                                    reference_scaled_mm_act_quant)
from oasr_ops.families.scaled_mm.ops import _epilogue_fp32, int_acc  # noqa: E402
from oasr_ops.runtime.arch import current_arch_family  # noqa: E402
from oasr_ops.runtime.registry import get_lane  # noqa: E402

DEV = torch.device("cuda")
ARCH = current_arch_family()
SMM_LANE = get_lane("sm90_int8_wgmma" if ARCH == "sm90" else "sm80_int8_mma")
MS = (1, 7, 17, 127, 1000, 4000)
WIDTHS = (64, 144, 256, 512, 768, 1024, 1280, 2048)
# Every tile the activation-quantizing op can serve (no Stream-K for an int8 output).
ACT_TILES = SMM_LANE.data_parallel()


@pytest.fixture(scope="module", autouse=True)
def _built():
    arch = cuda_arch_of(DEV)
    specs = [spec_for(c, dt, sch, arch) for c in SPACE for dt in (torch.float16, torch.bfloat16)
             for sch in ("int8", "fp8")]
    specs += [JitSpec.for_kernel(SMM_LANE, c, act_variant(a, b), ARCH) for a in ("gelu", "silu") for c in ACT_TILES
              for b in (None, "fp16", "bf16")]
    rep = build_many(specs, progress=False)
    print(rep.summary(), flush=True)
    assert not rep.failed, rep.summary()


def _poison(byte: int = 0x80):
    """Fill and free a block so the next allocations reuse memory holding `byte` (0x80: int8 -128, which the
    layer-norm kernel never writes; 0xFF: an e4m3 NaN, which its saturating conversion never writes)."""
    small = [torch.full((1 << 19,), byte, dtype=torch.uint8, device=DEV) for _ in range(64)]  # < 1 MB: small pool
    large = torch.full((64 << 20,), byte, dtype=torch.uint8, device=DEV)
    del small, large


def _check_lnq(x, w, b, eps, normalized, config):
    _poison()
    q, s, y = oasr_ops.layer_norm_quant(x, w, b, eps, normalized=normalized, config=config)
    torch.cuda.synchronize()
    rq, rs, ry = reference_layer_norm_quant(x, w, b, eps, normalized)
    assert (q != -128).all(), "unwritten output"
    assert (s > 0).all() and torch.allclose(s, rs, rtol=1e-2, atol=0)
    assert (q.int() - rq.int()).abs().max().item() <= 1
    assert (q == rq).float().mean().item() > 0.98
    if normalized:
        tol = 2 ** -7 if x.dtype == torch.bfloat16 else 2 ** -9
        assert torch.allclose(y.float(), ry.float(), rtol=tol, atol=tol)
    else:
        assert y.numel() == 0


def _lnq_cases(config, dtype, widths, seed):
    """(x, weight, bias, normalized) rows for one config: every width it holds x M in {1, 17, 1000} (the normalized
    row written at M = 17), random fresh inputs from one generator."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    for n in widths:
        if n > next(c for c in SPACE if c.id == config).max_width:
            continue
        for m in (1, 17, 1000):
            x = (torch.randn(m, n, device=DEV, generator=g) * 2 + 0.3).to(dtype)
            w = (torch.rand(n, device=DEV, generator=g) + 0.5).to(dtype)
            b = torch.randn(n, device=DEV, generator=g).to(dtype)
            yield x, w, b, m == 17


def _check_lnq_fp8(x, w, b, eps, normalized, config):
    """The fp8 scheme: e4m3 rows within one e4m3 step of the reference (the kernel multiplies by 1 / scale where the
    reference divides), almost all equal, scales equal to fp32 rounding, no NaN-poisoned byte left."""
    from oasr_ops.families.scaled_mm_fp8.reference import e4m3_steps

    _poison(0xFF)
    q, s, y = oasr_ops.layer_norm_quant(x, w, b, eps, normalized=normalized, scheme="fp8", config=config)
    torch.cuda.synchronize()
    rq, rs, ry = reference_layer_norm_quant(x, w, b, eps, normalized, "fp8")
    assert q.dtype == torch.float8_e4m3fn and (q.view(torch.uint8) != 0xFF).all(), "unwritten output"
    assert (s > 0).all() and torch.allclose(s, rs, rtol=1e-2, atol=0)
    steps = e4m3_steps(q, rq)
    assert steps.max().item() <= 1 and (steps == 0).float().mean().item() > 0.98
    if normalized:
        tol = 2 ** -7 if x.dtype == torch.bfloat16 else 2 ** -9
        assert torch.allclose(y.float(), ry.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("config", [c.id for c in SPACE])
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_layer_norm_quant_fp8_every_config(config, dtype):
    for x, w, b, normalized in _lnq_cases(config, dtype, (64, 512, 768, 1024), seed=1):
        _check_lnq_fp8(x, w, b, 1e-5, normalized, config)
    _check_lnq_fp8(torch.randn(7, 3, 512, device=DEV, dtype=dtype), None, None, 1e-6, False, "auto")


@pytest.mark.parametrize("config", [c.id for c in SPACE])
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_layer_norm_quant_every_config_every_width(config, dtype):
    for x, w, b, normalized in _lnq_cases(config, dtype, WIDTHS, seed=0):
        _check_lnq(x, w, b, 1e-5, normalized, config)


@pytest.mark.parametrize("m", MS)
def test_layer_norm_quant_auto_odd_m_fp32_params_no_params(m):
    x = torch.randn(m, 3, 768, device=DEV, dtype=torch.float16)
    _check_lnq(x, torch.rand(768, device=DEV) + 0.5, torch.randn(768, device=DEV) * 0.1, 1e-6, True, "auto")
    _check_lnq(x, None, None, 1e-5, False, "auto")


def test_layer_norm_quant_unaligned_and_wide_rows_fall_back_correctly():
    buf = torch.randn(1 + 37 * 256, device=DEV, dtype=torch.float16)
    x = buf[1:].view(37, 256)  # contiguous, not 16-byte aligned: the 1-element instantiation
    _check_lnq(x, None, None, 1e-5, True, "lnq_r256_v8")
    _check_lnq(torch.randn(5, 100, device=DEV, dtype=torch.float16), None, None, 1e-5, True, "auto")  # N % 8
    _check_lnq(torch.randn(5, 12288, device=DEV, dtype=torch.bfloat16), None, None, 1e-5, False, "auto")  # ref


def test_layer_norm_quant_under_cuda_graph_capture():
    x = torch.randn(1000, 512, device=DEV, dtype=torch.float16)
    w, b = torch.rand(512, device=DEV, dtype=torch.float16), torch.randn(512, device=DEV, dtype=torch.float16)
    oasr_ops.layer_norm_quant(x, w, b)  # build / load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s, _ = oasr_ops.layer_norm_quant(x, w, b)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    rq, rs, _ = reference_layer_norm_quant(x, w, b, 1e-5, False)
    assert (q.int() - rq.int()).abs().max().item() <= 1 and torch.allclose(s, rs, rtol=1e-2)


def _check_act_quant(got, a, w, sa, sw, b, out_scale, act, where) -> float:
    """Against the reference (the kernel's formula with an exact tanh, families/scaled_mm/act_quant.py): every value
    inside the envelope of tanh.approx.f32's documented error (tests/_act_envelope.py), so equal wherever the
    reference's unrounded act(y) / out_scale is not within that error of a .5 boundary, and at most one step apart
    wherever the error is below a step (everywhere but far negative tails with a tiny out_scale, |y| > ~4000 s).
    Returns the largest error bound in steps; the fractions that moved and could move go to the envelope log."""
    assert got.dtype == torch.int8
    want = reference_scaled_mm_act_quant(a, w, sa, sw, b, out_scale, act)
    y = epilogue_fma_fp32(int_acc(a, w), sa, sw, b)
    s = out_scale.double().reshape(-1, 1)
    bound = kernel_error(y, act) / s
    lo, hi = int8_envelope(apply_activation(y, act).double() / s, bound)
    info = assert_in_envelope(got, lo, hi, where)
    d = (got.int() - want.int()).abs()
    if bound.max().item() < 0.5:
        assert d.max().item() <= 1, where
    log_envelope(where, moved=(d > 0).double().mean().item(), may_move=info["may_move"], max_steps=d.max().item(),
                 n=info["n"], max_bound_steps=bound.max().item())
    return bound.max().item()


@pytest.mark.parametrize("act", ("gelu", "silu"))
@pytest.mark.parametrize("m", (1, 7, 17, 127, 1000, 4000))
def test_scaled_mm_act_quant_matches_the_reference(act, m):
    g = torch.Generator(device=DEV).manual_seed(m)
    n, k = 1024, 256
    a = torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), device=DEV, dtype=torch.int8, generator=g)
    sa = torch.rand(m, device=DEV, generator=g) * 2e-3 + 1e-4
    sw = torch.rand(n, device=DEV, generator=g) * 2e-3 + 1e-4
    bias = torch.randn(n, device=DEV, generator=g)
    for out_scale, b in ((torch.tensor([0.05], device=DEV), bias), (torch.rand(m, device=DEV) * 0.05 + 0.02, None)):
        _poison()
        got = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, out_scale, act, bias=b, config=SMM_LANE.default.id)
        # realistic magnitudes (|y| < 5, steps of 0.02-0.07): tanh.approx's bound stays far below one step
        assert _check_act_quant(got, a, w, sa, sw, b, out_scale, act, f"{act} M={m}") < 0.1


@pytest.mark.parametrize("act", ("gelu", "silu"))
@pytest.mark.parametrize("cfg", [c.id for c in ACT_TILES])
def test_scaled_mm_act_quant_every_tile_over_the_activation_range(act, cfg):
    """The fast-math epilogue (approximate exp / reciprocal, the polynomial erf) on every tile, with y spanning
    about [-60, 60]: both activations' tails (SiLU -> -0 and GELU -> 0 for y << 0, -> y for y >> 0), saturation at
    127 with the small scale, a partial last M tile and per-row scales."""
    m, n, k = 1000, 1024, 256
    g = torch.Generator(device=DEV).manual_seed(7)
    a = torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), device=DEV, dtype=torch.int8, generator=g)
    sa = torch.rand(m, device=DEV, generator=g) * 1e-2 + 1e-2
    sw = torch.rand(n, device=DEV, generator=g) * 1e-2 + 1e-2
    bias = torch.randn(n, device=DEV, generator=g)
    y = _epilogue_fp32(torch._int_mm(a, w.t()), sa, sw, bias)
    assert y.min().item() < -30 and y.max().item() > 30  # the range the test means to cover
    for out_scale, b in ((torch.tensor([0.5], device=DEV), bias), (torch.tensor([0.02], device=DEV), bias),
                         (torch.rand(m, device=DEV, generator=g) * 0.4 + 0.1, None)):
        _poison()
        got = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, out_scale, act, bias=b, config=cfg)
        _check_act_quant(got, a, w, sa, sw, b, out_scale, act, f"{act} {cfg} out_scale={out_scale[:1].item():.3g}")


@pytest.mark.parametrize("bias_dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
@pytest.mark.parametrize("act", ("gelu", "silu"))
@pytest.mark.parametrize("cfg", [c.id for c in ACT_TILES])
def test_scaled_mm_act_quant_reads_a_16bit_bias_as_its_fp32_copy(bias_dtype, act, cfg):
    """The ``int8_<act>_<dtype>bias`` kernels (what the fusion pass calls with a 16-bit model's bias): bitwise the
    fp32-bias kernel's output on ``bias.float()``, inside the reference's envelope, every odd M."""
    n, k = 1024, 256
    g = torch.Generator(device=DEV).manual_seed(11)
    w = torch.randint(-127, 128, (n, k), device=DEV, dtype=torch.int8, generator=g)
    sw = torch.rand(n, device=DEV, generator=g) * 2e-3 + 1e-4
    b16 = (torch.randn(n, device=DEV, generator=g) * 3).to(bias_dtype)
    for m in (1, 7, 17, 127, 1000):
        a = torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8, generator=g)
        sa = torch.rand(m, device=DEV, generator=g) * 2e-3 + 1e-4
        s = torch.tensor([0.05], device=DEV)
        _poison()
        got = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, s, act, bias=b16, config=cfg)
        _poison()
        want = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, s, act, bias=b16.float(), config=cfg)
        assert torch.equal(got, want), f"{cfg} {act} {bias_dtype} M={m}"
        _check_act_quant(got, a, w, sa, sw, b16.float(), s, act, f"{act} {cfg} {bias_dtype} bias M={m}")


def test_scaled_mm_act_quant_under_cuda_graph_capture():
    m, n, k = 4000, 1024, 256
    a = torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), device=DEV, dtype=torch.int8)
    sa, sw = torch.full((m,), 1e-3, device=DEV), torch.full((n,), 1e-3, device=DEV)
    s = torch.tensor([0.05], device=DEV)
    cfg = SMM_LANE.default.id
    oasr_ops.scaled_mm_act_quant(a, w, sa, sw, s, "silu", config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = oasr_ops.scaled_mm_act_quant(a, w, sa, sw, s, "silu", config=cfg)
    a.copy_(torch.randint(-127, 128, (m, k), device=DEV, dtype=torch.int8))
    graph.replay()
    torch.cuda.synchronize()
    _check_act_quant(out, a, w, sa, sw, None, s, "silu", "silu replay")


class _Block(nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.ln, self.fc1, self.act, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


def test_fused_block_compiled_with_cuda_graphs():
    torch.manual_seed(0)
    ref = _Block().to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        want = ref(x)
    # the lane default tile everywhere: its int8_gelu kernel is the one the module fixture built
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), oasr_ops.Int8W8A8Config(kernel=SMM_LANE.default.id))
    oasr_ops.calibrate(q, [x.half()])
    torch.compiler.reset()
    from oasr_ops.inductor.backend import oasr_backend

    # torch.compile refuses mode= together with options=: the backend reads the mode from its options
    fn = torch.compile(q, backend=oasr_backend, options={"mode": "reduce-overhead", "fuse_quantization": True})
    with torch.no_grad():
        for _ in range(3):
            out = fn(x.half())
        torch.cuda.synchronize()
    err = ((out.float() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-2, err
    from oasr_ops.inductor.fuse_quant import fuse_log

    rep = fuse_log()[-1]
    assert (rep.layer_norm_quant, rep.act_quant, rep.unfused) == (1, 1, [])


def test_stock_encoder_quantized_compiled_with_cuda_graphs():
    """A stock pre-norm `nn.TransformerEncoder` (session 28): `fusable_filter` names each layer's packed
    in-projection and fc1/fc2, `quantize_` converts the attention (`LinearMultiheadAttention`) and keeps the layers
    off PyTorch's fast path, calibrated, compiled with reduce-overhead: each LayerNorm feeds its GEMM through
    layer_norm_quant, each GELU's quantization is in fc1's epilogue; within int8 accuracy of the fp32 model on the
    unpadded positions."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True)
    ref = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    kpm = torch.zeros(8, 250, dtype=torch.bool, device=DEV)
    kpm[3, 200:] = True
    with torch.no_grad():
        want = ref(x, src_key_padding_mask=kpm)
    q = copy.deepcopy(ref).half()
    flt = oasr_ops.fusable_filter(q, x.half(), src_key_padding_mask=kpm)
    assert flt.layers == {f"layers.{i}.{p}" for i in range(2) for p in ("self_attn.in_proj", "linear1", "linear2")}
    q = oasr_ops.quantize_(q, oasr_ops.Int8W8A8Config(kernel=SMM_LANE.default.id), filter_fn=flt)
    oasr_ops.calibrate(q, [x.half()])
    torch.compiler.reset()
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_quant import fuse_log

    fn = torch.compile(q, backend=oasr_backend, options={"mode": "reduce-overhead", "fuse_quantization": True})
    with torch.no_grad():
        for _ in range(3):
            out = fn(x.half(), src_key_padding_mask=kpm)
        torch.cuda.synchronize()
    valid = ~kpm
    err = ((out.float() - want)[valid].abs().max() / want[valid].abs().max()).item()
    assert err < 3e-2, err
    rep = fuse_log()[-1]
    assert (rep.layer_norm_quant, rep.act_quant, rep.unfused) == (4, 2, [])


@pytest.mark.parametrize("scheme", ["int8_w8a8", "fp8_w8a8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantized_float32_model_under_cuda_autocast(scheme, dtype):
    """An fp32 FFN quantized by `quantize_` and run eagerly under CUDA autocast: the real kernels return autocast's
    dtype as the stock layers do, within the scheme's accuracy of the fp32 model; fp32 without autocast."""
    if scheme == "fp8_w8a8" and ARCH != "sm90":
        pytest.skip("the fp8 kernels run on sm90 here")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).to(DEV).eval()
    x = torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        ref = m(x)
        q = oasr_ops.quantize_(copy.deepcopy(m), scheme)
        with torch.autocast("cuda", dtype=dtype):
            want, got = m(x), q(x)
        assert q(x).dtype == torch.float32
    assert got.dtype == want.dtype == dtype
    err = float((got.float() - ref).abs().max() / ref.abs().max())
    assert err < (3e-2 if scheme == "int8_w8a8" else 1e-1), err


class _FFN(nn.Module):
    """fc1 -> GELU -> fc2 + residual, no LayerNorm: fc2's input range follows the input's."""

    def __init__(self, d=512) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


def test_a_too_narrow_calibration_clips_in_the_kernel_and_check_calibration_flags_it():
    """fc1's act-quant epilogue quantizes with fc2's static scale: calibrated on inputs 50x smaller than the
    traffic, the compiled (real kernel) output departs from the fp32 model, and check_calibration names the layers;
    calibrated with the traffic in the batches, it follows the model within int8 error and the check is quiet."""
    import warnings

    from oasr_ops.inductor.backend import oasr_backend

    torch.manual_seed(0)
    ref = _FFN().to(DEV).eval()
    x = 4 * torch.randn(8, 250, 512, device=DEV)
    with torch.no_grad():
        want = ref(x) - x  # the FFN's own output, without the residual that would hide its error
    q = oasr_ops.quantize_(copy.deepcopy(ref).half(), oasr_ops.Int8W8A8Config(kernel=SMM_LANE.default.id))

    def run() -> float:
        torch.compiler.reset()
        fn = torch.compile(q, backend=oasr_backend, options={"fuse_quantization": "act"})
        with torch.no_grad():
            out = fn(x.half()).float() - x
        torch.cuda.synchronize()
        from oasr_ops.inductor.fuse_quant import fuse_log

        assert fuse_log()[-1].act_quant == 1
        return float((out - want).norm() / want.norm())

    oasr_ops.calibrate(q, [x.half() * 0.02])
    bad = run()
    with pytest.warns(UserWarning, match=r"\(fc1, fc2\) exceeded their calibrated range"):
        report = oasr_ops.check_calibration(q, [x.half()])
    assert report["fc2"].overshoot > 5 and report["fc2"].clipped_fraction > 0
    oasr_ops.calibrate(q, [x.half() * 0.02, x.half()])
    good = run()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        oasr_ops.check_calibration(q, [x.half()])
    print(f"output error vs fp32: calibration 50x too small {bad:.3g}, recalibrated {good:.3g}")
    assert good < 2e-2 < 0.2 < bad, (good, bad)
