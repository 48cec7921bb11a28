"""`oasr::scaled_mm_act_quant`: the int8 GEMM whose epilogue applies an activation and quantizes the result to
int8 with a static scale — the FFN's fc1 -> GELU/SiLU -> (quantize) -> fc2 without the fp16 hidden tensor.

``oasr::scaled_mm_act_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale,
str activation, str config) -> Tensor``
    As `oasr::scaled_mm_quant` (same operands, checks and tiles: the DB op is ``scaled_mm_quant``), with
    ``activation`` in ``("gelu", "silu")`` applied in fp32 after the bias and before the quantization::

        y = scale_a[:, None] * (scale_w[None, :] * float32(acc)) (+ bias);  q = sat_int8(rne(act(y) / out_scale))

    out_scale is the calibrated per-tensor scale of the next GEMM's input (`oasr_ops.calibrate`), shape [1]
    (or [M]). bias: ``[N]`` fp32, or fp16 / bf16 (a 16-bit model's own bias, read as it is by the
    ``int8_<act>_<fp16|bf16>bias`` kernels and converted to fp32 exactly: the result is the same as with
    ``bias.float()``, without a cast kernel per call — what the fusion pass passes). Why static: a dynamic
    per-token scale needs the amax of a whole output row, which spans every N-tile CTA of the GEMM (a cross-CTA
    reduction or a second pass); a calibrated scale needs neither.

CUDA runs the ``int8_<activation>`` variant of the scaled_mm lanes' kernels (templates/sm90_scaled_mm.cu.j2 and
sm80, a template branch of its own; the other variants render byte-identically); CPU the reference below, which
computes the sm90 epilogue's formula (codegen/act_math.py, docs/kernels.md "act-quant epilogue")::

    y = fma(scale_a, fp32(scale_w * float(acc)), bias)          (one rounding for the bias add)
    act(y) = h + h * tanh(u),  h = y / 2;  u = y / 2 (SiLU, an identity) or
             u = y * (A + B x2 + C x2^2), x2 = min(y^2, 36)   (erf GELU, fitted: <= 1.53e-5 * max(1, |y|) off)

with an exact tanh where the sm90 kernel has tanh.approx.f32 (relative error <= 2^-11): a quantized value differs
from the reference by at most ``2^-12 * |y| / out_scale`` plus fp32 rounding (`tanh_error_bound`), so by at most
one step wherever |y| < ~4000 * out_scale, and only where act(y) / out_scale lies that close to a .5 boundary.
The sm80 kernels compute IEEE erff / expf: within the fit error (a step only at a boundary) of this reference.
"""
from __future__ import annotations

import torch

from ..autograd import register_inference_op
from ...codegen.act_math import GELU_A, GELU_B, GELU_C, GELU_X2_MAX, TANH_APPROX_REL_ERROR
from ...codegen.variants import act_variant
from ...runtime import select as _select
from ...runtime.plans import PlanCache, make_plan
from . import checks, ops

ACTIVATIONS = ("gelu", "silu")
# The bias elements the kernels read (codegen/variants.py ACT_BIAS_SUFFIX), and the plan key's bias field: 0
# without a bias, else the element's code, as the C++ hot path computes it (templates/hot_path.cpp,
# `act_quant_bias_code`).
BIAS_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_BIAS_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("scaled_mm_act_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, "
            "Tensor out_scale, str activation, str config) -> Tensor", tags=(torch.Tag.needs_fixed_stride_order,))


def _half_and_tanh(y: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, t) of the epilogue's ``act(y) = h + h * t`` in y's dtype: h = y / 2, t = tanh(u) (u: module docstring)."""
    h = 0.5 * y
    if activation == "gelu":
        x2 = (y * y).clamp_max(GELU_X2_MAX)
        return h, torch.tanh(y * ((GELU_C * x2 + GELU_B) * x2 + GELU_A))
    return h, torch.tanh(h)


def apply_activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    """act(y) in fp32 as the sm90 epilogue computes it (`h + h * tanh(u)`, module docstring), with torch.tanh for
    the kernel's tanh.approx. Not the exact GELU: within ``GELU_FIT_ERROR * max(1, |y|)`` of it (SiLU: exact up to
    fp32 rounding). Computed in y's dtype (fp32 from the epilogue; float64 evaluates the formula itself)."""
    h, t = _half_and_tanh(y, activation)
    return h + h * t


def epilogue_fma_fp32(acc: torch.Tensor, scale_a, scale_w, bias) -> torch.Tensor:
    """The activation variants' ``y = fma(scale_a, fp32(scale_w * float(acc)), bias)`` ([M, N] fp32). scale_a times
    the fp32 product is exact in float64 (two 24-bit significands), so one float64 add and the rounding to fp32
    give the fused multiply-add (up to a double rounding, about once in 2^29 values)."""
    t = scale_w.reshape(1, -1).float() * acc.float()
    y = scale_a.reshape(-1, 1).double() * t.double()
    if bias is not None:
        y = y + bias.double()
    return y.float()


def tanh_error_bound(y: torch.Tensor, activation: str) -> torch.Tensor:
    """The largest |act_kernel(y) - apply_activation(y)| the kernel's tanh.approx.f32 allows (float64, y's shape):
    ``|h * tanh(u)| * 2^-11`` (its documented relative error), plus 2^-22 |h| for the fp32 rounding of the FMAs
    and the approximate 1 / out_scale. Divide by out_scale for quantization steps."""
    h, t = _half_and_tanh(y.double(), activation)
    return (h * t).abs() * TANH_APPROX_REL_ERROR + h.abs() * 2.0 ** -22


def reference_scaled_mm_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation) -> torch.Tensor:
    n, k = w.shape
    y = epilogue_fma_fp32(ops.int_acc(a.reshape(-1, k), w), scale_a, scale_w, bias)
    q = torch.round(apply_activation(y, activation) / out_scale.reshape(-1, 1)).clamp_min(-128.0).clamp_max(127.0)
    return q.to(torch.int8).reshape(*a.shape[:-1], n)


def _check(a, w, scale_a, scale_w, bias, out_scale, activation, config) -> None:
    checks._check("scaled_mm_act_quant", a, w, scale_a, scale_w, None, out_scale=out_scale)
    if isinstance(bias, torch.Tensor) and bias.dtype not in BIAS_DTYPES:
        raise ValueError(f"oasr.scaled_mm_act_quant: bias must be float32, float16 or bfloat16, got {bias.dtype}")
    checks.check_bias("scaled_mm_act_quant", bias, getattr(bias, "dtype", None), w.shape[0], a)
    if activation not in ACTIVATIONS:
        raise ValueError(f"oasr.scaled_mm_act_quant: activation must be one of {ACTIVATIONS}, got {activation!r}")
    ops.check_config_arg(config, "scaled_mm_act_quant")


def _cpu(a, w, scale_a, scale_w, bias, out_scale, activation, config):
    _check(a, w, scale_a, scale_w, bias, out_scale, activation, config)
    checks._check_layout("scaled_mm_act_quant", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w),
                         ("bias", bias), ("out_scale", out_scale))
    ops.check_out_scale(out_scale, "scaled_mm_act_quant")
    return reference_scaled_mm_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation)


def _fake(a, w, scale_a, scale_w, bias, out_scale, activation, config):
    _check(a, w, scale_a, scale_w, bias, out_scale, activation, config)
    checks._check_layout("scaled_mm_act_quant", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w),
                         ("bias", bias), ("out_scale", out_scale))
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=torch.int8)


# The tiles the untuned act-quant selection may pick (None: every tile of the int8 wave model, heuristic.py, the
# quantizing op's own answer). History, both measured on the H200 (benchmarks/act_quant_gemm.py): with the first
# fast-math epilogue (an exp and a reciprocal per element, ~27 instructions) the 2x1-cluster ping-pong tile, the
# model's pick at large M, lost (Whisper-small fc1, M=12000 3072x768 GELU: 110.1 us vs 92.0 for
# t128x256x128_c1x1_coop), so the selection was restricted to the data-parallel tiles without clusters. With the
# one-tanh epilogue (docs/kernels.md, "The act-quant epilogue"; device step act-quant-fc1,
# benchmarks/logs/sm90_act_quant_gemm_fc1_tanh.json) the unrestricted model's pick is the measured best act-quant
# tile at both fc1 shapes measured: Whisper-small fc1 t128x128x128_c2x1_pp 64.9 us (t128x256x128 coop 74.5),
# Conformer-M fc1 (3984x2048x512 SiLU) t128x256x128_c1x1_coop 14.8 us (c2x1_pp 15.4). Two points: a measured DB
# entry overrides it. The restriction mechanism stays for a lane whose epilogue changes the ranking again.
ACT_HEURISTIC_TILES: tuple[str, ...] | None = None


def select_act_quant_config(n: int, k: int, m: int, arch: str | None = None) -> _select.Selection:
    """The tile of one `scaled_mm_act_quant` call: a measured entry of op ``scaled_mm_quant`` when the DB has one,
    else the int8 wave model restricted to `ACT_HEURISTIC_TILES`."""
    sel = ops.select_quant_config(n, k, m, arch)
    if sel.tier != "heuristic" or ACT_HEURISTIC_TILES is None:
        return sel
    lane = ops._lane_for(ops._current_arch(arch))
    model = ops._INT8_WAVE_MODEL.get(lane.name) if lane is not None else None
    if not model:
        return sel
    allowed = {cid: coef for cid, coef in model.items() if cid in ACT_HEURISTIC_TILES}
    if not allowed:
        return sel
    sms = ops.sm_count(ops._current_arch(arch))
    return _select.Selection(ops.wave_model_config(allowed, max(int(m), 1), n, k, sms), sel.tier, sel.signature)


_PLANS = PlanCache()


def _make_plan(config: str, activation: str, bias_dtype: torch.dtype | None, m: int, n: int, k: int):
    arch = ops._current_arch(None) or "sm80"
    sig = ops.signature("scaled_mm_quant", n, k)

    def torch_run(_sentinel):
        return lambda a, w, sa, sw, bias, out_scale: reference_scaled_mm_act_quant(a, w, sa, sw, bias, out_scale,
                                                                                   activation)
    return make_plan(ops.FAMILY, config, m, n, k, arch, sig,
                     select=lambda: select_act_quant_config(n, k, m, arch),
                     torch_run=torch_run,
                     kernel_run=lambda cfg: ops._kernel_run("scaled_mm_quant", cfg, None, m, n, k, arch, sig,
                                                            variant=act_variant(activation,
                                                                                BIAS_DTYPES.get(bias_dtype)),
                                                            fallback=torch_run("torch")))


def _cuda(a, w, scale_a, scale_w, bias, out_scale, activation, config):
    # the plan first; on a hit only what its key (config, activation, shape, DB epoch) does not fix is checked
    key = ops.plan_key("scaled_mm_act_quant", a, w, bias, config, activation)
    bias_dtype = None if bias is None else bias.dtype
    if key is not None and bias is not None:  # the bias field: its element's code (a kernel variant each)
        key = (*key[:6], _BIAS_CODES.get(bias_dtype, -1), *key[7:])
    plan = None if key is None else _PLANS.plans.get(key)
    if plan is None or not (checks.fast_ok(a, w, scale_a, scale_w, bias, bias_dtype, key[3], key[4])
                            and checks._vec_ok(out_scale, key[3], a.device)):
        _check(a, w, scale_a, scale_w, bias, out_scale, activation, config)
        checks._check_layout("scaled_mm_act_quant", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w),
                             ("bias", bias), ("out_scale", out_scale))
        n, k = w.shape
        m = checks._rows(a, k)
        if m == 0:
            ops.check_out_scale(out_scale, "scaled_mm_act_quant")
            return a.new_empty((*a.shape[:-1], n), dtype=torch.int8)
        if plan is None:
            plan = _PLANS.get_or_make(key, lambda: _make_plan(config, activation, bias_dtype, m, n, k))
    checked = ops.check_out_scale(out_scale, "scaled_mm_act_quant")
    plan.calls += 1
    if ops._hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        ops.hot_install("scaled_mm_act_quant", config, ops._hot.ACTIVATION_CODES[activation], key, plan,
                        out_scale if checked else None)
    return plan.run(a, w, scale_a, scale_w, bias, out_scale)


register_inference_op(_lib, "scaled_mm_act_quant", cpu=_cpu, cuda=_cuda, fake=_fake)
_, reset_plans = ops._hot.plan_cache_functions(_PLANS)


def scaled_mm_act_quant(a, w, scale_a, scale_w, out_scale, activation: str, bias=None, config: str = "auto"):
    """int8 GEMM -> activation -> int8 with the static `out_scale` (the next GEMM's `scale_a`)."""
    return torch.ops.oasr.scaled_mm_act_quant.default(a, w, scale_a, scale_w, bias, out_scale, activation, config)
