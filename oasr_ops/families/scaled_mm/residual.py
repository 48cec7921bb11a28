"""`oasr::scaled_mm_residual`: the int8 GEMM whose epilogue adds the residual stream — ``x + alpha * linear(x')``
(the encoder's FFN fc2 with alpha = 0.5 in a macaron block, 1.0 elsewhere) in one kernel, so the kernel after it
reads one tensor instead of the GEMM's output and the residual, and the add leaves the graph (issue 15).

``oasr::scaled_mm_residual(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor residual,
float alpha, ScalarType out_dtype, str config) -> Tensor``
    As `oasr::scaled_mm` (same operands, checks and tiles: the DB op is ``scaled_mm``), plus ``residual`` of
    out_dtype and exactly the output's shape ``[..., N]`` (a's leading dims; no broadcast), contiguous, and
    ``alpha`` a finite Python float (used as the fp32 value nearest to it)::

        y = scale_a[:, None] * (scale_w[None, :] * float32(acc))   # as scaled_mm, each multiply rounded
        y = y + float32(bias)                                      # if bias (rounded add, never an FMA)
        z = float32(alpha) * y                                     # rounded (exact for alpha = 0.5 and 1.0)
        out = round_to_nearest_even(float32(residual) + z -> out_dtype)   # one rounded fp32 add, then once

Aliasing: the op is functional; ``out`` is always a new tensor, so it never aliases ``residual``, which the
kernel only reads (as the GEMM's C operand, TMA-loaded by the epilogue). An in-place variant (out = residual)
would be safe on the sm90 data-parallel kernels only because each output element's C is loaded before its D is
stored by the same CTA; that is not offered (nor needed by the graph pass: Inductor plans the buffers).

CUDA runs the ``<fp16|bf16>_res`` variant of the sm90 lane's data-parallel tiles (templates/sm90_scaled_mm.cu.j2,
a template branch of its own; the existing variants render byte-identically) through its ``oasr_smmr_*``
launcher. There is no residual variant of the sm80 2.x lane nor of the Stream-K tiles: there, and for the
``torch`` sentinel, the op runs the reference below in eager ops (a measured Stream-K entry for the shape is
replaced by the heuristic's data-parallel tile). CPU runs the reference. Every path computes the same bits.
"""
from __future__ import annotations

import math
import struct

import torch

from ..autograd import register_inference_op
from ...configs import SENTINELS, parse
from ...runtime import select as _select
from ...runtime.plans import PlanCache, WarnOnce, make_plan
from . import checks, ops

OP = "scaled_mm_residual"
_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define("scaled_mm_residual(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor residual, "
            "float alpha, ScalarType out_dtype, str config) -> Tensor", tags=(torch.Tag.needs_fixed_stride_order,))
_warn_once = WarnOnce()
_FP32_MAX = 3.4028234663852886e38


def fp32(alpha: float) -> float:
    """The fp32 value the kernel receives for `alpha` (ctypes c_float rounds to nearest)."""
    return struct.unpack("f", struct.pack("f", alpha))[0]


def add_residual(y: torch.Tensor, residual, alpha: float, out_dtype, lead) -> torch.Tensor:
    """``round(float(residual) + fp32(alpha) * y)`` to out_dtype, y the GEMM's fp32 epilogue value [M, N], reshaped
    to ``[*lead, N]`` (both quantized families' residual ops end this way: fp8's in families/scaled_mm_fp8)."""
    n = y.shape[-1]
    # an fp32 tensor times an fp32-representable Python float: the product of two fp32 values, rounded once to fp32
    out = residual.reshape(-1, n).float() + y * fp32(alpha)
    return out.to(out_dtype).reshape(*lead, n)


def reference_scaled_mm_residual(a, w, scale_a, scale_w, bias, residual, alpha: float, out_dtype) -> torch.Tensor:
    """``round(float(residual) + fp32(alpha) * y)`` to out_dtype, y the scaled_mm fp32 value (module docstring)."""
    k = w.shape[1]
    y = ops._epilogue_fp32(ops.int_acc(a.reshape(-1, k), w), scale_a, scale_w, bias)
    return add_residual(y, residual, alpha, out_dtype, a.shape[:-1])


def check_residual(op: str, a, w, residual, alpha, out_dtype) -> None:
    """ValueError naming the problem with a residual op's `residual` and `alpha` (after its GEMM's own checks)."""
    if not isinstance(residual, torch.Tensor):
        raise ValueError(f"oasr.{op}: residual must be a tensor")
    out_shape = (*a.shape[:-1], w.shape[0])
    if residual.dtype != out_dtype:
        raise ValueError(f"oasr.{op}: residual must have the output dtype {out_dtype}, got {residual.dtype}")
    if tuple(residual.shape) != out_shape:
        raise ValueError(f"oasr.{op}: residual must have the output's shape {out_shape} (no broadcast), got "
                         f"{tuple(residual.shape)}")
    if residual.device != a.device:
        raise ValueError(f"oasr.{op}: residual is on {residual.device}, a on {a.device}")
    if not alpha_ok(alpha):
        raise ValueError(f"oasr.{op}: alpha must be a finite float within fp32's range, got {alpha!r}")


def _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config) -> None:
    checks._check(OP, a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    check_residual(OP, a, w, residual, alpha, out_dtype)
    ops.check_config_arg(config, OP)


def _check_layout(a, w, scale_a, scale_w, bias, residual) -> None:
    checks._check_layout(OP, ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias),
                         ("residual", residual))


def _cpu(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config):
    _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config)
    _check_layout(a, w, scale_a, scale_w, bias, residual)
    return reference_scaled_mm_residual(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype)


def _fake(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config):
    _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config)
    _check_layout(a, w, scale_a, scale_w, bias, residual)
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=out_dtype)


def select_residual_config(n: int, k: int, m: int, arch: str | None = None) -> _select.Selection:
    """The tile of one `scaled_mm_residual` call: `scaled_mm`'s selection (the residual costs an epilogue load of
    the C tile, not a different mainloop), except that a Stream-K tile — which only a measured entry picks — is
    replaced by the heuristic's data-parallel tile (there is no residual Stream-K kernel)."""
    sel = ops.select_config(n, k, m, arch)
    if sel.config in SENTINELS or parse(sel.config).kernel_schedule != "streamk":
        return sel
    return _select.Selection(ops.heuristic_config(max(int(m), 1), n, k, ops._current_arch(arch)), "heuristic",
                             sel.signature)


def residual_args(extra) -> tuple:
    residual, alpha = extra
    return residual.data_ptr(), fp32(alpha), residual.data_ptr() % 16 == 0  # C is read by TMA: 16-byte aligned


_PLANS = PlanCache()


def _make_plan(config: str, out_dtype, m: int, n: int, k: int):
    arch = ops._current_arch(None) or "sm80"
    sig = ops.signature("scaled_mm", n, k)
    concrete = config != "auto" and config not in SENTINELS and ":" not in config  # not a region table either
    if concrete and parse(config).kernel_schedule == "streamk":
        config = ops.heuristic_config(m, n, k, arch)  # a Stream-K id asked for: the plan names the tile that runs

    def torch_run(_sentinel):
        return lambda a, w, sa, sw, bias, extra: reference_scaled_mm_residual(a, w, sa, sw, bias, extra[0], extra[1],
                                                                              out_dtype)

    def kernel_run(cfg):
        lane = ops._lane_for(arch)
        if lane is None or cfg.generation != "3x":
            _warn_once(f"oasr.{OP}: no residual-epilogue kernel on {arch} (sm90 lane only); using torch")
            return None
        if cfg.kernel_schedule == "streamk":  # e.g. from a region table baked from scaled_mm's entries
            cfg = parse(ops.heuristic_config(m, n, k, arch))
        return ops._kernel_run(OP, cfg, out_dtype, m, n, k, arch, sig,
                               variant=f"{checks.OUT_DTYPES[out_dtype]}_res", fallback=torch_run("torch"),
                               extra_args=residual_args)
    return make_plan(ops.FAMILY, config, m, n, k, arch, sig,
                     select=lambda: select_residual_config(n, k, m, arch),
                     torch_run=torch_run, kernel_run=kernel_run)


def alpha_ok(alpha) -> bool:
    """A finite Python number within fp32's range (the epilogue multiplies in fp32), not a bool."""
    return (not isinstance(alpha, bool) and isinstance(alpha, (int, float)) and math.isfinite(alpha)
            and abs(alpha) <= _FP32_MAX)


def fast_ok(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, m: int, n: int,
            element: torch.dtype = torch.int8) -> bool:
    """With a plan made for the call key, what the key does not fix (`checks.fast_ok`, plus the residual and alpha;
    `element`: the operands' dtype, shared with the fp8 family's residual op)."""
    return (checks.fast_ok(a, w, scale_a, scale_w, bias, out_dtype, m, n, element) and residual.dtype is out_dtype
            and residual.device == a.device and residual.is_contiguous() and residual.dim() == a.dim()
            and residual.shape[-1] == n and residual.shape[:-1] == a.shape[:-1] and alpha_ok(alpha))


def _cuda(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config):
    key = ops.plan_key(OP, a, w, bias, config, out_dtype)
    plan = None if key is None else _PLANS.plans.get(key)
    if plan is None or not fast_ok(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, key[3], key[4]):
        _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config)
        _check_layout(a, w, scale_a, scale_w, bias, residual)
        n, k = w.shape
        m = checks._rows(a, k)
        if m == 0:
            return a.new_empty((*a.shape[:-1], n), dtype=out_dtype)
        if plan is None:
            plan = _PLANS.get_or_make(key, lambda: _make_plan(config, out_dtype, m, n, k))
    plan.calls += 1
    if ops._hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        ops.hot_install(OP, config, ops._hot.dtype_code(out_dtype), key, plan)
    return plan.run(a, w, scale_a, scale_w, bias, (residual, alpha))


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)
served, reset_plans = ops._hot.plan_cache_functions(_PLANS)


def scaled_mm_residual(a, w, scale_a, scale_w, residual, alpha: float = 1.0, bias=None,
                       out_dtype=torch.float16, config: str = "auto"):
    """``residual + alpha * scaled_mm(a, w, scale_a, scale_w, bias)`` in one kernel (module docstring)."""
    return torch.ops.oasr.scaled_mm_residual.default(a, w, scale_a, scale_w, bias, residual, float(alpha), out_dtype,
                                                     config)
