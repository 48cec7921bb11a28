"""The int8 W8A8 scaled GEMM family (`scaled_mm`): op schemas, checks, the reference, the CPU/fake/CUDA impls.

The shape heuristic lives in `heuristic.py`, the production set and the launcher loading in `kernels.py`;
selection is `runtime.select.serve_config`, driven by the family's spec (``__init__.py``).

Ops (registered on the ``oasr`` namespace with `torch.library.Library` define + impl + register_fake):

``oasr::scaled_mm(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, ScalarType out_dtype,
str config) -> Tensor``
    a: int8 ``[..., K]``, w: int8 ``[N, K]`` (the quantized ``nn.Linear.weight``), scale_a: fp32 ``[M]`` (per
    token, M = a.numel() / K) or ``[1]`` (per tensor), scale_w: fp32 ``[N]`` (per channel) or ``[1]``,
    bias: ``[N]`` of out_dtype or None, out_dtype: float16 | bfloat16. Output ``[..., N]`` of out_dtype.

``oasr::scaled_mm_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale,
str config) -> Tensor``
    The same GEMM quantizing its output to int8 for the next GEMM. bias: fp32 ``[N]`` or None. out_scale: fp32
    ``[1]`` (per tensor, the usual static calibration) or ``[M]`` (per row). Not ``[N]``: a per-column scale of the
    next GEMM's activations cannot be factored out of that GEMM; a per-tensor or per-row one is exactly its
    ``scale_a``. Output int8 ``[..., N]``: ``q = clamp(round_half_even(y / out_scale), -128, 127)``.

``oasr::quantize_per_token(Tensor x) -> (Tensor q, Tensor scale)``
    Symmetric dynamic per-token quantization of activations: ``scale = max(amax(|x|, -1), tiny) / 127`` (fp32,
    shape ``[M]``), ``q = clamp(round_half_even(x / scale), -127, 127)`` (int8, x's shape). Registered as a
    CompositeImplicitAutograd op: it decomposes into plain aten ops when traced, so Inductor fuses it with its
    neighbours (the producer of x, typically a LayerNorm); eager calls run the same aten ops.

The formula every implementation computes, bit for bit (``acc`` is the exact int32 dot product)::

    y = scale_a[:, None] * (scale_w[None, :] * float32(acc))   # two fp32 multiplies, each rounded
    y = y + float32(bias)                                      # if bias (rounded add, never an FMA)
    out = round_to_nearest_even(y -> out_dtype)                # once

CPU runs the reference (exact accumulation in float64, which represents every partial sum of int8 products
exactly for K < 2**37); CUDA runs the selected CUTLASS kernel (lanes sm90_int8_wgmma / sm80_int8_mma) through
the torch-ABI-free launcher, or the ``torch`` sentinel (``torch._int_mm`` + the same formula in eager ops).
Every kernel variant computes the same bits, so a tuning entry changes speed, never results. (sm80's mma.sync
saturates the int32 accumulator where wgmma wraps: they differ only if the exact sum overflows int32.)

Checks (ValueError, the same on CPU and CUDA, and in the fake functions): int8 a and w, w 2-D, K equal,
K % 16 == 0 (int8 operands are read 16 at a time by TMA / cp.async), N % 8 == 0 (N % 16 for the quantizing op:
128-bit rows of the output), scales fp32 of shape ``[1]`` or ``[M]`` / ``[N]`` on a's device, bias / out_scale
dtype, shape and device, out_dtype float16 / bfloat16 (`checks.py`, with `fast_ok`: the subset a call with a plan
already made for its key runs).

Selection (`select_config` / `select_quant_config`, thin wrappers of `runtime.select.serve_config` for the
family): a concrete id or a sentinel from the user tier, then the system tier (signatures
``scaled_mm|op=scaled_mm|N=768|K=256`` and ``op=scaled_mm_quant``; M rounds up to a region), a config outside
this process's production set warned once and skipped, else the shape heuristic `heuristic_config` (sm90: the
wave model `_INT8_WAVE_MODEL`; sm80: the occupancy ladder `_INT8_LADDER`). A region naming ``heuristic`` is served
by the heuristic with the entry's tier (``[[null, "heuristic"]]`` means measured: the heuristic won).
Only a measured entry can pick a Stream-K tile (the heuristic never does); `select_quant_config` never serves one
(warned once, skipped: the heuristic answers). Memoised per (DB epoch, op, N, K, M, arch); each resolution is
counted under its tier (`resolution_counts()`).

Note on names: ``oasr_ops.scaled_mm`` is the *function* (the public API); this module is
``sys.modules["oasr_ops.families.scaled_mm.ops"]``.
"""
from __future__ import annotations

import torch

from .. import hot_path as _hot
from ..autograd import register_inference_op
from ...codegen.jit import BuildError, LoadError
from ...configs import Config, ConfigError
from ...runtime import database as _database
from ...runtime import select as _select
from ...runtime.arch import current_arch_family, normalize_arch
from ...runtime.plans import Plan, PlanCache, WarnOnce, make_plan
from ...runtime.plans import check_config_arg as _check_config_arg
from ...runtime.plans import lane_check
from ...runtime.registry import lane_of
from ...runtime.select import Selection
# Re-exported: the family's public names (tests, benchmarks and tune/ reach them through this module).
from .heuristic import (_INT8_LADDER, _INT8_WAVE_MODEL, _WAVE_MODEL_RANGE, _fallback_plugin, _lane_for,  # noqa: F401
                        _tile_mn, heuristic_config, heuristic_ids, ladder_config, sm_count, wave_features,
                        wave_model_config, wave_model_time)
from .checks import (K_ALIGN, N_ALIGN, OUT_DTYPES, _check, _check_layout, _rows, _vec_ok, check_per_token_input,
                     fast_ok)
from .kernels import get_kernel, load_kernel, production_configs  # noqa: F401
from .out_scale import check_out_scale

FAMILY = "scaled_mm"
OPS = ("scaled_mm", "scaled_mm_quant")

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define(
    "scaled_mm(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, ScalarType out_dtype, "
    "str config) -> Tensor",
    tags=(torch.Tag.needs_fixed_stride_order,),
)
_lib.define(
    "scaled_mm_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale, "
    "str config) -> Tensor",
    tags=(torch.Tag.needs_fixed_stride_order,),
)
_lib.define("quantize_per_token(Tensor x) -> (Tensor, Tensor)")


_IN_A_LANE = lane_check(FAMILY, "scaled_mm (int8)")  # check_config_arg's check_id: one function object (its memo key)


def check_config_arg(config: str, op: str = "scaled_mm") -> None:
    """ValueError (naming `oasr.<op>`) unless `config` is auto, a sentinel, an int8 lane's config id (of any arch:
    the CPU cannot know the GPU's) or a region table of those: the same rule on CPU and CUDA and in the fake, for
    every op of the family (scaled_mm, scaled_mm_quant, scaled_mm_act_quant, scaled_mm_residual)."""
    _check_config_arg(config, op, _IN_A_LANE)


# ----------------------------------------------------------------------------------------------------------
# reference: the exact formula

def int_acc(a2: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The exact int32 accumulator ``a2 @ w.T`` ([M, K] x [N, K] int8 -> [M, N] int32), on a's device.

    CPU: a float64 matmul (every partial sum of int8 products is an integer below 2**53 for K < 2**37, so it is
    exact), wrapped to int32 as the kernels' accumulator would. CUDA: ``torch._int_mm`` (exact int32), with M
    padded to 17 rows where it needs more than 16.
    """
    if a2.device.type == "cuda":
        m = a2.shape[0]
        if m <= 16:
            pad = a2.new_zeros((17, a2.shape[1]))
            pad[:m] = a2
            return torch._int_mm(pad, w.t())[:m]
        return torch._int_mm(a2, w.t())
    acc = a2.double() @ w.double().t()
    return acc.to(torch.int64).to(torch.int32)


def _epilogue_fp32(acc: torch.Tensor, scale_a, scale_w, bias) -> torch.Tensor:
    y = scale_a.reshape(-1, 1) * (scale_w.reshape(1, -1) * acc.float())
    if bias is not None:
        y = y + bias.float()
    return y


def reference_scaled_mm(a, w, scale_a, scale_w, bias, out_dtype) -> torch.Tensor:
    """``round(scale_a[:, None] * (scale_w[None, :] * float(acc)) (+ bias))`` to out_dtype, acc exact int32."""
    n, k = w.shape
    a2 = a.reshape(-1, k)
    y = _epilogue_fp32(int_acc(a2, w), scale_a, scale_w, bias)
    return y.to(out_dtype).reshape(*a.shape[:-1], n)


def reference_scaled_mm_quant(a, w, scale_a, scale_w, bias, out_scale) -> torch.Tensor:
    """The same fp32 value y, then ``clamp(round_half_even(y / out_scale), -128, 127)`` as int8."""
    n, k = w.shape
    a2 = a.reshape(-1, k)
    y = _epilogue_fp32(int_acc(a2, w), scale_a, scale_w, bias)
    q = torch.round(y / out_scale.reshape(-1, 1)).clamp_min(-128.0).clamp_max(127.0)
    return q.to(torch.int8).reshape(*a.shape[:-1], n)


def _quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Composite (decomposes under tracing): per-row symmetric int8 quantization of ``x [..., K]``."""
    check_per_token_input("quantize_per_token", x)
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp_min(1e-12) / 127.0
    q = torch.round(xf / scale).clamp_min(-127.0).clamp_max(127.0).to(torch.int8)
    return q, scale.reshape(-1)


_lib.impl("quantize_per_token", _quantize_per_token, "CompositeImplicitAutograd")
# The same dynamic per-token quantization, carrying the input's calibrated per-tensor scale (`oasr_ops.calibrate`)
# for the backend's fusion pass: where the producer is a GEMM + activation, the pass moves the quantization into
# that GEMM's epilogue with the calibrated scale (`oasr::scaled_mm_act_quant`); everywhere else the scale is
# unused and the quantization stays dynamic per token (inductor/fuse_quant.py).
_lib.define("quantize_per_token_calibrated(Tensor x, Tensor calibrated_scale) -> (Tensor, Tensor)")
_lib.impl("quantize_per_token_calibrated", lambda x, calibrated_scale: _quantize_per_token(x),
          "CompositeImplicitAutograd")


def _scaled_mm_cpu(a, w, scale_a, scale_w, bias, out_dtype, config):
    _check("scaled_mm", a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    _check_layout("scaled_mm", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias))
    check_config_arg(config, "scaled_mm")
    return reference_scaled_mm(a, w, scale_a, scale_w, bias, out_dtype)


def _scaled_mm_quant_cpu(a, w, scale_a, scale_w, bias, out_scale, config):
    _check("scaled_mm_quant", a, w, scale_a, scale_w, bias, out_scale=out_scale)
    _check_layout("scaled_mm_quant", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w),
                  ("bias", bias), ("out_scale", out_scale))
    check_out_scale(out_scale)
    check_config_arg(config, "scaled_mm_quant")
    return reference_scaled_mm_quant(a, w, scale_a, scale_w, bias, out_scale)


def _scaled_mm_fake(a, w, scale_a, scale_w, bias, out_dtype, config):
    _check("scaled_mm", a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    _check_layout("scaled_mm", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias))
    check_config_arg(config, "scaled_mm")
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=out_dtype)


def _scaled_mm_quant_fake(a, w, scale_a, scale_w, bias, out_scale, config):
    _check("scaled_mm_quant", a, w, scale_a, scale_w, bias, out_scale=out_scale)
    _check_layout("scaled_mm_quant", ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w),
                  ("bias", bias), ("out_scale", out_scale))
    check_config_arg(config, "scaled_mm_quant")
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=torch.int8)


# ----------------------------------------------------------------------------------------------------------
# selection: `runtime.select.serve_config` applies the tier chain and the serving rules the family's spec asks
# for (the heuristic, Stream-K only from measured entries and never for the quantizing op, the production set).

_warn_once = WarnOnce()


_epoch = _database.epoch


def _current_arch(arch: str | None) -> str | None:
    return normalize_arch(arch) if arch else current_arch_family()


def signature(op: str, n: int, k: int) -> str:
    return _database.signature(FAMILY, op, None, n, k)


def select_config(n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The kernel of one `scaled_mm` call (fp16/bf16 output). See the module docstring for the rules."""
    return _select.serve_config(FAMILY, "scaled_mm", "int8", n, k, m, arch)


def select_quant_config(n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The kernel of one `scaled_mm_quant` call: as `select_config`, never a Stream-K tile."""
    return _select.serve_config(FAMILY, "scaled_mm_quant", "int8", n, k, m, arch)


def resolution_counts() -> dict[str, dict[str, int]]:
    """Resolutions (one per distinct shape per DB epoch) per op and tier since import: {op: {tier: n}}."""
    from ...runtime.select_report import resolution_counts as counts

    return counts(FAMILY)


def reset_selection() -> None:
    """Forget memoised selections, counts and warnings (tests)."""
    _select.reset_selection(FAMILY)


def variants_for(n: int, k: int, quant: bool, arch: str | None = None) -> list[str]:
    """The eligible variants of the native lane for a signature, as `oasr tune build --family scaled_mm` measures
    them: every config the static feasibility rules admit for (N, K); no Stream-K tile for the quantizing op."""
    a = _current_arch(arch) or "sm90"
    lane = _lane_for(a)
    if lane is None:
        return []
    if k % K_ALIGN or n % N_ALIGN["scaled_mm_quant" if quant else "scaled_mm"]:
        return []
    out = []
    for c in lane.space:
        if quant and c.kernel_schedule == "streamk":
            continue
        if lane.infeasible_reason(c, n=n, k=k, arch_family=a) is None:
            out.append(c.id)
    return out


def kernel_dtype(op: str, out_dtype: torch.dtype | None) -> str:
    return "int8" if op == "scaled_mm_quant" else OUT_DTYPES[out_dtype]


# ----------------------------------------------------------------------------------------------------------
# CUDA

_PLANS = PlanCache()
_plans = _PLANS.plans


def _torch_run(op: str, out_dtype):
    if op == "scaled_mm":
        def run(a, w, sa, sw, bias, extra):
            return reference_scaled_mm(a, w, sa, sw, bias, out_dtype)
    else:
        def run(a, w, sa, sw, bias, extra):
            return reference_scaled_mm_quant(a, w, sa, sw, bias, extra)
    return run


def out_scale_args(extra) -> tuple:  # the launcher's arguments after bias (out_scale, per-row flag), aligned enough
    return None if extra is None else extra.data_ptr(), int(extra is not None and extra.numel() != 1), True


def _kernel_run(op: str, cfg: Config, out_dtype, m: int, n: int, k: int, arch: str, sig: str,
                variant: str | None = None, fallback=None, extra_args=out_scale_args):
    """The launch of one kernel; `variant` / `fallback` override the op's kernel variant and its torch run (the
    activation-quantizing op, act_quant.py, runs the quantizing launcher with its own variant); `extra_args`, the
    launcher's arguments after bias (residual.py: the residual's pointer and alpha)."""
    try:
        lane = lane_of(cfg, arch, FAMILY)
    except ConfigError as e:
        raise ValueError(f"oasr.{op}: config {cfg.id} cannot run on {arch}: {e}") from None
    no_streamk = {"scaled_mm_quant": "quantizing", "scaled_mm_residual": "residual-epilogue"}.get(op)
    if no_streamk and cfg.kernel_schedule == "streamk":
        raise ValueError(f"oasr.{op}: {cfg.id} is a Stream-K tile; there is no {no_streamk} Stream-K kernel")
    reason = lane.infeasible_reason(cfg, m=m, n=n, k=k, arch_family=arch)
    if reason:
        _warn_once(f"oasr.{op}: {cfg.id} cannot serve {sig} M={m} ({reason}); using torch for it")
        return None
    dt = variant or kernel_dtype(op, out_dtype)
    try:
        kern = get_kernel(lane, cfg, dt, arch)
    except (BuildError, LoadError) as e:
        _warn_once(f"oasr.{op}: kernel {cfg.id} ({dt}) unavailable, using torch: {e}")
        return None
    status = kern.can_implement(m, n, k)
    if status != 0:
        _warn_once(f"oasr.{op}: {cfg.id} rejects {sig} M={m} (CUTLASS status {status}); using torch for it")
        return None
    ws_bytes = int(kern.workspace_size(m, n, k))
    run_c = kern.run
    fallback = fallback or _torch_run(op, out_dtype)
    expand_scale_w = cfg.generation == "2x"  # the 2.x row broadcast loads float4 vectors: no scalar broadcast
    vec_align = 16 if cfg.generation == "2x" else 4
    out_elt = torch.int8 if op == "scaled_mm_quant" else out_dtype

    def run_kernel(a, w, sa, sw, bias, extra):
        if expand_scale_w and sw.numel() == 1 and n > 1:
            sw = sw.expand(n).contiguous()
        x_ptr, x_arg, x_ok = extra_args(extra)
        if (a.data_ptr() % 16 or w.data_ptr() % 16 or sw.data_ptr() % vec_align
                or (bias is not None and bias.data_ptr() % vec_align) or not x_ok):
            _warn_once(f"oasr.{op}: an operand of {sig} is not aligned for {cfg.id}; using torch for such calls")
            return fallback(a, w, sa, sw, bias, extra)
        out = torch.empty((*a.shape[:-1], n), dtype=out_elt, device=a.device)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
        rc = run_c(a.data_ptr(), w.data_ptr(), sa.data_ptr(), int(sa.numel() != 1 or m == 1),
                   sw.data_ptr(), int(sw.numel() != 1 or n == 1),
                   None if bias is None else bias.data_ptr(), x_ptr, x_arg,
                   out.data_ptr(), m, n, k, None if ws is None else ws.data_ptr(), ws_bytes,
                   torch._C._cuda_getCurrentRawStream(a.get_device()))
        if rc != 0:
            raise RuntimeError(f"oasr.{op}: kernel {cfg.id} failed with status {rc} on M={m} N={n} K={k}")
        return out
    launcher = kern.handle.oasr_smmr_run if op == "scaled_mm_residual" else kern.handle.oasr_smm_run
    run_kernel.native = _hot.native_kernel(launcher, ws_bytes, vec_align, expand_scale_w)
    return run_kernel


def _make_plan(op: str, config: str, out_dtype, m: int, n: int, k: int) -> Plan:
    arch = _current_arch(None) or "sm80"
    sig = signature(op, n, k)
    return make_plan(FAMILY, config, m, n, k, arch, sig,
                     select=lambda: _select.serve_config(FAMILY, op, "int8", n, k, m, arch),
                     torch_run=lambda _sentinel: _torch_run(op, out_dtype),
                     kernel_run=lambda cfg: _kernel_run(op, cfg, out_dtype, m, n, k, arch, sig))


def plan_key(op: str, a, w, bias, config: str, out_dtype) -> tuple | None:
    """The plan-cache key of a call (None: `w` is not 2-D, the full checks say why)."""
    if w.dim() != 2:
        return None
    n, k = w.shape
    return (op, config, out_dtype, _rows(a, k), n, k, bias is not None, a.device, _epoch())


def get_plan(op: str, a, w, bias, config: str, out_dtype=None) -> Plan:
    key = plan_key(op, a, w, bias, config, out_dtype)
    m, n, k = key[3:6]
    return _PLANS.get_or_make(key, lambda: _make_plan(op, config, out_dtype, m, n, k))


def _cuda(op: str, a, w, scale_a, scale_w, bias, out_dtype, out_scale, config):
    """Both ops' CUDA implementation: the plan of (op, config, shape, DB epoch) looked up first; on a hit only what
    its key does not fix is checked (`fast_ok`), else every check; then the launch."""
    key = plan_key(op, a, w, bias, config, out_dtype)
    plan = None if key is None else _plans.get(key)
    quant = op == "scaled_mm_quant"
    if plan is None or not (fast_ok(a, w, scale_a, scale_w, bias, torch.float32 if quant else out_dtype, key[3],
                                    key[4]) and (not quant or _vec_ok(out_scale, key[3], a.device))):
        _check(op, a, w, scale_a, scale_w, bias, out_dtype=out_dtype, out_scale=out_scale)
        _check_layout(op, ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias),
                      ("out_scale", out_scale))
        n, k = w.shape
        if _rows(a, k) == 0:
            if out_scale is not None:
                check_out_scale(out_scale)
            return a.new_empty((*a.shape[:-1], n), dtype=out_dtype if op == "scaled_mm" else torch.int8)
        if plan is None:
            check_config_arg(config, op)
            plan = get_plan(op, a, w, bias, config, out_dtype)
    checked = out_scale is not None and check_out_scale(out_scale)
    plan.calls += 1
    if _hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        hot_install(op, config, _hot.dtype_code(out_dtype) if op == "scaled_mm" else 0, key, plan,
                    out_scale if checked else None)
    return plan.run(a, w, scale_a, scale_w, bias, out_scale)


def hot_install(op: str, config: str, variant: int, key: tuple, plan: Plan, out_scale=None) -> None:
    """Install `plan` (of `plan_key`'s `key`) in the C++ hot path; `variant`: families/hot_path.py's docstring."""
    _hot.install(op, config, (variant, *key[3:6], int(key[6]), _hot.device_code(key[7])), plan, key[-1], out_scale)


def _scaled_mm_cuda(a, w, scale_a, scale_w, bias, out_dtype, config):
    return _cuda("scaled_mm", a, w, scale_a, scale_w, bias, out_dtype, None, config)


def _scaled_mm_quant_cuda(a, w, scale_a, scale_w, bias, out_scale, config):
    return _cuda("scaled_mm_quant", a, w, scale_a, scale_w, bias, None, out_scale, config)


register_inference_op(_lib, "scaled_mm", cpu=_scaled_mm_cpu, cuda=_scaled_mm_cuda,
                      fake=_scaled_mm_fake)
register_inference_op(_lib, "scaled_mm_quant", cpu=_scaled_mm_quant_cpu, cuda=_scaled_mm_quant_cuda,
                      fake=_scaled_mm_quant_fake)


served, reset_plans = _hot.plan_cache_functions(_PLANS)


# ----------------------------------------------------------------------------------------------------------
# public API

def scaled_mm(a, w, scale_a, scale_w, bias=None, out_dtype=torch.float16, config: str = "auto"):
    """``round(scale_a[:, None] * (scale_w[None, :] * (a @ w.T)) + bias)`` on the kernel `config` names."""
    return torch.ops.oasr.scaled_mm.default(a, w, scale_a, scale_w, bias, out_dtype, config)


def scaled_mm_quant(a, w, scale_a, scale_w, out_scale, bias=None, config: str = "auto"):
    """`scaled_mm` quantized to int8 with `out_scale` (per tensor [1] or per row [M]) for the next GEMM."""
    return torch.ops.oasr.scaled_mm_quant.default(a, w, scale_a, scale_w, bias, out_scale, config)


def quantize_per_token(x):
    """(q int8 like x, scale fp32 [M]) with x ≈ q * scale[:, None] per row."""
    return torch.ops.oasr.quantize_per_token.default(x)


__all__ = [
    "scaled_mm", "scaled_mm_quant", "quantize_per_token", "select_config", "select_quant_config",
    "heuristic_config", "variants_for", "reference_scaled_mm", "reference_scaled_mm_quant", "int_acc",
    "production_configs", "resolution_counts", "Selection", "_INT8_LADDER", "_INT8_WAVE_MODEL",
]
