"""`oasr::scaled_mm_residual` on the CPU (issue 15, residual add in the int8 GEMM's epilogue): the op against a
float64 evaluation of its formula and against a numpy fp32 emulation of the kernel's rounding order (odd M, bias
or not, alpha 0.5 / 1.0 / other, fp16 / bf16), errors naming the wrong argument, fake + opcheck, the sm90
template's residual variant (and that the other lanes / Stream-K tiles refuse it), and one real nvcc build with
its C ABI (slow)."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch

import oasr_ops
from oasr_ops.codegen.emit_int8 import RESIDUAL_VARIANTS, VARIANTS
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse
from oasr_ops.families.scaled_mm import residual as R
from oasr_ops.runtime.registry import get_lane

SM90 = get_lane("sm90_int8_wgmma")
SM80 = get_lane("sm80_int8_mma")
OP = torch.ops.oasr.scaled_mm_residual.default
ODD_M = (1, 7, 17, 127, 1000)


def _inputs(m, n, k, dtype=torch.float16, *, bias=True, per_token=True, seed=0, lead=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    sa = (torch.rand(m if per_token else 1, generator=g) * 2e-3 + 1e-4).float()
    sw = (torch.rand(n, generator=g) * 2e-3 + 1e-4).float()
    b = (torch.randn(n, generator=g) * 0.5).to(dtype) if bias else None
    r = (torch.randn(m, n, generator=g) * 2).to(dtype)
    if lead is not None:
        a, r = a.reshape(*lead, k), r.reshape(*lead, n)
    return a, w, sa, sw, b, r


def _float64(a, w, sa, sw, b, r, alpha):
    """The op's formula in float64 (every rounding but the exact accumulator's absent)."""
    k = w.shape[1]
    acc = a.reshape(-1, k).double() @ w.double().t()
    y = sa.double().reshape(-1, 1) * sw.double().reshape(1, -1) * acc
    if b is not None:
        y = y + b.double()
    return r.reshape(-1, w.shape[0]).double() + alpha * y


def _numpy_fp32(a, w, sa, sw, b, r, alpha, dtype):
    """The kernel's rounding order, step by step in numpy float32 (an implementation independent of the op's):
    scale_w * acc, scale_a * that, + bias, * fp32(alpha), + residual, each rounded to fp32, then to the output."""
    k = w.shape[1]
    acc = (a.reshape(-1, k).numpy().astype(np.int64) @ w.numpy().astype(np.int64).T).astype(np.int32)
    y = sw.numpy()[None, :] * acc.astype(np.float32)
    y = sa.numpy()[:, None] * y if sa.numel() > 1 else np.float32(sa.item()) * y
    if b is not None:
        y = y + b.float().numpy()[None, :]
    y = np.float32(alpha) * y
    out = r.reshape(-1, w.shape[0]).float().numpy() + y
    assert out.dtype == np.float32
    return torch.from_numpy(out).to(dtype)


@pytest.mark.parametrize("m", ODD_M)
@pytest.mark.parametrize("alpha", [0.5, 1.0])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_float64_and_the_kernels_rounding_order(m, alpha, bias):
    dtype = torch.float16
    a, w, sa, sw, b, r = _inputs(m, 64, 96, dtype, bias=bias, seed=m)
    out = OP(a, w, sa, sw, b, r, alpha, dtype, "auto")
    assert out.shape == (m, 64) and out.dtype == dtype
    assert torch.isfinite(out).all()
    ref = _float64(a, w, sa, sw, b, r, alpha)
    # one rounding to fp16 (half an ulp) plus fp32 intermediates (a few fp32 ulps of the larger term)
    y = (ref - r.double()).abs()
    tol = ref.abs() * torch.finfo(dtype).eps / 2 + 8 * torch.finfo(torch.float32).eps * (r.double().abs() + y) \
        + torch.finfo(dtype).tiny
    assert ((out.double() - ref).abs() <= tol).all()
    assert torch.equal(out, _numpy_fp32(a, w, sa, sw, b, r, alpha, dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("alpha", [0.5, -1.7, 0.1])
def test_dtypes_and_alphas_not_exact_in_binary(dtype, alpha):
    a, w, sa, sw, b, r = _inputs(17, 32, 48, dtype, per_token=False, seed=3)
    out = OP(a, w, sa, sw, b, r, alpha, dtype, "auto")
    assert torch.equal(out, _numpy_fp32(a, w, sa, sw, b, r, alpha, dtype))


def test_leading_dims_and_the_public_function():
    a, w, sa, sw, b, r = _inputs(2 * 9, 32, 64, lead=(2, 9))
    out = oasr_ops.scaled_mm_residual(a, w, sa, sw, r, alpha=0.5, bias=b)
    assert out.shape == (2, 9, 32)
    plain = oasr_ops.scaled_mm(a, w, sa, sw, b)
    # the fused op skips the fp16 rounding of the GEMM output: within one fp16 step of the unfused composition
    assert (out.float() - (r.float() + 0.5 * plain.float())).abs().max() <= 2 * torch.finfo(torch.float16).eps * 8


def test_output_is_a_new_tensor_and_inputs_are_untouched():
    a, w, sa, sw, b, r = _inputs(7, 32, 64)
    before = r.clone()
    out = OP(a, w, sa, sw, b, r, 1.0, torch.float16, "auto")
    assert out.data_ptr() != r.data_ptr() and torch.equal(r, before)


def _err(match, *args):
    with pytest.raises(ValueError, match=match):
        OP(*args)


def test_errors_name_the_problem():
    a, w, sa, sw, b, r = _inputs(7, 32, 64)
    f16 = torch.float16
    _err(r"residual must have the output's shape \(7, 32\) \(no broadcast\), got \(32,\)",
         a, w, sa, sw, b, r[0], 1.0, f16, "auto")
    _err("no broadcast", a, w, sa, sw, b, r[:1], 1.0, f16, "auto")
    _err("no broadcast", a, w, sa, sw, b, r.reshape(1, 7, 32), 1.0, f16, "auto")
    _err("residual must have the output dtype torch.float16, got torch.float32",
         a, w, sa, sw, b, r.float(), 1.0, f16, "auto")
    _err(r"residual \(shape \(7, 32\), stride \(1, 7\)\) is not contiguous",
         a, w, sa, sw, b, r.t().contiguous().t(), 1.0, f16, "auto")
    for bad in (float("nan"), float("inf"), 1e39):
        _err("alpha must be a finite float within fp32's range", a, w, sa, sw, b, r, bad, f16, "auto")
    _err("out_dtype must be torch.float16 or torch.bfloat16", a, w, sa, sw, b, r, 1.0, torch.float32, "auto")
    _err("oasr.scaled_mm_residual: bias must have dtype torch.float16", a, w, sa, sw, b.float(), r, 1.0, f16, "auto")
    _err("oasr.scaled_mm_residual: N=36 is not a multiple of 8",
         a, torch.zeros(36, 64, dtype=torch.int8), sa, sw[:1], None, torch.zeros(7, 36, dtype=f16), 1.0, f16, "auto")
    with pytest.raises(ValueError, match="alpha must be a finite float"):
        R._check(a, w, sa, sw, b, r, True, f16, "auto")  # a bool is not an alpha


@pytest.mark.parametrize("m,bias,dtype", [(1, True, torch.float16), (17, False, torch.bfloat16)])
def test_opcheck_and_fake(m, bias, dtype):
    a, w, sa, sw, b, r = _inputs(m, 32, 64, dtype, bias=bias)
    torch.library.opcheck(OP, (a, w, sa, sw, b, r, 0.5, dtype, "auto"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fw, fsa, fsw, fr = (mode.from_tensor(t) for t in (a, w, sa, sw, r))
        fb = mode.from_tensor(b) if b is not None else None
        out = OP(fa, fw, fsa, fsw, fb, fr, 0.5, dtype, "auto")
        assert out.shape == (m, 32) and out.dtype == dtype
        with pytest.raises(ValueError, match="no broadcast"):
            OP(fa, fw, fsa, fsw, fb, fr.reshape(1, m, 32), 0.5, dtype, "auto")


def test_selection_never_serves_a_stream_k_tile(monkeypatch):
    from oasr_ops.families.scaled_mm import ops
    from oasr_ops.runtime.select import Selection

    monkeypatch.setattr(ops, "select_config", lambda n, k, m, arch=None: Selection("t128x128x128_c1x1_sk",
                                                                                 "system", "sig"))
    sel = R.select_residual_config(512, 2048, 3984, "sm90")
    assert parse(sel.config).kernel_schedule != "streamk" and sel.tier == "heuristic"
    monkeypatch.setattr(ops, "select_config", lambda n, k, m, arch=None: Selection("t64x128x128_c1x1_pp",
                                                                                 "system", "sig"))
    assert R.select_residual_config(512, 2048, 100, "sm90").config == "t64x128x128_c1x1_pp"


# ------------------------------------------------------------------------------------------------ template


def test_residual_variant_renders_c_as_the_residual_and_its_own_launcher():
    src = render(SM90, SM90.default, "fp16_res")
    assert "fusion::Sm90SrcFetch<ElementD>" in src and "Sm90ScalarBroadcast<float>" in src
    assert "args.epilogue.ptr_C = static_cast<const ElementD*>(residual);" in src
    assert "OASR_EXPORT int oasr_smmr_run(" in src and "oasr_smmr_abi_version" in src
    # C = the output type (TMA-loaded), in the collective epilogue's builder
    assert src.count("cutlass::half_t, cutlass::layout::RowMajor, 8,") == 2
    assert "bfloat16_t, cutlass::layout::RowMajor, 8," in render(SM90, SM90.default, "bf16_res")
    for v in VARIANTS:
        if v in RESIDUAL_VARIANTS:
            continue
        other = render(SM90, SM90.default, v)
        assert "smmr" not in other and "SrcFetch" not in other and "args.epilogue.ptr_C = nullptr;" in other


@pytest.mark.parametrize("variant", RESIDUAL_VARIANTS)
def test_residual_variant_refused_where_it_does_not_exist(variant):
    with pytest.raises(ValueError, match="no residual-epilogue variant .* in the 2.x lane"):
        render(SM80, SM80.default, variant)
    with pytest.raises(ValueError, match="no residual-epilogue Stream-K kernel"):
        render(SM90, parse("t128x128x128_c1x1_sk"), variant)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_build_of_a_residual_kernel_and_its_c_abi(monkeypatch, tmp_path):
    """One residual kernel compiled for real (sm_90a, ~2 min of nvcc) and its launcher loaded by the family's
    loader: `oasr_smmr_*` with the residual pointer and a float alpha; `oasr_smm_run` refuses (it has no residual)."""
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.families.scaled_mm.kernels import load_kernel

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    spec = JitSpec.for_kernel(SM90, parse("t64x128x128_c1x1_pp"), "fp16_res", "sm90")
    report = build_many([spec], jobs=1, progress=False)
    assert not report.failed, report.failed
    lib = ctypes.CDLL(str(spec.so_path))
    lib.oasr_describe.restype = ctypes.c_char_p
    assert lib.oasr_describe().decode().startswith("t64x128x128_c1x1_pp|fp16_res|sm90_int8_wgmma|")
    assert lib.oasr_smmr_abi_version() == 1
    kern = load_kernel(spec)  # checks the smmr ABI version and binds the signatures
    assert kern.can_implement(1000, 512, 2048) == 0
    assert kern.workspace_size(1000, 512, 2048) >= 0
    # without a residual, both entry points refuse before touching the GPU
    v = ctypes.c_void_p
    lib.oasr_smm_run.restype = ctypes.c_int
    assert lib.oasr_smm_run(*([None] * 3), 0, None, 0, None, None, 0, None, 8, 8, 16, None, ctypes.c_size_t(0),
                            None) != 0
    assert kern.run(v(16), v(16), v(16), 0, v(16), 0, None, None, 1.0, v(16), 8, 8, 16, None, 0, None) != 0
