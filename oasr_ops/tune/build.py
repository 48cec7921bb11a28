"""`oasr tune build`: census points -> measurements (bench.py) -> partition -> tuning DB entries, for any
registered family with a candidate factory (`oasr_ops.tune.candidates`; `--family` picks one).

Per signature:
  1. points = census Ms (thinned with --thin/--max-points) + fill points (shapes.fill_points: the fill ladder,
     x sqrt(2) above 1024) + validation points (validation.geometric_midpoints between consecutive measured Ms;
     --no-validate drops them); a family may also take points from another family's census signatures
     (``handlers["census_from"]``: the int8 family measures every gemm site `quantize_` turns into a scaled_mm);
  2. arms = the family's candidates for the signature (gemm: `torch`, the lane default, then every feasible
     config of the native lane; scaled_mm: every eligible tile and the `heuristic` pseudo-arm), each passing its
     numeric gate first (a tolerance gate once, at the middle point; a bitwise gate at every point);
  3. per point, the arms the cost model keeps (prune.keep_ids: its top-16 + the forced set; --no-prune keeps
     all), then cross-evaluation (prune.collect_table: every point's top-3 and the fallback at every point),
     measured with bench.measure (CUDA graphs, separator, cold/warm weights, interleaved shuffled rounds); where
     the family charges host issue cost the objective adds alpha x that cost, alpha = the point's eager fraction;
  4. partition against the family's fallback arm (--min-speedup gate, --max-loss guard), checked at the
     validation points (validation.partition_validated: a region whose config loses there is split or falls
     back), then the wave guard (region_guard.guard_signature: inside a CUTLASS region, the stretches of M past a
     wave edge of its tile where the cost model's structure predicts the measured win turns into a loss go to
     cuBLAS), and write the entry with evidence and notes through database.publish, with the cost model fitted
     on the log (tune.calibrate.fit; the families it covers) as the file's ``model`` section;
  5. checkpoint the finished signature (a JSON per signature under the checkpoint directory), so an
     interrupted build resumes where it stopped.
Every measurement is appended to a JSONL log (one record per arm per point; validation points' records carry
``"validation": true``, must-tune points' ``"must_tune": true``; ``"pruned"`` lists the arms the
model left out, on the point's first record) for `oasr tune evaluate` and `--from-log`; every line is still one
measurement, and logs written before these fields load unchanged.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import families as _families  # noqa: F401  (fills the registry)
from ..runtime import registry
from ..runtime.database import parse_signature
from .candidates import (Candidate, candidates_for, fallback_id, gate_candidates, host_costs, operands_for,
                         parts_of, pseudo_arms, tunable_families)
from .census_file import load_census, point_m
from .partition import thin_census
from .points import Point
from .prune import TOP_K, collect_table, forced_ids, keep_ids, models_for
from .shapes import fill_points
from .from_log import entries_from_log, model_from_log  # noqa: F401  (entries_from_log: re-exported)
from .region_guard import guard_signature
from .serving_regions import build_step
from .validation import geometric_midpoints, partition_validated

log = logging.getLogger(__name__)

FILL_WEIGHT = 0.01  # relative to the mean census weight: fill points inform region edges, traffic decides


@dataclass
class SignatureWork:
    signature: str
    points: list[Point]
    weight_bytes: int = 0  # the served model's weight working set (decides cold vs warm weights)


def default_family() -> str:
    """The family `oasr tune build` measures without --family: the first registered one with candidates."""
    return tunable_families()[0]


def load_censuses(paths: list[str], family: str | None = None) -> dict[str, SignatureWork]:
    """Merge census files: the same (signature, M) from several censuses sums weights and calls, keeps
    must_tune if any sets it, and averages the eager fraction by calls."""
    family = family or default_family()
    merged: dict[str, dict[int, Point]] = {}
    wbytes: dict[str, int] = {}
    for path in paths:
        doc = load_census(path)  # checked: a malformed file is a ValueError naming it, not a KeyError here
        sigs = doc["signatures"]
        model_bytes = int(doc.get("weight_bytes", 0) or 0)
        for sig, body in sigs.items():
            if not isinstance(body, dict) or not sig.startswith(family + "|"):
                continue
            wbytes[sig] = max(wbytes.get(sig, 0), model_bytes, int(body.get("weight_bytes", 0) or 0))
            for p in body.get("points", []):
                m = point_m(p)
                q = merged.setdefault(sig, {}).get(m)
                new = Point(m, float(p.get("weight", 1.0)), int(p.get("calls", 0)), bool(p.get("must_tune", False)),
                            float(p.get("eager_fraction", 0.0)))
                if q is None:
                    merged[sig][m] = new
                else:
                    tot = q.calls + new.calls
                    q.eager_fraction = ((q.eager_fraction * q.calls + new.eager_fraction * new.calls) / tot
                                        if tot else max(q.eager_fraction, new.eager_fraction))
                    q.weight += new.weight
                    q.calls = tot
                    q.must_tune = q.must_tune or new.must_tune
    return {s: SignatureWork(s, sorted(pts.values(), key=lambda p: p.m), wbytes.get(s, 0))
            for s, pts in sorted(merged.items())}


def load_works(paths: list[str], family: str) -> dict[str, SignatureWork]:
    """The family's signatures of the censuses: its own points, plus the points of every other family's
    signature its ``census_from`` handler maps to one of its own (same M; weights and calls add, must_tune
    ORs; the weight bytes are the handler's)."""
    out = load_censuses(paths, family)
    mapper = registry.get(family).handler("census_from")
    if mapper is None:
        return out
    for other in registry.families():
        if other == family:
            continue
        for sig, work in load_censuses(paths, other).items():
            parts = parse_signature(sig)
            mapped = mapper(parts, work.weight_bytes) if parts is not None else None
            if mapped is None:
                continue
            tsig, tbytes = mapped
            tgt = out.setdefault(tsig, SignatureWork(tsig, [], 0))
            tgt.weight_bytes = max(tgt.weight_bytes, tbytes)
            by_m = {p.m: p for p in tgt.points}
            for p in work.points:
                q = by_m.get(p.m)
                if q is None:
                    by_m[p.m] = Point(p.m, p.weight, p.calls, p.must_tune, p.eager_fraction)
                else:
                    q.weight += p.weight
                    q.calls += p.calls
                    q.must_tune = q.must_tune or p.must_tune
            tgt.points = sorted(by_m.values(), key=lambda p: p.m)
    return dict(sorted(out.items()))


def plan_points(work: SignatureWork, *, thin: bool, max_points: int, max_fill: int) -> list[Point]:
    pts = work.points
    if thin:
        pts = thin_census(pts, max_points)
    mean_w = sum(p.weight for p in pts) / max(len(pts), 1) or 1.0
    fills = [Point(m, weight=FILL_WEIGHT * mean_w, fill=True) for m in fill_points([p.m for p in pts],
                                                                                  max_fill=max_fill)]
    return sorted(pts + fills, key=lambda p: p.m)


def validation_points(points: list[Point]) -> list[Point]:
    """The held-out points between `points` (geometric midpoints of consecutive Ms), at fill weight."""
    census = [p for p in points if not p.fill] or points
    mean_w = sum(p.weight for p in census) / max(len(census), 1) or 1.0
    return [Point(m, weight=FILL_WEIGHT * mean_w, validation=True) for m in geometric_midpoints(p.m for p in points)]


def plan_signature(work: SignatureWork, opts: "BuildOptions") -> list[Point]:
    """Every point the build measures for one signature (census, fill, validation), sorted by M."""
    pts = plan_points(work, thin=opts.thin, max_points=opts.max_points, max_fill=opts.max_fill)
    if opts.validate:
        pts = sorted(pts + validation_points(pts), key=lambda p: p.m)
    return pts


def arm_plan(signature: str, points: list[Point], opts: "BuildOptions", arch: str,
             cands: list[Candidate] | None = None, models: list | None = None) -> dict[int, list[str]]:
    """Per M, the arms the build measures there before cross-evaluation: the candidates feasible at the point,
    pruned by the cost model (prune.keep_ids) unless `opts.prune` is off. Deterministic from the signature, the
    points and the arch's tuning file (its model section), so `oasr tune prebuild --census` plans the same."""
    parts = parts_of(signature)
    cands = candidates_for(parts, arch) if cands is None else cands
    lane = registry.native_lane(arch, parts.family)
    forced = forced_ids(cands, lane.default.id if lane is not None else None)
    models = models_for(parts.family, arch) if models is None and opts.prune else (models or [None])
    out: dict[int, list[str]] = {}
    for p in points:
        q = _with_parts(p, signature, parts)
        here = [c.id for c in cands if c.feasible(q) is None]
        out[p.m] = keep_ids(here, q, forced, models, top_k=opts.top_k, arch=arch) if opts.prune else here
    return out


# ------------------------------------------------------------------------------------------------ measuring

@dataclass
class BuildOptions:
    out: str = "user"
    family: str = field(default_factory=default_family)
    fresh: bool = False
    thin: bool = False
    max_points: int = 16
    max_fill: int = 8
    min_speedup: float = 1.05
    max_loss: float = 0.02  # no region config may be > 2 % slower than the fallback at any measured point
    rounds: int = 5
    log: Path | None = None
    checkpoint_dir: Path | None = None
    arch: str | None = None
    progress: bool = True
    device: str = "cuda"  # where operands live (a CPU run exercises the path with the ops' CPU reference)
    prune: bool = True  # measure only the cost model's top-k + the forced set per point (--no-prune: every arm)
    top_k: int = TOP_K
    validate: bool = True  # measure the geometric midpoints and check the regions there (--no-validate)


@dataclass
class BuildResult:
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    points_measured: int = 0
    arms_measured: int = 0
    measure_s: float = 0.0
    wall_s: float = 0.0
    resumed: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "sig|config[|M=m]" -> numeric gate reason
    arms_pruned: int = 0  # (point, arm) pairs the cost model left out
    validation_points: int = 0  # held-out points measured
    validation_splits: int = 0  # regions split (or handed to the fallback) because their config lost at one
    model: bool = False  # a cost-model section was written


def checkpoint_path(checkpoint_dir: Path, sig: str) -> Path:
    """The checkpoint file of one signature under a checkpoint directory (`oasr tune build --checkpoint-dir`,
    and each (arch, family) of `oasr tune matrix`)."""
    return Path(checkpoint_dir) / (hashlib.sha256(sig.encode()).hexdigest()[:16] + ".json")


def read_checkpoint(checkpoint_dir: Path, sig: str) -> dict[str, Any] | None:
    """The finished signature's DB entry, or None when it has no checkpoint (or a damaged one: measured again).
    An entry is an object with a list of regions (what every family's entries hold); anything else in its place
    would otherwise survive until the DB's publish refused it, after every other signature was measured."""
    try:
        doc = json.loads(checkpoint_path(checkpoint_dir, sig).read_text())
        entry = doc["entry"] if doc.get("signature") in (None, sig) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("regions"), list) else None


def write_checkpoint(checkpoint_dir: Path, sig: str, entry: dict[str, Any], **extra: Any) -> Path:
    """Write a finished signature's checkpoint atomically (a temp file of this process, then a rename), so a
    reader — or a second writer of the same signature on another worker — never sees a partial one."""
    path = checkpoint_path(checkpoint_dir, sig)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps({"signature": sig, "entry": entry, **extra}))
    os.replace(tmp, path)
    return path


def _with_parts(p: Point, signature: str, parts: Any) -> Point:
    """A planned point with the signature's parts filled in (what a family's operands are shaped by)."""
    from dataclasses import replace

    return replace(p, signature=signature, family=parts.family, op=parts.op, dtype=parts.dt or "half",
                   n=parts.n, k=parts.k)


def measure_signature(work: SignatureWork, points: list[Point], opts: BuildOptions, cands: list[Candidate],
                      lane_name: str, host_us: dict[str, float], log_fh, result: BuildResult,
                      arch: str = "sm90") -> dict[str, Any]:
    """Measure one signature (the arms `arm_plan` keeps at each point, then cross-evaluation) and partition,
    checked at the validation points. Needs the family's ops to run on `opts.device` (a CUDA GPU for real
    timings)."""
    import torch

    from . import bench
    from ..runtime.validators import current_soft_validators

    stamp = current_soft_validators(lane_name)  # what these measurements depend on, for --from-log
    parts = parts_of(work.signature)
    pts = [_with_parts(p, work.signature, parts) for p in points]
    charged = any(c.host is not None for c in cands)  # the objective adds host cost: the log says gpu_s apart
    pseudo = pseudo_arms(cands)
    cold = bench.weights_cold(work.weight_bytes)
    main = [p for p in pts if not p.validation] or pts
    mid = main[len(main) // 2]
    probe = operands_for(mid, opts.device, seed=0)
    copies = bench.copies_for(probe.weight_bytes(), cold=cold, cap=256)
    del probe
    # the weights (rotated copies) and constants live for the whole signature; activations are fresh per point
    shared = operands_for(mid, opts.device, seed=0, copies=copies)
    # a once-per-signature gate runs at the middle point: wrong tiles never enter the table
    once = [c for c in cands if not c.gate.per_point]
    arms = list(cands)
    if once:
        ok, rejected = gate_candidates(once, shared)
        for cid, why in rejected.items():
            result.rejected[f"{work.signature}|{cid}"] = why
        passed = {c.id for c in ok}
        arms = [c for c in cands if c.gate.per_point or c.id in passed]
    by_id = {c.id: c for c in arms}
    all_ids = {c.id: c for c in cands}
    # pruned over every feasible candidate, gated or not, so `oasr tune prebuild --census` (which cannot run the
    # numeric gate) plans exactly these; a gated-out arm is then simply not measured
    plan = arm_plan(work.signature, pts, opts, arch, cands=cands)
    seeds = {p.m: i + 1 for i, p in enumerate(pts)}  # a cross-evaluation pass sees the same activations
    env = bench.Environment()
    t0 = time.monotonic()
    seen: set[int] = set()
    pruned_at: dict[int, list[str]] = {}  # logged on the point's first record

    def arms_at(p: Point) -> list[str]:
        keep = [c for c in plan[p.m] if c in by_id]
        if opts.prune:
            pruned_at[p.m] = [c.id for c in arms if c.id not in keep and c.feasible(p) is None]
            result.arms_pruned += len(pruned_at[p.m])
        return keep

    # progress: a tqdm bar on a terminal only (no carriage returns in a log file)
    bar = tqdm(total=len(points), desc=work.signature, unit="point", file=sys.stderr, leave=False,
               disable=None if opts.progress else True)

    def measure_at(p: Point, ids: list[str]) -> dict[str, Any]:
        ops = operands_for(p, opts.device, seed=seeds[p.m], like=shared)
        here = [by_id[c] for c in ids if c in by_id]
        per_point = [c for c in here if c.gate.per_point]
        if per_point:  # the bitwise gate needs its baseline's output even where the baseline is not asked for
            gl = list({c.id: c for c in [*per_point, *(all_ids[c.gate.baseline] for c in per_point)]}.values())
            ok, rejected = gate_candidates(gl, ops)
            for cid, why in rejected.items():
                result.rejected[f"{work.signature}|{cid}|M={p.m}"] = why
            passed = {c.id for c in ok}
            here = [c for c in here if not c.gate.per_point or c.id in passed]
        if not here:
            return {}
        calls_n = max(bench.MIN_CALLS, copies)
        arm_calls = {c.id: [c.make_call(ops, j) for j in range(calls_n)] for c in here}
        res = bench.measure(arm_calls, rounds=opts.rounds, env=env)
        host_of = {c.id: c.host for c in here}
        extra = {f"{c.id}_tile": c.config_at(p) for c in pseudo}  # what a pseudo-arm timed at this point
        row = {}
        for cid, r in res.items():
            e = r.estimate
            host = host_us.get(host_of[cid], 0.0) * 1e-6 if host_of[cid] is not None else 0.0
            obj = e.median_s + p.eager_fraction * host
            row[cid] = (obj, e.sigma_s, e.n)
            rec: dict[str, Any] = {"signature": work.signature, "m": p.m, "config": cid, "median_s": obj}
            if charged:
                rec["gpu_s"] = e.median_s
            rec.update({"sigma_s": e.sigma_s, "n": e.n, "weight": p.weight, "fill": p.fill})
            if charged:
                rec["eager_fraction"] = p.eager_fraction
            rec.update(extra)
            rec.update({"l2": "cold" if cold else "warm", **env.as_dict(), "validators": stamp})
            # new fields go last and only where set: a log without them reads as before
            if p.validation:
                rec["validation"] = True
            if p.must_tune:
                rec["must_tune"] = True
            if p.m in pruned_at:
                rec["pruned"] = pruned_at.pop(p.m)
            if log_fh is not None:
                log_fh.write(json.dumps(rec) + "\n")
        result.arms_measured += len(row)
        if p.m not in seen:
            seen.add(p.m)
            result.points_measured += 1
            bar.update(1)
        return row

    times = collect_table(pts, arms_at, measure_at, fallback=fallback_id(cands),
                          feasible=lambda p, c: c in by_id and by_id[c].feasible(p) is None)
    if log_fh is not None:
        log_fh.flush()
    result.measure_s += time.monotonic() - t0
    bar.close()
    l2 = "cold" if cold else "warm"
    v = partition_validated(times, {p.m: p.weight for p in pts}, [p.m for p in pts if p.validation],
                            fallback=fallback_id(cands), min_speedup=opts.min_speedup, max_loss=opts.max_loss,
                            starred=[p.m for p in pts if p.must_tune],
                            evidence_extra={p.m: {"_l2": l2} for p in pts})
    result.validation_points += sum(1 for p in pts if p.validation)
    result.validation_splits += v.splits
    shared = None  # the weight copies go before the cache is emptied (the closures hold the cell)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    entry = guard_signature(v.partition.entry(source="aot"), times, fallback_id(cands), work.signature, arch)
    return build_step(entry, work.signature, charged and any(p.eager_fraction > 0 for p in pts))


MeasureOne = Any  # (work, points, opts, result) -> DB entry dict


def run_build(works: dict[str, SignatureWork], opts: BuildOptions, arch: str, lane_name: str,
              measure_one: MeasureOne, model_fn: Any = None) -> BuildResult:
    """The orchestration, independent of how a signature is measured: plan points, resume finished signatures
    from their checkpoints, measure the rest, checkpoint each as it finishes, publish every entry (with
    ``model_fn()``'s cost-model section when it returns one)."""
    from . import database

    t_start = time.monotonic()
    result = BuildResult()
    if opts.checkpoint_dir is not None:
        opts.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    for i, (sig, work) in enumerate(works.items()):
        done = read_checkpoint(opts.checkpoint_dir, sig) if opts.checkpoint_dir is not None else None
        if done is not None:
            result.entries[sig] = done
            result.resumed.append(sig)
            continue
        points = plan_signature(work, opts)
        if opts.progress:
            log.info("[%d/%d] %s: %d points", i + 1, len(works), sig, len(points))
        entry = measure_one(work, points, opts, result)
        result.entries[sig] = entry
        if opts.checkpoint_dir is not None:
            write_checkpoint(opts.checkpoint_dir, sig, entry)
    if result.entries:
        model = model_fn() if model_fn is not None else None
        result.model = model is not None
        database.publish(opts.family, result.entries, tier=opts.out, arch=arch, lane=lane_name, fresh=opts.fresh,
                         model=model)
    result.wall_s = time.monotonic() - t_start
    return result


def build(census_paths: list[str], opts: BuildOptions) -> BuildResult:
    """Measure `opts.family` on this GPU and write. Raises RuntimeError without a CUDA GPU (unless
    `opts.device` says otherwise); BenchError inside a capture."""
    import torch

    from . import bench
    from ..runtime.arch import require_arch

    if opts.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("oasr tune build measures on a GPU; none is available here")
    bench.refuse_in_capture()
    arch = require_arch(opts.arch)
    lane = registry.native_lane(arch, opts.family)
    if lane is None:
        raise RuntimeError(f"no {opts.family} lane is native to {arch}")
    works = load_works(census_paths, opts.family)
    # host issue cost per arm kind, for the eager part of the objective (families that charge it)
    host_us = host_costs(opts.family, arch, opts.device)
    log_fh = open(opts.log, "a") if opts.log else None
    try:
        def one(work, points, o, result):
            cands = candidates_for(parts_of(work.signature), arch)
            return measure_signature(work, points, o, cands, lane.name, host_us, log_fh, result, arch)

        def model() -> dict[str, Any] | None:  # fitted on the whole log: this run's records and earlier ones
            if log_fh is not None:
                log_fh.flush()
            return model_from_log(opts.log, opts.family, arch) if opts.log else None
        return run_build(works, opts, arch, lane.name, one, model)
    finally:
        if log_fh is not None:
            log_fh.close()


