"""Why the fp8 build and the census benchmark disagree at 3-4 us shapes (issue 14): each timing factor apart.

    python benchmarks/scaled_mm_fp8_protocol.py --out protocol.json [--rounds 9] [--shapes 16x768x256,...]

The build (`oasr tune build`, `tune.bench.measure`) measured the small-M swap-AB tiles 14-20 % faster than
torch._scaled_mm (e.g. N=768 K=256: 3.43 vs 3.92 us at M=15, warm weights, a separator kernel after every call);
the first census benchmark (back-to-back calls, cold weights) measured the same tile 0.97x of torch at M=16
(4.41 vs 4.29 us). At each shape this times torch._scaled_mm rowwise, what the DB serves (`auto`) and the two
small-M FastAccum swap-AB tiles under every combination of:

* what precedes each call: ``b2b`` — the same GEMM (back-to-back, the anchors' protocol: a kernel launched with
  programmatic dependent launch, as cuBLAS's may be, overlaps its prologue with the previous call's tail);
  ``sep`` — a tiny unrelated kernel, subtracted (the build's protocol); ``quant`` — the activation quantizer
  `quantize_per_token_fp8` on fresh fp16 activations, whose output the GEMM reads, less the quantizer alone
  (what an fp8_w8a8 deployment runs: every Linear is quantizer -> GEMM);
* the weights: ``cold`` (copies rotating over 2x L2) or ``warm`` (one copy; the build's state for the census
  models whose weights fit in L2).

All arms of one (shape, protocol) are timed together in alternating rounds (`tune.bench.measure(order=
"alternate")`, median). The JSON has per shape and protocol each arm's us and torch/arm; the summary says, per
protocol, each arm's geomean speed vs torch over the shapes. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The census benchmark's small-M losers (sm90_scaled_mm_fp8_bench_rebuilt.json) and winners next to them.
SHAPES = ((16, 768, 256), (64, 768, 256), (16, 1024, 256), (16, 512, 256), (16, 256, 256), (16, 1024, 1024),
          (16, 3072, 1024), (256, 768, 256))
TILES = ("t64x64x256_c1x1_pp_fa_swab", "t64x16x256_c1x1_pp_fa_swab")
PROTOCOLS = tuple(f"{p}_{w}" for p in ("b2b", "sep", "quant") for w in ("warm", "cold"))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def shape_rows(m: int, n: int, k: int, rounds: int) -> dict[str, dict[str, float]]:
    from oasr_ops.families.scaled_mm_fp8.reference import quantize_weight_fp8
    from oasr_ops.tune import bench

    g = torch.Generator(device="cuda").manual_seed(m + 7 * n + 13 * k)
    cold_copies = bench.copies_for(n * k, cold=True, cap=256)
    ws, sws = [], []
    for _ in range(cold_copies):
        wq, sw = quantize_weight_fp8(torch.randn(n, k, device="cuda", generator=g))
        ws.append(wq)
        sws.append(sw)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
    a, sa = torch.ops.oasr.quantize_per_token_fp8(x)
    sw2 = [s.reshape(1, -1).contiguous() for s in sws]
    quant = torch.ops.oasr.quantize_per_token_fp8
    bf16 = torch.bfloat16

    def gemm(arm: str, a_, sa_, i: int):
        if arm == "torch":
            return torch._scaled_mm(a_, ws[i].t(), scale_a=sa_.reshape(-1, 1), scale_b=sw2[i], out_dtype=bf16)
        return torch.ops.oasr.scaled_mm_fp8(a_, ws[i], sa_, sws[i], None, bf16, arm)

    arms = ("torch", "auto", *TILES)
    out: dict[str, dict[str, float]] = {}
    for proto in PROTOCOLS:
        kind, state = proto.split("_")
        copies = cold_copies if state == "cold" else 1
        calls = max(bench.MIN_CALLS, copies)

        def call(arm: str, i: int):
            j = i % copies
            if kind == "quant":
                if arm == "quantizer":
                    return lambda: quant(x)
                return lambda: gemm(arm, *quant(x), j)
            return lambda: gemm(arm, a, sa, j)

        names = list(arms) + (["quantizer"] if kind == "quant" else [])
        res = bench.measure({nm: [call(nm, i) for i in range(calls)] for nm in names}, rounds=rounds,
                            order="alternate", separator=(kind == "sep"))
        us = {nm: r.estimate.median_s * 1e6 for nm, r in res.items()}
        if kind == "quant":  # the GEMM's share: the pair less the quantizer alone
            q = us.pop("quantizer")
            us = {nm: t - q for nm, t in us.items()}
            us["quantizer_alone"] = q
        row = {f"{nm}_us": t for nm, t in us.items()}
        row.update({f"{nm}_vs_torch": us["torch"] / us[nm] for nm in arms if us.get(nm, 0) > 0})
        row["copies"] = copies
        out[proto] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}x{k}" for m, n, k in SHAPES), help="MxNxK,...")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        log("needs a CUDA GPU")
        return 2
    import oasr_ops  # noqa: F401  (registers the ops)

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds,
           "protocols": PROTOCOLS, "tiles": TILES, "rows": []}
    out = Path(args.out)
    t0 = time.time()
    for m, n, k in shapes:
        per = shape_rows(m, n, k, args.rounds)
        doc["rows"].append({"M": m, "N": n, "K": k, "protocols": per})
        log(f"M={m} N={n} K={k} ({time.time() - t0:.0f} s): " + "; ".join(
            f"{p} torch {v['torch_us']:.2f} auto {v['auto_us']:.2f} ({v.get('auto_vs_torch', 0):.3f}x)"
            for p, v in per.items()))
        out.write_text(json.dumps(doc, indent=1))
    summary: dict[str, dict[str, float | None]] = {}
    for proto in PROTOCOLS:
        summary[proto] = {arm: geomean([r["protocols"][proto].get(f"{arm}_vs_torch", 0) for r in doc["rows"]])
                          for arm in ("auto", *TILES)}
        summary[proto]["torch_us_geomean"] = geomean([r["protocols"][proto]["torch_us"] for r in doc["rows"]])
    doc["summary"] = summary
    doc["wall_s"] = time.time() - t0
    out.write_text(json.dumps(doc, indent=1))
    print("| protocol | " + " | ".join(f"{a} vs torch" for a in ("auto", *TILES)) + " | torch us (geomean) |")
    print("|---|" + "---|" * (len(TILES) + 2))
    for proto, s in summary.items():
        print(f"| {proto} | " + " | ".join(f"{s[a]:.3f}x" if s[a] else "-" for a in ("auto", *TILES)) +
              f" | {s['torch_us_geomean']:.2f} |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
