"""The int8 W8A8 scaled GEMM family (`scaled_mm`): torch ops, config selection and the shape heuristic.

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
dtype, shape and device, out_dtype float16 / bfloat16.

Selection (`select_config` / `select_quant_config`): a concrete id or a sentinel from the user tier, then the
system tier (via `oasr_ops.tune.select`, family ``scaled_mm``, signatures ``scaled_mm|op=scaled_mm|N=768|K=256``
and ``op=scaled_mm_quant``; M rounds up to a region), a config outside this process's production set warned
once and skipped, else the shape heuristic `heuristic_config` (sm90: the wave model `_INT8_WAVE_MODEL`; sm80:
the occupancy ladder `_INT8_LADDER`). A region naming ``heuristic`` is served by the heuristic with the entry's
tier (``[[null, "heuristic"]]`` means measured: the heuristic won).
Only a measured entry can pick a Stream-K tile (the heuristic never does); `select_quant_config` never serves one
(warned once, skipped: the heuristic answers). Memoised per (DB epoch, op, N, K, M, arch); each resolution is
counted under its tier (`resolution_counts()`).

Note on names: ``oasr_ops.scaled_mm`` is the *function* (the public API); this module is
``sys.modules["oasr_ops.scaled_mm"]`` — import from it with ``from oasr_ops.scaled_mm import ...``.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings
from dataclasses import dataclass

import torch

from ...codegen.jit import KernelCache, KernelLibrary, load_launcher
from ...configs import AUTO, Config, ConfigError, parse
from ...runtime.plans import TABLE_PREFIX as _TABLE_PREFIX
from ...runtime.plans import Plan, PlanCache, check_config_arg, resolve_table

FAMILY = "scaled_mm"
OPS = ("scaled_mm", "scaled_mm_quant")
OUT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
K_ALIGN = 16
N_ALIGN = {"scaled_mm": 8, "scaled_mm_quant": 16}

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


# ----------------------------------------------------------------------------------------------------------
# argument checks (shared by every implementation and the fake functions)

def _rows(a: torch.Tensor, k: int) -> int:
    return a.numel() // k if k else 0


def _check_vec(name: str, t: torch.Tensor, full: int, full_name: str, a: torch.Tensor, op: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"oasr.{op}: {name} must be a tensor")
    if t.dtype != torch.float32:
        raise ValueError(f"oasr.{op}: {name} must be float32, got {t.dtype}")
    if t.device != a.device:
        raise ValueError(f"oasr.{op}: {name} is on {t.device}, a on {a.device}")
    if t.dim() != 1 or t.shape[0] not in (1, full):
        raise ValueError(f"oasr.{op}: {name} must have shape [1] (per tensor) or [{full_name}={full}], "
                         f"got {tuple(t.shape)}")


def _check(op: str, a, w, scale_a, scale_w, bias, out_dtype=None, out_scale=None) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(w, torch.Tensor):
        raise ValueError(f"oasr.{op}: a and w must be tensors")
    if a.dtype != torch.int8 or w.dtype != torch.int8:
        raise ValueError(f"oasr.{op}: a and w must be int8 (quantize activations with "
                         f"torch.ops.oasr.quantize_per_token), got {a.dtype} and {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"oasr.{op}: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if a.dim() < 1:
        raise ValueError(f"oasr.{op}: a must have at least one dimension [..., K]")
    n, k = w.shape
    if a.shape[-1] != k:
        raise ValueError(f"oasr.{op}: K mismatch: a is {tuple(a.shape)}, w is {tuple(w.shape)} (w is [N, K])")
    if a.device != w.device:
        raise ValueError(f"oasr.{op}: a is on {a.device}, w on {w.device}")
    if k % K_ALIGN or k == 0:
        raise ValueError(f"oasr.{op}: K={k} is not a positive multiple of {K_ALIGN} (int8 operands are read 16 at "
                         "a time)")
    if n % N_ALIGN[op]:
        raise ValueError(f"oasr.{op}: N={n} is not a multiple of {N_ALIGN[op]} (output rows are written "
                         "128 bits at a time)")
    m = _rows(a, k)
    _check_vec("scale_a", scale_a, m, "M", a, op)
    _check_vec("scale_w", scale_w, n, "N", a, op)
    if op == "scaled_mm":
        if out_dtype not in OUT_DTYPES:
            raise ValueError(f"oasr.scaled_mm: out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
        bias_dtype = out_dtype
    else:
        _check_vec("out_scale", out_scale, m, "M", a, op)
        bias_dtype = torch.float32
    if bias is not None:
        if bias.dtype != bias_dtype:
            raise ValueError(f"oasr.{op}: bias must have dtype {bias_dtype}, got {bias.dtype}")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"oasr.{op}: bias must have shape ({n},), got {tuple(bias.shape)}")
        if bias.device != a.device:
            raise ValueError(f"oasr.{op}: bias is on {bias.device}, a on {a.device}")


def _check_layout(op: str, *tensors: tuple[str, torch.Tensor | None]) -> None:
    for name, t in tensors:
        if t is not None and not t.is_contiguous():
            raise ValueError(f"oasr.{op}: {name} (shape {tuple(t.shape)}, stride {t.stride()}) is not contiguous; "
                             "call .contiguous() first")


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
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp_min(1e-12) / 127.0
    q = torch.round(xf / scale).clamp_min(-127.0).clamp_max(127.0).to(torch.int8)
    return q, scale.reshape(-1)


_lib.impl("quantize_per_token", _quantize_per_token, "CompositeImplicitAutograd")


def _scaled_mm_cpu(a, w, scale_a, scale_w, bias, out_dtype, config):
    _check("scaled_mm", a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    check_config_arg(config, "scaled_mm")
    return reference_scaled_mm(a, w, scale_a, scale_w, bias, out_dtype)


def _scaled_mm_quant_cpu(a, w, scale_a, scale_w, bias, out_scale, config):
    _check("scaled_mm_quant", a, w, scale_a, scale_w, bias, out_scale=out_scale)
    check_config_arg(config, "scaled_mm_quant")
    return reference_scaled_mm_quant(a, w, scale_a, scale_w, bias, out_scale)


def _scaled_mm_fake(a, w, scale_a, scale_w, bias, out_dtype, config):
    _check("scaled_mm", a, w, scale_a, scale_w, bias, out_dtype=out_dtype)
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=out_dtype)


def _scaled_mm_quant_fake(a, w, scale_a, scale_w, bias, out_scale, config):
    _check("scaled_mm_quant", a, w, scale_a, scale_w, bias, out_scale=out_scale)
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=torch.int8)


# ----------------------------------------------------------------------------------------------------------
# the shape heuristic

# SMs of the family's reference part where no GPU is present to ask (H100/H200 SXM: 132; A100: 108; ...).
_SM_COUNT = {"sm80": 108, "sm86": 84, "sm87": 16, "sm89": 128, "sm90": 132}

# The sm90 heuristic: a wave model per data-parallel tile, the argmin of the predicted time. For a tile tm x tn,
#   w = ceil(ceil(M / tm) * ceil(N / tn) / SMs)                      (waves of output tiles over the SMs)
#   t_us = a + b*w + (K/1024) * (c1 + c2*(w - 1)) + d * (M*K / 1e7)
# a: launch and fixed cost; b: per-wave prologue/epilogue; c1: the first wave's mainloop per 1024 of K, c2: each
# further wave's (a lone wave of few CTAs streams faster than a full one); d: activation traffic (M*K bytes). All
# coefficients are >= 0 (non-negative least squares on the relative error), so every tile's predicted time is
# non-decreasing in M, N and K; ties go to the first tile in table order. Stream-K tiles are not in the table: only
# a measured entry picks them.
# FITTED on the H200 (132 SMs, 2026-11-29 data) from the scaled_mm build's measurements of all nine tiles at 126
# census points of Conformer S/M/L + Whisper base (benchmarks/int8_ladder_points.json): `python
# benchmarks/fit_int8_ladder.py --load benchmarks/int8_ladder_points.json`. Geomean regret vs the best
# data-parallel tile (max, share of points within 1 %): in-sample 0.33 % (8.3 %, 90 %); leave-one-(N, K)-signature-
# out 0.45 % (9.7 %, 88 %); fitted on the d=256/1024 signatures only, on the held-out d=512 ones 0.35 % (9.0 %,
# 90 %). The occupancy ladder it replaces (refitted the same ways): 3.1 % in-sample, 3.2 % on d=512, 3.5 %
# leave-one-signature-out. Repeat measurements of one tile at one point differ by 0.8 % (sd, the build log's
# heuristic pseudo-arm vs the same tile's arm). d is ~0 except for the 128x128 2x1-cluster and 128x256 tiles.
# The form was chosen among ~30 candidate regressor sets by these scores; chosen by leave-one-signature-out on the
# d=256/1024 signatures alone it is still the pick. Validated range: M 15..24032, N 256..4096, K 256..19456;
# beyond it the largest tile answers (_WAVE_MODEL_RANGE: at 8192^3 the model's own pick measured 7 % slower).
_INT8_WAVE_MODEL: dict[str, dict[str, tuple[float, float, float, float, float]]] = {
    "sm90_int8_wgmma": {  # config: (a, b, c1, c2, d) in us
        "t64x64x128_c1x1_pp": (3.1837, 0.4929, 0.8698, 1.2363, 0.0000),
        "t64x128x128_c1x1_pp": (3.1265, 0.8402, 1.2484, 1.7041, 0.0000),
        "t64x256x128_c1x1_pp": (3.4701, 1.3886, 2.3316, 2.6822, 0.0185),
        "t128x64x128_c1x1_coop": (2.6887, 1.1966, 1.2752, 1.8715, 0.0000),
        "t128x128x128_c1x1_coop": (2.5572, 1.7428, 2.3355, 2.9759, 0.0101),
        "t128x128x128_c2x1_pp": (3.2440, 1.2889, 2.3396, 2.3187, 0.8175),
        "t128x256x128_c1x1_coop": (2.7290, 2.4628, 4.6122, 5.8469, 0.2824),
    },
}

# The untuned selector of lanes without a wave model (sm80): rungs (config, min_fill), largest tile first. A rung
# serves a shape when its output tiles ceil(M/tm) * ceil(N/tn) reach min_fill x SMs x k_weight(K), where k_weight =
# clamp(K / _K_FULL, _K_MIN_WEIGHT, 1): a shallow-K tile finishes quickly, so fewer, larger tiles pay less in
# prologue/epilogue than a fuller wave of small ones; a deep-K tile's idle SMs cost in proportion to K. The last
# rung (min_fill 0) always serves. Tiles with more than 64 rows are skipped for M <= 64 (half of their MMA work
# would be padding). On sm90 this form, fitted, scored 3.1 % in-sample and gave way to the wave model above (its
# literal is kept in benchmarks/fit_int8_ladder.py as the baseline).
_INT8_LADDER: dict[str, tuple[tuple[str, float], ...]] = {
    "sm80_int8_mma": (  # not fitted: no sm80 GPU was measured
        ("b128x256x64_w64x64x64_s3", 1.0),
        ("b128x128x64_w64x64x64_s3", 1.0),
        ("b128x64x64_w64x32x64_s4", 0.75),
        ("b64x128x64_w32x64x64_s4", 0.75),
        ("b64x64x64_w32x32x64_s5", 0.5),
        ("b32x64x128_w32x32x128_s4", 0.0),
    ),
}
_K_FULL = 512
_K_MIN_WEIGHT = 0.0625
_SMALL_M = 64


def sm_count(arch: str | None) -> int:
    """SMs of the GPU serving `arch`: the current device's when it is of that family, else the family's part."""
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            if arch is None or f"sm{major}{minor}" == arch:
                return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    except Exception:  # no usable device: the table answers
        pass
    return _SM_COUNT.get(arch or "", 132)


def wave_features(tile_m: int, tile_n: int, m: int, n: int, k: int, sms: int) -> tuple[float, ...]:
    """The wave model's regressors for a tile_m x tile_n tile at (M, N, K) on `sms` SMs (see _INT8_WAVE_MODEL)."""
    w = -(-(-(-m // tile_m) * -(-n // tile_n)) // sms)
    kk = k / 1024.0
    return (1.0, float(w), kk, (w - 1) * kk, m * k / 1e7)


def wave_model_time(coef, tile_m: int, tile_n: int, m: int, n: int, k: int, sms: int) -> float:
    """Predicted microseconds of one tile's kernel at (M, N, K): the dot product of `coef` and `wave_features`."""
    return sum(c * f for c, f in zip(coef, wave_features(tile_m, tile_n, m, n, k, sms)))


@functools.lru_cache(maxsize=None)
def _tile_mn(cid: str) -> tuple[int, int]:
    c = parse(cid)
    return c.tile[0], c.tile[1]


def wave_model_config(model, m: int, n: int, k: int, sms: int) -> str:
    """The tile of `model` ({config id: coefficients}) with the least predicted time; ties: the first listed."""
    best, best_t = "", float("inf")
    for cid, coef in model.items():
        t = wave_model_time(coef, *_tile_mn(cid), m, n, k, sms)
        if t < best_t:
            best, best_t = cid, t
    return best


def ladder_config(ladder, m: int, n: int, k: int, sms: int, *, k_full: float = _K_FULL,
                  k_min_weight: float = _K_MIN_WEIGHT) -> str:
    """The first rung of `ladder` ((config id, min_fill), ...) that fills enough of `sms` SMs for (M, N, K)."""
    kw = min(1.0, max(k_min_weight, k / k_full))
    chosen = ladder[-1][0]
    for cid, fill in ladder:
        c = parse(cid)
        tm, tn = c.tile[0], c.tile[1]
        if m <= _SMALL_M and tm > _SMALL_M:
            continue
        tiles = -(-m // tm) * -(-n // tn)
        if tiles >= fill * sms * kw:
            return cid
    return chosen


def heuristic_ids(lane) -> tuple[str, ...]:
    """Every tile the heuristic can answer for `lane` (the wave model's tiles or the ladder's rungs)."""
    model = _INT8_WAVE_MODEL.get(lane.name)
    if model:
        return tuple(model)
    return tuple(cid for cid, _ in _INT8_LADDER.get(lane.name, ()))


# Beyond the shapes the wave model was fitted on it extrapolates per-wave costs it never saw; there the largest
# tile (the best arithmetic intensity, what compute-bound shapes want) answers when it fills a wave of SMs. Measured at 8192^3 on the H200
# (docs/perf/scaled_mm.md): 128x256 cooperative 1280 TOPS vs the model's pick, 128x128 2x1 ping-pong, 1195.
_WAVE_MODEL_RANGE = {"sm90_int8_wgmma": (24576, 4096, 19456)}  # M, N, K maxima of the fit's data (rounded up)


def _heuristic_for(lane, m: int, n: int, k: int, arch: str | None) -> str:
    m = max(int(m), 1)
    model = _INT8_WAVE_MODEL.get(lane.name)
    if model:
        m_max, n_max, k_max = _WAVE_MODEL_RANGE.get(lane.name, (1 << 62,) * 3)
        sms = sm_count(arch)
        if m > m_max or n > n_max or k > k_max:
            largest = max(model, key=lambda cid: _tile_mn(cid)[0] * _tile_mn(cid)[1])
            tm, tn = _tile_mn(largest)
            if -(-m // tm) * -(-n // tn) >= sms:  # it fills at least one wave: compute-bound territory
                return largest
        return wave_model_config(model, m, int(n), int(k), sms)
    ladder = _INT8_LADDER.get(lane.name)
    if ladder:
        return ladder_config(ladder, m, n, k, sm_count(arch))
    return lane.default.id


def heuristic_config(m: int, n: int, k: int, arch: str | None = None, lane=None) -> str:
    """The `heuristic` sentinel's answer for (M, N, K) on `arch`: a data-parallel tile id of the native lane."""
    if lane is None:
        lane = _lane_for(arch)
    if lane is None:
        return "torch"
    return _heuristic_for(lane, m, n, k, arch)


def _fallback_plugin(lane, m, n, k, dtype):  # tune.select's fallback hook: fn(lane, m, n, k, dtype) -> id
    if lane is None:
        return None
    arch = _current_arch(None) or next(iter(lane.native_for), None)
    return _heuristic_for(lane, m, n, k, arch)


def _lane_for(arch: str | None):
    from ...runtime.registry import native_lane

    if arch is None:
        return None
    return native_lane(arch, FAMILY)


# ----------------------------------------------------------------------------------------------------------
# selection

@dataclass(frozen=True)
class Selection:
    config: str  # a concrete config id, or "torch"
    tier: str  # user | system | heuristic | explicit | baked | default
    signature: str


_SEL_LOCK = threading.Lock()
_SEL_MEMO: dict[tuple, Selection] = {}
_RESOLUTIONS: dict[tuple[str, str], int] = {}  # (op, tier) -> resolutions
_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, stacklevel=3)


def _epoch() -> int:
    from ...runtime import database

    return database.epoch()


def _current_arch(arch: str | None) -> str | None:
    from ...runtime.arch import current_arch_family, normalize_arch

    return normalize_arch(arch) if arch else current_arch_family()


def signature(op: str, n: int, k: int) -> str:
    from ...runtime import database

    return database.signature(FAMILY, op, None, n, k)


def production_configs(arch: str) -> list[Config]:
    """The configs this process compiles and serves for `arch`: the gemm family's rule (lane default, coverage
    basis, what the tuning DB references; ``OASR_GEMM_COMPILE_SET=all``: the whole lane) plus every tile the
    heuristic can answer."""
    from ..gemm.kernels import production_configs as lane_production_configs

    lane = _lane_for(arch)
    if lane is None:
        return []
    chosen = lane_production_configs(lane, arch)
    for cid in heuristic_ids(lane):
        c = parse(cid)
        if c in lane.space and c not in chosen:
            chosen.append(c)
    return chosen


def _production_ids(arch: str) -> frozenset[str]:
    key = ("prod", _epoch(), arch, os.environ.get("OASR_GEMM_COMPILE_SET", ""))
    ids = _PROD_MEMO.get(key)
    if ids is None:
        ids = frozenset(c.id for c in production_configs(arch))
        _PROD_MEMO.clear()
        _PROD_MEMO[key] = ids
    return ids


_PROD_MEMO: dict[tuple, frozenset[str]] = {}


def _resolve(op: str, n: int, k: int, m: int, arch: str | None) -> Selection:
    sig = signature(op, n, k)
    a = _current_arch(arch)
    if a is None:
        return Selection("torch", "default", sig)  # no GPU family known: only the reference runs anyway
    lane = _lane_for(a)
    if lane is None:
        return Selection("torch", "default", sig)
    from ...runtime import select as _select

    sel = _select.select_config(FAMILY, op, "int8", n, k, m, a)
    cfg, tier = sel.config, sel.tier
    if cfg in ("heuristic",):
        return Selection(heuristic_config(m, n, k, a, lane), tier, sig)
    if cfg in ("torch", "fused"):
        return Selection("torch", tier, sig)
    if cfg == "default":
        cfg = lane.default.id
    try:
        c = lane.get(cfg)
    except ConfigError:
        _warn_once(f"oasr.{op}: {sig}: {cfg} is not a config of lane {lane.name}; using the heuristic")
        return Selection(heuristic_config(m, n, k, a, lane), "heuristic", sig)
    if c.kernel_schedule == "streamk":
        if op == "scaled_mm_quant":
            _warn_once(f"oasr.scaled_mm_quant: {sig}: {cfg} is a Stream-K tile and there is no quantizing "
                       "Stream-K launcher; skipped (the heuristic answers)")
            return Selection(heuristic_config(m, n, k, a, lane), "heuristic", sig)
        if tier not in ("user", "system"):
            _warn_once(f"oasr.{op}: {sig}: Stream-K tile {cfg} did not come from a measured entry; skipped")
            return Selection(heuristic_config(m, n, k, a, lane), "heuristic", sig)
    if cfg not in _production_ids(a):
        _warn_once(f"oasr.{op}: {sig}: {cfg} is outside this process's production set; skipped (the heuristic "
                   "answers)")
        return Selection(heuristic_config(m, n, k, a, lane), "heuristic", sig)
    return Selection(cfg, tier, sig)


def _select(op: str, n: int, k: int, m: int, arch: str | None) -> Selection:
    key = (_epoch(), op, n, k, m, arch)
    sel = _SEL_MEMO.get(key)
    if sel is None:
        sel = _resolve(op, n, k, m, arch)
        with _SEL_LOCK:
            if key not in _SEL_MEMO:
                _SEL_MEMO[key] = sel
                _RESOLUTIONS[(op, sel.tier)] = _RESOLUTIONS.get((op, sel.tier), 0) + 1
    return sel


def select_config(n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The kernel of one `scaled_mm` call (fp16/bf16 output). See the module docstring for the rules."""
    return _select("scaled_mm", n, k, m, arch)


def select_quant_config(n: int, k: int, m: int, arch: str | None = None) -> Selection:
    """The kernel of one `scaled_mm_quant` call: as `select_config`, never a Stream-K tile."""
    return _select("scaled_mm_quant", n, k, m, arch)


def resolution_counts() -> dict[str, dict[str, int]]:
    """Resolutions (one per distinct shape per DB epoch) per op and tier since import: {op: {tier: n}}."""
    out: dict[str, dict[str, int]] = {}
    for (op, tier), cnt in sorted(_RESOLUTIONS.items()):
        out.setdefault(op, {})[tier] = cnt
    return out


def reset_selection() -> None:
    """Forget memoised selections, counts and warnings (tests)."""
    with _SEL_LOCK:
        _SEL_MEMO.clear()
        _RESOLUTIONS.clear()
        _PROD_MEMO.clear()
    _WARNED.clear()


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


# ----------------------------------------------------------------------------------------------------------
# kernels: the scaled_mm C launcher (oasr_smm_*) on top of the shared JIT build/load

_KERNELS = KernelCache()


def kernel_dtype(op: str, out_dtype: torch.dtype | None) -> str:
    return "int8" if op == "scaled_mm_quant" else OUT_DTYPES[out_dtype]


def get_kernel(lane, config: Config, dtype: str, arch: str) -> KernelLibrary:
    """Build (JIT, first use) and load one scaled_mm kernel. Raises BuildError / LoadError (remembered)."""
    from ...codegen.jit import JitSpec

    return _KERNELS.get((lane.name, config.id, dtype, arch),
                        lambda: load_kernel(JitSpec.for_kernel(lane, config, dtype, arch)))


def load_kernel(spec) -> KernelLibrary:
    """The scaled_mm launcher (``oasr_smm_*``: scale pointers, per-row/per-column flags, optional bias and
    out_scale) of a built kernel."""
    from ...codegen.emit_int8 import SMM_ABI_VERSION

    p, i = ctypes.c_void_p, ctypes.c_int
    return load_launcher(spec, "smm", SMM_ABI_VERSION, [p, p, p, i, p, i, p, p, i, p, i, i, i, p, ctypes.c_size_t, p],
                         [i, i, i])


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


def _kernel_run(op: str, cfg: Config, out_dtype, m: int, n: int, k: int, arch: str, sig: str):
    from ...codegen.jit import BuildError, LoadError
    from ...runtime.registry import lane_of

    try:
        lane = lane_of(cfg, arch, FAMILY)
    except ConfigError as e:
        raise ValueError(f"oasr.{op}: config {cfg.id} cannot run on {arch}: {e}") from None
    if op == "scaled_mm_quant" and cfg.kernel_schedule == "streamk":
        raise ValueError(f"oasr.scaled_mm_quant: {cfg.id} is a Stream-K tile; there is no quantizing Stream-K kernel")
    reason = lane.infeasible_reason(cfg, m=m, n=n, k=k, arch_family=arch)
    if reason:
        _warn_once(f"oasr.{op}: {cfg.id} cannot serve {sig} M={m} ({reason}); using torch for it")
        return None
    dt = kernel_dtype(op, out_dtype)
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
    fallback = _torch_run(op, out_dtype)
    expand_scale_w = cfg.generation == "2x"  # the 2.x row broadcast loads float4 vectors: no scalar broadcast
    vec_align = 16 if cfg.generation == "2x" else 4
    out_elt = torch.int8 if op == "scaled_mm_quant" else out_dtype

    def run_kernel(a, w, sa, sw, bias, extra):
        if expand_scale_w and sw.numel() == 1 and n > 1:
            sw = sw.expand(n).contiguous()
        if (a.data_ptr() % 16 or w.data_ptr() % 16 or sw.data_ptr() % vec_align
                or (bias is not None and bias.data_ptr() % vec_align)):
            _warn_once(f"oasr.{op}: an operand of {sig} is not aligned for {cfg.id}; using torch for such calls")
            return fallback(a, w, sa, sw, bias, extra)
        out = torch.empty((*a.shape[:-1], n), dtype=out_elt, device=a.device)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
        rc = run_c(a.data_ptr(), w.data_ptr(), sa.data_ptr(), int(sa.numel() != 1 or m == 1),
                   sw.data_ptr(), int(sw.numel() != 1 or n == 1),
                   None if bias is None else bias.data_ptr(),
                   None if extra is None else extra.data_ptr(), int(extra is not None and extra.numel() != 1),
                   out.data_ptr(), m, n, k, None if ws is None else ws.data_ptr(), ws_bytes,
                   torch._C._cuda_getCurrentRawStream(a.get_device()))
        if rc != 0:
            raise RuntimeError(f"oasr.{op}: kernel {cfg.id} failed with status {rc} on M={m} N={n} K={k}")
        return out
    return run_kernel


def _make_plan(op: str, config: str, out_dtype, m: int, n: int, k: int) -> Plan:
    arch = _current_arch(None) or "sm80"
    sig = signature(op, n, k)
    tier = "explicit"
    if config.startswith(_TABLE_PREFIX):
        config, tier = resolve_table(config, m), "baked"
    if config == AUTO:
        sel = _select(op, n, k, m, arch)
        config, tier = sel.config, sel.tier
    lane = _lane_for(arch)
    if config == "heuristic":
        config = heuristic_config(m, n, k, arch, lane)
    if config == "default":
        config = lane.default.id if lane is not None else "torch"
    if config in ("torch", "fused"):
        return Plan("torch", tier, sig, _torch_run(op, out_dtype))
    cfg = parse(config)
    run = _kernel_run(op, cfg, out_dtype, m, n, k, arch, sig)
    if run is None:
        return Plan("torch", tier, sig, _torch_run(op, out_dtype))
    return Plan(cfg.id, tier, sig, run)


def get_plan(op: str, a, w, bias, config: str, out_dtype=None) -> Plan:
    n, k = w.shape
    m = _rows(a, k)
    key = (op, config, out_dtype, m, n, k, bias is not None, a.device, _epoch())
    return _PLANS.get_or_make(key, lambda: _make_plan(op, config, out_dtype, m, n, k))


def _cuda(op: str, a, w, scale_a, scale_w, bias, out_dtype, out_scale, config):
    """Both ops' CUDA implementation: checks, the plan of (op, config, shape, DB epoch), the launch."""
    _check(op, a, w, scale_a, scale_w, bias, out_dtype=out_dtype, out_scale=out_scale)
    _check_layout(op, ("a", a), ("w", w), ("scale_a", scale_a), ("scale_w", scale_w), ("bias", bias),
                  ("out_scale", out_scale))
    n, k = w.shape
    m = _rows(a, k)
    if m == 0:
        return a.new_empty((*a.shape[:-1], n), dtype=out_dtype if op == "scaled_mm" else torch.int8)
    plan = _plans.get((op, config, out_dtype, m, n, k, bias is not None, a.device, _epoch()))
    if plan is None:
        check_config_arg(config, op)
        plan = get_plan(op, a, w, bias, config, out_dtype)
    plan.calls += 1
    return plan.run(a, w, scale_a, scale_w, bias, out_scale)


def _scaled_mm_cuda(a, w, scale_a, scale_w, bias, out_dtype, config):
    return _cuda("scaled_mm", a, w, scale_a, scale_w, bias, out_dtype, None, config)


def _scaled_mm_quant_cuda(a, w, scale_a, scale_w, bias, out_scale, config):
    return _cuda("scaled_mm_quant", a, w, scale_a, scale_w, bias, None, out_scale, config)


_lib.impl("scaled_mm", _scaled_mm_cpu, "CPU")
_lib.impl("scaled_mm", _scaled_mm_cuda, "CUDA")
_lib.impl("scaled_mm_quant", _scaled_mm_quant_cpu, "CPU")
_lib.impl("scaled_mm_quant", _scaled_mm_quant_cuda, "CUDA")
torch.library.register_fake("oasr::scaled_mm", _scaled_mm_fake, lib=_lib)
torch.library.register_fake("oasr::scaled_mm_quant", _scaled_mm_quant_fake, lib=_lib)


served = _PLANS.served
reset_plans = _PLANS.clear


# The heuristic is applied here, not registered with `tune.select.register_fallback`: the selector answers the
# ``heuristic`` sentinel (tier ``heuristic``) where no entry covers M, and `_resolve` maps every ``heuristic``
# answer (fallback or a measured region) through the same heuristic. `_fallback_plugin` is the hook's signature for
# callers that want the concrete id from `tune.select` itself (`register_fallback("scaled_mm", _fallback_plugin)`).


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
