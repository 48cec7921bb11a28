"""Regions that hold between measured points, part 2: the wave guard (step 8 of the partition, after
tune/validation.py).

Why: a region's CUTLASS config was measured at a few Ms; the DB serves it at every M in between. A data-parallel
tile's time is a step function of M — it runs ceil(CTAs / SMs) waves — while cuBLAS picks its tile per shape and is
close to smooth. Measured on the H200 (docs/perf/cost_model.md), every midpoint where a shipped region lost to
cuBLAS by more than 5 % sat just past a wave boundary of the region's tile (N=1024 K=1024, 128x128 tile: M=6112
runs 2.9 waves and wins 1.08x; M=4650 runs 2.2 waves and loses, 0.83x). Held-out validation points cannot catch
this: the wave pattern repeats every ~SMs x tile_m / N_tiles rows, far denser than any affordable measurement.

The rule: inside a region served by config c (not the fallback), predict c's speedup over the fallback at every M
from the measured speedup s_a at the nearest measured points a (one below, one above, where both arms were
measured, inside the region or not; a point measured at the same tile count as M alone when there is one) scaled by
the cost model's structure:  s(M) = s_a x [T_c(a) / T_f(a)] / [T_c(M) / T_f(M)]  (the cost model's fallback arm is
cuBLAS's smooth efficiency curve; the structure is uncalibrated, so the rule does not depend on a fit). c keeps
the Ms where min over the anchors of s(M) >= 1 + MARGIN; the rest go to the fallback. T_c is constant between two
multiples of the tile's M extent (x cluster) and the fallback's time grows with M, so checking each such interval
at its smallest M checks all of it. Only families whose fallback is ``torch`` (cuBLAS) and whose configs the cost
model describes are guarded; anything it cannot model is left as partitioned.

Capped at the anchor (``cap_at_anchor``, the families guarded through their spec's ``wave_guard_dtype``: fp8): the
prediction from an anchor is min(s_a, s(M)), so the guard only takes Ms away, never credits the fallback for
growing faster than the tile. The smooth fallback curve is the fp16 cuBLAS fit, not fp8's, and cuBLAS steps too
(N=1024 K=4096: torch._scaled_mm 25.5 us at M=3552, 26.6 us at M=3841, +4.5 % for +8 % M): uncapped, the fp8 guard
kept a 128x128 tile at M=3841 from a 0.996x anchor and it measured 0.85x on the H200. Leave-one-out on the fp8
build log (benchmarks/region_guard_loo.py): 8 of 195 held-out points below 0.98x uncapped, 2 capped, geomean
1.170x -> 1.169x (docs/perf/scaled_mm_fp8.md). The gemm family keeps the uncapped rule it was validated with.

Calibrated (``calibrated_ratio``, the same families): T_c is the cost model with per-config (a, b, R) fitted on
the signature's own measurements (tune.calibrate.fit_table: the structure's wave rounds, priced by this tile's
measured times) and T_f is the fallback's measured times interpolated linearly in M between the measured points,
instead of the uncalibrated structure over the fp16 cuBLAS curve. The structure alone could not see a tile whose
measured time sits off its wave line: N=3072 K=1024, 128x128 2x1 ping-pong measured 10.0 us at M=1024 and 14.4 us
at M=1907 (two and three waves) and 13.1 us at the held-out M=1025 (two waves; torch 11.1 us, 0.85x on the H200).
Fitted, two waves cost ~11.3 us: from the M=1907 anchor (1.21x) the prediction at M=1025 is 0.98x, so it goes to
torch. A fit per signature uses only points a leave-one-out drops (benchmarks/region_guard_loo.py) and is what
the build and ``--from-log`` both compute; configs measured at fewer than three points keep the structural ratio.

Fallback between its points (``fallback_time``). torch._scaled_mm's time is flat on a launch floor at small M and
rises once the GPU fills, so a straight line from a floor point to the next measured point overprices it in
between: N=K=512, torch 5.37 us at M=1907 and 13.51 us at M=9233, the line says 7.2 us at M=3552, measured 5.54 us;
with M=3552 left out (leave-one-out on the v3 build log) the guard kept the heuristic's 128x128 2x1 tile there,
measured 0.906x. In a gap whose lower point is on the floor (within LAUNCH_FLOOR_BAND of the smallest measured
time) the fallback is priced at max(t0, t1 x M / m1): it does not get faster with M, and its time per row does not
grow with M (a GEMM's efficiency rises with M), so this is a lower bound, and the guard only takes Ms away. Off
the floor the line stays: there the lower bound is loose and dropped 21 of 256 GPU-measured wins (1.13x geomean).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..configs import Config, ConfigError, parse
from ..runtime import arch_profile, cost_model, registry
from ..runtime.database import parse_signature
from .candidates import candidates_for, pseudo_arms
from .partition import Table, _medians
from .points import Point

__all__ = ["MARGIN", "guard_regions", "guard_entry", "guard_signature", "structural_ratio", "ratio_for_signature",
           "capped_at_anchor", "calibrated_ratio", "interpolated", "fallback_time", "pseudo_arm_resolver",
           "LAUNCH_FLOOR_BAND"]

#: A predicted win smaller than this is not trusted away from the points it was measured at. Chosen on the
#: shipped gemm DB's between-points check (benchmarks/logs/sm90_between_points.json): every midpoint measured
#: below 0.95x cuBLAS had a predicted speedup < 1.0; 1.03 leaves room for the prediction's error.
MARGIN = 0.03

# (config id, M) -> predicted T_config / T_fallback, the structural part of s(M).
RatioFn = Callable[[str, int], float | None]


def structural_ratio(n: int, k: int, dtype: str, arch: str, activation: bool = False) -> RatioFn:
    """T_config(M) / T_torch(M) from the cost model's uncalibrated structure on the arch's reference SKU (None for
    a config the model cannot describe)."""
    profile = arch_profile.reference_profile(arch)

    def ratio(cid: str, m: int) -> float | None:
        cfg = _config(cid)
        if cfg is None or cfg.generation not in ("2x", "3x"):
            return None
        t_c = cost_model.predict_s(cfg, m, n, k, dtype, profile, activation=activation)
        t_f = cost_model.predict_s("torch", m, n, k, dtype, profile, activation=activation)
        return t_c / t_f if math.isfinite(t_c) and t_f > 0 else None

    return ratio


def ratio_for_signature(sig: str, arch: str) -> RatioFn | None:
    """`structural_ratio` for a signature of a family the cost model describes, else None: a ``modelled`` family
    (a half-precision signature is modelled as fp16: bf16 has the same structure and peak), or one that names the
    operand dtype of its tiles (``wave_guard_dtype``: fp8's tiles are modelled as fp8 GEMMs against fp8 cuBLAS)."""
    parts = parse_signature(sig)
    if parts is None:
        return None
    spec = registry.get(parts.family)
    if spec.modelled:
        dtype = parts.dt if parts.dt in ("fp16", "bf16") else "fp16"
    elif spec.wave_guard_dtype:
        dtype = spec.wave_guard_dtype
    else:
        return None
    return structural_ratio(parts.n, parts.k, dtype, arch, activation=parts.op.endswith("activation"))


def interpolated(points: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """M -> time, linear between the measured (M, time) points and flat outside them (below the first: the
    smallest measured time, launch-bound; above the last: the guard never acts there)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("interpolated needs at least one measured point")

    def at(m: int) -> float:
        if m <= pts[0][0]:
            return pts[0][1]
        for (m0, t0), (m1, t1) in zip(pts, pts[1:]):
            if m <= m1:
                return t0 + (t1 - t0) * (m - m0) / (m1 - m0)
        return pts[-1][1]
    return at


#: A fallback time within this factor of its smallest measured time is taken to be on its launch floor (module
#: doc, "Fallback between its points"). Chosen on the three fp8 H200 build logs' leave-one-out and the GPU's
#: held-out rows (benchmarks/region_guard_loo.py): 1.12-1.20 all keep no logged loser and drop no measured winner;
#: 1.10 keeps a 0.91x loser (v1 log), 1.25 drops a measured 1.05x winner.
LAUNCH_FLOOR_BAND = 1.15


def fallback_time(points: Sequence[tuple[int, float]], band: float = LAUNCH_FLOOR_BAND) -> Callable[[int], float]:
    """M -> the fallback's time between its measured (M, time) points: `interpolated`, except in a gap whose
    lower point (m0, t0) is on the launch floor (t0 <= band x the smallest measured time), where it is
    min(linear, max(t0, t1 x M / m1)) — the lower bound of a time that does not fall with M and whose time per
    row does not rise with M (module doc)."""
    pts = sorted(points)
    linear = interpolated(pts)
    floor = band * min(t for _, t in pts)

    def at(m: int) -> float:
        for (m0, t0), (m1, t1) in zip(pts, pts[1:]):
            if m0 < m < m1:
                return min(linear(m), max(t0, t1 * m / m1)) if t0 <= floor else linear(m)
        return linear(m)
    return at


def calibrated_ratio(sig: str, times: Table, fallback: str, arch: str) -> RatioFn | None:
    """T_config(M) / T_fallback(M) calibrated on the signature's measurements (module doc): the cost model with
    each config's (a, b, R) fitted on its measured points over the fallback's measured times between its points
    (`fallback_time`).
    A config with fewer than three measured points gets `structural_ratio`. None for a signature whose family is
    not guarded through ``wave_guard_dtype``, or with fewer than two measured fallback points."""
    from ..runtime.cost_model import Calibration
    from .calibrate import fit_table

    parts = parse_signature(sig)
    if parts is None or not capped_at_anchor(sig):
        return None
    dtype = registry.get(parts.family).wave_guard_dtype
    med = _medians(times)
    fb = [(m, row[fallback]) for m, row in med.items() if fallback in row]
    if len(fb) < 2:
        return None
    profile = arch_profile.reference_profile(arch)
    cal = Calibration(arch_family=arch, dtype=dtype, configs=fit_table(med, parts.n, parts.k, dtype, profile))
    t_fallback = fallback_time(fb)
    structural = structural_ratio(parts.n, parts.k, dtype, arch)

    def ratio(cid: str, m: int) -> float | None:
        cfg = _config(cid)
        if cfg is None or cid not in cal.configs:
            return structural(cid, m)
        t_c = cost_model.predict_s(cfg, m, parts.n, parts.k, dtype, profile, cal)
        return t_c / t_fallback(m) if math.isfinite(t_c) and t_c > 0 else None

    return ratio


@functools.lru_cache(maxsize=512)
def _config(cid: str) -> Config | None:
    try:
        return parse(cid)
    except ConfigError:
        return None  # a sentinel or another family's id: not something the structure describes


def _m_step(cid: str) -> int | None:
    """The M extent of one tile row (x cluster): the tile's N extent for a swap-AB config, whose tile columns run
    over the tokens."""
    cfg = _config(cid)
    if cfg is None:
        return None
    return cfg.tile[1] * cfg.cluster[1] if cfg.swap_ab else cfg.tile[0] * cfg.cluster[0]


def _merge(regions: list[list[Any]]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for hi, cfg in regions:
        if out and out[-1][1] == cfg:
            out[-1][0] = hi
        else:
            out.append([hi, cfg])
    return out


def capped_at_anchor(sig: str) -> bool:
    """Whether the guard caps its prediction at the anchor's measured speedup for this signature (module doc):
    for a family guarded through ``wave_guard_dtype`` rather than a cost-model tier."""
    parts = parse_signature(sig)
    if parts is None:
        return False
    spec = registry.get(parts.family)
    return not spec.modelled and spec.wave_guard_dtype is not None


def guard_regions(regions: Sequence[Sequence[Any]], times: Table, fallback: str, ratio: RatioFn,
                  margin: float = MARGIN, cap_at_anchor: bool = False,
                  resolve: Callable[[str, int], str] | None = None) -> tuple[list[list[Any]], list[str]]:
    """The regions with every stretch of M where a region's config is predicted to lose (by the rule above)
    handed to ``fallback``; and one note per region that changed. The catch-all row (``[None, cfg]``) is left as
    it is: above the largest measured M the build already serves the fallback. ``cap_at_anchor``: a prediction
    never exceeds the anchor's measured speedup (module doc). ``resolve(cfg, m)``: the tile a pseudo-arm region
    (``heuristic``) runs at M — its stretches, anchors and predictions are that tile's; without it (or for a
    concrete config) the config itself."""
    med = _medians(times)
    out: list[list[Any]] = []
    notes: list[str] = []
    lo = 0
    for hi, cfg in regions:
        if hi is None or cfg == fallback:
            out.append([hi, cfg])
            lo = hi if hi is not None else lo
            continue
        hi = int(hi)
        # anchors on both sides, also outside the region: a measured loss just below the region's first point
        # says as much about the Ms above it as the win the region was chosen for
        anchors = sorted(m for m in med if cfg in med[m] and fallback in med[m])

        def tile(m: int, cfg: str = cfg) -> str:
            return resolve(cfg, m) if resolve is not None and _config(cfg) is None else cfg
        base = {a: ratio(tile(a), a) for a in anchors}
        if not anchors or _m_step(tile(lo + 1)) is None or any(v is None for v in base.values()):
            out.append([hi, cfg])
            lo = hi
            continue
        pieces: list[list[Any]] = []
        lost = 0
        start = lo + 1
        while start <= hi:
            step = _m_step(tile(start)) or 1
            end = min(hi, (-(-start // step)) * step)  # the interval of M with the same tile count as `start`
            r_m = ratio(tile(start), start)
            # a point measured in this stretch runs the same waves: it alone speaks for it
            near = [a for a in anchors if start <= a <= end] or (
                [a for a in anchors if a <= start][-1:] + [a for a in anchors if a >= start][:1])
            measured = {a: med[a][fallback] / med[a][cfg] for a in near}
            preds = [min(measured[a], measured[a] * base[a] / r_m) if cap_at_anchor else measured[a] * base[a] / r_m
                     for a in near] if r_m else []
            keep = bool(preds) and min(preds) >= 1.0 + margin
            pieces.append([end, cfg if keep else fallback])
            lost += 0 if keep else end - start + 1
            start = end + 1
        merged = _merge(pieces)
        if lost:
            notes.append(f"M in ({lo}, {hi}]: {cfg} kept on {len([p for p in merged if p[1] == cfg])} stretch(es); "
                         f"{lost} of {hi - lo} Ms to {fallback} (predicted < {1 + margin:.2f}x past a wave edge)")
        out.extend(merged)
        lo = hi
    return _merge(out), notes


def guard_entry(entry: Mapping[str, Any], times: Table, fallback: str, ratio: RatioFn | None,
                margin: float = MARGIN, cap_at_anchor: bool = False,
                resolve: Callable[[str, int], str] | None = None) -> dict[str, Any]:
    """`guard_regions` applied to a partition's DB entry (regions + notes); unchanged without a ratio."""
    if ratio is None or fallback != "torch":
        return dict(entry)
    regions, notes = guard_regions(entry["regions"], times, fallback, ratio, margin, cap_at_anchor, resolve)
    return {**entry, "regions": regions, "notes": [*entry.get("notes", []), *notes]}


def pseudo_arm_resolver(sig: str, arch: str) -> Callable[[str, int], str] | None:
    """(pseudo-arm id, M) -> the tile it runs for the signature's family on `arch` (the ``heuristic`` arm's
    current rule), or None where the family has no pseudo-arm. Why the guard needs it: a ``heuristic`` region
    runs a data-parallel tile like any other, and unguarded it kept a measured 0.92x loser of the fp8 family
    (N=K=512, M=4096) once the heuristic answered that tile (session 36)."""
    parts = parse_signature(sig)
    arms = {c.id: c for c in pseudo_arms(candidates_for(parts, arch))} if parts is not None else {}
    if not arms:
        return None

    def resolve(cid: str, m: int) -> str:
        arm = arms.get(cid)
        return arm.config_at(Point(m, n=parts.n, k=parts.k, op=parts.op, family=parts.family)) if arm else cid
    return resolve


def guard_signature(entry: Mapping[str, Any], times: Table, fallback: str, sig: str, arch: str,
                    margin: float = MARGIN) -> dict[str, Any]:
    """`guard_entry` with the signature's family's ratio and cap (what the build and ``--from-log`` run): the
    calibrated ratio for the families guarded through ``wave_guard_dtype``, the structural one otherwise; a
    pseudo-arm region is guarded as the tiles it resolves to."""
    ratio = calibrated_ratio(sig, times, fallback, arch) or ratio_for_signature(sig, arch)
    return guard_entry(entry, times, fallback, ratio, margin, capped_at_anchor(sig), pseudo_arm_resolver(sig, arch))
