"""The fp8 e4m3 W8A8 scaled GEMM family (`scaled_mm_fp8`): op schemas, the CPU/fake/CUDA impls, selection.

Ops (``oasr`` namespace, `torch.library.Library` define + impl + register_fake):

``oasr::scaled_mm_fp8(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, ScalarType out_dtype,
str config) -> Tensor``
    a: float8_e4m3fn ``[..., K]``, w: float8_e4m3fn ``[N, K]``, scale_a fp32 ``[M]`` (per token) or ``[1]``,
    scale_w fp32 ``[N]`` (per channel) or ``[1]``, bias ``[N]`` of out_dtype or None, out_dtype float16 |
    bfloat16. Output ``[..., N]``.
``oasr::scaled_mm_fp8_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale,
str config) -> Tensor``
    The same GEMM, output quantized to e4m3 for the next GEMM: ``e4m3(clamp(y / out_scale, -448, 448))``;
    bias fp32 ``[N]``; out_scale fp32 ``[1]`` or ``[M]`` (finite, > 0).
``oasr::quantize_per_token_fp8(Tensor x) -> (Tensor q, Tensor scale)``
    Per-token symmetric e4m3 quantization (CompositeImplicitAutograd: Inductor fuses it with x's producer);
    ``quantize_per_token_fp8_calibrated(x, calibrated_scale)`` is the same, carrying a calibrated scale for the
    fusion pass. ``oasr::scaled_mm_fp8_act_quant``: act_quant.py.

The formula and the checks: `reference.py`. CPU runs the reference; CUDA runs the selected kernel (lanes
sm90_fp8_wgmma / sm89_fp8_mma) through the int8 family's C launcher, or the ``torch`` arm: torch._scaled_mm
rowwise (bf16 out: one call, bias fused; fp16 out: torch._scaled_mm with fp32 output and the epilogue in eager
ops, as rowwise scaling writes bf16 only).

Selection (`runtime.select.serve_config` with the family's spec): user tier, system tier (signatures
``scaled_mm_fp8|op=scaled_mm_fp8|N=..|K=..`` and ``op=scaled_mm_fp8_quant``; M rounds up to a region), a config
of another lane or outside this process's production set warned once and skipped, else the half-wave heuristic
(`heuristic.py`). Stream-K only from measured entries, never for the quantizing op.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..autograd import register_inference_op
from ...codegen.jit import BuildError, LoadError
from ...configs import SENTINELS, Config, ConfigError
from ...configs import parse as parse_config
from ...runtime import database as _database
from ...runtime import select as _select
from ...runtime.arch import current_arch_family, normalize_arch
from ...runtime.plans import Plan, PlanCache, WarnOnce, make_plan
from ...runtime.plans import check_config_arg as _check_config_arg
from ...runtime.plans import lane_check
from ...runtime.registry import lane_of, native_lane
from ...runtime.select import Selection
from .heuristic import heuristic_config, heuristic_ids  # noqa: F401  (re-exported)
from .kernels import get_kernel, production_configs  # noqa: F401
from .. import hot_path as _hot
from ..scaled_mm.checks import _check_layout as check_layout
from ..scaled_mm.checks import _vec_ok as vec_ok
from ..scaled_mm.checks import fast_ok
# the shared C launcher's out_scale arguments; the int8 family's plan keys and hot-path installs, which these ops share
from ..scaled_mm.ops import hot_install, out_scale_args, plan_key
from ..scaled_mm.out_scale import check_out_scale
from .reference import (FP8, K_ALIGN, N_ALIGN, OUT_DTYPES, check, epilogue_fp32,
                        quantize_per_token_fp8, reference_scaled_mm_fp8, reference_scaled_mm_fp8_quant, rows,
                        to_fp8)

FAMILY = "scaled_mm_fp8"
OPS = ("scaled_mm_fp8", "scaled_mm_fp8_quant")

_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define(
    "scaled_mm_fp8(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, ScalarType out_dtype, "
    "str config) -> Tensor",
    tags=(torch.Tag.needs_fixed_stride_order,),
)
_lib.define(
    "scaled_mm_fp8_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale, "
    "str config) -> Tensor",
    tags=(torch.Tag.needs_fixed_stride_order,),
)
_lib.define("quantize_per_token_fp8(Tensor x) -> (Tensor, Tensor)")
_lib.impl("quantize_per_token_fp8", quantize_per_token_fp8, "CompositeImplicitAutograd")
# The same dynamic per-token quantization, carrying the input's calibrated per-tensor scale (`oasr_ops.calibrate`)
# for the backend's fusion pass: where the producer is a GEMM + activation, the pass moves the quantization into
# that GEMM's epilogue with the calibrated scale (`oasr::scaled_mm_fp8_act_quant`); everywhere else the scale is
# unused and the quantization stays dynamic per token (inductor/fuse_quant.py).
_lib.define("quantize_per_token_fp8_calibrated(Tensor x, Tensor calibrated_scale) -> (Tensor, Tensor)")
_lib.impl("quantize_per_token_fp8_calibrated", lambda x, calibrated_scale: quantize_per_token_fp8(x),
          "CompositeImplicitAutograd")


_IN_A_LANE = lane_check(FAMILY)  # check_config_arg's check_id: one function object (its memo key)


def check_config_arg(config: str, op: str = "scaled_mm_fp8") -> None:
    """ValueError (naming `oasr.<op>`) unless `config` is auto, a sentinel, an fp8 lane's config id (of any arch:
    the CPU cannot know the GPU's) or a region table of those: the same rule on CPU and CUDA and in the fake."""
    _check_config_arg(config, op, _IN_A_LANE)


def _layout(op, a, w, scale_a, scale_w, bias, out_scale=None) -> None:
    check_layout(op, ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias),
                 ("out_scale", out_scale))


def _scaled_mm_fp8_cpu(a, w, scale_a, scale_w, bias, out_dtype, config):
    check("scaled_mm_fp8", a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    _layout("scaled_mm_fp8", a, w, scale_a, scale_w, bias)
    check_config_arg(config, "scaled_mm_fp8")
    return reference_scaled_mm_fp8(a, w, scale_a, scale_w, bias, out_dtype)


def _scaled_mm_fp8_quant_cpu(a, w, scale_a, scale_w, bias, out_scale, config):
    check("scaled_mm_fp8_quant", a, w, scale_a, scale_w, bias, out_scale=out_scale)
    _layout("scaled_mm_fp8_quant", a, w, scale_a, scale_w, bias, out_scale)
    check_out_scale(out_scale, "scaled_mm_fp8_quant")
    check_config_arg(config, "scaled_mm_fp8_quant")
    return reference_scaled_mm_fp8_quant(a, w, scale_a, scale_w, bias, out_scale)


def _scaled_mm_fp8_fake(a, w, scale_a, scale_w, bias, out_dtype, config):
    check("scaled_mm_fp8", a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    _layout("scaled_mm_fp8", a, w, scale_a, scale_w, bias)
    check_config_arg(config, "scaled_mm_fp8")
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=out_dtype)


def _scaled_mm_fp8_quant_fake(a, w, scale_a, scale_w, bias, out_scale, config):
    check("scaled_mm_fp8_quant", a, w, scale_a, scale_w, bias, out_scale=out_scale)
    _layout("scaled_mm_fp8_quant", a, w, scale_a, scale_w, bias, out_scale)
    check_config_arg(config, "scaled_mm_fp8_quant")
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=FP8)


# ----------------------------------------------------------------------------------------------------------
# selection

_warn_once = WarnOnce()
_epoch = _database.epoch


def _current_arch(arch: str | None) -> str | None:
    return normalize_arch(arch) if arch else current_arch_family()


def signature(op: str, n: int, k: int) -> str:
    return _database.signature(FAMILY, op, None, n, k)


def select_config(n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The kernel of one `scaled_mm_fp8` call (module docstring)."""
    return _select.serve_config(FAMILY, "scaled_mm_fp8", "fp8", n, k, m, arch)


def select_quant_config(n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The kernel of one `scaled_mm_fp8_quant` call: as `select_config`, never a Stream-K tile."""
    return _select.serve_config(FAMILY, "scaled_mm_fp8_quant", "fp8", n, k, m, arch)


def resolution_counts() -> dict[str, dict[str, int]]:
    from ...runtime.select_report import resolution_counts as counts

    return counts(FAMILY)


def reset_selection() -> None:
    """Forget memoised selections, counts and warnings (tests)."""
    _select.reset_selection(FAMILY)


def variants_for(n: int, k: int, quant: bool, arch: str | None = None) -> list[str]:
    """The eligible configs of the native lane for a signature (what `oasr tune build --family scaled_mm_fp8`
    measures): every config the static rules admit for (N, K); no Stream-K tile for the quantizing op."""
    a = _current_arch(arch) or "sm90"
    lane = native_lane(a, FAMILY)
    if lane is None or k % K_ALIGN or n % N_ALIGN:
        return []
    return [c.id for c in lane.space
            if not (quant and c.kernel_schedule == "streamk")
            and lane.infeasible_reason(c, n=n, k=k, arch_family=a) is None]


def kernel_dtype(op: str, out_dtype: torch.dtype | None) -> str:
    return "fp8" if op == "scaled_mm_fp8_quant" else OUT_DTYPES[out_dtype]


# ----------------------------------------------------------------------------------------------------------
# CUDA

_PLANS = PlanCache()
_plans = _PLANS.plans


def torch_scaled_mm(a2, w, sa, sw, bias, out_dtype):
    """The ``torch`` arm: torch._scaled_mm rowwise (bf16 output, bias fused); fp16 output through an fp32
    torch._scaled_mm and the epilogue formula in eager ops (rowwise scaling writes bf16 only)."""
    m, n = a2.shape[0], w.shape[0]
    if out_dtype == torch.bfloat16:
        sa2 = sa.reshape(-1, 1).expand(m, 1).contiguous()
        sw2 = sw.reshape(1, -1).expand(1, n).contiguous()
        return torch._scaled_mm(a2, w.t(), scale_a=sa2, scale_b=sw2, bias=bias, out_dtype=torch.bfloat16)
    one = torch.ones((), device=a2.device, dtype=torch.float32)
    acc = torch._scaled_mm(a2, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return epilogue_fp32(acc, sa, sw, bias).to(out_dtype)


def _torch_run(op: str, out_dtype):
    if op == "scaled_mm_fp8":
        def run(a, w, sa, sw, bias, extra):
            n, k = w.shape
            y = torch_scaled_mm(a.reshape(-1, k), w, sa, sw, bias, out_dtype)
            return y.reshape(*a.shape[:-1], n)
    else:
        def run(a, w, sa, sw, bias, extra):
            n, k = w.shape
            one = torch.ones((), device=a.device, dtype=torch.float32)
            acc = torch._scaled_mm(a.reshape(-1, k), w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
            return to_fp8(epilogue_fp32(acc, sa, sw, bias), extra).reshape(*a.shape[:-1], n)
    return run


def _kernel_run(op: str, cfg: Config, out_dtype, m: int, n: int, k: int, arch: str, sig: str, lane=None,
                variant: str | None = None, fallback=None, extra_args=out_scale_args):
    """fn(a, w, sa, sw, bias, extra) running `cfg`'s kernel for this shape, or None (warned) where it cannot.
    `lane`: the lane to build from (default: the registered lane holding `cfg`; the probe benchmark passes
    `lanes.sm90_with_candidates()` to time configs that are not served yet). `variant` / `fallback` override the
    op's kernel variant and its torch run (the activation-quantizing op, act_quant.py, runs the quantizing
    launcher with its ``fp8_<act>`` variant); `extra_args`, the launcher's arguments after bias (residual.py: the
    residual's pointer and alpha, for the ``<dtype>_res`` variant's ``oasr_smmr_run``)."""
    if lane is None:
        try:
            lane = lane_of(cfg, arch, FAMILY)
        except ConfigError as e:
            raise ValueError(f"oasr.{op}: config {cfg.id} cannot run on {arch}: {e}") from None
    no_streamk = {"scaled_mm_fp8_quant": "quantizing", "scaled_mm_fp8_residual": "residual-epilogue"}.get(op)
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
    two_x = cfg.generation == "2x"  # the 2.x row broadcast loads float4 vectors: no scalar broadcast
    vec_align = 16 if two_x else 4
    out_elt = FP8 if op == "scaled_mm_fp8_quant" else out_dtype

    def run_kernel(a, w, sa, sw, bias, extra):
        if two_x and sw.numel() == 1 and n > 1:
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
    # what the C++ hot path replays (families/hot_path.py): the residual variant's launcher takes alpha as a float
    launcher = kern.handle.oasr_smmr_run if op == "scaled_mm_fp8_residual" else kern.handle.oasr_smm_run
    run_kernel.native = _hot.native_kernel(launcher, ws_bytes, vec_align, two_x)
    return run_kernel


def heuristic_where_torch(config: str, m: int, n: int, k: int, arch: str | None) -> str:
    """What an fp16-output `scaled_mm_fp8` site or a `scaled_mm_fp8_quant` site runs where the selection (the DB,
    its region table or the untuned policy) answered `config`: `config`, except ``torch``, which becomes the
    half-wave heuristic's tile.

    Why: for these two the torch arm is not one torch._scaled_mm call. Rowwise scaling writes bf16 only, so it runs
    an fp32 GEMM output and the epilogue (and, for the quantizing op, the e4m3 quantization) in eager ops: three or
    four more passes over an fp32 [M, N]. fp16 output: the DB's torch regions were measured with a bf16 output
    (the build's), where torch is one call, not what is served (the Whisper-style encoder ran its fp8 GEMMs there
    at 0.39-0.65x of fp16 end to end, docs/perf/e2e.md). Quantizing op: the family's untuned policy (``torch``)
    ran that path on every shape without an entry, 2.3-5.7x slower than the heuristic's tile at six encoder
    shapes from M = 16 to 12000, and 2.4-6.5x slower than the best tile at all 24 points of a build of two fc1
    signatures (H100, session 39: benchmarks/logs/sm90_fp8_quant_policy_h100_s39.log,
    h100_scaled_mm_fp8_actq_build_s39.jsonl). Applied by the runtime (`_make_plan`, unless ``torch`` was asked for
    by name) and by the bake (rewrite.py), so a compiled graph never names ``torch`` where the runtime would not
    have served it."""
    if config != "torch":
        return config
    tile = heuristic_config(m, n, k, arch)
    return config if tile in SENTINELS else tile


def _torch_is_eager(op: str, out_dtype) -> bool:
    """Whether `op`'s torch arm is torch._scaled_mm plus eager passes (`heuristic_where_torch` says why)."""
    return op == "scaled_mm_fp8_quant" or out_dtype == torch.float16


def _make_plan(op: str, config: str, out_dtype, m: int, n: int, k: int) -> Plan:
    arch = _current_arch(None) or "sm90"
    sig = signature(op, n, k)
    plan = make_plan(FAMILY, config, m, n, k, arch, sig,
                     select=lambda: _select.serve_config(FAMILY, op, "fp8", n, k, m, arch),
                     torch_run=lambda _sentinel: _torch_run(op, out_dtype),
                     kernel_run=lambda cfg: _kernel_run(op, cfg, out_dtype, m, n, k, arch, sig))
    if not _torch_is_eager(op, out_dtype):
        return plan  # bf16 output: torch is one torch._scaled_mm call, what the DB measured
    return tile_where_torch(plan, config, lambda: heuristic_where_torch("torch", m, n, k, arch),
                            lambda cfg: _kernel_run(op, cfg, out_dtype, m, n, k, arch, sig))


def tile_where_torch(plan: Plan, config: str, tile_of: Callable[[], str], kernel_run: Callable[[Config], Any],
                     tier: str | None = None) -> Plan:
    """`plan` of an fp8 op whose torch path is eager passes around torch._scaled_mm (an fp16 output, the quantizing,
    residual and activation-quantizing epilogues), when it resolved to ``torch`` from
    ``auto`` or a region table: the plan of `tile_of()` (the op's rule; a sentinel keeps torch) where its kernel
    loads, named `tier` (default: `plan`'s). An explicit ``torch`` is kept."""
    if plan.config != "torch" or config == "torch":
        return plan
    tile = tile_of()
    run = None if tile in SENTINELS else kernel_run(parse_config(tile))
    return plan if run is None else Plan(tile, tier or plan.tier, plan.signature, run)


def _cuda(op: str, a, w, scale_a, scale_w, bias, out_dtype, out_scale, config):
    """Both ops' CUDA implementation, as the int8 family's (scaled_mm/ops.py `_cuda`): the plan of (op, config,
    shape, DB epoch) looked up first; on a hit only what its key does not fix is checked (`fast_ok`), else every
    check; then the launch, and the plan offered to the C++ hot path (families/hot_path.py) while it is on."""
    key = plan_key(op, a, w, bias, config, out_dtype)
    plan = None if key is None else _plans.get(key)
    quant = op == "scaled_mm_fp8_quant"
    if plan is None or not (fast_ok(a, w, scale_a, scale_w, bias, torch.float32 if quant else out_dtype, key[3],
                                    key[4], element=FP8) and (not quant or vec_ok(out_scale, key[3], a.device))):
        check(op, a, w, scale_a, scale_w, bias, out_dtype=out_dtype, out_scale=out_scale)
        _layout(op, a, w, scale_a, scale_w, bias, out_scale)
        if out_scale is not None:
            check_out_scale(out_scale, op)
        n, k = w.shape
        m = rows(a, k)
        if m == 0:
            return a.new_empty((*a.shape[:-1], n), dtype=out_dtype if op == "scaled_mm_fp8" else FP8)
        if plan is None:
            check_config_arg(config, op)
            plan = _PLANS.get_or_make(key, lambda: _make_plan(op, config, out_dtype, m, n, k))
    checked = out_scale is not None and check_out_scale(out_scale, op)
    plan.calls += 1
    if _hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        hot_install(op, config, _hot.dtype_code(out_dtype) if op == "scaled_mm_fp8" else 0, key, plan,
                    out_scale if checked else None)
    return plan.run(a, w, scale_a, scale_w, bias, out_scale)


def _scaled_mm_fp8_cuda(a, w, scale_a, scale_w, bias, out_dtype, config):
    return _cuda("scaled_mm_fp8", a, w, scale_a, scale_w, bias, out_dtype, None, config)


def _scaled_mm_fp8_quant_cuda(a, w, scale_a, scale_w, bias, out_scale, config):
    return _cuda("scaled_mm_fp8_quant", a, w, scale_a, scale_w, bias, None, out_scale, config)


register_inference_op(_lib, "scaled_mm_fp8", cpu=_scaled_mm_fp8_cpu, cuda=_scaled_mm_fp8_cuda,
                      fake=_scaled_mm_fp8_fake)
register_inference_op(_lib, "scaled_mm_fp8_quant", cpu=_scaled_mm_fp8_quant_cpu, cuda=_scaled_mm_fp8_quant_cuda,
                      fake=_scaled_mm_fp8_quant_fake)

served, reset_plans = _hot.plan_cache_functions(_PLANS)


# ----------------------------------------------------------------------------------------------------------
# public API

def scaled_mm_fp8(a, w, scale_a, scale_w, bias=None, out_dtype=torch.bfloat16, config: str = "auto"):
    """``round(scale_a[:, None] * (scale_w[None, :] * (a @ w.T)) + bias)`` of e4m3 operands on `config`."""
    return torch.ops.oasr.scaled_mm_fp8.default(a, w, scale_a, scale_w, bias, out_dtype, config)


def scaled_mm_fp8_quant(a, w, scale_a, scale_w, out_scale, bias=None, config: str = "auto"):
    """`scaled_mm_fp8` quantized to e4m3 with `out_scale` (per tensor [1] or per row [M]) for the next GEMM."""
    return torch.ops.oasr.scaled_mm_fp8_quant.default(a, w, scale_a, scale_w, bias, out_scale, config)


def quantize_fp8(x):
    """(q e4m3 like x, scale fp32 [M]) with x ≈ q * scale[:, None] per row."""
    return torch.ops.oasr.quantize_per_token_fp8.default(x)
