"""Partition one signature's measurements into DB regions (spec, "Building: partition and pruning").

Input: a measurement table ``times[m][config]`` for one signature (seconds of the build objective — GPU time
plus alpha x host issue time, already combined by the harness — as a float, an ``Estimate`` or a
``(median_s, sigma_s, n)`` triple; a config missing at a point was not measured there) and per-point weights
(the census's share of GPU time or calls at that M; fill points usually get a small weight).

Pipeline (``partition_signature`` runs all of it; each step is a pure function the GPU builder can call alone):

1. ``top_k``: each point's 3 fastest configs.
2. ``cross_eval_requests``: the (point, config) pairs still to measure so every point's top-3 is measured at every
   other point. The builder measures them and calls again until it returns nothing (a cross-evaluated config
   can enter a point's top-3; the loop ends because the config set is finite).
3. ``set_cover``: weighted greedy set cover: a small shared config set such that every point has a config
   within ``tol`` (3 %) of its best.
4. ``segment``: DP over the M axis into contiguous regions, each served by one cover config, minimising the
   weighted time plus a small per-region penalty (against fragmentation on noise).
5. ``apply_gate``: a region keeps its config only if it beats the fallback (``default`` / ``torch``) by
   ``min_speedup`` (1.05) in weighted time over the region's points; otherwise the fallback serves it.
6. ``to_regions``: ``[[m_hi, config], ..., [None, catch_all]]`` with m_hi = the largest measured M in the
   region. Regions round UP: M takes the first region with m_hi >= M, so a config serves only Ms at or below
   the largest M it was measured at in its region.

7. (tune/validation.py) the regions are checked at held-out Ms between the measured ones.

Also ``thin_census`` (``--thin --max-points``) which runs before measuring.

No torch, no GPU. numpy only for the DP's inner minimum.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Union

import numpy as np

from .points import Point
from .stats import Estimate

__all__ = [
    "DEFAULT_TOL", "DEFAULT_MIN_SPEEDUP", "DEFAULT_TOP_K", "DEFAULT_REGION_PENALTY",
    "CensusPoint", "Segment", "Partition",
    "normalize_table", "effective_weights", "top_k", "cross_eval_requests", "covers", "set_cover",
    "segment", "apply_gate", "to_regions", "partition_signature", "thin_census", "DEFAULT_MAX_LOSS",
]

DEFAULT_TOL = 0.03
DEFAULT_MIN_SPEEDUP = 1.05
DEFAULT_TOP_K = 3
#: A new region must save this fraction of the signature's total oracle weighted time to be worth it.
DEFAULT_REGION_PENALTY = 0.002
#: A region config may be at most this much slower than the fallback at any measured or held-out point.
DEFAULT_MAX_LOSS = 0.02

TimeLike = Union[float, int, Estimate, Sequence[float]]
Table = Mapping[int, Mapping[str, TimeLike]]


# ---------------------------------------------------------------------------------------------- inputs

def _as_estimate(v: TimeLike) -> Estimate:
    if isinstance(v, Estimate):
        return v
    if isinstance(v, (int, float)):
        return Estimate(float(v), 0.0, 0)
    seq = list(v)  # (median_s, sigma_s, n), the DB evidence triple
    return Estimate(float(seq[0]), float(seq[1]) if len(seq) > 1 else 0.0, int(seq[2]) if len(seq) > 2 else 0)


def normalize_table(times: Table) -> dict[int, dict[str, Estimate]]:
    """``times`` with int Ms and ``Estimate`` values; non-finite or non-positive times are dropped (a failed
    arm is 'not measured', never 'infinitely fast')."""
    out: dict[int, dict[str, Estimate]] = {}
    for m, row in times.items():
        r: dict[str, Estimate] = {}
        for c, v in row.items():
            e = _as_estimate(v)
            if math.isfinite(e.median_s) and e.median_s > 0:
                r[str(c)] = e
        out[int(m)] = r
    return out


def _medians(times: Table) -> dict[int, dict[str, float]]:
    return {m: {c: e.median_s for c, e in row.items()} for m, row in normalize_table(times).items()}


def effective_weights(ms: Iterable[int], weights: Mapping[int, float] | None,
                      floor: float = 0.01) -> dict[int, float]:
    """Weights the optimisation uses. Missing weights are 0; if no point has a positive weight, all get 1;
    otherwise each point gets at least ``floor`` x the mean positive weight, so a zero-weight fill point still
    breaks ties instead of being served by whatever region happens to absorb it."""
    ms = list(ms)
    w = {m: max(0.0, float((weights or {}).get(m, 0.0))) for m in ms}
    pos = [v for v in w.values() if v > 0]
    if not pos:
        return {m: 1.0 for m in ms}
    lo = floor * (sum(pos) / len(pos))
    return {m: max(v, lo) for m, v in w.items()}


# ---------------------------------------------------------------------------------------------- steps 1-3

def top_k(times: Table, k: int = DEFAULT_TOP_K) -> dict[int, list[str]]:
    """Each point's ``k`` fastest measured configs, fastest first (ties by name)."""
    med = _medians(times)
    return {m: [c for c, _ in sorted(row.items(), key=lambda kv: (kv[1], kv[0]))[:k]] for m, row in med.items()}


def cross_eval_requests(times: Table, k: int = DEFAULT_TOP_K,
                        always: Iterable[str] = ()) -> list[tuple[int, str]]:
    """(point, config) pairs not yet measured such that, once measured, every point's top-``k`` (and every
    config in ``always``, e.g. the fallback) is measured at every point. Sorted by (m, config).

    The builder loops: measure the returned pairs, add them to the table, call again, until empty.
    """
    med = _medians(times)
    need = set(always)
    for cs in top_k(times, k).values():
        need.update(cs)
    return sorted((m, c) for m in med for c in need if c not in med[m])


def covers(times: Table, tol: float = DEFAULT_TOL) -> dict[str, set[int]]:
    """config -> the points where it is within ``tol`` of that point's best measured time."""
    med = _medians(times)
    out: dict[str, set[int]] = {}
    for m, row in med.items():
        if not row:
            continue
        best = min(row.values())
        for c, t in row.items():
            if t <= best * (1.0 + tol):
                out.setdefault(c, set()).add(m)
    return out


def set_cover(times: Table, weights: Mapping[int, float] | None = None, tol: float = DEFAULT_TOL,
              candidates: Collection[str] | None = None, k: int = DEFAULT_TOP_K) -> list[str]:
    """Weighted greedy set cover: configs (in the order chosen) such that every point with a measurement has one
    within ``tol`` of its best.

    Candidates default to the union of the points' top-``k`` (the cross-evaluated configs: only they are
    measured everywhere, which the DP needs); each point's best is among them, so a cover always exists.
    Greedy step: the candidate covering the most uncovered weight; ties -> more uncovered points, then the
    lower sum of w x t/best over the newly covered points (closer to the oracle), then the name.
    """
    med = _medians(times)
    pts = [m for m, row in med.items() if row]
    w = effective_weights(pts, weights)
    if candidates is None:
        cand = sorted({c for cs in top_k(times, k).values() for c in cs})
    else:
        cand = sorted(set(candidates))
    cov = covers(times, tol)
    best = {m: min(med[m].values()) for m in pts}
    uncovered = set(pts)
    chosen: list[str] = []
    while uncovered:
        def key(c: str) -> tuple[float, int, float, str]:
            new = cov.get(c, set()) & uncovered
            return (-sum(w[m] for m in new), -len(new), sum(w[m] * med[m][c] / best[m] for m in new), c)

        pick = min((c for c in cand if c not in chosen), key=key, default=None)
        if pick is None or not (cov.get(pick, set()) & uncovered):
            raise ValueError(f"points {sorted(uncovered)} cannot be covered by candidates {cand}")
        chosen.append(pick)
        uncovered -= cov[pick]
    return chosen


# ---------------------------------------------------------------------------------------------- steps 4-6

@dataclass
class Segment:
    """A contiguous run of measured points served by one config.

    ``dp_config``: what the DP chose; ``config``: what serves it after the gate (the fallback when the gate
    failed). ``speedup``: weighted fallback time / weighted dp_config time over the points where both were
    measured (None when the fallback was measured at none of them).
    """

    ms: tuple[int, ...]
    config: str
    dp_config: str = ""
    speedup: float | None = None

    @property
    def m_hi(self) -> int:
        return self.ms[-1]


def segment(times: Table, weights: Mapping[int, float] | None, configs: Sequence[str],
            region_penalty: float = DEFAULT_REGION_PENALTY) -> list[Segment]:
    """Optimal segmentation of the sorted measured Ms into contiguous regions, each served by one of
    ``configs``, minimising  sum_p w_p t_p(config of p's region) + penalty x #regions,  with
    penalty = ``region_penalty`` x sum_p w_p x best_p (a fraction of the oracle's total weighted time, so it is
    scale-free). A config can serve a region only if it was measured at every point in it.

    Ties: fewer regions (by the penalty), then the earliest split, then the earlier config in ``configs``.
    """
    med = _medians(times)
    ms = sorted(m for m, row in med.items() if row)
    if not ms:
        return []
    if not configs:
        raise ValueError("segment needs at least one config")
    w = effective_weights(ms, weights)
    n, C = len(ms), len(configs)
    cost = np.full((C, n), np.inf)
    for ci, c in enumerate(configs):
        for j, m in enumerate(ms):
            if c in med[m]:
                cost[ci, j] = w[m] * med[m][c]
    # Prefix sums of finite costs and of unmeasured counts: a region [i, j) is feasible for c iff no gap in it.
    finite = np.where(np.isfinite(cost), cost, 0.0)
    pre = np.concatenate([np.zeros((C, 1)), np.cumsum(finite, axis=1)], axis=1)
    gaps = np.concatenate([np.zeros((C, 1)), np.cumsum(~np.isfinite(cost), axis=1)], axis=1)
    oracle = sum(w[m] * min(med[m].values()) for m in ms)
    pen = region_penalty * oracle

    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back: list[tuple[int, int]] = [(-1, -1)] * (n + 1)
    for j in range(1, n + 1):
        seg = pre[:, j:j + 1] - pre[:, :j]                      # (C, j): cost of region [i, j) per config
        seg = np.where(gaps[:, j:j + 1] - gaps[:, :j] > 0, np.inf, seg)
        ci = np.argmin(seg, axis=0)                               # best config per start i (first on ties)
        tot = best[:j] + pen + seg[ci, np.arange(j)]
        i = int(np.argmin(tot))                                   # first i on ties: the earliest split
        best[j] = tot[i]
        back[j] = (i, int(ci[i]))
    if not math.isfinite(best[n]):
        raise ValueError("no feasible segmentation: some point is measured by none of the configs")
    out: list[Segment] = []
    j = n
    while j > 0:
        i, ci = back[j]
        out.append(Segment(ms=tuple(ms[i:j]), config=configs[ci], dp_config=configs[ci]))
        j = i
    return out[::-1]


def _merge(segs: list[Segment]) -> list[Segment]:
    """Join adjacent segments served by the same config (after the gate two fallbacks can touch)."""
    out: list[Segment] = []
    for s in segs:
        if out and out[-1].config == s.config:
            prev = out[-1]
            out[-1] = Segment(ms=prev.ms + s.ms, config=s.config,
                              dp_config=prev.dp_config if prev.dp_config == s.dp_config else s.config,
                              speedup=None)
        else:
            out.append(s)
    return out


def apply_gate(segments: Sequence[Segment], times: Table, weights: Mapping[int, float] | None, fallback: str,
               min_speedup: float = DEFAULT_MIN_SPEEDUP) -> list[Segment]:
    """Keep each region's config only if  sum w t_fallback / sum w t_config >= min_speedup  over the region's
    points where both were measured; otherwise the fallback serves the region. With no such point there is no
    evidence of a win, so the fallback is kept too. Adjacent regions that end up on the same config merge.
    """
    med = _medians(times)
    w = effective_weights(med.keys(), weights)
    out: list[Segment] = []
    for s in segments:
        c = s.dp_config or s.config
        if c == fallback:
            out.append(Segment(s.ms, fallback, c, 1.0))
            continue
        both = [m for m in s.ms if c in med[m] and fallback in med[m]]
        if not both:
            out.append(Segment(s.ms, fallback, c, None))
            continue
        sp = sum(w[m] * med[m][fallback] for m in both) / sum(w[m] * med[m][c] for m in both)
        # The small epsilon keeps an exact 1.05x (common in hand-made tables) on the winning side of the gate.
        out.append(Segment(s.ms, c if sp >= min_speedup * (1 - 1e-12) else fallback, c, sp))
    return _merge(out)


def to_regions(segments: Sequence[Segment], catch_all: str | None = "fallback",
               fallback: str | None = None) -> list[list[Any]]:
    """DB regions ``[[m_hi, config], ...]`` (round-up) plus the catch-all row.

    ``catch_all``:
      * ``"fallback"`` (default; a build entry): append ``[None, fallback]`` — above the largest measured M the
        fallback serves, because a config serves only sizes at or below where it was measured (the spec's
        example entry ends ``[null, "torch"]``). If the last region is already the fallback it becomes the
        catch-all itself.
      * ``"last"``: the last region's config becomes the catch-all (its m_hi is replaced by None).
      * ``None``: no catch-all (an ``oasr_ops.autotune()`` entry; a larger M falls through to the next tier).
      * any other string: that config is appended as ``[None, catch_all]`` (merged the same way).
    """
    regs: list[list[Any]] = [[s.m_hi, s.config] for s in segments]
    if catch_all is None or not regs:
        return regs
    if catch_all == "last":
        regs[-1][0] = None
        return regs
    tail = fallback if catch_all == "fallback" else catch_all
    if tail is None:
        raise ValueError("catch_all='fallback' needs the fallback name")
    if regs[-1][1] == tail:
        regs[-1][0] = None
    else:
        regs.append([None, tail])
    return regs


# ---------------------------------------------------------------------------------------------- all of it

@dataclass
class Partition:
    """One signature's result: DB ``regions``, per-point ``evidence`` and human ``notes``; ``cover`` and
    ``segments`` explain how they were reached (not written to the DB)."""

    regions: list[list[Any]]
    evidence: dict[str, dict[str, Any]]
    notes: list[str]
    cover: list[str]
    segments: list[Segment]

    def entry(self, source: str = "aot") -> dict[str, Any]:
        """The DB entry: ``{"regions", "evidence", "source", "notes"}``."""
        return {"regions": self.regions, "evidence": self.evidence, "source": source, "notes": self.notes}


def _ratio(med_row: Mapping[str, float], num: str, den: str) -> float | None:
    if num in med_row and den in med_row:
        return med_row[num] / med_row[den]
    return None


def partition_signature(
    times: Table,
    weights: Mapping[int, float] | None = None,
    *,
    fallback: str = "default",
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
    tol: float = DEFAULT_TOL,
    k: int = DEFAULT_TOP_K,
    region_penalty: float = DEFAULT_REGION_PENALTY,
    catch_all: str | None = "fallback",
    starred: Collection[int] = (),
    evidence_extra: Mapping[int, Mapping[str, Any]] | None = None,
    max_loss: float | None = None,
) -> Partition:
    """Steps 1-6 for one signature. The table should be cross-evaluated already (``cross_eval_requests`` empty);
    if not, a config is simply not eligible for a region containing a point it was not measured at.

    ``max_loss``: when given, a config may not serve a region containing a point where it is slower than the
    fallback by more than this fraction (the weighted gate alone lets a heavy point carry a losing light one);
    the fallback joins the DP's candidates so every point stays servable.

    ``fallback`` must be measured at least at one point (ValueError otherwise: the gate would silently hand the
    whole axis to an arm nobody timed). ``starred``: points whose note gets a ``*`` after M (the builder marks
    must-tune points). ``evidence_extra[m]`` is merged into that point's evidence (e.g. ``{"_l2": "cold"}``).

    Evidence per point: top-k, the served config and the fallback, each ``[median_s, sigma_s, n]``.
    Notes per point: ``"M=416: b32x64x64_w16x32x64_s3 (2.00x vs default)"`` (fallback time / served time).
    """
    est = normalize_table(times)
    med = {m: {c: e.median_s for c, e in row.items()} for m, row in est.items()}
    ms = sorted(m for m, row in med.items() if row)
    if not ms:
        return Partition(regions=[], evidence={}, notes=[], cover=[], segments=[])
    if not any(fallback in med[m] for m in ms):
        raise ValueError(f"fallback arm {fallback!r} was measured at no point")
    tops = top_k(times, k)
    cover = set_cover(times, weights, tol=tol, k=k)
    if max_loss is None:
        segs = segment(times, weights, cover, region_penalty=region_penalty)
    else:
        guarded = {m: {c: v for c, v in est[m].items()
                       if c == fallback or fallback not in med[m] or med[m][c] <= (1 + max_loss) * med[m][fallback]}
                   for m in est}
        segs = segment(guarded, weights, list(dict.fromkeys([*cover, fallback])), region_penalty=region_penalty)
    segs = apply_gate(segs, times, weights, fallback, min_speedup)
    regions = to_regions(segs, catch_all=catch_all, fallback=fallback)

    served = {m: s.config for s in segs for m in s.ms}
    evidence: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for m in ms:
        row = est[m]
        show = list(dict.fromkeys([*tops[m], served[m], fallback]))
        ev: dict[str, Any] = {c: row[c].as_evidence() for c in show if c in row}
        ev.update((evidence_extra or {}).get(m, {}))
        evidence[f"M={m}"] = ev
        tag = f"M={m}{'*' if m in starred else ''}"
        cfg = served[m]
        if cfg != fallback:
            r = _ratio(med[m], fallback, cfg)
            notes.append(f"{tag}: {cfg} ({r:.2f}x vs {fallback})" if r is not None
                         else f"{tag}: {cfg} ({fallback} not measured here)")
        else:
            best = tops[m][0]
            r = _ratio(med[m], fallback, best)
            if best == fallback or r is None:
                notes.append(f"{tag}: {fallback} (fallback)")
            else:
                notes.append(f"{tag}: {fallback} (fallback kept; best {best} {r:.2f}x)")
    return Partition(regions=regions, evidence=evidence, notes=notes, cover=cover, segments=segs)


# ---------------------------------------------------------------------------------------------- thinning

# One census M of a signature: the offline tools' shared point (m, weight, calls, must_tune, eager_fraction, ...).
CensusPoint = Point


def _get(p: Any, name: str, default: Any) -> Any:
    return p.get(name, default) if isinstance(p, Mapping) else getattr(p, name, default)


def _with(p: Any, **kv: Any) -> Any:
    if isinstance(p, Mapping):
        d = dict(p)
        d.update(kv)
        return d
    if is_dataclass(p):
        names = {f.name for f in fields(p)}
        return replace(p, **{k: v for k, v in kv.items() if k in names})
    raise TypeError(f"census point must be a dict or a dataclass, got {type(p).__name__}")


def thin_census(points: Sequence[Any], max_points: int) -> list[Any]:
    """At most ``max_points`` points of one signature (spec ``build.thin_census``), sorted by M.

    The smallest and the largest M stay. The log-M range [log m_min, log m_max] is cut into ``max_points - 2``
    equal bins; each bin keeps its heaviest interior point (ties: more calls, then the smaller M). A dropped
    point's weight and calls are added to, and its must_tune flag OR-ed into, the next kept point above it —
    the point whose region will serve it under round-up. eager_fraction (not named by the spec) becomes the
    calls-weighted mean of the merged points, so the objective's alpha still describes the merged calls.

    Points are dicts or dataclasses with m, weight, calls, must_tune, eager_fraction (missing fields read as
    0/False); the result has the input's kind, copied (inputs are not modified). Duplicate Ms: ValueError.
    ``len(points) <= max_points`` returns a sorted copy. ``max_points < 2`` with more points: ValueError.
    """
    pts = sorted(points, key=lambda p: int(_get(p, "m", 0)))
    ms = [int(_get(p, "m", 0)) for p in pts]
    if len(set(ms)) != len(ms):
        raise ValueError("thin_census: duplicate M in one signature")
    if len(pts) <= max_points:
        return [_with(p) for p in pts]
    if max_points < 2:
        raise ValueError("max_points must be >= 2 (the smallest and largest M always stay)")
    lo, hi = math.log(ms[0]), math.log(ms[-1])
    nb = max_points - 2
    keep = {0, len(pts) - 1}
    if nb > 0:
        width = (hi - lo) / nb
        heaviest: dict[int, int] = {}
        for i in range(1, len(pts) - 1):
            b = min(int((math.log(ms[i]) - lo) / width), nb - 1)
            key = (float(_get(pts[i], "weight", 0.0)), int(_get(pts[i], "calls", 0)), -ms[i])
            j = heaviest.get(b)
            if j is None or key > (float(_get(pts[j], "weight", 0.0)), int(_get(pts[j], "calls", 0)), -ms[j]):
                heaviest[b] = i
        keep.update(heaviest.values())

    out: list[Any] = []
    acc_w, acc_c, acc_must, acc_eager = 0.0, 0, False, 0.0  # dropped points waiting for the next kept one
    for i, p in enumerate(pts):
        w = float(_get(p, "weight", 0.0))
        c = int(_get(p, "calls", 0))
        must = bool(_get(p, "must_tune", False))
        ef = float(_get(p, "eager_fraction", 0.0))
        if i not in keep:
            acc_w += w
            acc_c += c
            acc_must = acc_must or must
            acc_eager += ef * c
            continue
        calls = c + acc_c
        eager = (ef * c + acc_eager) / calls if calls > 0 else ef
        out.append(_with(p, weight=w + acc_w, calls=calls, must_tune=must or acc_must, eager_fraction=eager))
        acc_w, acc_c, acc_must, acc_eager = 0.0, 0, False, 0.0
    return out
