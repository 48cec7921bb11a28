"""The M ladder: bucket edges of the dynamic dimension, and ladder fill points for a build.

The ladder (spec, "oasr.autotune()"): step 8 up to 128, x sqrt(2) up to 1024, x2 above::

    8, 16, 24, ..., 128, 184, 256, 360, 512, 728, 1024, 2048, 4096, ...

The x sqrt(2) rungs are ``128 * 2**(k/2)`` rounded to the *nearest* multiple of 8 (184, 360, 728); they are
computed from the exact power, not compounded from the previous rounded rung, so the even rungs stay exact
powers of two. Every rung is a multiple of 8 (tensor-core friendly M, and the census keys M in multiples of 8
anyway).

Two users:

* ``oasr_ops.autotune()`` keys a dynamic M by ``bucket_of(m)`` (the smallest rung >= m), so a new M in an already
  profiled bucket does not re-profile every candidate. Buckets are only cache keys: a result still serves only
  Ms at or below the M it was measured at (round-up semantics), which the caller enforces.
* ``oasr tune build`` measures a signature's census Ms plus ``fill_points(census_ms)``: rungs of the *fill*
  ladder (`fill_ladder`: the same rungs up to 1024, then x sqrt(2) instead of x2 above it) in the gaps between
  census points (and one rung around each end), so the partition sees how configs rank between the Ms the
  census happened to record. Above 1024 the bucket ladder's x2 spacing left regions spanning 2-2.4x in M with
  one measured point behind them; on the H200 that is where a region's config lost to cuBLAS between its
  measured points (issue 11), so the build samples every x sqrt(2) there.

Pure Python; no torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["LINEAR_STEP", "LINEAR_MAX", "SQRT2_MAX", "DEFAULT_MAX_M", "m_ladder", "fill_ladder", "bucket_of",
           "fill_points"]

LINEAR_STEP = 8
LINEAR_MAX = 128
SQRT2_MAX = 1024
#: Default top of a finite ladder: the largest M an ASR encoder GEMM sees in practice (batch 32 x 512 frames).
DEFAULT_MAX_M = 16384


def _round8(x: float) -> int:
    # Round half up (not Python's banker's rounding) so the rule is the obvious one.
    return int(math.floor(x / 8.0 + 0.5)) * 8


def _rungs(dense: bool = False) -> Iterable[int]:
    """The infinite ladder, increasing (``dense``: x sqrt(2) forever, the build's fill ladder)."""
    for m in range(LINEAR_STEP, LINEAR_MAX + 1, LINEAR_STEP):
        yield m
    k = 1
    while True:
        m = _round8(LINEAR_MAX * 2.0 ** (k / 2.0))
        if m > SQRT2_MAX and not dense:
            break
        yield m
        k += 1
    m = SQRT2_MAX
    while True:
        m *= 2
        yield m


def m_ladder(max_m: int = DEFAULT_MAX_M) -> list[int]:
    """All ladder rungs ``<= max_m``, increasing. ``max_m`` need not be a rung itself.

    >>> m_ladder(1024)[-8:]
    [120, 128, 184, 256, 360, 512, 728, 1024]
    """
    if max_m < LINEAR_STEP:
        return []
    out: list[int] = []
    for m in _rungs():
        if m > max_m:
            break
        out.append(m)
    return out


def fill_ladder(max_m: int = DEFAULT_MAX_M) -> list[int]:
    """The build's fill-point ladder up to ``max_m``: `m_ladder`'s rungs up to 1024, then x sqrt(2) (1448, 2048,
    2896, 4096, ...; every rung a multiple of 8, the even ones exact powers of two). Not a bucket ladder:
    `bucket_of` (the autotune cache key) keeps the x2 rungs.

    >>> fill_ladder(4096)[-6:]
    [728, 1024, 1448, 2048, 2896, 4096]
    """
    out: list[int] = []
    for m in _rungs(dense=True):
        if m > max_m:
            break
        out.append(m)
    return out


def _next_fill_rung(m: int) -> int:
    return next(r for r in _rungs(dense=True) if r >= m)


def bucket_of(m: int) -> int:
    """The bucket serving ``m``: the smallest ladder rung ``>= m`` (the bucket's upper edge).

    The ladder is unbounded above (x2 forever), so every positive m has a bucket. ``m <= 0`` is a ValueError:
    an empty GEMM is never dispatched to a tuned kernel.
    """
    m = int(m)
    if m <= 0:
        raise ValueError(f"M must be positive, got {m}")
    for r in _rungs():
        if r >= m:
            return r
    raise AssertionError("unreachable: the ladder is unbounded")


def fill_points(census_ms: Iterable[int], *, max_fill: int = 8, margin: int = 1,
                max_m: int | None = None) -> list[int]:
    """Fill-ladder rungs (`fill_ladder`) worth measuring for a signature besides its census Ms. Increasing,
    disjoint from the census.

    Candidates: every rung strictly between the smallest and the largest census M, plus ``margin`` rungs below
    the smallest and ``margin`` above the largest ("around": the rung above the top census M tells the
    partition how the top region's config behaves past the traffic, which a build entry's catch-all serves).
    Rungs equal to a census M are not candidates (already measured); rungs above ``max_m`` are dropped.

    At most ``max_fill`` are returned. When there are more candidates, they are chosen by farthest-point
    sampling in log M: repeatedly the candidate whose distance (|log ratio|) to the nearest already-measured
    point (census or chosen fill) is largest, ties to the smaller M. So the budget goes to the widest gaps
    first, and a dense census (streaming cohorts every few %) gets no fill at all when the budget is 0.
    """
    census = sorted({int(m) for m in census_ms if int(m) > 0})
    if not census or max_fill <= 0:
        return []
    lo, hi = census[0], census[-1]
    top = _next_fill_rung(hi)
    for _ in range(margin):
        top = _next_fill_rung(top + 1)
    ladder = fill_ladder(top)
    cset = set(census)
    below = [r for r in ladder if r < lo][-margin:] if margin > 0 else []
    inside = [r for r in ladder if lo < r < hi]
    above = [r for r in ladder if r > hi][:margin] if margin > 0 else []
    cands = sorted({r for r in below + inside + above if r not in cset and (max_m is None or r <= max_m)})
    if len(cands) <= max_fill:
        return cands

    chosen: list[int] = []
    measured = list(census)
    logs = {c: math.log(c) for c in cands}
    # Distance of each candidate to its nearest measured point; updated incrementally as fills are chosen.
    dist = {c: min(abs(logs[c] - math.log(p)) for p in measured) for c in cands}
    while len(chosen) < max_fill:
        best = max(cands, key=lambda c: (dist[c], -c))
        chosen.append(best)
        cands.remove(best)
        lb = logs[best]
        for c in cands:
            dist[c] = min(dist[c], abs(logs[c] - lb))
    return sorted(chosen)
