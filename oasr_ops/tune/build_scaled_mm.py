"""`oasr tune build --family scaled_mm`: the int8 W8A8 GEMM's tuning file (spec "The int8 scaled GEMM").

Per signature `scaled_mm|op=scaled_mm|N=..|K=..`: every eligible variant (scaled_mm.variants_for: the nine
sm90 tiles, Stream-K included) is measured at every point — no pruning, no cost model — after a numeric gate
that requires the variant's output to be *bitwise* equal to the heuristic's variant (every tile computes the
same bits: exact int32 accumulation, one rounding). The partition runs against a `heuristic` pseudo-arm (the
heuristic's own tile timed at each point, under the name `heuristic`), so a region names a tile only where it
beats the heuristic by --min-speedup; the entry is kept even when every region says `heuristic`
(`[[null, "heuristic"]]` = measured).

Points: a quantized deployment runs its Linear GEMMs as scaled_mm with the same (M, N, K), so the census's
gemm points map to scaled_mm points for every layer `quantize_` quantizes (K % 16 == 0, N % 8 == 0).
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any

from .build import BuildOptions, BuildResult, Point, SignatureWork, load_censuses, run_build
from .partition import partition_signature


def scaled_mm_works(census_paths: list[str]) -> dict[str, SignatureWork]:
    """scaled_mm signatures of the censuses: their own scaled_mm points, plus every gemm site quantize_ turns
    into a scaled_mm (same M, N, K; the activation is not fused in the int8 op)."""
    from ..families.scaled_mm.ops import K_ALIGN, N_ALIGN, signature

    out: dict[str, SignatureWork] = dict(load_censuses(census_paths, family="scaled_mm"))
    for sig, work in load_censuses(census_paths, family="gemm").items():
        kv = dict(p.split("=", 1) for p in sig.split("|")[1:])
        n, k = int(kv["N"]), int(kv["K"])
        if k % K_ALIGN or n % N_ALIGN["scaled_mm"]:
            continue
        ssig = signature("scaled_mm", n, k)
        tgt = out.setdefault(ssig, SignatureWork(ssig, [], 0))
        tgt.weight_bytes = max(tgt.weight_bytes, work.weight_bytes // 2)  # int8 weights: half the bytes
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


def measure_scaled_mm_signature(work: SignatureWork, points: list[Point], opts: BuildOptions, arch: str,
                                log_fh, result: BuildResult) -> dict[str, Any]:
    import importlib

    import torch

    from . import bench

    smm = importlib.import_module("oasr_ops.families.scaled_mm.ops")

    kv = dict(p.split("=", 1) for p in work.signature.split("|")[1:])
    op, n, k = kv["op"], int(kv["N"]), int(kv["K"])
    quant = op == "scaled_mm_quant"
    variants = smm.variants_for(n, k, quant, arch)
    from ..runtime.validators import current_soft_validators

    stamp = current_soft_validators(smm._lane_for(arch).name)  # what these measurements depend on
    cold = work.weight_bytes > bench.l2_bytes() if work.weight_bytes else True
    copies = bench.copies_for(n * k, cold=cold, cap=256)
    ws = [torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8) for _ in range(copies)]
    sw = torch.rand(n, device="cuda", dtype=torch.float32) * 0.01 + 0.001
    out_scale = torch.tensor([0.05], device="cuda")

    def call(cfg: str, a, sa, w):
        if quant:
            return torch.ops.oasr.scaled_mm_quant(a, w, sa, sw, None, out_scale, cfg)
        return torch.ops.oasr.scaled_mm(a, w, sa, sw, None, torch.float16, cfg)

    times: dict[int, dict[str, Any]] = {}
    weights: dict[int, float] = {}
    env = bench.Environment()
    t0 = time.monotonic()
    for p in points:
        a = torch.randint(-127, 128, (p.m, k), device="cuda", dtype=torch.int8)
        sa = torch.rand(p.m, device="cuda", dtype=torch.float32) * 0.01 + 0.001
        heur = smm.heuristic_config(p.m, n, k, arch)
        ref = call(heur, a, sa, ws[0])
        arms: dict[str, list] = {}
        for cfg in variants:
            out = call(cfg, a, sa, ws[0])
            if not torch.equal(out, ref):  # every tile must compute the same bits
                result.rejected[f"{work.signature}|{cfg}|M={p.m}"] = "not bitwise equal to the heuristic's tile"
                continue
            arms[cfg] = [lambda c=cfg, w=ws[j % copies]: call(c, a, sa, w) for j in range(max(8, copies))]
        arms["heuristic"] = [lambda w=ws[j % copies]: call(heur, a, sa, w) for j in range(max(8, copies))]
        res = bench.measure(arms, rounds=opts.rounds, env=env)
        row = {}
        for cfg, r in res.items():
            e = r.estimate
            row[cfg] = (e.median_s, e.sigma_s, e.n)
            if log_fh is not None:
                log_fh.write(json.dumps({"signature": work.signature, "m": p.m, "config": cfg,
                                         "median_s": e.median_s, "sigma_s": e.sigma_s, "n": e.n,
                                         "weight": p.weight, "fill": p.fill, "heuristic_tile": heur,
                                         "l2": "cold" if cold else "warm", **env.as_dict(),
                                         "validators": stamp}) + "\n")
        times[p.m] = row
        weights[p.m] = p.weight
        result.points_measured += 1
        result.arms_measured += len(row)
        if opts.progress:
            sys.stderr.write(f"\r  {work.signature}: {len(times)}/{len(points)} points")
            sys.stderr.flush()
    if opts.progress:
        sys.stderr.write("\n")
    result.measure_s += time.monotonic() - t0
    part = partition_signature(times, weights, fallback="heuristic", min_speedup=opts.min_speedup,
                               max_loss=opts.max_loss,
                               starred=[p.m for p in points if p.must_tune],
                               evidence_extra={p.m: {"_l2": "cold" if cold else "warm"} for p in points})
    del ws
    torch.cuda.empty_cache()
    return part.entry(source="aot")


def build_scaled_mm(census_paths: list[str], opts: BuildOptions) -> BuildResult:
    import torch

    from ..runtime.registry import native_lane
    from . import bench
    from ..runtime.arch import require_arch

    if not torch.cuda.is_available():
        raise RuntimeError("oasr tune build measures on a GPU; none is available here")
    bench.refuse_in_capture()
    arch = require_arch(opts.arch)
    lane = native_lane(arch, "scaled_mm")
    if lane is None:
        raise RuntimeError(f"no scaled_mm lane is native to {arch}")
    works = scaled_mm_works(census_paths)
    log_fh = open(opts.log, "a") if opts.log else None
    try:
        def one(work, points, o, result):
            return measure_scaled_mm_signature(work, points, o, arch, log_fh, result)
        return run_build(works, opts, arch, lane.name, one)
    finally:
        if log_fh is not None:
            log_fh.close()
