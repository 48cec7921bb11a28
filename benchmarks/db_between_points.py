"""Does a shipped DB hold between its measured points? (issue 11's check of db/sm90/gemm.json; issue 14's of
db/sm90/scaled_mm_fp8.json)

  OASR_TUNE_USER_DB=off python benchmarks/db_between_points.py --log benchmarks/logs/sm90_gemm_build.jsonl \
      --out between.json
  OASR_TUNE_USER_DB=off python benchmarks/db_between_points.py --family scaled_mm_fp8 --dense 3 \
      --log benchmarks/logs/sm90_scaled_mm_fp8_build_v1.jsonl --out between_fp8.json

For every signature of the family in the build's log: the Ms the build measured (validation points included) and,
held out (never measured by the build), the geometric midpoints between consecutive ones and, with ``--dense D``,
up to D more Ms per interval: the Ms where a config the DB serves there is at its worst against a smooth
competitor (`cost_model.probe_ms`: the first M past each of its wave edges, and the first M of each region), so a
stretch the wave guard should have handed to the fallback is sampled where it would lose most. At each M
`auto` (what the DB serves) and the fallback are timed `--rounds` times each (3) in alternating order (AB, BA,
...) as CUDA graphs of 20 calls (median); ``--protocol build`` times them instead as the build and the fp8 census
benchmark do (`tune.bench.measure`: a separator kernel after every call, subtracted; max(7, --rounds) rounds in
alternating order, one replay each, median):

* gemm: fp16 with bias (SiLU for gemm_activation), `oasr.gemm(config="auto")` vs cuBLAS (`F.linear` [+ `F.silu`]);
  one weight (hot).
* scaled_mm_fp8: e4m3 activations with per-token scales, per-channel e4m3 weights, bf16 output,
  `oasr.scaled_mm_fp8(config="auto")` vs its ``torch`` arm (torch._scaled_mm rowwise); the 20 calls of a graph
  rotate over up to 20 weight copies (the build measured cold weights).

Reports auto/fallback geomean at the measured Ms and at the held-out Ms, the count below 0.95x and 0.98x, the
worst held-out M, and the config auto served at each M.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.nn.functional as F

from cost_model_heldout import alternating_us  # same timing protocol as the held-out check

FAMILIES = ("gemm", "scaled_mm_fp8")
CALLS = 20  # calls per graph (cost_model_heldout.graph_time_us's default)


def held_out_ms(ms: list[int], regions: list[list[Any]] | None, dense: int, n: int, dtype: str,
                arch: str = "sm90") -> list[int]:
    """The geometric midpoints of consecutive measured Ms (ratio >= 1.2) and, per interval, up to `dense` Ms
    where a served config is at its worst (`cost_model.probe_ms` of each region's config, and each region's
    first M), evenly subsampled; never a measured M."""
    from oasr_ops.configs import ConfigError, parse
    from oasr_ops.runtime import cost_model
    from oasr_ops.runtime.arch_profile import reference_profile

    measured = set(ms)
    out = {round(math.sqrt(x * y)) for x, y in zip(ms, ms[1:]) if y / x >= 1.2}
    if dense and regions:
        profile = reference_profile(arch)
        probes: set[int] = set()
        lo = 0
        for hi, cid in regions:
            top = ms[-1] if hi is None else int(hi)
            if top > lo:
                probes.add(lo + 1)
                try:
                    probes.update(cost_model.probe_ms(parse(cid), lo, top, n, dtype, profile))
                except ConfigError:
                    pass  # a sentinel (torch, heuristic): smooth, nothing to probe
            lo = top
        for x, y in zip(ms, ms[1:]):
            inside = sorted(p for p in probes if x < p < y and p not in out)
            if len(inside) > dense:
                inside = [inside[round(i * (len(inside) - 1) / (dense - 1))] for i in range(dense)] if dense > 1 \
                    else inside[len(inside) // 2:len(inside) // 2 + 1]
            out.update(inside)
    return sorted(out - measured)


def timed(ref: Callable[[], Any], auto: Callable[[], Any], rounds: int, protocol: str) -> tuple[float, float]:
    """(fallback us, auto us) under `protocol` (module doc)."""
    if protocol == "b2b":
        return alternating_us(ref, auto, rounds)
    from oasr_ops.tune import bench

    res = bench.measure({"ref": [ref] * CALLS, "auto": [auto] * CALLS}, rounds=max(7, rounds), order="alternate")
    return res["ref"].estimate.median_s * 1e6, res["auto"].estimate.median_s * 1e6


def gemm_arms(parts, m: int, weights: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    import oasr_ops

    act = "silu" if parts.op == "gemm_activation" else "none"
    w, bias = weights
    x = torch.randn(m, parts.k, device="cuda", dtype=torch.float16)
    ref = (lambda: F.linear(x, w, bias)) if act == "none" else (lambda: F.silu(F.linear(x, w, bias)))
    return ref, lambda: oasr_ops.gemm(x, w, bias, act, "auto")


def fp8_arms(parts, m: int, weights: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    a, sa = torch.ops.oasr.quantize_per_token_fp8(torch.randn(m, parts.k, device="cuda", dtype=torch.float16))
    ws = weights

    def arm(config: str) -> Callable[[], Any]:
        it = itertools.cycle(ws)  # each captured call reads the next weight copy

        def call():
            w, sw = next(it)
            return torch.ops.oasr.scaled_mm_fp8(a, w, sa, sw, None, torch.bfloat16, config)
        return call
    return arm("torch"), arm("auto")


def prepare(parts) -> Any:
    """The signature's weights, shared by all its Ms."""
    n, k = parts.n, parts.k
    if parts.family == "gemm":
        return (torch.randn(n, k, device="cuda", dtype=torch.float16) * k ** -0.5,
                torch.randn(n, device="cuda", dtype=torch.float16))
    else:
        from oasr_ops.families.scaled_mm_fp8.reference import quantize_weight_fp8

        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        copies = max(1, min(CALLS, math.ceil(2 * l2 / (n * k))))
        return [quantize_weight_fp8(torch.randn(n, k, device="cuda")) for _ in range(copies)]


def served_config(family: str, m: int, n: int, k: int) -> str | None:
    if family != "scaled_mm_fp8":
        return None
    import sys

    fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
    for key, plan in fops._PLANS.plans.items():
        if key[0] == "scaled_mm_fp8" and key[1] == "auto" and key[3:6] == (m, n, k):
            return f"{plan.config} ({plan.tier})"
    return None


def prebuild(db: Any, family: str, jobs: int) -> None:
    """Build every kernel the DB's regions name, in the dtype this benchmark times (a lazy JIT would build them
    one at a time inside the timing loop)."""
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.configs import ConfigError, parse
    from oasr_ops.runtime.registry import native_lane

    lane = native_lane("sm90", family)
    ids = set()
    for e in db.entries.values():
        for _, cid in e.regions:
            try:
                ids.add(parse(cid))
            except ConfigError:
                pass  # a sentinel
    dt = "fp16" if family == "gemm" else "bf16"
    specs = [JitSpec.for_kernel(lane, c, dt, "sm90") for c in sorted(ids, key=lambda c: c.id) if c in lane.space]
    print(build_many(specs, jobs=jobs, progress=False).summary(), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True, help="the build's measurement log (the Ms it measured)")
    p.add_argument("--out", required=True)
    p.add_argument("--family", choices=FAMILIES, default="gemm")
    p.add_argument("--rounds", type=int, default=3, help="alternating fallback/auto timings per point (median)")
    p.add_argument("--protocol", choices=("b2b", "build"), default="b2b",
                   help="b2b: back-to-back graphs (cost_model_heldout.alternating_us); build: tune.bench.measure")
    p.add_argument("--dense", type=int, default=0, help="extra held-out Ms per interval at the served configs' "
                                                        "wave edges (default 0: midpoints only)")
    p.add_argument("--prebuild-jobs", type=int, default=0,
                   help="first build the kernels the DB serves (in the dtype timed), this many nvcc at a time")
    a = p.parse_args()
    os.environ.setdefault("OASR_TUNE_USER_DB", "off")
    import oasr_ops  # noqa: F401  (registers the ops)
    from oasr_ops.runtime.database import parse_signature
    from oasr_ops.tune import database

    measured: dict[str, set[int]] = defaultdict(set)
    with open(a.log) as f:
        for line in f:
            r = json.loads(line)
            measured[r["signature"]].add(int(r["m"]))
    db = database.get_file("system", "sm90", a.family)
    if a.prebuild_jobs and db is not None:
        prebuild(db, a.family, a.prebuild_jobs)
    arms_of = gemm_arms if a.family == "gemm" else fp8_arms
    dtype = "fp16" if a.family == "gemm" else "fp8"
    rows = []
    t0 = time.perf_counter()
    for sig, ms in sorted(measured.items()):
        parts = parse_signature(sig)
        if parts is None or parts.family != a.family or parts.op == "scaled_mm_fp8_quant":
            continue
        entry = db.entries.get(sig) if db is not None else None
        regions = [list(r) for r in entry.regions] if entry is not None else None
        ms_sorted = sorted(ms)
        held = held_out_ms(ms_sorted, regions, a.dense, parts.n, dtype)
        weights = prepare(parts)
        for m, kind in [(m, "measured") for m in ms_sorted] + [(m, "midpoint") for m in held]:
            ref, auto = arms_of(parts, m, weights)
            t_ref, t_auto = timed(ref, auto, a.rounds, a.protocol)
            rows.append({"signature": sig, "m": m, "kind": kind, "torch_us": t_ref, "auto_us": t_auto,
                         "speed_vs_torch": t_ref / t_auto, "auto_config": served_config(a.family, m, parts.n,
                                                                                        parts.k)})
        del weights
        torch.cuda.empty_cache()
        print(f"{sig}: {len(ms_sorted)} measured, {len(held)} held out ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    gm = lambda xs: math.exp(sum(math.log(v) for v in xs) / len(xs))  # noqa: E731
    summary: dict[str, Any] = {}
    for kind in ("measured", "midpoint"):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        sp = [r["speed_vs_torch"] for r in sel]
        worst = sorted(sel, key=lambda r: r["speed_vs_torch"])[:5]
        summary[kind] = {"points": len(sp), "geomean": gm(sp), "min": min(sp),
                         "below_0.95": sum(s < 0.95 for s in sp), "below_0.98": sum(s < 0.98 for s in sp),
                         "worst": {k: worst[0][k] for k in ("signature", "m", "speed_vs_torch", "auto_config")},
                         "worst5": [{k: w[k] for k in ("signature", "m", "speed_vs_torch", "auto_config")}
                                    for w in worst]}
    summary["wall_s"] = time.perf_counter() - t0
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "family": a.family,
                   "dense": a.dense, "protocol": a.protocol, "date": time.strftime("%Y-%m-%d"), "summary": summary, "rows": rows}, f,
                  indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
