"""Pruning the build's arms with the cost model (spec "Building: partition and pruning"; issue 11, item 4).

Per point the build measures only the union of

* the cost model's top-``TOP_K`` (16) of the signature's modelled arms (`runtime.cost_model.rank` over the lane's
  configs feasible there), ranked by the uncalibrated structure and, where the arch's tuning file ships a model
  section (`database.model_params`), by that calibration too — the spec's "both models' top-k": the structure
  transfers to new widths, the calibration fits the measured ones;
* the forced set: the lane default, ``fused`` where the family has it, ``torch``, the partition's fallback and
  every pseudo-arm (a ``heuristic`` arm resolves per point) — and any arm the model cannot price (its id is not
  a config of a half-precision family: int8/fp8 tiles are not modelled, so scaled_mm measures every tile).

`collect_table` then cross-evaluates (partition.cross_eval_requests): every point's top-3 and the fallback are
measured at every other point, so the partition's DP can let one config serve a region of several points.
With pruning off (``--no-prune``) every arm is measured at every point and cross-evaluation asks for nothing.

`pruning_regret` replays that on a finished full build's log (pruning simulated by hiding the arms outside the
top-k; cross-evaluation reads them back from the log) and compares the resulting DB selection with the full one.
No torch, no GPU.
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..configs import SENTINELS, ConfigError, parse
from ..runtime import cost_model, database, registry
from ..runtime.arch_profile import ArchProfile, reference_profile
from .partition import DEFAULT_TOP_K, cross_eval_requests
from .points import Point

__all__ = ["TOP_K", "FORCED", "calibration_for", "models_for", "forced_ids", "model_dtype", "keep_ids",
           "collect_table", "pruning_regret"]

TOP_K = 16
FORCED = ("torch", "fused")
_HALF = {"half": "fp16", "fp16": "fp16", "bf16": "bf16"}

Models = Sequence["cost_model.Calibration | None"]


def calibration_for(family: str, arch: str) -> cost_model.Calibration | None:
    """The calibration the arch's current tuning file ships for `family` (user tier first), or None. A broken
    model section is warned about and ignored (pruning then ranks with the structure alone)."""
    try:
        raw = database.model_params(family, arch)
        return cost_model.from_json(raw) if raw is not None else None
    except (ValueError, OSError) as e:
        warnings.warn(f"oasr tune: the {arch}/{family} tuning file's model section is unusable ({e}); pruning "
                      "with the uncalibrated structure", stacklevel=2)
        return None


def models_for(family: str, arch: str) -> list[cost_model.Calibration | None]:
    """The rankings pruning takes the union of: the structure (None) and the file's calibration if any."""
    cal = calibration_for(family, arch)
    return [None] if cal is None else [None, cal]


def forced_ids(cands: Iterable[Any], default_id: str | None) -> set[str]:
    """Arms measured at every point whatever the model says (see the module doc)."""
    out = set(FORCED)
    if default_id:
        out.add(default_id)
    for c in cands:
        if c.fallback or c.resolve is not None:
            out.add(c.id)
    return out


def model_dtype(point: Point) -> str | None:
    """The cost model's dtype for a point, or None where it does not model the family: only the half-precision
    families (their signatures carry ``dt=``; the int8/fp8 ones do not, and their points say ``half`` only as the
    build's placeholder)."""
    if point.family:
        try:
            if not registry.get(point.family).dtyped:
                return None
        except (KeyError, ValueError):
            return None
    return _HALF.get(point.dtype)


def _modelled(cid: str) -> bool:
    if cid in SENTINELS:
        return False
    try:
        parse(cid)
    except ConfigError:
        return False
    return True


def keep_ids(ids: Sequence[str], point: Point, forced: Iterable[str], models: Models, *, top_k: int = TOP_K,
             profile: ArchProfile | None = None, arch: str = "sm90") -> list[str]:
    """The arms of `ids` to measure at `point`, in `ids` order: the forced ones, the ones the model cannot price,
    and each model's top-`top_k` of the rest. ``top_k <= 0`` or a family the model does not cover keeps all."""
    dt = model_dtype(point)
    if top_k <= 0 or dt is None:
        return list(ids)
    forced = set(forced)
    priced = [c for c in ids if c not in forced and _modelled(c)]
    if len(priced) <= top_k:
        return list(ids)
    prof = profile or reference_profile(arch)
    keep = set(forced) | {c for c in ids if c not in priced}
    m = max(int(point.m), 1)
    for cal in models:
        keep.update(c for c, _t in cost_model.rank(priced, m, point.n, point.k, dt, prof, cal)[:top_k])
    return [c for c in ids if c in keep]


# ---------------------------------------------------------------------------------------------- measuring

MeasureFn = Callable[[Point, list[str]], Mapping[str, Any]]  # (point, ids) -> {id: time-like}; failures left out


def collect_table(points: Sequence[Point], arms_at: Callable[[Point], list[str]], measure: MeasureFn, *,
                  fallback: str, feasible: Callable[[Point, str], bool] = lambda p, c: True,
                  k: int = DEFAULT_TOP_K) -> dict[int, dict[str, Any]]:
    """The measurement table of one signature: each point's `arms_at` arms, then cross-evaluation rounds
    (every point's top-`k` and the fallback at every other point where feasible) until nothing is left to ask.
    An arm is asked for at most once per point (a failed or gated-out arm is not retried), so it terminates."""
    by_m = {p.m: p for p in points}
    times: dict[int, dict[str, Any]] = {}
    tried: dict[int, set[str]] = {}
    for p in points:
        ids = arms_at(p)
        tried[p.m] = set(ids)
        times[p.m] = dict(measure(p, ids)) if ids else {}
    while True:
        asks: dict[int, list[str]] = defaultdict(list)
        for m, c in cross_eval_requests(times, k, always=[fallback]):
            if c not in tried[m]:
                asks[m].append(c)
        if not asks:
            return times
        for m, cs in sorted(asks.items()):
            tried[m].update(cs)
            ok = [c for c in cs if feasible(by_m[m], c)]
            if ok:
                times[m].update(measure(by_m[m], ok))


# ---------------------------------------------------------------------------------------------- regret report

def pruning_regret(records: Iterable[Mapping[str, Any]], arch: str, *, top_k: int = TOP_K,
                   models: Models = (None,), min_speedup: float = 1.05, max_loss: float = 0.02
                   ) -> dict[str, Any]:
    """Simulate pruning on a full build's log and score the pruned build against the full one.

    Per signature: the full build's entry (every logged arm at every point, `partition_validated` as the build
    runs it), and the pruned build's: each point keeps `keep_ids` of its logged arms, `collect_table`
    cross-evaluates reading the hidden arms back from the log, and the same partition runs on that table.
    Both entries are scored on the full log (regret vs the measured oracle, `evaluate`). Returns
    ``{"points", "arms_full", "arms_pruned" (measured, cross-evaluation included), "full": score, "pruned": score,
    "vs_full": {"geomean", "max", "worse_points"}}`` — vs_full compares the pruned selection's time with the full
    selection's at each point (0.01 = 1 % slower)."""
    from .from_log import log_tables, partition_logged
    from .candidates import candidates_for, fallback_id, parts_of
    from .evaluate import evaluate
    from ..runtime.registry import native_lane

    recs = [r for r in records]
    tables, weights, held, _l2 = log_tables(recs)
    full_entries: dict[str, Any] = {}
    pruned_entries: dict[str, Any] = {}
    n_full = n_pruned = 0
    for sig, table in tables.items():
        parts = parts_of(sig)
        cands = candidates_for(parts, arch)
        lane = native_lane(arch, parts.family)
        forced = forced_ids(cands, lane.default.id if lane else None)
        fb = fallback_id(cands)
        pts = [Point(m, signature=sig, family=parts.family, op=parts.op, dtype=parts.dt or "half", n=parts.n,
                     k=parts.k) for m in sorted(table)]
        full_entries[sig] = partition_logged(sig, table, weights[sig], held[sig], arch, min_speedup, max_loss)
        n_full += sum(len(r) for r in table.values())
        pruned = collect_table(
            pts, lambda p: keep_ids(sorted(table[p.m]), p, forced, models, top_k=top_k, arch=arch),
            lambda p, ids: {c: table[p.m][c] for c in ids if c in table[p.m]}, fallback=fb,
            feasible=lambda p, c: c in table[p.m])
        n_pruned += sum(len(r) for r in pruned.values())
        pruned_entries[sig] = partition_logged(sig, pruned, weights[sig], held[sig], arch, min_speedup, max_loss)
    res = evaluate(recs, {"full": full_entries, "pruned": pruned_entries}, miss=None)
    full, prn = res["selectors"]["full"], res["selectors"]["pruned"]
    times = {(p.signature, p.m): p for p in full.points}
    rel = []
    for q in prn.points:
        f = times.get((q.signature, q.m))
        if f is not None and f.regret is not None and q.regret is not None:
            rel.append((1.0 + q.regret) / (1.0 + f.regret) - 1.0)
    gm = math.exp(sum(math.log1p(x) for x in rel) / len(rel)) - 1.0 if rel else None
    return {"points": res["points"], "top_k": top_k, "arms_full": n_full, "arms_pruned": n_pruned,
            "full": full.as_dict(per_point=False), "pruned": prn.as_dict(per_point=False),
            "vs_full": {"geomean": gm, "max": max(rel) if rel else None,
                        "worse_points": sum(1 for x in rel if x > 1e-9), "n": len(rel)}}
