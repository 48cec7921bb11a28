"""`oasr::scaled_mm_fp8_act_quant`: the fp8 GEMM whose epilogue applies an activation and quantizes the result to
e4m3 with a static scale — the FFN's fc1 -> GELU/SiLU -> (quantize) -> fc2 without the fp16 hidden tensor. The fp8
counterpart of the int8 family's `oasr::scaled_mm_act_quant` (families/scaled_mm/act_quant.py), whose activation
formula (`apply_activation`) and template snippet (templates/_act_fast.cuh.j2) it shares.

``oasr::scaled_mm_fp8_act_quant(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale,
str activation, str config) -> Tensor``
    As `oasr::scaled_mm_fp8_quant` (same operands, checks and tiles: the DB op is ``scaled_mm_fp8_quant``), with
    ``activation`` in ``("gelu", "silu")`` applied in fp32 after the bias and before the quantization::

        y = fma(scale_a[:, None], scale_w[None, :] * acc, bias);  q = e4m3(clamp(act(y) / out_scale, -448, 448))

    out_scale is the calibrated per-tensor scale of the next GEMM's input (`oasr_ops.calibrate`: amax / 448),
    shape [1] (or [M]); the next `scaled_mm_fp8` reads the e4m3 output with ``scale_a = out_scale``.

CUDA runs the ``fp8_<activation>`` variant of the sm90 lane's data-parallel tiles (templates/sm90_scaled_mm_fp8.cu.j2,
a branch of its own: the other variants render byte-identically) with the int8 epilogue's math (act(y) = h + h *
tanh(u), one tanh.approx.f32; `apply_activation`, docs/kernels.md "act-quant epilogue") and the quantization as
``act(y) * rcp.approx(out_scale)`` converted by cvt.rn.satfinite (which saturates to +-448 itself). A value differs
from this reference (which has an exact tanh) by at most ``tanh_error_bound(y) / out_scale`` plus its e4m3 rounding
(besides what the fp32 accumulation differs from the reference's float64 one, as for every fp8 kernel): one e4m3
step where that bound is below the step, more in the activations' negative tails, where the bound is absolute
(2^-12 |y|) and the e4m3 steps of the near-zero outputs are smaller. The sm89 lane has no
activation epilogue: on sm89 (and wherever no fp8 lane exists) ``auto`` serves the ``torch`` path
(torch._scaled_mm + this formula in eager ops), and an sm89 config id is refused with a ValueError. CPU runs the
reference.
"""
from __future__ import annotations

import torch

from ..autograd import register_inference_op
from ..scaled_mm.act_quant import ACTIVATIONS, apply_activation, epilogue_fma_fp32
# a calibrated out_scale is a buffer passed on every call: read (a device sync) once per version, not per call
from ..scaled_mm.out_scale import check_out_scale
from ...runtime import select as _select
from ...runtime.plans import PlanCache, make_plan
from ...runtime.registry import native_lane
from . import ops
from .heuristic import heuristic_config
from .reference import FP8, acc64, check, epilogue_fp32, rows, to_fp8

OP = "scaled_mm_fp8_act_quant"
DB_OP = "scaled_mm_fp8_quant"  # the tiles, the DB op and the signature of the quantizing op
_lib = torch.library.Library("oasr", "FRAGMENT")
_lib.define(f"{OP}(Tensor a, Tensor w, Tensor scale_a, Tensor scale_w, Tensor? bias, Tensor out_scale, "
            "str activation, str config) -> Tensor", tags=(torch.Tag.needs_fixed_stride_order,))


def act_quant_fp8(y: torch.Tensor, out_scale: torch.Tensor, activation: str) -> torch.Tensor:
    """``e4m3(clamp(act(y) / out_scale, -448, 448))`` of the fp32 epilogue value y ([M, N])."""
    return to_fp8(apply_activation(y, activation), out_scale)


def reference_scaled_mm_fp8_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation) -> torch.Tensor:
    n, k = w.shape
    y = epilogue_fma_fp32(acc64(a.reshape(-1, k), w), scale_a, scale_w, bias)
    return act_quant_fp8(y, out_scale, activation).reshape(*a.shape[:-1], n)


def _check(a, w, scale_a, scale_w, bias, out_scale, activation, config) -> None:
    check(OP, a, w, scale_a, scale_w, bias, out_scale=out_scale)
    if activation not in ACTIVATIONS:
        raise ValueError(f"oasr.{OP}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    ops.check_config_arg(config, OP)


def _layout(a, w, scale_a, scale_w, bias, out_scale) -> None:
    ops.check_layout(OP, ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias),
                     ("out_scale", out_scale))


def _cpu(a, w, scale_a, scale_w, bias, out_scale, activation, config):
    _check(a, w, scale_a, scale_w, bias, out_scale, activation, config)
    _layout(a, w, scale_a, scale_w, bias, out_scale)
    check_out_scale(out_scale, OP)
    return reference_scaled_mm_fp8_act_quant(a, w, scale_a, scale_w, bias, out_scale, activation)


def _fake(a, w, scale_a, scale_w, bias, out_scale, activation, config):
    _check(a, w, scale_a, scale_w, bias, out_scale, activation, config)
    _layout(a, w, scale_a, scale_w, bias, out_scale)
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=FP8)


def _act_lane(arch: str | None):
    """The lane whose kernels have the activation epilogue on `arch` (the 3.x sm90 lane), else None."""
    lane = native_lane(arch, ops.FAMILY) if arch else None
    return lane if lane is not None and lane.default.generation == "3x" else None


def select_act_quant_config(n: int, k: int, m: int, arch: str | None = None) -> _select.Selection:
    """The tile of one `scaled_mm_fp8_act_quant` call: a measured tile of op ``scaled_mm_fp8_quant`` when the DB
    has one; else the half-wave heuristic's tile (the family's untuned ``torch`` policy would run cuBLAS + the
    activation and quantization in eager ops: slower than not fusing). ``torch`` where no lane has the activation
    epilogue (sm89, no fp8 lane)."""
    sel = ops.select_quant_config(n, k, m, arch)
    a = ops._current_arch(arch)
    lane = _act_lane(a)
    if lane is None:
        return _select.Selection("torch", sel.tier, sel.signature)
    if sel.config in lane.ids():
        return sel
    return _select.Selection(heuristic_config(max(int(m), 1), n, k, a, lane), "heuristic", sel.signature)


_PLANS = PlanCache()


def _make_plan(config: str, activation: str, m: int, n: int, k: int):
    arch = ops._current_arch(None) or "sm90"
    sig = ops.signature(DB_OP, n, k)

    def torch_run(_sentinel):
        def run(a, w, sa, sw, bias, out_scale):
            one = torch.ones((), device=a.device, dtype=torch.float32)
            acc = torch._scaled_mm(a.reshape(-1, k), w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
            return act_quant_fp8(epilogue_fp32(acc, sa, sw, bias), out_scale, activation).reshape(*a.shape[:-1], n)
        return run

    def kernel_run(cfg):
        if cfg.generation != "3x":
            raise ValueError(f"oasr.{OP}: config {cfg.id} is of a lane without an activation epilogue (the "
                             f"{OP} kernels exist for the sm90 lane only; use config='auto' or 'torch')")
        return ops._kernel_run(DB_OP, cfg, None, m, n, k, arch, sig, variant=f"fp8_{activation}",
                               fallback=torch_run("torch"))

    plan = make_plan(ops.FAMILY, config, m, n, k, arch, sig,
                     select=lambda: select_act_quant_config(n, k, m, arch),
                     torch_run=torch_run, kernel_run=kernel_run)
    # a region table's torch (what a graph compiled with a symbolic M bakes for a signature without an entry: the
    # family's untuned policy): the tile `select_act_quant_config` serves, as for `auto`. Running the torch path here
    # would be torch._scaled_mm with an fp32 output, then the activation and the quantization in eager ops: slower
    # than not fusing
    lane = _act_lane(arch)
    return ops.tile_where_torch(plan, config, lambda: "torch" if lane is None else
                                heuristic_config(max(int(m), 1), n, k, arch, lane), kernel_run, tier="heuristic")


def _cuda(a, w, scale_a, scale_w, bias, out_scale, activation, config):
    # the plan first; on a hit only what its key (config, activation, shape, bias or not, DB epoch) does not fix is
    # checked, as in the int8 family's act_quant.py
    key = ops.plan_key(OP, a, w, bias, config, activation)
    plan = None if key is None else _PLANS.plans.get(key)
    if plan is None or not (ops.fast_ok(a, w, scale_a, scale_w, bias, torch.float32, key[3], key[4], element=FP8)
                            and ops.vec_ok(out_scale, key[3], a.device)):
        _check(a, w, scale_a, scale_w, bias, out_scale, activation, config)
        _layout(a, w, scale_a, scale_w, bias, out_scale)
        check_out_scale(out_scale, OP)
        n, k = w.shape
        m = rows(a, k)
        if m == 0:
            return a.new_empty((*a.shape[:-1], n), dtype=FP8)
        if plan is None:
            plan = _PLANS.get_or_make(key, lambda: _make_plan(config, activation, m, n, k))
    checked = check_out_scale(out_scale, OP)
    plan.calls += 1
    if ops._hot.installing:  # the C++ hot path missed this call: let it answer the next one of this key
        ops.hot_install(OP, config, ops._hot.ACTIVATION_CODES[activation], key, plan, out_scale if checked else None)
    return plan.run(a, w, scale_a, scale_w, bias, out_scale)


register_inference_op(_lib, OP, cpu=_cpu, cuda=_cuda, fake=_fake)
_, reset_plans = ops._hot.plan_cache_functions(_PLANS)


def scaled_mm_fp8_act_quant(a, w, scale_a, scale_w, out_scale, activation: str, bias=None, config: str = "auto"):
    """fp8 GEMM -> activation -> e4m3 with the static `out_scale` (the next GEMM's `scale_a`)."""
    return torch.ops.oasr.scaled_mm_fp8_act_quant.default(a, w, scale_a, scale_w, bias, out_scale, activation, config)
