"""oasr::layer_norm_quant on CPU: the reference against an independent float64 computation, the fake, the checks,
the kernel source (one per config x variant) and a real nvcc build of it (sm_90a / sm_80, no GPU needed)."""
from __future__ import annotations

import ctypes

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import oasr_ops
from oasr_ops.codegen.render_layer_norm_quant import SPACE, LnqSpec, parse_lnq, render_layer_norm_quant
from oasr_ops.families.layer_norm_quant.ops import AUTO_BY_WIDTH, auto_config


def _expected(x, w, b, eps):
    """float64 LayerNorm, rounded to x's dtype, then per-token int8 quantization computed in float64."""
    n = x.shape[-1]
    xd = x.double().reshape(-1, n)
    mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    y = (xd - mean) / torch.sqrt(var + eps)
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    y = y.to(x.dtype)
    yd = y.double()
    scale = (yd.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127.0).float()
    q = torch.round(yd / scale.double()).clamp(-127, 127).to(torch.int8)
    return q.reshape(x.shape), scale.reshape(-1), y.reshape(x.shape)


@pytest.mark.parametrize("m", [1, 7, 17, 127])
@pytest.mark.parametrize("n,dtype", [(64, torch.float16), (144, torch.bfloat16), (256, torch.float16),
                                     (80, torch.float32)])
def test_reference_matches_float64_layer_norm_then_per_token_quantization(m, n, dtype):
    g = torch.Generator().manual_seed(m * 1000 + n)
    x = (torch.randn(m, n, generator=g) * 3 + 0.5).to(dtype)
    w = (torch.rand(n, generator=g) + 0.5).to(dtype)
    b = (torch.randn(n, generator=g) * 0.1).float()  # fp32 bias with a half input is accepted
    q, s, y = oasr_ops.layer_norm_quant(x, w, b, 1e-5, normalized=True)
    eq, es, ey = _expected(x, w, b, 1e-5)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and y.dtype == dtype
    # y may differ from the float64 rounding by one ulp of x's dtype; q by one step where it does
    assert torch.allclose(y.float(), ey.float(), rtol=2 ** -7 if dtype == torch.bfloat16 else 2 ** -10, atol=1e-3)
    assert torch.allclose(s, es, rtol=1e-2)
    assert (q.int() - eq.int()).abs().max() <= 1
    assert (q == eq).float().mean() > 0.97
    # dequantized q reconstructs y within half a step
    assert ((q.float() * s[:, None] - y.float().reshape(-1, n)).abs() <= s[:, None] * 0.5 + 1e-6).all()


def test_quantization_is_exactly_quantize_per_token_of_the_unfused_layer_norm():
    x = torch.randn(3, 5, 128, dtype=torch.float16)
    w, b = torch.randn(128, dtype=torch.float16), torch.randn(128, dtype=torch.float16)
    q, s, y = oasr_ops.layer_norm_quant(x, w, b, 1e-6, normalized=False)
    y_ref = torch.nn.functional.layer_norm(x.float(), (128,), w.float(), b.float(), 1e-6).half()
    q2, s2 = oasr_ops.quantize_per_token(y_ref.reshape(-1, 128))
    assert torch.equal(q.reshape(-1, 128), q2) and torch.equal(s, s2)
    assert y.numel() == 0 and q.shape == x.shape and s.shape == (15,)


def test_fp8_scheme_is_exactly_quantize_per_token_fp8_of_the_unfused_layer_norm():
    x = torch.randn(3, 5, 128, dtype=torch.bfloat16) * 3
    w, b = torch.randn(128, dtype=torch.bfloat16), torch.randn(128, dtype=torch.bfloat16)
    q, s, y = oasr_ops.layer_norm_quant(x, w, b, 1e-5, normalized=True, scheme="fp8")
    y_ref = torch.nn.functional.layer_norm(x.float(), (128,), w.float(), b.float(), 1e-5).bfloat16()
    q2, s2 = oasr_ops.quantize_fp8(y_ref.reshape(-1, 128))
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and torch.equal(y, y_ref)
    assert torch.equal(q.reshape(-1, 128).view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)
    assert (q.float().abs().amax(dim=-1) == 448).all()  # each row's amax lands on e4m3's largest value


def test_no_weight_no_bias_and_constant_rows():
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    x[2] = 1.0  # zero variance: y = 0, scale = tiny, q = 0
    q, s, _ = oasr_ops.layer_norm_quant(x)
    assert (q[2] == 0).all() and s[2] == pytest.approx(1e-12 / 127, rel=1e-3)
    eq, es, _ = _expected(x, None, None, 1e-5)
    assert (q.int() - eq.int()).abs().max() <= 1


def test_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(2, 9, 256, dtype=torch.float16)
        q, s, y = torch.ops.oasr.layer_norm_quant(x, None, None, 1e-5, True, "int8", "auto")
        assert q.shape == x.shape and q.dtype == torch.int8 and s.shape == (18,) and y.shape == x.shape
        q, s, y = torch.ops.oasr.layer_norm_quant(x, None, None, 1e-5, False, "int8", "lnq_r64_v4")
        assert y.shape == (0,)
        q, s, y = torch.ops.oasr.layer_norm_quant(x, None, None, 1e-5, False, "fp8", "auto")
        assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn and s.shape == (18,) and y.shape == (0,)


@pytest.mark.parametrize("call,match", [
    (lambda x: oasr_ops.layer_norm_quant(x.int()), "float16, bfloat16 or float32"),
    (lambda x: oasr_ops.layer_norm_quant(x, torch.ones(63, dtype=x.dtype)), r"shape \(64,\)"),
    (lambda x: oasr_ops.layer_norm_quant(x, None, torch.ones(64, dtype=torch.bfloat16)), "dtype"),
    (lambda x: oasr_ops.layer_norm_quant(x, scheme="int4"), "unknown scheme"),
    (lambda x: oasr_ops.layer_norm_quant(x, config="lnq_r48_v8"), "threads per row"),
    (lambda x: oasr_ops.layer_norm_quant(x, config="b128"), "not a layer_norm_quant config id"),
    (lambda x: oasr_ops.layer_norm_quant(x, eps=-1.0), "eps"),
    (lambda x: oasr_ops.layer_norm_quant(x.t().contiguous().t()), "not contiguous"),
])
def test_bad_input_raises_naming_the_problem(call, match):
    x = torch.randn(64, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=match):
        call(x)


def test_gradients_are_refused():
    x = torch.randn(4, 64, requires_grad=True)
    q, s, y = oasr_ops.layer_norm_quant(x, normalized=True)
    with pytest.raises(RuntimeError, match="no backward"):
        y.sum().backward()


def test_auto_config_by_width_and_ids_round_trip():
    assert [c.id for c in SPACE] == [parse_lnq(c.id).id for c in SPACE] and len(SPACE) == 8
    for width, cid in AUTO_BY_WIDTH:
        assert auto_config(width).id == cid and parse_lnq(cid).max_width >= width
    assert auto_config(144).id == "lnq_r32_v8" and auto_config(1280).id == "lnq_r64_v8"
    assert auto_config(AUTO_BY_WIDTH[-1][0] + 1) is None  # wider rows: the reference serves them


def test_every_config_and_variant_renders_its_own_source():
    seen = set()
    for c in SPACE:
        for v in ("fp16_int8", "bf16_int8", "fp16_fp8", "bf16_fp8"):
            src = render_layer_norm_quant(c, v)
            assert f"constexpr int kThreadsPerRow = {c.threads_per_row};" in src
            qmax, qtype = ("448", "__nv_fp8_e4m3") if v.endswith("fp8") else ("127", "int8_t")
            assert f"constexpr int kVec = {c.vec};" in src and f"kQmax = {qmax}.f" in src
            assert f"using QElement = {qtype};" in src
            assert src == render_layer_norm_quant(c, v)  # deterministic (the JIT key hashes it)
            seen.add(src)
    assert len(seen) == 4 * len(SPACE)
    with pytest.raises(ValueError, match="scheme"):
        render_layer_norm_quant(SPACE[0], "fp16_int4")


@pytest.mark.slow
@pytest.mark.parametrize("cfg,variant,arch", [("lnq_r128_v8", "fp16_int8", "90a"), ("lnq_r32_v4", "bf16_int8", "80"),
                                              ("lnq_r32_v8", "fp16_fp8", "90a"), ("lnq_r64_v4", "bf16_fp8", "89")])
def test_nvcc_builds_and_exports_the_launcher(tmp_path, monkeypatch, cfg, variant, arch):
    from oasr_ops.codegen.jit import nvcc_path
    from oasr_ops.families.layer_norm_quant.kernels import load_kernel

    if nvcc_path() is None:
        pytest.skip("nvcc not found")
    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = LnqSpec.make(parse_lnq(cfg), variant, arch)
    lib = load_kernel(spec)  # builds, dlopens (no GPU needed), checks both ABI versions
    assert lib.describe.startswith(f"{cfg}|{variant}|layer_norm_quant|")
    c = parse_lnq(cfg)
    assert lib.can_implement(4000, c.max_width) == 0
    assert lib.can_implement(4000, c.max_width + 1) == 1 and lib.can_implement(0, 256) == 1
    assert lib.workspace_size(4000, 256) == 0
    log = spec.log_path.read_text()
    assert "warning" not in log.lower() and "error" not in log.lower()
    ctypes.CDLL(str(lib.path)).oasr_lnq_abi_version()
