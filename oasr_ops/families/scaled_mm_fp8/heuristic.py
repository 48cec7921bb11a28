"""The fp8 family's untuned shape heuristic (the ``heuristic`` sentinel's answer; registered as the spec's
`heuristic`): the largest data-parallel tile still launching half a wave of CTAs (spec, "The heuristic
sentinel"), unfitted until a measured file exists.

Candidates, largest first, non-FastAccum only (the heuristic keeps the full-fp32 accumulation; a measured entry
may pick a FastAccum tile where it wins the gate and the clock), never Stream-K (only a measured entry may):

* M <= 64: the 64-row 64x128 ping-pong tile, then the swap-AB tiles 64x64x256 and 64x16x256 (vLLM's small-M
  tiles: the tile's 64 rows run over N, its 16 or 64 columns over the few tokens). 128-row tiles would be half
  padding.
* M > 64: 128x128 cooperative, 64x128 ping-pong, then the swap-AB 64x64x256 (where no tile fills half a wave:
  small N, its 64 rows over N give the most CTAs). Not 128x256 cooperative nor 128x128 2x1 ping-pong: with full
  fp32 accumulation each of their consumer warpgroups holds two 128-register accumulators and spills (8192^3 on
  the H200: 430 and 354 TFLOP/s against 958 for 128x128 cooperative). Chosen on the H200 build log
  benchmarks/logs/sm90_scaled_mm_fp8_build_v3.jsonl (every tile at 231 points): the heuristic's tile is 2.5 %
  slower than the best full-accumulation tile (geomean; max 30 %) and 12.6 % slower than the tuned answer
  (max 54 %), where the list led by those two tiles was 41 % / 55 % (max 299 % / 353 %)
  (docs/perf/scaled_mm_fp8.md). The heuristic serves an fp16 output where the DB or the policy says torch.

The first candidate whose CTA count (output tiles, ``ceil(M/tm) * ceil(N/tn)``; swapped for swap-AB tiles)
reaches half the SMs answers; where none does, the last (the one with the most CTAs). `heuristic_ids(lane)` (every tile it can answer) is
the family's production extra: those kernels are always built.
"""
from __future__ import annotations

import functools

from ...configs import parse
from ...runtime.registry import native_lane
from ..scaled_mm.heuristic import sm_count as _int8_sm_count

FAMILY = "scaled_mm_fp8"
_SMALL_M = 64
HALF_WAVE = 0.5

_CANDIDATES: dict[str, dict[str, tuple[str, ...]]] = {
    "sm90_fp8_wgmma": {
        "small": ("t64x128x128_c1x1_pp", "t64x64x256_c1x1_pp_swab", "t64x16x256_c1x1_pp_swab"),
        "large": ("t128x128x128_c1x1_coop", "t64x128x128_c1x1_pp", "t64x64x256_c1x1_pp_swab"),
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
    m = max(int(m), 1)
    return half_wave_config(table["small" if m <= _SMALL_M else "large"], m, int(n), sm_count(arch))


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
