"""fp8 e4m3 W8A8 scaled_mm_fp8 on the GPU: tuned (`auto`) and heuristic oasr kernels vs torch._scaled_mm rowwise
(bf16 out) over the census shapes, vs fp16 cuBLAS at M >= 4096, 8192^3 TFLOP/s, the heuristic's regret against
the tuned answer, and FastAccum vs full-fp32 accumulation (speed of the best tile of each and their error
against a float64 reference, as a multiple of torch._scaled_mm's own).

    python benchmarks/scaled_mm_fp8.py --out scaled_mm_fp8.json [--census benchmarks/census/*.json]
        [--ms 16,64,256,1024,4096,16384] [--tile-ms 64,4096] [--rounds 9] [--protocol build|anchor]
        [--weights census|cold|warm] [--quick]

Shapes: every scaled_mm_fp8 signature an fp8_w8a8 deployment of the censuses runs (each gemm site mapped by the
family's census_from, N % 16 == 0 and K % 16 == 0) x --ms.

Method. Every shape's arms are timed together, --rounds rounds in alternating order (forward, then reverse: each
arm is first as often as last; a single fixed order measured torch against itself at 0.92x on the H200), and the
per-shape figure is each arm's median over the rounds. --protocol:

* ``build`` (default): the protocol `oasr tune build` measured the DB with (`tune.bench.measure`): one replay of a
  CUDA graph of max(8, copies) calls per arm per round, a tiny separator kernel after every call (subtracted), so
  consecutive calls cannot overlap through programmatic dependent launch — in a model the GEMM follows another
  kernel (the activation quantizer), never itself; weights cold or warm by the build's rule
  (`tune.bench.weights_cold`: cold when the census model's weight working set exceeds L2; ``--weights`` forces
  one). A DB is judged under the conditions it was built for.
* ``anchor``: benchmarks/anchors' protocol (`benchmarks/scaled_mm.py`'s `time_graph`): a graph of >= --calls
  back-to-back calls, median of --reps replays per round, cold weights (copies over 2x L2).

Why the two disagree at 3-4 us shapes: benchmarks/scaled_mm_fp8_protocol.py measures each factor.
Goals (docs/perf/scaled_mm_fp8.md): auto/torch geomean >= 1.05x and no shape < 0.98x; auto vs fp16 cuBLAS at
M >= 4096 geomean >= 1.6x; 8192^3 >= 1450 TFLOP/s (hot weights, anchor protocol). Nothing is asserted; progress
goes to stderr, tables to stdout, JSON to --out (also written after each signature, so a killed run leaves what
it measured).
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
from dataclasses import dataclass
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
    scales, and `copies16` fp16 copies of the weights (and the fp16 activations) for the cuBLAS arm."""

    def __init__(self, m: int, n: int, k: int, cold: bool = True, seed: int = 0, fp16: bool = True,
                 copies: int | None = None):
        from oasr_ops.families.scaled_mm_fp8.reference import quantize_weight_fp8

        g = torch.Generator(device="cuda").manual_seed(seed)
        self.m, self.n, self.k = m, n, k
        # fp8 weights rotate out of L2 on their own (the build's copies); the fp16 ones need half as many
        self.copies = copies if copies is not None else n_copies(n * k, cold)
        self.copies16 = max(1, -(-self.copies // 2)) if fp16 else 0
        self.x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
        self.a, self.sa = torch.ops.oasr.quantize_per_token_fp8(self.x)
        self.w, self.sw = [], []
        for _ in range(self.copies):
            wq, sw = quantize_weight_fp8(torch.randn(n, k, device="cuda", generator=g))
            self.w.append(wq)
            self.sw.append(sw)
        self.sa2 = self.sa.reshape(-1, 1).contiguous()
        self.sw2 = [s.reshape(1, -1).contiguous() for s in self.sw]
        self.wf = [w.half() for w in self.w[:self.copies16]]

    def oasr(self, config: str, dt=torch.bfloat16):
        a, sa, w, sw, c = self.a, self.sa, self.w, self.sw, self.copies
        return lambda i: torch.ops.oasr.scaled_mm_fp8(a, w[i % c], sa, sw[i % c], None, dt, config)

    def rowwise(self, fast: bool = False):
        a, sa2, w, sw2, c = self.a, self.sa2, self.w, self.sw2, self.copies
        return lambda i: torch._scaled_mm(a, w[i % c].t(), scale_a=sa2, scale_b=sw2[i % c],
                                          out_dtype=torch.bfloat16, use_fast_accum=fast)

    def fp16(self):
        x, wf, c = self.x, self.wf, self.copies16
        return lambda i: torch.mm(x, wf[i % c].t())

    def ref64(self):
        return (self.a.double() @ self.w[0].double().t()) * self.sa.double()[:, None] * self.sw[0].double()[None, :]


@dataclass(frozen=True)
class Protocol:
    """How `time_arms` times a shape's arms (module doc)."""

    name: str = "build"  # "build" (tune.bench.measure: separator, alternating rounds) or "anchor" (time_graph)
    rounds: int = 9
    reps: int = 7  # anchor: replays per round
    calls: int = 16  # anchor: minimum calls per graph


def alternating_medians(names: list[str], rounds: int, timer) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each name timed once per round by `timer(name)`, the rounds in alternating order (`bench.round_order`);
    the per-name median over the rounds and every round's value."""
    import random

    from oasr_ops.tune.bench import round_order

    per: dict[str, list[float]] = {nm: [] for nm in names}
    rng = random.Random(0)
    for r in range(rounds):
        for nm in round_order(names, r, rng, "alternate"):
            per[nm].append(timer(nm))
    return {nm: statistics.median(v) for nm, v in per.items()}, per


def time_arms(arms: dict, copies: int, proto: Protocol) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per-call microseconds of each arm `arms[name](i)` (i: the weight copy), median over the rounds, and the
    rounds themselves."""
    if proto.name == "anchor":
        return alternating_medians(list(arms), proto.rounds,
                                   lambda nm: time_graph(arms[nm], copies, proto.calls, proto.reps))
    from oasr_ops.tune import bench

    n = max(bench.MIN_CALLS, copies)
    res = bench.measure({nm: [(lambda f, j: (lambda: f(j)))(fn, i) for i in range(n)] for nm, fn in arms.items()},
                        rounds=proto.rounds, order="alternate")
    return ({nm: r.estimate.median_s * 1e6 for nm, r in res.items()},
            {nm: [x * 1e6 for x in r.samples_s] for nm, r in res.items()})


def served(p: Problem, config: str) -> str:
    fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
    plan = fops._PLANS.plans.get(("scaled_mm_fp8", config, torch.bfloat16, p.m, p.n, p.k, False, p.a.device,
                                  fops._epoch()))
    return f"{plan.config} ({plan.tier})" if plan is not None else "?"


def census_signatures(paths: list[str]) -> list[tuple[int, int, int]]:
    """(N, K, the census model's weight working set in bytes) of every plain-op signature."""
    from oasr_ops.tune.build import load_works
    from oasr_ops.runtime.db_signatures import parse_signature

    works = load_works(paths, "scaled_mm_fp8")
    out = {}
    for sig, work in works.items():
        parts = parse_signature(sig)
        if parts is not None and parts.op == "scaled_mm_fp8":
            out[(parts.n, parts.k)] = max(out.get((parts.n, parts.k), 0), work.weight_bytes)
    return sorted((n, k, b) for (n, k), b in out.items())


def tile_scan(p: Problem, ids: list[str], proto: Protocol) -> dict:
    """Every tile's time and error (max |y - ref| over torch rowwise's) at one point."""
    ref = p.ref64()
    base = float((p.rowwise()(0).double() - ref).abs().max())
    floor = torch.finfo(torch.bfloat16).eps * float(ref.abs().max())
    out = {}
    for cid in ids:
        y = p.oasr(cid)(0)
        out[cid] = {"err_ratio": float((y.double() - ref).abs().max()) / max(base, floor)}
    fast_err = float((p.rowwise(True)(0).double() - ref).abs().max())
    out["torch_rowwise_fast_accum"] = {"err_ratio": fast_err / max(base, floor)}
    arms = {cid: p.oasr(cid) for cid in ids}
    arms["torch_rowwise_fast_accum"] = p.rowwise(True)
    us, _ = time_arms(arms, p.copies, proto)
    for name, t in us.items():
        out[name]["us"] = t
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--census", action="append", default=None, help="census JSON (default: benchmarks/census/*)")
    ap.add_argument("--ms", default="16,64,256,1024,4096,16384")
    ap.add_argument("--tile-ms", default="64,4096", help="Ms at which every tile is timed (FastAccum vs not); empty: none")
    ap.add_argument("--protocol", choices=("build", "anchor"), default="build", help="module doc")
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds per shape (median)")
    ap.add_argument("--weights", choices=("census", "cold", "warm"), default="census",
                    help="weight state (build protocol): the build's rule per census signature, or forced")
    ap.add_argument("--reps", type=int, default=7, help="anchor protocol: replays per round")
    ap.add_argument("--calls", type=int, default=16, help="anchor protocol: minimum calls per graph")
    ap.add_argument("--quick", action="store_true", help="M in {64, 4096}, tiles at 4096 only")
    ap.add_argument("--no-8192", action="store_true", help="skip the 8192^3 arms")
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
    from oasr_ops.tune import bench

    lane = native_lane(current_arch_family() or "", "scaled_mm_fp8")
    ids = list(lane.ids()) if lane is not None else []
    if args.prebuild_jobs and lane is not None:
        from oasr_ops.codegen.jit import JitSpec, build_many

        specs = [JitSpec.for_kernel(lane, c, "bf16", current_arch_family()) for c in lane.space]
        log(build_many(specs, jobs=args.prebuild_jobs, progress=False).summary())
    census = args.census or sorted(glob.glob(str(ROOT / "benchmarks" / "census" / "*.json")))
    nks = census_signatures(census)
    ms = [64, 4096] if args.quick else [int(x) for x in args.ms.split(",")]
    tile_ms = [4096] if args.quick else [int(x) for x in args.tile_ms.split(",") if x]
    proto = Protocol(args.protocol, args.rounds, args.reps, args.calls)
    log(f"{len(nks)} signatures x {len(ms)} Ms; every tile at M in {tile_ms}; lane {lane.name if lane else None}; "
        f"{proto}")
    if proto.name == "build":
        method = (f"tune.bench.measure: a CUDA graph of max(8, copies) calls with a separator kernel after each "
                  f"(subtracted), {proto.rounds} rounds in alternating order, median; weights {args.weights}")
    else:
        method = (f"CUDA graph of >= {proto.calls} back-to-back calls, median of {proto.reps} replays, "
                  f"{proto.rounds} rounds in alternating order, median; cold weights")
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "l2_bytes": l2_bytes(),
           "protocol": proto.name, "rounds": proto.rounds, "weights": args.weights, "method": method,
           "census": census, "shapes": [], "tiles": [], "8192": {}}
    out = Path(args.out)
    t0 = time.time()
    for si, (n, k, model_bytes) in enumerate(nks):
        if proto.name == "anchor" or args.weights == "cold":
            cold = True
        elif args.weights == "warm":
            cold = False
        else:
            cold = bench.weights_cold(model_bytes)
        copies = n_copies(n * k * 3, True) if proto.name == "anchor" else bench.copies_for(n * k, cold, cap=256)
        for m in ms:
            p = Problem(m, n, k, fp16=m >= 4096, copies=copies)
            row = {"M": m, "N": n, "K": k, "weight_copies": p.copies, "l2": "cold" if cold else "warm"}
            arms = {"oasr_auto": p.oasr("auto"), "oasr_heuristic": p.oasr("heuristic"),
                    "torch_rowwise": p.rowwise()}
            if m >= 4096:
                arms["fp16_cublas"] = p.fp16()
            us, rounds = time_arms(arms, p.copies, proto)
            for name in arms:
                row[f"{name}_us"] = us[name]
            row["rounds_us"] = rounds
            row["auto_config"] = served(p, "auto")
            row["heuristic_config"] = served(p, "heuristic")
            row["auto_vs_torch"] = row["torch_rowwise_us"] / row["oasr_auto_us"]
            row["heuristic_regret"] = row["oasr_heuristic_us"] / row["oasr_auto_us"] - 1
            if m in tile_ms and ids:
                row["tiles"] = tile_scan(p, ids, proto)
            doc["shapes"].append(row)
            del p
            torch.cuda.empty_cache()
        log(f"[{si + 1}/{len(nks)}] N={n} K={k} done ({time.time() - t0:.0f} s)")
        out.write_text(json.dumps(doc, indent=1))
    if not args.no_8192:  # hot weights, the anchors' protocol (8192^3 is far above any launch effect)
        p = Problem(8192, 8192, 8192, cold=False)
        flops = 2 * 8192 ** 3
        arms = {"oasr_auto": p.oasr("auto"), "oasr_heuristic": p.oasr("heuristic"), "torch_rowwise": p.rowwise(),
                "torch_rowwise_fast_accum": p.rowwise(True), "fp16_cublas": p.fp16()}
        for cid in ids:
            arms[f"tile:{cid}"] = p.oasr(cid)
        us, _ = time_arms(arms, 1, Protocol("anchor", 3, args.reps, 8))
        for name, t in us.items():
            doc["8192"][name] = {"us": t, "tflops": flops / t / 1e6}
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
        # a shape served torch compares torch with itself: below 0.98x there is noise, not a partition loss
        "shapes_below_0.98x_served_a_tile": sum(r["auto_vs_torch"] < 0.98 and not r["auto_config"].startswith("torch")
                                                for r in rows),
        "worst_vs_torch": [{k_: r[k_] for k_ in ("M", "N", "K", "auto_vs_torch", "auto_config", "oasr_auto_us",
                                                  "torch_rowwise_us")}
                           for r in sorted(rows, key=lambda r: r["auto_vs_torch"])[:6]],
        "protocol": proto.name, "weights": args.weights,
        "auto_vs_fp16_geomean_m_ge_4096": geomean(vs_f16),
        "heuristic_regret_geomean": (geomean([1 + r["heuristic_regret"] for r in rows]) or 1) - 1,
        "heuristic_regret_max": max((r["heuristic_regret"] for r in rows), default=None),
        "tflops_8192_auto": doc["8192"].get("oasr_auto", {}).get("tflops"),
        "tflops_8192_best_tile": max((v["tflops"] for k_, v in doc["8192"].items() if k_.startswith("tile:")),
                                     default=None),
        "tflops_8192_torch_rowwise": doc["8192"].get("torch_rowwise", {}).get("tflops"),
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
