"""The int8 family's untuned shape heuristic: the `heuristic` sentinel's answer (registered as the scaled_mm
spec's `heuristic`, so selection serves it; `runtime.select` and `runtime.plans` call it, never by name).

sm90: the wave model `_INT8_WAVE_MODEL` (a fitted cost per data-parallel tile; the argmin), with the largest tile
beyond the range it was fitted on; sm80: the occupancy ladder `_INT8_LADDER`. The heuristic never answers a
Stream-K tile (only a measured entry may). `heuristic_ids(lane)` (every tile it can answer) is the family's
production-set extra: those kernels are always built.
"""
from __future__ import annotations

import functools

import torch

from ...configs import parse
from ...runtime.arch import current_arch_family
from ...runtime.registry import native_lane

FAMILY = "scaled_mm"

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


def heuristic(lane, m: int, n: int, k: int, arch: str | None) -> str:
    """The spec's `heuristic`: fn(lane, m, n, k, arch) -> a data-parallel tile id of `lane` for (M, N, K)."""
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
    return heuristic(lane, m, n, k, arch)


def _fallback_plugin(lane, m, n, k, dtype):  # select's fallback plug-in signature: fn(lane, m, n, k, dtype) -> id
    if lane is None:
        return None
    arch = current_arch_family() or next(iter(lane.native_for), None)
    return heuristic(lane, m, n, k, arch)


def _lane_for(arch: str | None):
    if arch is None:
        return None
    return native_lane(arch, FAMILY)
