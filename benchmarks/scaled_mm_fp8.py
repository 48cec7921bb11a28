"""fp8 e4m3 W8A8 scaled_mm_fp8 on the GPU: tuned (`auto`) and heuristic oasr kernels vs torch._scaled_mm rowwise
(bf16 out) over the census shapes, vs fp16 cuBLAS at M >= 4096, 8192^3 TFLOP/s, the heuristic's regret against
the tuned answer, and FastAccum vs full-fp32 accumulation (speed of the best tile of each and their error
against a float64 reference, as a multiple of torch._scaled_mm's own).

    python benchmarks/scaled_mm_fp8.py --out scaled_mm_fp8.json [--census benchmarks/census/*.json]
        [--ms 16,64,256,1024,4096,16384] [--tile-ms 64,4096] [--reps 7] [--calls 16] [--quick]

Shapes: every scaled_mm_fp8 signature an fp8_w8a8 deployment of the censuses runs (each gemm site mapped by the
family's census_from, N % 16 == 0 and K % 16 == 0) x --ms. Method (the anchors' protocol, benchmarks/scaled_mm.py's
`time_graph`): each arm is a CUDA graph of >= --calls calls replayed --reps times, median replay / calls; weights
rotate through enough copies to exceed 2x L2 (cold); e4m3 activations + per-token scales stay hot. Goals
(docs/perf/scaled_mm_fp8.md): auto/torch geomean >= 1.05x and no shape < 0.98x; auto vs fp16 cuBLAS at M >= 4096
geomean >= 1.6x; 8192^3 >= 1450 TFLOP/s. Nothing is asserted; progress goes to stderr, tables to stdout, JSON
to --out (also written after each signature, so a killed run leaves what it measured).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

_spec = importlib.util.spec_from_file_location("_smm_bench", Path(__file__).with_name("scaled_mm.py"))
_smm_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_smm_bench)
time_graph, n_copies, l2_bytes = _smm_bench.time_graph, _smm_bench.n_copies, _smm_bench.l2_bytes


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


class Problem:
    """Inputs of one (M, N, K) point: e4m3 activations + per-token scales, `copies` e4m3 weights + per-channel
    scales, and fp16 copies of both for the cuBLAS arm."""

    def __init__(self, m: int, n: int, k: int, cold: bool = True, seed: int = 0, fp16: bool = True):
        from oasr_ops.families.scaled_mm_fp8.reference import quantize_weight_fp8

        g = torch.Generator(device="cuda").manual_seed(seed)
        self.m, self.n, self.k = m, n, k
        self.copies = n_copies(n * k * (3 if fp16 else 1), cold)
        self.x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
        self.a, self.sa = torch.ops.oasr.quantize_per_token_fp8(self.x)
        self.w, self.sw = [], []
        for _ in range(self.copies):
            wq, sw = quantize_weight_fp8(torch.randn(n, k, device="cuda", generator=g))
            self.w.append(wq)
            self.sw.append(sw)
        self.sa2 = self.sa.reshape(-1, 1).contiguous()
        self.sw2 = [s.reshape(1, -1).contiguous() for s in self.sw]
        self.wf = [w.half() for w in self.w] if fp16 else []

    def oasr(self, config: str, dt=torch.bfloat16):
        a, sa, w, sw = self.a, self.sa, self.w, self.sw
        return lambda i: torch.ops.oasr.scaled_mm_fp8(a, w[i], sa, sw[i], None, dt, config)

    def rowwise(self, fast: bool = False):
        a, sa2, w, sw2 = self.a, self.sa2, self.w, self.sw2
        return lambda i: torch._scaled_mm(a, w[i].t(), scale_a=sa2, scale_b=sw2[i], out_dtype=torch.bfloat16,
                                          use_fast_accum=fast)

    def fp16(self):
        x, wf = self.x, self.wf
        return lambda i: torch.mm(x, wf[i].t())

    def ref64(self):
        return (self.a.double() @ self.w[0].double().t()) * self.sa.double()[:, None] * self.sw[0].double()[None, :]


def served(p: Problem, config: str) -> str:
    fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
    plan = fops._PLANS.plans.get(("scaled_mm_fp8", config, torch.bfloat16, p.m, p.n, p.k, False, p.a.device,
                                  fops._epoch()))
    return f"{plan.config} ({plan.tier})" if plan is not None else "?"


def census_signatures(paths: list[str]) -> list[tuple[int, int]]:
    from oasr_ops.tune.build import load_works
    from oasr_ops.runtime.db_signatures import parse_signature

    works = load_works(paths, "scaled_mm_fp8")
    out = set()
    for sig in works:
        parts = parse_signature(sig)
        if parts is not None and parts.op == "scaled_mm_fp8":
            out.add((parts.n, parts.k))
    return sorted(out)


def tile_scan(p: Problem, ids: list[str], reps: int, calls: int) -> dict:
    """Every tile's time and error (max |y - ref| over torch rowwise's) at one point."""
    ref = p.ref64()
    base = float((p.rowwise()(0).double() - ref).abs().max())
    floor = torch.finfo(torch.bfloat16).eps * float(ref.abs().max())
    out = {}
    for cid in ids:
        y = p.oasr(cid)(0)
        err = float((y.double() - ref).abs().max())
        out[cid] = {"us": time_graph(p.oasr(cid), p.copies, calls, reps), "err_ratio": err / max(base, floor)}
    fast_err = float((p.rowwise(True)(0).double() - ref).abs().max())
    out["torch_rowwise_fast_accum"] = {"us": time_graph(p.rowwise(True), p.copies, calls, reps),
                                       "err_ratio": fast_err / max(base, floor)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--census", action="append", default=None, help="census JSON (default: benchmarks/census/*)")
    ap.add_argument("--ms", default="16,64,256,1024,4096,16384")
    ap.add_argument("--tile-ms", default="64,4096", help="Ms at which every tile is timed (FastAccum vs not)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="M in {64, 4096}, tiles at 4096 only")
    ap.add_argument("--prebuild-jobs", type=int, default=0,
                    help="first build every lane tile's bf16 kernel, this many nvcc at a time (a lazy JIT would "
                         "build them one at a time inside the timing loop)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        log("needs a CUDA GPU")
        return 2
    import oasr_ops  # noqa: F401  (registers the ops)
    from oasr_ops.configs import parse
    from oasr_ops.families.scaled_mm_fp8.lanes import summation_order
    from oasr_ops.runtime.arch import current_arch_family
    from oasr_ops.runtime.registry import native_lane

    lane = native_lane(current_arch_family() or "", "scaled_mm_fp8")
    ids = list(lane.ids()) if lane is not None else []
    if args.prebuild_jobs and lane is not None:
        from oasr_ops.codegen.jit import JitSpec, build_many

        specs = [JitSpec.for_kernel(lane, c, "bf16", current_arch_family()) for c in lane.space]
        log(build_many(specs, jobs=args.prebuild_jobs, progress=False).summary())
    census = args.census or sorted(glob.glob(str(ROOT / "benchmarks" / "census" / "*.json")))
    nks = census_signatures(census)
    ms = [64, 4096] if args.quick else [int(x) for x in args.ms.split(",")]
    tile_ms = [4096] if args.quick else [int(x) for x in args.tile_ms.split(",")]
    log(f"{len(nks)} signatures x {len(ms)} Ms; every tile at M in {tile_ms}; lane {lane.name if lane else None}")
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "l2_bytes": l2_bytes(),
           "method": f"CUDA graph of >= {args.calls} calls, median of {args.reps} replays, cold weights",
           "census": census, "shapes": [], "tiles": [], "8192": {}}
    out = Path(args.out)
    t0 = time.time()
    for si, (n, k) in enumerate(nks):
        for m in ms:
            p = Problem(m, n, k, fp16=m >= 4096)
            row = {"M": m, "N": n, "K": k, "weight_copies": p.copies}
            arms = {"oasr_auto": p.oasr("auto"), "oasr_heuristic": p.oasr("heuristic"),
                    "torch_rowwise": p.rowwise()}
            if m >= 4096:
                arms["fp16_cublas"] = p.fp16()
            for name, fn in arms.items():
                row[f"{name}_us"] = time_graph(fn, p.copies, args.calls, args.reps)
            row["auto_config"] = served(p, "auto")
            row["heuristic_config"] = served(p, "heuristic")
            row["auto_vs_torch"] = row["torch_rowwise_us"] / row["oasr_auto_us"]
            row["heuristic_regret"] = row["oasr_heuristic_us"] / row["oasr_auto_us"] - 1
            if m in tile_ms and ids:
                row["tiles"] = tile_scan(p, ids, args.reps, args.calls)
            doc["shapes"].append(row)
            del p
            torch.cuda.empty_cache()
        log(f"[{si + 1}/{len(nks)}] N={n} K={k} done ({time.time() - t0:.0f} s)")
        out.write_text(json.dumps(doc, indent=1))
    # 8192^3, hot weights
    p = Problem(8192, 8192, 8192, cold=False)
    flops = 2 * 8192 ** 3
    arms = {"oasr_auto": p.oasr("auto"), "oasr_heuristic": p.oasr("heuristic"), "torch_rowwise": p.rowwise(),
            "torch_rowwise_fast_accum": p.rowwise(True), "fp16_cublas": p.fp16()}
    for cid in ids:
        arms[f"tile:{cid}"] = p.oasr(cid)
    for name, fn in arms.items():
        us = time_graph(fn, 1, calls=8, reps=args.reps)
        doc["8192"][name] = {"us": us, "tflops": flops / us / 1e6}
    doc["8192"]["auto_config"] = served(p, "auto")
    doc["8192"]["heuristic_config"] = served(p, "heuristic")
    del p

    rows = doc["shapes"]
    print("| M | N | K | oasr auto | oasr heuristic | torch rowwise | fp16 cuBLAS | auto/torch | auto config |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f16 = f"{r['fp16_cublas_us']:.2f}" if "fp16_cublas_us" in r else "-"
        print(f"| {r['M']} | {r['N']} | {r['K']} | {r['oasr_auto_us']:.2f} | {r['oasr_heuristic_us']:.2f} | "
              f"{r['torch_rowwise_us']:.2f} | {f16} | {r['auto_vs_torch']:.3f}x | {r['auto_config']} |")
    vs_torch = [r["auto_vs_torch"] for r in rows]
    vs_f16 = [r["fp16_cublas_us"] / r["oasr_auto_us"] for r in rows if "fp16_cublas_us" in r]
    summary = {
        "auto_vs_torch_geomean": geomean(vs_torch), "auto_vs_torch_min": min(vs_torch) if vs_torch else None,
        "shapes_below_0.98x_torch": sum(x < 0.98 for x in vs_torch),
        "auto_vs_fp16_geomean_m_ge_4096": geomean(vs_f16),
        "heuristic_regret_geomean": (geomean([1 + r["heuristic_regret"] for r in rows]) or 1) - 1,
        "heuristic_regret_max": max((r["heuristic_regret"] for r in rows), default=None),
        "tflops_8192_auto": doc["8192"]["oasr_auto"]["tflops"],
        "tflops_8192_best_tile": max((v["tflops"] for k_, v in doc["8192"].items() if k_.startswith("tile:")),
                                     default=None),
        "tflops_8192_torch_rowwise": doc["8192"]["torch_rowwise"]["tflops"],
    }
    # FastAccum vs full accumulation: per scanned point, the best tile of each kind and their error ratios
    fa = []
    for r in rows:
        if "tiles" not in r:
            continue
        t = {c: v for c, v in r["tiles"].items() if c in ids}
        fast = {c: v for c, v in t.items() if parse(c).fast_accum}
        full = {c: v for c, v in t.items() if not parse(c).fast_accum}
        bf, bn = min(fast, key=lambda c: fast[c]["us"]), min(full, key=lambda c: full[c]["us"])
        fa.append({"M": r["M"], "N": r["N"], "K": r["K"], "best_fast": bf, "best_full": bn,
                   "speedup_fast_over_full": full[bn]["us"] / fast[bf]["us"],
                   "max_err_ratio_fast": max(v["err_ratio"] for v in fast.values()),
                   "max_err_ratio_full": max(v["err_ratio"] for v in full.values()),
                   "err_ratio_by_order": {summation_order(parse(c)): max(v["err_ratio"] for c2, v in t.items()
                                                                         if summation_order(parse(c2)) ==
                                                                         summation_order(parse(c)))
                                          for c in t}})
    summary["fast_accum_speedup_geomean"] = geomean([x["speedup_fast_over_full"] for x in fa])
    summary["fast_accum_max_err_ratio"] = max((x["max_err_ratio_fast"] for x in fa), default=None)
    summary["full_accum_max_err_ratio"] = max((x["max_err_ratio_full"] for x in fa), default=None)
    doc["fast_accum"] = fa
    doc["summary"] = summary
    doc["wall_s"] = time.time() - t0
    print("\nsummary: " + json.dumps(summary, indent=1))
    print("\n8192^3 (hot weights): " + ", ".join(f"{k_} {v['tflops']:.0f}" for k_, v in doc["8192"].items()
                                                 if isinstance(v, dict)) + " TFLOP/s")
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
