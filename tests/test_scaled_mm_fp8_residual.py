"""`oasr::scaled_mm_fp8_residual` on the CPU (issue 15, the residual add in the fp8 GEMM's epilogue): the op against
a float64 evaluation of its formula and a numpy fp32 emulation of the kernel's rounding order (odd M, bias or not,
alpha 0.5 / 1.0 / others, fp16 / bf16), errors naming the wrong argument, fake + opcheck, which tile it serves
(never ``torch`` unless asked, never Stream-K), the sm90 template's residual variant (plain and swap-AB tiles) and
its refusal elsewhere, the fusion pass on an fp8 Conformer, and one real nvcc build with its C ABI (slow)."""
from __future__ import annotations

import copy
import ctypes
import shutil

import numpy as np
import pytest
import torch

import oasr_ops
from oasr_ops.codegen.emit_fp8 import RESIDUAL_VARIANTS, VARIANTS
from oasr_ops.codegen.render import render
from oasr_ops.configs import parse
from oasr_ops.families.scaled_mm_fp8 import heuristic
from oasr_ops.families.scaled_mm_fp8 import residual as R
from oasr_ops.families.scaled_mm_fp8.lanes import SM89_FP8_MMA as SM89
from oasr_ops.families.scaled_mm_fp8.lanes import SM90_FP8_WGMMA as SM90
from oasr_ops.families.scaled_mm_fp8.reference import FP8

from test_scaled_mm_fp8 import _FP8_OPCHECK, _no_mutation_no_alias
from test_scaled_mm_residual import _float64  # the formula in float64: the same for e4m3 operands

OP = torch.ops.oasr.scaled_mm_fp8_residual.default
ODD_M = (1, 7, 17, 127, 1000)


def _inputs(m, n, k, dtype=torch.float16, *, bias=True, per_token=True, seed=0, lead=None):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 40).clamp(-448, 448).to(FP8)
    w = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(FP8)
    sa = (torch.rand(m if per_token else 1, generator=g) * 2e-3 + 1e-4).float()
    sw = (torch.rand(n, generator=g) * 2e-3 + 1e-4).float()
    b = (torch.randn(n, generator=g) * 0.5).to(dtype) if bias else None
    r = (torch.randn(m, n, generator=g) * 2).to(dtype)
    if lead is not None:
        a, r = a.reshape(*lead, k), r.reshape(*lead, n)
    return a, w, sa, sw, b, r


def _numpy_fp32(a, w, sa, sw, b, r, alpha, dtype):
    """The kernel's rounding order in numpy float32, independent of the op's code: the exact dot product (float64:
    e4m3 products are exact there) rounded to fp32, scale_w * acc, scale_a * that, + bias, * fp32(alpha),
    + residual, each rounded to fp32, then once to the output."""
    k = w.shape[1]
    acc = (a.reshape(-1, k).float().numpy().astype(np.float64) @ w.float().numpy().astype(np.float64).T)
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
    assert out.shape == (m, 64) and out.dtype == dtype and torch.isfinite(out).all()
    ref = _float64(a, w, sa, sw, b, r, alpha)
    y = (ref - r.double()).abs()
    tol = ref.abs() * torch.finfo(dtype).eps / 2 + 8 * torch.finfo(torch.float32).eps * (r.double().abs() + y) \
        + torch.finfo(dtype).tiny
    assert ((out.double() - ref).abs() <= tol).all()
    assert torch.equal(out, _numpy_fp32(a, w, sa, sw, b, r, alpha, dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("alpha", [0.5, -1.7, 0.1])
def test_dtypes_and_alphas_not_exact_in_binary(dtype, alpha):
    a, w, sa, sw, b, r = _inputs(17, 32, 48, dtype, per_token=False, seed=3)
    assert torch.equal(OP(a, w, sa, sw, b, r, alpha, dtype, "auto"), _numpy_fp32(a, w, sa, sw, b, r, alpha, dtype))


def test_leading_dims_and_the_public_function():
    a, w, sa, sw, b, r = _inputs(2 * 9, 32, 64, lead=(2, 9))
    out = oasr_ops.scaled_mm_fp8_residual(a, w, sa, sw, r, alpha=0.5, bias=b, out_dtype=torch.float16)
    assert out.shape == (2, 9, 32)
    plain = oasr_ops.scaled_mm_fp8(a, w, sa, sw, b, torch.float16)
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
    op = r"oasr\.scaled_mm_fp8_residual: "
    _err(op + r"residual must have the output's shape \(7, 32\) \(no broadcast\), got \(32,\)",
         a, w, sa, sw, b, r[0], 1.0, f16, "auto")
    _err(op + "residual must have the output dtype torch.float16, got torch.bfloat16",
         a, w, sa, sw, b, r.bfloat16(), 1.0, f16, "auto")
    _err(op + r"residual \(shape \(7, 32\), stride \(1, 7\)\) is not contiguous",
         a, w, sa, sw, b, r.t().contiguous().t(), 1.0, f16, "auto")
    for bad in (float("nan"), float("inf"), 1e39):
        _err(op + "alpha must be a finite float within fp32's range", a, w, sa, sw, b, r, bad, f16, "auto")
    _err(op + "out_dtype must be torch.float16 or torch.bfloat16", a, w, sa, sw, b, r, 1.0, torch.float32, "auto")
    _err(op + "bias must have dtype torch.float16", a, w, sa, sw, b.float(), r, 1.0, f16, "auto")
    _err(op + "a and w must be float8_e4m3fn", a.float(), w, sa, sw, b, r, 1.0, f16, "auto")
    _err(op + "N=24 is not a positive multiple of 16", a, w[:24], sa, sw[:24], None,
         torch.zeros(7, 24, dtype=f16), 1.0, f16, "auto")
    _err(op + "unknown config 'no_such_tile'", a, w, sa, sw, b, r, 1.0, f16, "no_such_tile")


@pytest.mark.parametrize("m,bias,dtype", [(1, True, torch.float16), (17, False, torch.bfloat16)])
def test_opcheck_and_fake(m, bias, dtype):
    a, w, sa, sw, b, r = _inputs(m, 32, 64, dtype, bias=bias)
    # opcheck's test_schema compares inputs with arithmetic that has no fp8 CPU kernel: checked by hand on the bytes
    torch.library.opcheck(OP, (a, w, sa, sw, b, r, 0.5, dtype, "auto"), test_utils=_FP8_OPCHECK)
    _no_mutation_no_alias(OP, (a, w, sa, sw, b, r, 0.5, dtype, "auto"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fw, fsa, fsw, fr = (mode.from_tensor(t) for t in (a, w, sa, sw, r))
        fb = mode.from_tensor(b) if b is not None else None
        out = OP(fa, fw, fsa, fsw, fb, fr, 0.5, dtype, "auto")
        assert out.shape == (m, 32) and out.dtype == dtype
        with pytest.raises(ValueError, match="no broadcast"):
            OP(fa, fw, fsa, fsw, fb, fr.reshape(1, m, 32), 0.5, dtype, "auto")


# ------------------------------------------------------------------------------------------------ selection


@pytest.mark.parametrize("answer", ["torch", "t128x128x128_c1x1_sk", "t128x128x128_c1x1_sk_fa"])
def test_torch_and_stream_k_answers_become_the_heuristics_tile(monkeypatch, answer):
    """torch._scaled_mm cannot add the residual in its epilogue and there is no Stream-K residual kernel: both
    answers of the plain op's selection become the half-wave heuristic's data-parallel tile."""
    from oasr_ops.families.scaled_mm_fp8 import ops
    from oasr_ops.runtime.select import Selection

    assert answer == "torch" or answer in SM90.ids()
    monkeypatch.setattr(ops, "select_config", lambda n, k, m, arch=None: Selection(answer, "system", "sig"))
    sel = R.select_residual_config(512, 2048, 3984, "sm90")
    assert sel.config == heuristic.heuristic_config(3984, 512, 2048, "sm90") and sel.tier == "heuristic"
    assert parse(sel.config).kernel_schedule != "streamk" and sel.config in SM90.ids()


def test_a_measured_data_parallel_tile_is_kept(monkeypatch):
    from oasr_ops.families.scaled_mm_fp8 import ops
    from oasr_ops.runtime.select import Selection

    monkeypatch.setattr(ops, "select_config", lambda n, k, m, arch=None: Selection("t64x128x128_c1x1_pp",
                                                                                 "system", "sig"))
    assert R.select_residual_config(512, 2048, 100, "sm90") == Selection("t64x128x128_c1x1_pp", "system", "sig")


def test_without_an_fp8_lane_it_is_torch():
    assert R.select_residual_config(512, 2048, 100, "sm80").config == "torch"


def test_every_answer_is_a_prebuilt_residual_kernel():
    """What the selection can answer on sm90 (the heuristic's tiles, the DB's data-parallel tiles) is in the
    deployment prebuild's residual set (`oasr tune prebuild`): no served process compiles a residual kernel."""
    from oasr_ops.families.scaled_mm_fp8.prebuild import prebuild_specs

    built = {(s.config.id, s.dtype) for s in prebuild_specs("sm90", False, ("fp16", "bf16"))}
    for n, k in ((512, 2048), (768, 3072), (1024, 4096), (256, 1024)):
        for m in ODD_M + (3984, 12000, 30000):
            tile = R.select_residual_config(n, k, m, "sm90").config
            assert (tile, "fp16_res") in built and (tile, "bf16_res") in built, (n, k, m, tile)


# ------------------------------------------------------------------------------------------------ template


@pytest.mark.parametrize("tile", [SM90.default.id, next(c.id for c in SM90.space if c.swap_ab)])
def test_residual_variant_renders_c_as_the_residual_and_its_own_launcher(tile):
    cfg = SM90.get(tile)
    src = render(SM90, cfg, "fp16_res")
    assert "fusion::Sm90SrcFetch<ElementD>" in src and "Sm90ScalarBroadcast<float>" in src
    assert "args.epilogue.ptr_C = static_cast<const ElementD*>(residual);" in src
    assert "OASR_EXPORT int oasr_smmr_run(" in src and "oasr_smmr_abi_version" in src
    layout = "ColumnMajor" if cfg.swap_ab else "RowMajor"  # a swap-AB tile's C and D: [N x M] column-major
    assert src.count(f"cutlass::half_t, cutlass::layout::{layout}, 8,") == 2
    assert f"bfloat16_t, cutlass::layout::{layout}, 8," in render(SM90, cfg, "bf16_res")
    for v in VARIANTS:
        if v in RESIDUAL_VARIANTS or (v == "fp8" and cfg.kernel_schedule == "streamk"):
            continue
        other = render(SM90, cfg, v)
        assert "smmr" not in other and "SrcFetch" not in other and "args.epilogue.ptr_C = nullptr;" in other


@pytest.mark.parametrize("variant", RESIDUAL_VARIANTS)
def test_residual_variant_refused_where_it_does_not_exist(variant):
    with pytest.raises(ValueError, match="no residual-epilogue variant .* in the 2.x lane"):
        render(SM89, SM89.default, variant)
    streamk = next(c for c in SM90.space if c.kernel_schedule == "streamk")
    with pytest.raises(ValueError, match="no residual-epilogue Stream-K kernel"):
        render(SM90, streamk, variant)


# ------------------------------------------------------------------------------------------------ the pass


@pytest.mark.usefixtures("fresh_inductor")
def test_fp8_conformer_ffn_residuals_fuse_and_match_the_ops():
    """quantize_ fp8 on the fusable layers + calibrate, compiled with the backend's defaults: both macaron FFN fc2s
    of each block become oasr.scaled_mm_fp8_residual (alpha 0.5) reading their fc1's e4m3 act-quant output, and the
    result stays as close to the fp32 model as the graph compiled with the residual fusion off (one fp16 rounding
    fewer per fused add, which can flip an e4m3 step of the next layer's quantization: not bitwise)."""
    from examples.conformer import build_model, example_inputs
    from oasr_ops.inductor.backend import oasr_backend
    from oasr_ops.inductor.fuse_residual import RESIDUAL_LOG

    from _fx_capture import Capture, calls

    torch.manual_seed(0)
    model = build_model("S", num_layers=1, dtype="fp16").eval()
    x, = example_inputs(batch=2, frames=64)
    q = oasr_ops.quantize_(copy.deepcopy(model), "fp8_w8a8", filter_fn=oasr_ops.fusable_filter(model, x))
    oasr_ops.calibrate(q, [x])
    with torch.no_grad():
        f32 = build_model("S", num_layers=1, dtype="fp32").eval()
        f32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        r32 = f32(x.float())
        ref = torch.compile(copy.deepcopy(q), backend=oasr_backend, options={"fuse_residual": False})(x)
        torch.compiler.reset()
        cap, mark = Capture(), RESIDUAL_LOG.mark()
        out = torch.compile(q, backend=oasr_backend, options={"post_grad_custom_pre_pass": cap})(x)
    rep, = RESIDUAL_LOG.since(mark)
    assert (rep.fused, rep.alphas, rep.unfused) == (2, [0.5, 0.5], [])
    res = calls(cap.graphs[-1], torch.ops.oasr.scaled_mm_fp8_residual)
    assert len(res) == 2 and all(n.args[6] == 0.5 for n in res)
    assert all(n.args[0].target is torch.ops.oasr.scaled_mm_fp8_act_quant.default for n in res)
    def rel(y, want):
        return ((y.float() - want).abs().max() / want.abs().max()).item()
    assert rel(out, ref.float()) < 1e-2  # measured 4.8e-3: e4m3 steps flipped downstream of the fused adds
    assert rel(out, r32) <= 1.25 * rel(ref, r32)  # measured 1.75e-2 both ways: the fusion adds no error


# ------------------------------------------------------------------------------------------------ nvcc


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.slow
def test_real_nvcc_build_of_a_residual_kernel_and_its_c_abi(monkeypatch, tmp_path):
    """One fp8 residual kernel compiled for real (a swap-AB tile, sm_90a, ~2 min of nvcc) and its launcher loaded
    by the family's loader: `oasr_smmr_*` with the residual pointer and a float alpha; `oasr_smm_run` refuses."""
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.families.scaled_mm.kernels import load_kernel

    monkeypatch.setenv("OASR_JIT_DIR", str(tmp_path))
    cfg = next(c for c in SM90.space if c.swap_ab)
    spec = JitSpec.for_kernel(SM90, cfg, "fp16_res", "sm90")
    report = build_many([spec], jobs=1, progress=False)
    assert not report.failed, report.failed
    lib = ctypes.CDLL(str(spec.so_path))
    lib.oasr_describe.restype = ctypes.c_char_p
    assert lib.oasr_describe().decode().startswith(f"{cfg.id}|fp16_res|sm90_fp8_wgmma|")
    assert lib.oasr_smmr_abi_version() == 1
    kern = load_kernel(spec)
    assert kern.can_implement(1000, 512, 2048) == 0
    assert kern.workspace_size(1000, 512, 2048) >= 0
    v = ctypes.c_void_p
    lib.oasr_smm_run.restype = ctypes.c_int
    assert lib.oasr_smm_run(*([None] * 3), 0, None, 0, None, None, 0, None, 16, 16, 16, None, ctypes.c_size_t(0),
                            None) != 0
    assert kern.run(v(16), v(16), v(16), 0, v(16), 0, None, None, 1.0, v(16), 16, 16, 16, None, 0, None) != 0
