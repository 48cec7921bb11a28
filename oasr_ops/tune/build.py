"""`oasr tune build`: census points -> measurements (bench.py) -> partition -> tuning DB entries, for any
registered family with a candidate factory (`oasr_ops.tune.candidates`; `--family` picks one).

Per signature:
  1. points = census Ms (thinned with --thin/--max-points) + ladder fill points (shapes.fill_points); a family
     may also take points from another family's census signatures (``handlers["census_from"]``: the int8
     family measures every gemm site `quantize_` turns into a scaled_mm);
  2. arms = the family's candidates for the signature (gemm: `torch`, the lane default, then every feasible
     config of the native lane; scaled_mm: every eligible tile and the `heuristic` pseudo-arm), each passing its
     numeric gate first (a tolerance gate once, at the middle point; a bitwise gate at every point);
  3. measure every arm at every point (bench.measure: CUDA graphs, separator, cold/warm weights, interleaved
     shuffled rounds); where the family charges host issue cost the objective adds alpha x that cost, alpha =
     the point's eager fraction;
  4. partition (partition.partition_signature against the family's fallback arm, --min-speedup gate) and write
     the entry with evidence and notes through database.publish;
  5. checkpoint the finished signature (a JSON per signature under the checkpoint directory), so an
     interrupted build resumes where it stopped.
Every measurement is appended to a JSONL log (one record per arm per point) for `oasr tune evaluate` and
`--from-log`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import families as _families  # noqa: F401  (fills the registry)
from ..runtime import registry
from ..runtime.database import parse_signature
from .candidates import (Candidate, candidates_for, fallback_id, gate_candidates, host_costs, operands_for,
                         parts_of, pseudo_arms, tunable_families)
from .partition import partition_signature, thin_census
from .points import Point
from .shapes import fill_points

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
        doc = json.loads(Path(path).read_text())
        sigs = doc.get("signatures", doc)
        model_bytes = int(doc.get("weight_bytes", 0) or 0)
        for sig, body in sigs.items():
            if not isinstance(body, dict) or not sig.startswith(family + "|"):
                continue
            wbytes[sig] = max(wbytes.get(sig, 0), model_bytes, int(body.get("weight_bytes", 0) or 0))
            for p in body.get("points", []):
                m = int(p["m"] if "m" in p else p["M"])
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


# ------------------------------------------------------------------------------------------------ measuring

@dataclass
class BuildOptions:
    out: str = "user"
    family: str = field(default_factory=default_family)
    fresh: bool = False
    thin: bool = False
    max_points: int = 16
    max_fill: int = 4
    min_speedup: float = 1.05
    max_loss: float = 0.02  # no region config may be > 2 % slower than the fallback at any measured point
    rounds: int = 5
    log: Path | None = None
    checkpoint_dir: Path | None = None
    arch: str | None = None
    progress: bool = True
    device: str = "cuda"  # where operands live (a CPU run exercises the path with the ops' CPU reference)


@dataclass
class BuildResult:
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    points_measured: int = 0
    arms_measured: int = 0
    measure_s: float = 0.0
    wall_s: float = 0.0
    resumed: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "sig|config[|M=m]" -> numeric gate reason


def _ckpt_path(opts: BuildOptions, sig: str) -> Path:
    assert opts.checkpoint_dir is not None
    return opts.checkpoint_dir / (hashlib.sha256(sig.encode()).hexdigest()[:16] + ".json")


def _as_point(p: Point, work: SignatureWork, parts: Any) -> Point:
    """A planned point with the signature's parts filled in (what a family's operands are shaped by)."""
    from dataclasses import replace

    return replace(p, signature=work.signature, family=parts.family, op=parts.op, dtype=parts.dt or "half",
                   n=parts.n, k=parts.k)


def measure_signature(work: SignatureWork, points: list[Point], opts: BuildOptions, cands: list[Candidate],
                      lane_name: str, host_us: dict[str, float], log_fh, result: BuildResult) -> dict[str, Any]:
    """Measure every gated arm at every point of one signature and partition. Needs the family's ops to run on
    `opts.device` (a CUDA GPU for real timings)."""
    import torch

    from . import bench
    from ..runtime.validators import current_soft_validators

    stamp = current_soft_validators(lane_name)  # what these measurements depend on, for --from-log
    parts = parts_of(work.signature)
    pts = [_as_point(p, work, parts) for p in points]
    charged = any(c.host is not None for c in cands)  # the objective adds host cost: the log says gpu_s apart
    pseudo = pseudo_arms(cands)
    cold = work.weight_bytes > bench.l2_bytes() if work.weight_bytes else True
    mid = pts[len(pts) // 2]
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
    times: dict[int, dict[str, Any]] = {}
    weights: dict[int, float] = {}
    env = bench.Environment()
    t0 = time.monotonic()
    ops = None
    for i, p in enumerate(pts):
        ops = operands_for(p, opts.device, seed=i + 1, like=shared)
        here = [c for c in arms if c.feasible(p) is None]
        per_point = [c for c in here if c.gate.per_point]
        if per_point:
            ok, rejected = gate_candidates(per_point, ops)
            for cid, why in rejected.items():
                result.rejected[f"{work.signature}|{cid}|M={p.m}"] = why
            passed = {c.id for c in ok}
            here = [c for c in here if not c.gate.per_point or c.id in passed]
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
            if log_fh is not None:
                log_fh.write(json.dumps(rec) + "\n")
        times[p.m] = row
        weights[p.m] = p.weight
        result.points_measured += 1
        result.arms_measured += len(row)
        if opts.progress:
            sys.stderr.write(f"\r  {work.signature}: {len(times)}/{len(points)} points")
            sys.stderr.flush()
    if log_fh is not None:
        log_fh.flush()
    result.measure_s += time.monotonic() - t0
    if opts.progress:
        sys.stderr.write("\n")
    part = partition_signature(times, weights, fallback=fallback_id(cands), min_speedup=opts.min_speedup,
                               max_loss=opts.max_loss,
                               starred=[p.m for p in points if p.must_tune],
                               evidence_extra={p.m: {"_l2": "cold" if cold else "warm"} for p in points})
    del shared, ops
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return part.entry(source="aot")


MeasureOne = Any  # (work, points, opts, result) -> DB entry dict


def run_build(works: dict[str, SignatureWork], opts: BuildOptions, arch: str, lane_name: str,
              measure_one: MeasureOne) -> BuildResult:
    """The orchestration, independent of how a signature is measured: plan points, resume finished signatures
    from their checkpoints, measure the rest, checkpoint each as it finishes, publish every entry."""
    from . import database

    t_start = time.monotonic()
    result = BuildResult()
    if opts.checkpoint_dir is not None:
        opts.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    for i, (sig, work) in enumerate(works.items()):
        if opts.checkpoint_dir is not None and _ckpt_path(opts, sig).is_file():
            try:
                result.entries[sig] = json.loads(_ckpt_path(opts, sig).read_text())["entry"]
                result.resumed.append(sig)
                continue
            except (OSError, ValueError, KeyError):
                pass  # a damaged checkpoint is measured again
        points = plan_points(work, thin=opts.thin, max_points=opts.max_points, max_fill=opts.max_fill)
        if opts.progress:
            sys.stderr.write(f"[{i + 1}/{len(works)}] {sig}: {len(points)} points\n")
        entry = measure_one(work, points, opts, result)
        result.entries[sig] = entry
        if opts.checkpoint_dir is not None:
            tmp = _ckpt_path(opts, sig).with_suffix(".tmp")
            tmp.write_text(json.dumps({"signature": sig, "entry": entry}))
            os.replace(tmp, _ckpt_path(opts, sig))
    if result.entries:
        database.publish(opts.family, result.entries, tier=opts.out, arch=arch, lane=lane_name, fresh=opts.fresh)
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
            return measure_signature(work, points, o, cands, lane.name, host_us, log_fh, result)
        return run_build(works, opts, arch, lane.name, one)
    finally:
        if log_fh is not None:
            log_fh.close()


def entries_from_log(log_path: str | Path, opts: BuildOptions, fallback: str | None = None
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Partition a finished build's measurement log again, without a GPU (a changed partition rule is scored
    and applied offline). Uses each record's median (the objective), weight and fill flag. The fallback arm is
    the signature's family's (its candidates' ``fallback``) unless `fallback` names one. Returns the entries
    and the soft validators the log's measurements were taken under (None when the log does not say)."""
    from collections import defaultdict

    times: dict[str, dict[int, dict[str, Any]]] = defaultdict(lambda: defaultdict(dict))
    weights: dict[str, dict[int, float]] = defaultdict(dict)
    l2: dict[str, str] = {}
    stamp: dict[str, Any] | None = None
    with open(log_path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            stamp = r.get("validators", stamp)
            times[r["signature"]][int(r["m"])][r["config"]] = (r["median_s"], r.get("sigma_s", 0.0), r.get("n", 1))
            weights[r["signature"]][int(r["m"])] = float(r.get("weight", 1.0))
            l2[r["signature"]] = r.get("l2", "cold")
    arch = opts.arch or "sm90"
    out = {}
    for sig in sorted(times):
        parts = parse_signature(sig)
        cands = candidates_for(parts, arch) if parts is not None else []
        # A pseudo-arm is whatever tile the *current* rule picks, timed by its own record at that point: a
        # refitted heuristic is partitioned against its own choices, not the ones the log was measured with.
        for c in pseudo_arms(cands):
            for m, row in times[sig].items():
                tile = c.config_at(Point(m, n=parts.n, k=parts.k, op=parts.op, family=parts.family))
                if tile in row:
                    row[c.id] = row[tile]
        part = partition_signature(dict(times[sig]), weights[sig], fallback=fallback or fallback_id(cands),
                                   min_speedup=opts.min_speedup, max_loss=opts.max_loss,
                                   evidence_extra={m: {"_l2": l2[sig]} for m in times[sig]})
        out[sig] = part.entry(source="aot")
    return out, stamp


# ------------------------------------------------------------------------------------------------ CLI

def _run(args: argparse.Namespace) -> int:
    from ..paths import cache_root
    from ..runtime.arch import current_arch_family

    arch = args.arch or current_arch_family() or "unknown"
    run_dir = cache_root() / "tune" / "v2" / "measurements"
    opts = BuildOptions(
        out=args.out, family=args.family, fresh=args.fresh, thin=args.thin, max_points=args.max_points,
        max_fill=args.max_fill, min_speedup=args.min_speedup, max_loss=args.max_loss, rounds=args.rounds,
        arch=args.arch,
        log=Path(args.log) if args.log else run_dir / f"{arch}.jsonl",
        checkpoint_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else run_dir / f"{arch}-checkpoints",
    )
    opts.log.parent.mkdir(parents=True, exist_ok=True)
    if args.from_log:
        from . import database
        from ..runtime.arch import require_arch
        from ..runtime.registry import native_lane

        a = require_arch(args.arch)
        lane = native_lane(a, args.family)
        entries, stamp = entries_from_log(args.from_log, opts)
        if args.stamp_from:  # a log written before logs carried validators: take the GPU-written file's stamp
            stamp = json.loads(Path(args.stamp_from).read_text())["validators"]
        if stamp is None:
            print("oasr tune build: the log records no validators; stamping with this machine's (pass "
                  "--stamp-from a DB file written by the measuring run)", file=sys.stderr)
        database.publish(args.family, entries, tier=args.out, arch=a, lane=lane.name if lane else None,
                         fresh=args.fresh, stamp=stamp)
        print(json.dumps({"signatures": len(entries), "from_log": args.from_log, "stamp": stamp}))
        return 0
    if not args.census:
        print("oasr tune build: --census is required (or --from-log)", file=sys.stderr)
        return 2
    if args.family != default_family():
        # every other family keeps its own default log and checkpoints beside the default family's
        if not args.log:
            opts.log = opts.log.with_name(opts.log.stem + f"-{args.family}.jsonl")
        if not args.checkpoint_dir:
            opts.checkpoint_dir = opts.checkpoint_dir.with_name(opts.checkpoint_dir.name + f"-{args.family}")
    res = build(args.census, opts)
    print(json.dumps({"signatures": len(res.entries), "resumed": len(res.resumed),
                      "points_measured": res.points_measured, "arms_measured": res.arms_measured,
                      "measure_s": round(res.measure_s, 1), "wall_s": round(res.wall_s, 1),
                      "rejected_by_numeric_gate": res.rejected, "log": str(opts.log)}, indent=1))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="measure census points on this GPU and write tuning entries")
    p.add_argument("--census", action="append", default=[], help="census JSON (repeatable)")
    p.add_argument("--from-log", help="partition a finished build's measurement log again (no GPU) and write it")
    p.add_argument("--stamp-from", help="with --from-log: stamp the file with this DB file's validators (the "
                                        "measuring run's), for logs that do not record them")
    p.add_argument("--out", default="user", help="user | system | a directory")
    p.add_argument("--family", default=default_family(), choices=tunable_families())
    p.add_argument("--fresh", action="store_true", help="replace the tier's file instead of merging")
    p.add_argument("--thin", action="store_true", help="cap census points per signature (--max-points)")
    p.add_argument("--max-points", type=int, default=16)
    p.add_argument("--max-fill", type=int, default=4, help="ladder fill points per signature")
    p.add_argument("--min-speedup", type=float, default=1.05)
    p.add_argument("--max-loss", type=float, default=0.02,
                   help="a region config may lose to the fallback by at most this fraction at any point")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--arch", help="arch family (default: this GPU)")
    p.add_argument("--log", help="measurement log JSONL (default ~/.cache/oasr/tune/v2/measurements/<arch>.jsonl)")
    p.add_argument("--checkpoint-dir", help="per-signature checkpoints (resume)")
    p.set_defaults(func=_run)
