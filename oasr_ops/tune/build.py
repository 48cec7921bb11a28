"""`oasr tune build`: census points -> measurements (bench.py) -> partition -> tuning DB entries.

Per signature (gemm family):
  1. points = census Ms (thinned with --thin/--max-points) + ladder fill points (shapes.fill_points);
  2. arms = the forced set (lane default, `torch`, `fused` where it applies) + every feasible config of the native
     lane (there is no cost model to prune with yet), each first passing the numeric gate at one point;
  3. measure every arm at every point (bench.measure: CUDA graphs, separator, cold/warm weights, interleaved
     shuffled rounds); the objective adds alpha x host issue cost, alpha = the point's eager fraction;
  4. partition (partition.partition_signature, fallback `torch`, --min-speedup gate) and write the entry with
     evidence and notes through database.publish;
  5. checkpoint the finished signature (a JSON per signature under the checkpoint directory), so an
     interrupted build resumes where it stopped.
Every measurement is appended to a JSONL log (one record per arm per point) for `oasr tune evaluate`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .partition import partition_signature, thin_census
from .shapes import fill_points

FILL_WEIGHT = 0.01  # relative to the mean census weight: fill points inform region edges, traffic decides


@dataclass
class Point:
    m: int
    weight: float = 1.0
    calls: int = 0
    must_tune: bool = False
    eager_fraction: float = 0.0
    fill: bool = False


@dataclass
class SignatureWork:
    signature: str
    points: list[Point]
    weight_bytes: int = 0  # the served model's weight working set (decides cold vs warm weights)


def parse_gemm_signature(sig: str) -> tuple[str, str, int, int]:
    """`gemm|op=gemm|dt=half|N=512|K=256` -> (op, dt, N, K); ValueError otherwise."""
    parts = sig.split("|")
    if parts[0] != "gemm":
        raise ValueError(f"not a gemm signature: {sig!r}")
    kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    try:
        return kv["op"], kv.get("dt", "half"), int(kv["N"]), int(kv["K"])
    except (KeyError, ValueError):
        raise ValueError(f"malformed gemm signature: {sig!r}") from None


def load_censuses(paths: list[str], family: str = "gemm") -> dict[str, SignatureWork]:
    """Merge census files: the same (signature, M) from several censuses sums weights and calls, keeps
    must_tune if any sets it, and averages the eager fraction by calls."""
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


def plan_points(work: SignatureWork, *, thin: bool, max_points: int, max_fill: int) -> list[Point]:
    pts = work.points
    if thin:
        pts = thin_census([vars(p) for p in pts], max_points)
        pts = [Point(**{k: v for k, v in p.items() if k in Point.__dataclass_fields__}) for p in pts]
    mean_w = sum(p.weight for p in pts) / max(len(pts), 1) or 1.0
    fills = [Point(m, weight=FILL_WEIGHT * mean_w, fill=True) for m in fill_points([p.m for p in pts],
                                                                                  max_fill=max_fill)]
    return sorted(pts + fills, key=lambda p: p.m)


# ------------------------------------------------------------------------------------------------ measuring

@dataclass
class BuildOptions:
    out: str = "user"
    family: str = "gemm"
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


@dataclass
class BuildResult:
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    points_measured: int = 0
    arms_measured: int = 0
    measure_s: float = 0.0
    wall_s: float = 0.0
    resumed: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "sig|config" -> numeric gate reason


def _ckpt_path(opts: BuildOptions, sig: str) -> Path:
    assert opts.checkpoint_dir is not None
    return opts.checkpoint_dir / (hashlib.sha256(sig.encode()).hexdigest()[:16] + ".json")


def _arm_call(cfg: str, a, w, bias, act: str):
    import torch

    return lambda: torch.ops.oasr.gemm(a, w, bias, act, cfg)


def measure_signature(work: SignatureWork, points: list[Point], opts: BuildOptions, lane, arch: str,
                      host_us: dict[str, float], log_fh, result: BuildResult) -> dict[str, Any]:
    """Measure every gated arm at every point of one signature and partition. Needs a CUDA GPU."""
    import torch

    from . import bench
    from .stats import numeric_gate

    from ..runtime.validators import current_soft_validators

    stamp = current_soft_validators(lane.name)  # what these measurements depend on, for --from-log
    op, _dt, n, k = parse_gemm_signature(work.signature)
    act = "silu" if op == "gemm_activation" else "none"
    dtype = torch.float16
    cold = work.weight_bytes > bench.l2_bytes() if work.weight_bytes else True
    copies = bench.copies_for(n * k * 2, cold=cold, cap=256)
    ws = [torch.randn(n, k, device="cuda", dtype=dtype) / math.sqrt(k) for _ in range(copies)]
    bias = torch.randn(n, device="cuda", dtype=dtype)

    forced = ["torch", lane.default.id] + (["fused"] if act == "relu" else [])
    cands = [c.id for c in lane.space if c.id not in forced]
    # numeric gate once per arm, at a mid-sized point: wrong tiles never enter the table
    m_gate = points[len(points) // 2].m
    a = torch.randn(m_gate, k, device="cuda", dtype=dtype)
    ref = torch.nn.functional.linear(a.double(), ws[0].double(), bias.double())
    ref = torch.nn.functional.silu(ref) if act == "silu" else ref
    cublas = torch.ops.oasr.gemm(a, ws[0], bias, act, "torch")
    arms = []
    for cid in forced + cands:
        if cid not in ("torch", "fused"):
            c = lane.get(cid)
            if lane.infeasible_reason(c, n=n, k=k, arch_family=arch):
                continue
        out = torch.ops.oasr.gemm(a, ws[0], bias, act, cid)
        ok, why = numeric_gate(out, ref, cublas)
        if ok:
            arms.append(cid)
        else:
            result.rejected[f"{work.signature}|{cid}"] = why
    times: dict[int, dict[str, Any]] = {}
    weights: dict[int, float] = {}
    env = bench.Environment()
    t0 = time.monotonic()
    for p in points:
        a = torch.randn(p.m, k, device="cuda", dtype=dtype)
        calls_n = max(bench.MIN_CALLS, copies)
        arm_calls = {cid: [_arm_call(cid, a, ws[j % copies], bias, act) for j in range(calls_n)]
                     for cid in arms
                     if cid in ("torch", "fused") or not lane.infeasible_reason(lane.get(cid), m=p.m, n=n, k=k)}
        res = bench.measure(arm_calls, rounds=opts.rounds, env=env)
        row = {}
        for cid, r in res.items():
            host = host_us["torch" if cid in ("torch", "fused") else "oasr"] * 1e-6
            e = r.estimate
            obj = e.median_s + p.eager_fraction * host
            row[cid] = (obj, e.sigma_s, e.n)
            rec = {"signature": work.signature, "m": p.m, "config": cid, "median_s": obj, "gpu_s": e.median_s,
                   "sigma_s": e.sigma_s, "n": e.n, "weight": p.weight, "fill": p.fill,
                   "eager_fraction": p.eager_fraction, "l2": "cold" if cold else "warm", **env.as_dict(),
                   "validators": stamp}
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
    part = partition_signature(times, weights, fallback="torch", min_speedup=opts.min_speedup, max_loss=opts.max_loss,
                               starred=[p.m for p in points if p.must_tune],
                               evidence_extra={p.m: {"_l2": "cold" if cold else "warm"} for p in points})
    del ws
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
    """Measure on this GPU and write. Raises RuntimeError without a CUDA GPU; BenchError inside a capture."""
    import torch

    from ..runtime.registry import native_lane
    from . import bench
    from ..runtime.arch import require_arch

    if not torch.cuda.is_available():
        raise RuntimeError("oasr tune build measures on a GPU; none is available here")
    bench.refuse_in_capture()
    arch = require_arch(opts.arch)
    lane = native_lane(arch, opts.family)
    if lane is None:
        raise RuntimeError(f"no {opts.family} lane is native to {arch}")
    works = load_censuses(census_paths, opts.family)
    # host issue cost per arm kind, for the eager part of the objective
    a = torch.randn(16, 256, device="cuda", dtype=torch.float16)
    w = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    host_us = {"torch": bench.host_overhead_us(lambda: torch.ops.oasr.gemm(a, w, None, "none", "torch"), 500),
               "oasr": bench.host_overhead_us(lambda: torch.ops.oasr.gemm(a, w, None, "none", lane.default.id), 500)}
    log_fh = open(opts.log, "a") if opts.log else None
    try:
        def one(work, points, o, result):
            return measure_signature(work, points, o, lane, arch, host_us, log_fh, result)
        return run_build(works, opts, arch, lane.name, one)
    finally:
        if log_fh is not None:
            log_fh.close()


def entries_from_log(log_path: str | Path, opts: BuildOptions, fallback: str = "torch"
                     ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Partition a finished build's measurement log again, without a GPU (a changed partition rule is scored
    and applied offline). Uses each record's median (the objective), weight and fill flag. Returns the entries
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
    if fallback == "heuristic":
        # The pseudo-arm is whatever tile the *current* heuristic picks, timed by its own record at that point:
        # a refitted heuristic is partitioned against its own choices, not the ones the log was measured with.
        import importlib

        smm = importlib.import_module("oasr_ops.families.scaled_mm.ops")
        for sig, rows in times.items():
            kv = dict(p.split("=", 1) for p in sig.split("|")[1:])
            for m, row in rows.items():
                tile = smm.heuristic_config(m, int(kv["N"]), int(kv["K"]), opts.arch or "sm90")
                if tile in row:
                    row["heuristic"] = row[tile]
    out = {}
    for sig in sorted(times):
        part = partition_signature(dict(times[sig]), weights[sig], fallback=fallback, min_speedup=opts.min_speedup,
                                   max_loss=opts.max_loss,
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
        entries, stamp = entries_from_log(args.from_log, opts,
                                          fallback="heuristic" if args.family == "scaled_mm" else "torch")
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
    if args.family == "scaled_mm":
        from .build_scaled_mm import build_scaled_mm

        if not args.log:  # the int8 family keeps its own default log and checkpoints beside the gemm ones
            opts.log = opts.log.with_name(opts.log.stem + "-scaled_mm.jsonl")
        if not args.checkpoint_dir:
            opts.checkpoint_dir = opts.checkpoint_dir.with_name(opts.checkpoint_dir.name + "-scaled_mm")
        res = build_scaled_mm(args.census, opts)
    else:
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
    p.add_argument("--family", default="gemm", choices=["gemm", "scaled_mm"])
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
