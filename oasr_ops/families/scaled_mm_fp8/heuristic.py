"""The fp8 family's untuned shape heuristic (the ``heuristic`` sentinel's answer; registered as the spec's
`heuristic`): the largest data-parallel tile still launching half a wave of CTAs (spec, "The heuristic
sentinel"), unfitted until a measured file exists.

Candidates, largest first, never Stream-K (only a measured entry may). Two lists per lane: FastAccum tiles where
K <= FAST_ACCUM_MAX_K, full-fp32-accumulation (promoting) tiles above it.

* K <= 1024, FastAccum (session 36): M <= 64 the 64x128 ping-pong tile, then the swap-AB 64x64x256 and 64x16x256;
  M > 64 the 128x128 2x1-cluster ping-pong tile (vLLM's M > 128 fp8 tile), 64x128 ping-pong (vLLM's M 65..128),
  then swap-AB 64x64x256. Why FastAccum: its accumulator keeps ~13-14 mantissa bits, and at K <= 1024 every
  FastAccum tile passed the build's 4x-of-cuBLAS gate at every measured point in both fp16 and bf16 output (the
  H200 build of the shipped file, 167 points at K <= 1024; the error grows with K: 3.4x cuBLAS's at K=2048 in fp16
  in the GPU suite, where the gate refused 3 FastAccum (tile, M) pairs; 5.6x at K=4864). On that build's log
  (sm90_scaled_mm_fp8_build_v3.jsonl) these tiles are 1.155x faster than the full-accumulation lists' (geomean;
  1.26x at M > 1024, worst 0.955x) and 2.1 % from the best logged tile (the full-accumulation lists: 17.9 %); on
  the first build's log (v1) 1.164x and 1.2 % (benchmarks/fp8_heuristic_offline.py). Untuned fp16 outputs get
  the heuristic's tile (torch._scaled_mm's rowwise path writes bf16 only), so this is what an fp8 model of
  untuned widths runs: Whisper small's fc1 (12000x3072x768) 55 us instead of 87 (fp16 cuBLAS 84; the probe log).
  ``OASR_FP8_HEURISTIC_FAST_ACCUM=off`` keeps full accumulation at every K (the rule before; `env.py`); it also
  changes what the DB's ``heuristic`` regions run (they were partitioned with the FastAccum tiles' times).
* K > 1024, full accumulation: M <= 64 as above without FastAccum; M > 64 128x128 cooperative, 64x128 ping-pong,
  then swap-AB 64x64x256. Not 128x256 cooperative nor 128x128 2x1 ping-pong: with full fp32 accumulation each of
  their consumer warpgroups holds two 128-register accumulators and spills (8192^3 on the H200: 430 and 354
  TFLOP/s against 958 for 128x128 cooperative). Chosen on the H200 build log
  benchmarks/logs/sm90_scaled_mm_fp8_build_v3.jsonl (every tile at 231 points): 2.5 % slower than the best
  full-accumulation tile (geomean; max 30 %) (docs/perf/scaled_mm_fp8.md).

The first candidate whose CTA count (output tiles, ``ceil(M/tm) * ceil(N/tn)``; swapped for swap-AB tiles)
reaches half the SMs answers; where none does, the last (the one with the most CTAs). `heuristic_ids(lane)` (every tile it can answer) is
the family's production extra: those kernels are always built.
"""
from __future__ import annotations

import functools

from ... import env as _env
from ...configs import parse
from ...runtime.registry import native_lane
from ..scaled_mm.heuristic import sm_count as _int8_sm_count

FAMILY = "scaled_mm_fp8"
_SMALL_M = 64
HALF_WAVE = 0.5
# the deepest K at which the heuristic answers a FastAccum tile (module docstring: measured, not derived)
FAST_ACCUM_MAX_K = 1024

_CANDIDATES: dict[str, dict[str, tuple[str, ...]]] = {
    "sm90_fp8_wgmma": {
        "small": ("t64x128x128_c1x1_pp", "t64x64x256_c1x1_pp_swab", "t64x16x256_c1x1_pp_swab"),
        "large": ("t128x128x128_c1x1_coop", "t64x128x128_c1x1_pp", "t64x64x256_c1x1_pp_swab"),
        "small_fast": ("t64x128x128_c1x1_pp_fa", "t64x64x256_c1x1_pp_fa_swab", "t64x16x256_c1x1_pp_fa_swab"),
        "large_fast": ("t128x128x128_c2x1_pp_fa", "t64x128x128_c1x1_pp_fa", "t64x64x256_c1x1_pp_fa_swab"),
    },
    "sm89_fp8_mma": {
        "small": ("b64x128x64_w32x64x64_s4", "b64x64x64_w32x32x64_s5", "b32x64x128_w32x32x128_s4"),
        "large": ("b128x128x64_w64x64x64_s3", "b128x64x64_w64x32x64_s4", "b64x128x64_w32x64x64_s4",
                  "b64x64x64_w32x32x64_s5", "b32x64x128_w32x32x128_s4"),
    },
}


def sm_count(arch: str | None) -> int:
    """SMs of the GPU serving `arch` (the current device's when it is of that family, else the family's part)."""
    return _int8_sm_count(arch)


@functools.lru_cache(maxsize=None)
def _grid(cid: str) -> tuple[int, int, bool]:
    c = parse(cid)
    return c.tile[0], c.tile[1], c.swap_ab


def ctas(cid: str, m: int, n: int) -> int:
    """Output tiles (CTAs of a data-parallel launch) of config `cid` at (M, N)."""
    tm, tn, swab = _grid(cid)
    rows, cols = (n, m) if swab else (m, n)
    return -(-rows // tm) * -(-cols // tn)


def half_wave_config(candidates: tuple[str, ...], m: int, n: int, sms: int) -> str:
    """The first of `candidates` (largest first) launching at least half a wave of CTAs, else the last."""
    for cid in candidates:
        if ctas(cid, m, n) >= HALF_WAVE * sms:
            return cid
    return candidates[-1]


def heuristic(lane, m: int, n: int, k: int, arch: str | None) -> str:
    """The spec's `heuristic`: fn(lane, m, n, k, arch) -> a data-parallel tile id of `lane` for (M, N, K)."""
    table = _CANDIDATES.get(lane.name)
    if table is None:
        return lane.default.id
    return half_wave_config(table[candidate_list(table, m, k)], max(int(m), 1), int(n), sm_count(arch))


def candidate_list(table: dict[str, tuple[str, ...]], m: int, k: int) -> str:
    """Which of a lane's lists answers (M, K): small or large M; FastAccum where the lane has such lists,
    K <= FAST_ACCUM_MAX_K and ``OASR_FP8_HEURISTIC_FAST_ACCUM`` is not off."""
    name = "small" if max(int(m), 1) <= _SMALL_M else "large"
    fast = f"{name}_fast"
    if fast in table and int(k) <= FAST_ACCUM_MAX_K and _env.fp8_heuristic_fast_accum():
        return fast
    return name


def heuristic_ids(lane) -> tuple[str, ...]:
    """Every tile the heuristic can answer for `lane`."""
    table = _CANDIDATES.get(lane.name, {})
    return tuple(dict.fromkeys(cid for group in table.values() for cid in group))


def heuristic_config(m: int, n: int, k: int, arch: str | None = None, lane=None) -> str:
    """The `heuristic` sentinel's answer for (M, N, K) on `arch`; ``torch`` where the arch has no fp8 lane."""
    if lane is None:
        lane = native_lane(arch, FAMILY) if arch else None
    if lane is None:
        return "torch"
    return heuristic(lane, m, n, k, arch)
