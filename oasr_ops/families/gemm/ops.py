"""torch.library ops: schemas, fake (meta) functions, the CPU reference and the CUDA implementation.

Registered with `torch.library.Library` (define + impl + register_fake), not the `custom_op` decorator, which
costs ≈9 µs more per eager call (measured with torch 2.11).

`oasr::gemm(Tensor a, Tensor w, Tensor? bias, str activation, str config) -> Tensor`
  a: [..., K] fp16/bf16, w: [N, K] (nn.Linear.weight), bias: [N] or None, activation: none|relu|gelu|silu,
  config: a concrete config id, a sentinel (default, torch, fused), `auto` (resolved through the tuning DB),
  or a baked region table `regions:<m_hi>=<config>;...;*=<config>` (a compiled graph with symbolic M).

The CUDA implementation resolves a *plan* once per (config, dtype, N, K, M, activation, bias, device, DB epoch)
and then only allocates the output, checks pointer alignment and calls the kernel through ctypes on the current
stream. Nothing synchronises, so the op is capturable in CUDA graphs.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ...configs import Config, ConfigError
from ...runtime import database as _database
from .. import hot_path as _hot
from ..autograd import register_inference_op
from ...runtime.arch import current_arch_family
from ...runtime.plans import Plan, PlanCache, WarnOnce, make_plan
from ...runtime.plans import check_config_arg as _check_config_arg
from ...runtime.plans import lane_check
from ...runtime.plans import format_table, parse_table, resolve_table  # noqa: F401  (re-exported)
from ...runtime.select import select_config

ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "silu": 3}
SUPPORTED_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}

_lib = torch.library.Library("oasr", "DEF")
_lib.define(
    "gemm(Tensor a, Tensor w, Tensor? bias, str activation, str config) -> Tensor",
    tags=(torch.Tag.needs_fixed_stride_order,),
)


# ----------------------------------------------------------------------------------------------------------
# argument checks (shared by every implementation, so CPU and CUDA reject the same inputs)

def _check(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str) -> None:
    if a.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"oasr.gemm: a has dtype {a.dtype}; supported: float16, bfloat16")
    if w.dtype != a.dtype:
        raise ValueError(f"oasr.gemm: w has dtype {w.dtype} but a has {a.dtype}")
    if w.dim() != 2:
        raise ValueError(f"oasr.gemm: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if a.dim() < 1:
        raise ValueError("oasr.gemm: a must have at least one dimension [..., K]")
    if a.shape[-1] != w.shape[1]:
        raise ValueError(f"oasr.gemm: K mismatch: a is {tuple(a.shape)}, w is {tuple(w.shape)} (w is [N, K])")
    if a.device != w.device:
        raise ValueError(f"oasr.gemm: a is on {a.device}, w on {w.device}")
    if bias is not None:
        if bias.dtype != a.dtype:
            raise ValueError(f"oasr.gemm: bias has dtype {bias.dtype} but a has {a.dtype}")
        if bias.shape != (w.shape[0],):
            raise ValueError(f"oasr.gemm: bias must have shape ({w.shape[0]},), got {tuple(bias.shape)}")
        if bias.device != a.device:
            raise ValueError(f"oasr.gemm: bias is on {bias.device}, a on {a.device}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"oasr.gemm: unknown activation {activation!r}; one of {sorted(ACTIVATIONS)}")


def _check_layout(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    for name, t in (("a", a), ("w", w), ("bias", bias)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"oasr.gemm: {name} (shape {tuple(t.shape)}, stride {t.stride()}) is not contiguous; "
                             "call .contiguous() first")


_IN_A_LANE = lane_check("gemm")  # check_config_arg's check_id: one function object (its memo key)


def check_config_arg(config: str) -> None:
    """ValueError unless `config` is auto, a sentinel, a gemm lane's config id (of any arch: the CPU cannot know the
    GPU's) or a region table of those: the same rule on CPU and CUDA and in the fake."""
    _check_config_arg(config, "gemm", _IN_A_LANE)


# ----------------------------------------------------------------------------------------------------------
# reference (CPU, and the `torch` sentinel's epilogue)

def _activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    return y


def reference_gemm(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str) -> torch.Tensor:
    """fp32 accumulation, epilogue in fp32, one rounding to the output dtype — the kernels' own formula."""
    y = F.linear(a.float(), w.float(), None if bias is None else bias.float())
    return _activate(y, activation).to(a.dtype)


def _gemm_cpu(a, w, bias, activation, config):
    _check(a, w, bias, activation)
    _check_layout(a, w, bias)  # what CUDA rejects, CPU rejects: same input, same answer on every path
    check_config_arg(config)
    return reference_gemm(a, w, bias, activation)


def _gemm_fake(a, w, bias, activation, config):
    _check(a, w, bias, activation)
    _check_layout(a, w, bias)  # rejected at compile time, not by the compiled graph's first call
    check_config_arg(config)
    return a.new_empty((*a.shape[:-1], w.shape[0]))


# ----------------------------------------------------------------------------------------------------------
# CUDA

_PLANS = PlanCache()
_plans = _PLANS.plans
_warn_once = WarnOnce()


_db_epoch = _database.epoch


def _op(activation: str) -> str:
    return "gemm" if activation == "none" else "gemm_activation"


def _torch_plan(activation: str, fused: bool) -> Callable[..., torch.Tensor]:
    if fused and activation == "relu":
        # cuBLASLt applies bias + ReLU in its epilogue. GELU is not used here: cuBLASLt's GELU epilogue is
        # the tanh approximation and would change results against the erf GELU every other path computes.
        def run_fused(a, w, bias):
            if bias is None:
                return torch.relu(F.linear(a, w))
            a2 = a.reshape(-1, a.shape[-1])
            return torch._addmm_activation(bias, a2, w.t()).reshape(*a.shape[:-1], w.shape[0])
        run_fused.native = _hot.native_torch(activation, fused_relu=True)
        return run_fused

    def run_torch(a, w, bias):
        return _activate(F.linear(a, w, bias), activation)
    run_torch.native = _hot.native_torch(activation)
    return run_torch


def _kernel_plan(cfg: Config, dtype_name: str, activation: str, m: int, n: int, k: int,
                 arch: str, sig: str) -> Callable[..., torch.Tensor] | None:
    """A launcher for `cfg`, or None (with one warning) when it cannot serve this call."""
    from ...codegen.jit import BuildError, LoadError
    from .kernels import get_kernel, lane_of

    try:
        lane = lane_of(cfg, arch)
    except ConfigError as e:
        raise ValueError(f"oasr.gemm: config {cfg.id} cannot run on {arch}: {e}") from None
    reason = lane.infeasible_reason(cfg, m=m, n=n, k=k, arch_family=arch, dtype=dtype_name)
    if reason:
        _warn_once(("infeasible", sig, cfg.id), f"oasr.gemm: {cfg.id} cannot serve {sig} M={m} ({reason}); "
                   "using torch for it")
        return None
    try:
        lib = get_kernel(lane, cfg, dtype_name, arch)
    except (BuildError, LoadError) as e:
        _warn_once(("build", cfg.id, dtype_name), f"oasr.gemm: kernel {cfg.id} ({dtype_name}) unavailable, "
                   f"using torch: {e}")
        return None
    act = ACTIVATIONS[activation]
    split = cfg.split_k
    status = lib.can_implement(m, n, k, split, act)
    if status != 0:
        _warn_once(("can_implement", sig, cfg.id), f"oasr.gemm: {cfg.id} rejects {sig} M={m} "
                   f"(CUTLASS status {status}); using torch for it")
        return None
    ws_bytes = int(lib.workspace_size(m, n, k, split, act))
    run_c = lib.run
    align = 16  # bytes: TMA descriptors and 128-bit vector loads
    raw_stream = torch._C._cuda_getCurrentRawStream  # what torch.cuda.current_stream().cuda_stream returns

    def run_kernel(a, w, bias):
        if a.data_ptr() % align or w.data_ptr() % align or (bias is not None and bias.data_ptr() % align):
            _warn_once(("misaligned", sig), f"oasr.gemm: an operand of {sig} is not {align}-byte aligned; "
                       "using torch for such calls")
            return _activate(F.linear(a, w, bias), activation)
        out = torch.empty((*a.shape[:-1], n), dtype=a.dtype, device=a.device)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
        rc = run_c(a.data_ptr(), w.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
                   m, n, k, split, act, None if ws is None else ws.data_ptr(), ws_bytes,
                   raw_stream(a.get_device()))
        if rc != 0:
            raise RuntimeError(f"oasr.gemm: kernel {cfg.id} failed with status {rc} on M={m} N={n} K={k}")
        return out
    run_kernel.native = _hot.native_kernel(lib.handle.oasr_run, split, act, ws_bytes)
    return run_kernel


def _make_plan(config: str, dtype: torch.dtype, activation: str, m: int, n: int, k: int) -> Plan:
    dtype_name = SUPPORTED_DTYPES[dtype]
    sig = _database.signature("gemm", _op(activation), "half", n, k)
    arch = current_arch_family() or "sm80"
    # `auto` asks with arch=None (the current arch): without a GPU the answer is the `default` sentinel, which
    # the plan serves with the sm80 lane's default.
    return make_plan("gemm", config, m, n, k, arch, sig,
                     select=lambda: select_config("gemm", _op(activation), dtype_name, n, k, m),
                     torch_run=lambda sentinel: _torch_plan(activation, sentinel == "fused"),
                     kernel_run=lambda cfg: _kernel_plan(cfg, dtype_name, activation, m, n, k, arch, sig),
                     keep_sentinel=True)


def get_plan(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, activation: str, config: str) -> Plan:
    n, k = w.shape
    m = a.numel() // k if k else 0
    key = (config, a.dtype, activation, m, n, k, bias is not None, a.device, _db_epoch())
    return _PLANS.get_or_make(key, lambda: _make_plan(config, a.dtype, activation, m, n, k))


def _fast_ok(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The cheap subset of the checks that, with a plan already made for this key, implies all of them."""
    return (w.dim() == 2 and a.shape[-1] == w.shape[1] and w.dtype == a.dtype and w.device == a.device
            and a.is_contiguous() and w.is_contiguous()
            and (bias is None or (bias.dtype == a.dtype and bias.device == a.device and bias.is_contiguous()
                                  and bias.shape == (w.shape[0],))))


def _gemm_cuda(a, w, bias, activation, config):
    if not _fast_ok(a, w, bias):
        _check(a, w, bias, activation)
        _check_layout(a, w, bias)
    n, k = w.shape
    if k == 0 or n == 0:  # an empty reduction (zeros + bias, activation) or output: no kernel needed
        _check(a, w, bias, activation)
        check_config_arg(config)
        return _activate(F.linear(a, w, bias), activation)
    m = a.numel() // k
    epoch = _db_epoch()
    plan = _plans.get((config, a.dtype, activation, m, n, k, bias is not None, a.device, epoch))
    if plan is None:  # first call of this key: the full checks, then a plan
        _check(a, w, bias, activation)
        check_config_arg(config)
        if m == 0:
            return a.new_empty((*a.shape[:-1], n))
        plan = get_plan(a, w, bias, activation, config)
    plan.calls += 1
    if _hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        _hot.install("gemm", config, (_hot.dtype_code(a.dtype), ACTIVATIONS[activation], m, n, k,
                                      int(bias is not None), _hot.device_code(a.device)), plan, epoch)
    return plan.run(a, w, bias)


register_inference_op(_lib, "gemm", cpu=_gemm_cpu, cuda=_gemm_cuda, fake=_gemm_fake)


def served() -> list[Plan]:
    """Every plan this process has run, with its call count (what `print which config served` reads)."""
    _hot.collect_calls()
    return _PLANS.served()


def reset_plans() -> None:
    """Forget resolved plans (the DB epoch already keys them; this is for tests and `reload_tuning()`)."""
    _hot.clear()
    _PLANS.clear()
    resolve_table.cache_clear()
