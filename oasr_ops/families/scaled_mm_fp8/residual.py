"""`oasr::scaled_mm_fp8_residual`: the fp8 GEMM whose epilogue adds the residual stream — ``x + alpha * linear(x')``
(an encoder's FFN fc2: alpha 0.5 in a macaron block, 1.0 elsewhere) in one kernel. The fp8 counterpart of the int8
family's `oasr::scaled_mm_residual` (families/scaled_mm/residual.py), whose checks, alpha rule and final add it
shares; the backend's `fuse_residual` pass serves both.

``oasr::scaled_mm_fp8_residual(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor residual,
float alpha, ScalarType out_dtype, str config) -> Tensor``
    As `oasr::scaled_mm_fp8` (same operands, checks and tiles: the DB op is ``scaled_mm_fp8``), plus ``residual``
    of out_dtype and exactly the output's shape ``[..., N]`` (no broadcast), contiguous, and ``alpha`` a finite
    Python float (used as the fp32 value nearest to it)::

        y = scale_a[:, None] * (scale_w[None, :] * acc)       # as scaled_mm_fp8, each multiply rounded
        y = y + float32(bias)                                 # if bias (rounded add, never an FMA)
        out = round(float32(residual) + float32(alpha) * y -> out_dtype)   # two rounded fp32 steps, then once

    ``out`` is a new tensor (never aliases ``residual``, which the kernel only reads as its C operand).

CUDA runs the ``<fp16|bf16>_res`` variant of the sm90 lane's data-parallel tiles (templates/sm90_scaled_mm_fp8.cu.j2,
a branch of its own; swap-AB tiles read the residual as their column-major C, the same bytes) through the
``oasr_smmr_*`` launcher. Which tile: `scaled_mm_fp8`'s selection, except where that is ``torch`` (the family's
untuned policy, and measured regions) or a Stream-K tile: there the half-wave heuristic's data-parallel tile. Why
not torch: torch._scaled_mm cannot add the residual in its epilogue, so the ``torch`` arm is an fp32-output
torch._scaled_mm plus this formula in eager ops (three more passes over [M, N]), the cost the fp16-output rule
(`ops.heuristic_where_torch`) already avoids; ``config="torch"`` asked by name runs it. The sm89 lane has no residual
variant: there (and without an fp8 lane) the op runs the torch arm, warned once. CPU runs the reference (float64
accumulation of the exact e4m3 products, rounded to fp32 once, as `reference.py`).
"""
from __future__ import annotations

import torch

from ..autograd import register_inference_op
from ..scaled_mm.residual import add_residual, check_residual, fast_ok, residual_args
from ...configs import SENTINELS, parse
from ...runtime import select as _select
from ...runtime.plans import PlanCache, WarnOnce, make_plan
from . import ops
from .heuristic import heuristic_config
from .reference import FP8, acc64, check, epilogue_fp32, rows

OP = "scaled_mm_fp8_residual"
DB_OP = "scaled_mm_fp8"  # the tiles, the DB op and the signature of the plain fp8 GEMM
_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define(f"{OP}(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor residual, float alpha, "
            "ScalarType out_dtype, str config) -> Tensor", tags=(torch.Tag.needs_fixed_stride_order,))
_warn_once = WarnOnce()


def reference_scaled_mm_fp8_residual(a, w, scale_a, scale_w, bias, residual, alpha: float, out_dtype) -> torch.Tensor:
    k = w.shape[1]
    y = epilogue_fp32(acc64(a.reshape(-1, k), w), scale_a, scale_w, bias)
    return add_residual(y, residual, alpha, out_dtype, a.shape[:-1])


def _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config) -> None:
    check(OP, a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    check_residual(OP, a, w, residual, alpha, out_dtype)
    ops.check_config_arg(config, OP)


def _layout(a, w, scale_a, scale_w, bias, residual) -> None:
    ops.check_layout(OP, ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias),
                     ("residual", residual))


def _cpu(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config):
    _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config)
    _layout(a, w, scale_a, scale_w, bias, residual)
    return reference_scaled_mm_fp8_residual(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype)


def _fake(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config):
    _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config)
    _layout(a, w, scale_a, scale_w, bias, residual)
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=out_dtype)


def _residual_tile(config: str, m: int, n: int, k: int, arch: str | None) -> str:
    """What a residual site runs where `scaled_mm_fp8`'s selection answered `config` (module docstring): `config`,
    except ``torch`` and Stream-K tiles, which become the heuristic's data-parallel tile (``torch`` where there is
    no fp8 lane)."""
    if config in SENTINELS or parse(config).kernel_schedule == "streamk":
        return heuristic_config(max(int(m), 1), n, k, arch)
    return config


def select_residual_config(n: int, k: int, m: int, arch: str | None = None) -> _select.Selection:
    """The tile of one `scaled_mm_fp8_residual` call: `scaled_mm_fp8`'s selection through `_residual_tile` (a
    replaced answer is reported as tier ``heuristic``)."""
    sel = ops.select_config(n, k, m, arch)
    tile = _residual_tile(sel.config, m, n, k, ops._current_arch(arch))
    return sel if tile == sel.config else _select.Selection(tile, "heuristic", sel.signature)


_PLANS = PlanCache()


def _make_plan(config: str, out_dtype, m: int, n: int, k: int):
    arch = ops._current_arch(None) or "sm90"
    sig = ops.signature(DB_OP, n, k)
    concrete = config != "auto" and config not in SENTINELS and ":" not in config  # not a region table either
    if concrete:  # a Stream-K id asked for: the plan names the tile that runs
        tile = _residual_tile(config, m, n, k, arch)
        config = config if tile in SENTINELS else tile

    def torch_run(_sentinel):
        def run(a, w, sa, sw, bias, extra):
            one = torch.ones((), device=a.device, dtype=torch.float32)
            acc = torch._scaled_mm(a.reshape(-1, k), w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
            return add_residual(epilogue_fp32(acc, sa, sw, bias), extra[0], extra[1], out_dtype, a.shape[:-1])
        return run

    def kernel_run(cfg):
        if cfg.generation != "3x":
            _warn_once(f"oasr.{OP}: no residual-epilogue kernel in {cfg.id}'s lane (sm90 lane only); using torch")
            return None
        if cfg.kernel_schedule == "streamk":  # e.g. from a region table baked from scaled_mm_fp8's entries
            tile = _residual_tile(cfg.id, m, n, k, arch)
            if tile in SENTINELS:
                return None
            cfg = parse(tile)
        return ops._kernel_run(OP, cfg, out_dtype, m, n, k, arch, sig, variant=f"{ops.OUT_DTYPES[out_dtype]}_res",
                               fallback=torch_run("torch"), extra_args=residual_args)

    plan = make_plan(ops.FAMILY, config, m, n, k, arch, sig,
                     select=lambda: select_residual_config(n, k, m, arch),
                     torch_run=torch_run, kernel_run=kernel_run)
    # a region table's torch: the tile, as `_residual_tile`
    return ops.tile_where_torch(plan, config, lambda: _residual_tile("torch", m, n, k, arch), kernel_run)


def _cuda(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config):
    # the plan first; on a hit only what its key does not fix is checked, as in the int8 family's residual.py
    key = ops.plan_key(OP, a, w, bias, config, out_dtype)
    plan = None if key is None else _PLANS.plans.get(key)
    if plan is None or not fast_ok(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, key[3], key[4],
                                   element=FP8):
        _check(a, w, scale_a, scale_w, bias, residual, alpha, out_dtype, config)
        _layout(a, w, scale_a, scale_w, bias, residual)
        n, k = w.shape
        m = rows(a, k)
        if m == 0:
            return a.new_empty((*a.shape[:-1], n), dtype=out_dtype)
        if plan is None:
            plan = _PLANS.get_or_make(key, lambda: _make_plan(config, out_dtype, m, n, k))
    plan.calls += 1
    if ops._hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        ops.hot_install(OP, config, ops._hot.dtype_code(out_dtype), key, plan)
    return plan.run(a, w, scale_a, scale_w, bias, (residual, float(alpha)))


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)
served, reset_plans = ops._hot.plan_cache_functions(_PLANS)


def scaled_mm_fp8_residual(a, w, scale_a, scale_w, residual, alpha: float = 1.0, bias=None,
                           out_dtype=torch.bfloat16, config: str = "auto"):
    """``residual + alpha * scaled_mm_fp8(a, w, scale_a, scale_w, bias)`` in one kernel (module docstring)."""
    return torch.ops.oasr.scaled_mm_fp8_residual.default(a, w, scale_a, scale_w, bias, residual, float(alpha),
                                                         out_dtype, config)

