"""fp8 tile probe (issue 14, goals (b) and (c)): the candidate sm90 configs (`lanes.SM90_CANDIDATES`, not served
yet) against the lane's best large-M tiles, torch._scaled_mm rowwise (with and without use_fast_accum) and fp16
cuBLAS, at 8192^3 and the ASR census shapes with M >= 4096.

    python benchmarks/scaled_mm_fp8_probe.py --out probe.json [--jobs 16] [--rounds 3] [--reps 7] [--quick]

Kernels: every probed config's bf16 kernel is built first (`build_many`, --jobs in parallel; a config whose
build fails is reported and left out). Shapes: 8192^3 (hot weights) and M in {4096, 12000, 16384} x (N, K) in
{(3072, 768), (768, 3072), (2048, 512), (512, 2048), (4096, 1024), (1024, 4096)} (cold weights: copies over
2x L2). Method: each arm a CUDA graph of >= --calls calls (`benchmarks/scaled_mm.py`'s `time_graph`, median of
--reps replays); the arms are timed --rounds times, in forward then reverse order alternately (a fixed order
biased the second of a pair by up to 8 % on the H200), and the median round is kept. Numerics at every shape, on
the first weight copy: each config's max |y - ref64| as a multiple of torch rowwise's own (`err_ratio`), and
whether it equals the first probed config of its summation-order group bitwise (`bitwise_with`: the group rule
the build gates on). Nothing is asserted; the JSON (--out) has per-shape rows and a summary:
best candidate / best lane tile / torch at each shape, geomeans vs torch rowwise and vs fp16 cuBLAS.
"""
from __future__ import annotations

import argparse
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
time_graph, n_copies = _smm_bench.time_graph, _smm_bench.n_copies

# The lane's tiles that win at large M today (docs/perf/scaled_mm_fp8.md): the bar for the candidates.
LANE_REFERENCES = ("t128x256x128_c1x1_coop_fa", "t128x128x128_c2x1_pp_fa", "t128x128x128_c1x1_coop",
                   "t64x128x128_c1x1_pp_fa", "t128x128x128_c1x2_pp_fa", "t128x128x128_c2x1_pp_z8_fa",
                   "t128x256x128_c1x1_coop_z8_fa")
MS = (4096, 12000, 16384)
NKS = ((3072, 768), (768, 3072), (2048, 512), (512, 2048), (4096, 1024), (1024, 4096))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def build(lane, ids: list[str], jobs: int) -> list[str]:
    """Build the bf16 kernels of `ids`; the ids that built."""
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.configs import parse

    specs = {cid: JitSpec.for_kernel(lane, parse(cid), "bf16", "sm90") for cid in ids}
    t0 = time.time()
    report = build_many(list(specs.values()), jobs=jobs, progress=False)
    log(f"{len(specs)} kernels ({time.time() - t0:.0f} s): {report.summary()}")
    return [cid for cid, spec in specs.items() if spec.name not in report.failed]


def shape_row(m: int, n: int, k: int, lane, ids: list[str], rounds: int, reps: int, calls: int) -> dict:
    from oasr_ops.configs import parse
    from oasr_ops.families.scaled_mm_fp8.lanes import summation_order
    from oasr_ops.families.scaled_mm_fp8.reference import quantize_weight_fp8

    fops = sys.modules["oasr_ops.families.scaled_mm_fp8.ops"]
    cold = not (m == n == k == 8192)
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    copies = n_copies(n * k * 3, cold)  # fp8 + fp16 copies of W rotate out of L2
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
    a, sa = torch.ops.oasr.quantize_per_token_fp8(x)
    ws, sws = [], []
    for _ in range(copies):
        wq, sw = quantize_weight_fp8(torch.randn(n, k, device="cuda", generator=g))
        ws.append(wq)
        sws.append(sw)
    sa2 = sa.reshape(-1, 1).contiguous()
    sw2 = [s.reshape(1, -1).contiguous() for s in sws]
    wf = [w.half() for w in ws]
    bf16 = torch.bfloat16

    def rowwise(fast: bool):
        return lambda i: torch._scaled_mm(a, ws[i].t(), scale_a=sa2, scale_b=sw2[i], out_dtype=bf16,
                                          use_fast_accum=fast)

    arms = {"torch_rowwise": rowwise(False), "torch_rowwise_fast_accum": rowwise(True),
            "fp16_cublas": lambda i: torch.mm(x, wf[i].t())}
    sig = f"scaled_mm_fp8|op=scaled_mm_fp8|N={n}|K={k}"
    for cid in ids:
        run = fops._kernel_run("scaled_mm_fp8", parse(cid), bf16, m, n, k, "sm90", sig, lane=lane)
        if run is not None:
            arms[cid] = (lambda r: (lambda i: r(a, ws[i], sa, sws[i], None, None)))(run)
    # numerics on copy 0
    ref = (a.double() @ ws[0].double().t()) * sa.double()[:, None] * sws[0].double()[None, :]
    base = max(float((rowwise(False)(0).double() - ref).abs().max()),
               torch.finfo(bf16).eps * float(ref.abs().max()))
    numerics: dict[str, dict] = {}
    reps_of: dict[str, tuple[str, torch.Tensor]] = {}
    for name, fn in arms.items():
        if name == "fp16_cublas":
            continue
        y = fn(0)
        entry = {"err_ratio": float((y.double() - ref).abs().max()) / base}
        if name in ids:
            order = summation_order(parse(name))
            rep = reps_of.setdefault(order, (name, y))
            if rep[0] != name:
                entry["bitwise_with"] = {"config": rep[0], "equal": bool(torch.equal(y, rep[1]))}
            entry["order"] = order
        numerics[name] = entry
    del ref, reps_of
    # timing: rounds in alternating (forward / reverse) order, the median round
    names = list(arms)
    per: dict[str, list[float]] = {nm: [] for nm in names}
    for r in range(rounds):
        for nm in (names if r % 2 == 0 else names[::-1]):
            per[nm].append(time_graph(arms[nm], copies, calls, reps))
    flops = 2.0 * m * n * k
    row = {"M": m, "N": n, "K": k, "weight_copies": copies, "l2": "cold" if cold else "hot", "arms": {}}
    for nm in names:
        us = statistics.median(per[nm])
        row["arms"][nm] = {"us": us, "tflops": flops / us / 1e6, "rounds_us": per[nm], **numerics.get(nm, {})}
    return row


def summarize(rows: list[dict], candidates: list[str], references: list[str]) -> dict:
    def best(row, pool):
        got = [(row["arms"][c]["us"], c) for c in pool if c in row["arms"]]
        return min(got) if got else (None, None)

    per_shape = []
    for r in rows:
        t_c, c = best(r, candidates)
        t_l, l_ = best(r, references)
        t_all, a_ = best(r, candidates + references)
        torch_us = r["arms"]["torch_rowwise"]["us"]
        f16 = r["arms"]["fp16_cublas"]["us"]
        per_shape.append({"M": r["M"], "N": r["N"], "K": r["K"], "best_candidate": c, "best_lane_tile": l_,
                          "best": a_, "best_vs_torch": torch_us / t_all if t_all else None,
                          "best_lane_vs_torch": torch_us / t_l if t_l else None,
                          "best_vs_fp16": f16 / t_all if t_all else None,
                          "torch_fast_vs_torch": torch_us / r["arms"]["torch_rowwise_fast_accum"]["us"],
                          "tflops_best": r["arms"][a_]["tflops"] if a_ else None,
                          "tflops_torch": r["arms"]["torch_rowwise"]["tflops"]})
    big = [p for p in per_shape if not (p["M"] == p["N"] == p["K"] == 8192)]
    wins: dict[str, int] = {}
    for p in per_shape:
        if p["best"]:
            wins[p["best"]] = wins.get(p["best"], 0) + 1
    bitwise_bad = sorted({f"{nm}@{r['M']}x{r['N']}x{r['K']}" for r in rows for nm, v in r["arms"].items()
                          if v.get("bitwise_with") and not v["bitwise_with"]["equal"]})
    worst_err = {}
    for r in rows:
        for nm, v in r["arms"].items():
            if "err_ratio" in v:
                worst_err[nm] = max(worst_err.get(nm, 0.0), v["err_ratio"])
    return {
        "shapes": per_shape,
        "census_geomean_best_vs_torch": geomean([p["best_vs_torch"] for p in big]),
        "census_geomean_best_lane_vs_torch": geomean([p["best_lane_vs_torch"] for p in big]),
        "census_geomean_best_vs_fp16": geomean([p["best_vs_fp16"] for p in big]),
        "census_geomean_torch_vs_fp16": geomean([r["arms"]["fp16_cublas"]["us"] / r["arms"]["torch_rowwise"]["us"]
                                                 for r in rows if not (r["M"] == r["N"] == r["K"] == 8192)]),
        "wins": dict(sorted(wins.items(), key=lambda kv: -kv[1])),
        "bitwise_mismatches": bitwise_bad,
        "max_err_ratio": dict(sorted(worst_err.items())),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="8192^3 and M=16384 only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        log("needs a CUDA GPU")
        return 2
    import oasr_ops  # noqa: F401  (registers the ops)
    from oasr_ops.families.scaled_mm_fp8.lanes import SM90_CANDIDATES, sm90_with_candidates

    lane = sm90_with_candidates()
    candidates = [c.id for c in SM90_CANDIDATES]
    built = build(lane, candidates + list(LANE_REFERENCES), args.jobs)
    cands = [c for c in candidates if c in built]
    refs = [c for c in LANE_REFERENCES if c in built]
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "method": f"CUDA graph of >= {args.calls} calls, median of {args.reps} replays, median of "
                     f"{args.rounds} rounds in alternating order; cold weights except 8192^3",
           "candidates": candidates, "built": built, "not_built": [c for c in candidates + list(LANE_REFERENCES)
                                                                  if c not in built], "rows": []}
    out = Path(args.out)
    shapes = [(8192, 8192, 8192)] + [(m, n, k) for m in ((16384,) if args.quick else MS) for n, k in NKS]
    t0 = time.time()
    for m, n, k in shapes:
        row = shape_row(m, n, k, lane, cands + refs, args.rounds, args.reps, args.calls)
        doc["rows"].append(row)
        top = sorted(row["arms"].items(), key=lambda kv: kv[1]["us"])[:4]
        log(f"M={m} N={n} K={k}: " + ", ".join(f"{nm} {v['tflops']:.0f}" for nm, v in top) + " TFLOP/s "
            f"({time.time() - t0:.0f} s)")
        out.write_text(json.dumps(doc, indent=1))
        torch.cuda.empty_cache()
    doc["summary"] = summarize(doc["rows"], cands, refs)
    doc["wall_s"] = time.time() - t0
    out.write_text(json.dumps(doc, indent=1))
    s = doc["summary"]
    print("| M | N | K | best | TFLOP/s | best/torch | best lane tile/torch | best/fp16 | torch fast/torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    for p in s["shapes"]:
        print(f"| {p['M']} | {p['N']} | {p['K']} | {p['best']} | {f(p['tflops_best'], '.0f')} | "
              f"{f(p['best_vs_torch'], '.3f')} | {f(p['best_lane_vs_torch'], '.3f')} | {f(p['best_vs_fp16'], '.2f')} | "
              f"{f(p['torch_fast_vs_torch'], '.3f')} |")
    print(json.dumps({k: v for k, v in s.items() if k != "shapes"}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
