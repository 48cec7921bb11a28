"""Roofline bound on int8 W8A8 `scaled_mm` over fp16 GEMM on the H200, next to the measured speedup.

    python benchmarks/int8_roofline.py [--bench benchmarks/logs/sm90_scaled_mm_bench_tuned.json] [--min-m 4096]
        [--floor-us X] [--md /tmp/roofline.md]

For every shape of a benchmarks/scaled_mm.py run (M, N, K; no bias), the ideal time of each GEMM under the H200's
roofline is max(bytes / HBM bandwidth, flops / dense peak), each operand and the output crossing HBM exactly once:

  int8 W8A8: A int8 M*K + W int8 N*K + scale_a fp32 4*M + scale_w fp32 4*N + out fp16 2*M*N bytes; 2*M*N*K ops
             at the dense int8 peak
  fp16:      A fp16 2*M*K + W fp16 2*N*K + out fp16 2*M*N bytes; 2*M*N*K flops at the dense fp16 peak

(H200 SXM datasheet figures: HBM3e 4.8 TB/s, dense fp16/bf16 989.4 TFLOP/s, dense int8 1978.9 TOPS; no sparsity.)
The ideal speedup is t_fp16 / t_int8: 2 where both are compute-bound, 2 - 1.33 where both are memory-bound
(per-byte), in between otherwise. A second variant adds a fixed floor to both ideal times (the launch / fill /
drain cost every kernel pays however small its work; default: the smallest time any arm measured in the run).
Achieved fraction of the roofline = ideal time / measured time. A sensitivity row leaves the activations out of
the HBM traffic (the benchmark keeps them L2-hot; only the weights rotate through cold copies). Prints markdown;
--md also writes it to a file.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

HBM_BPS = 4.8e12
FP16_FLOPS = 989.4e12
INT8_OPS = 1978.9e12
DEFAULT_BENCH = Path(__file__).resolve().parent / "logs" / "sm90_scaled_mm_bench_tuned.json"


def int8_bytes(m: int, n: int, k: int, act: bool = True) -> int:
    return (m * k + 4 * m if act else 0) + n * k + 4 * n + 2 * m * n


def fp16_bytes(m: int, n: int, k: int, act: bool = True) -> int:
    return (2 * m * k if act else 0) + 2 * n * k + 2 * m * n


def ideal_us(nbytes: float, ops: float, peak: float, floor_us: float = 0.0) -> float:
    return floor_us + 1e6 * max(nbytes / HBM_BPS, ops / peak)


def gm(xs) -> float:
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def analyse(rows, floor_us: float = 0.0, act: bool = True):
    """Per-shape ideal times and ratios; act=False leaves the activations (A, scale_a) out of the HBM traffic."""
    out = []
    for r in rows:
        m, n, k = r["M"], r["N"], r["K"]
        ops = 2.0 * m * n * k
        i8 = ideal_us(int8_bytes(m, n, k, act), ops, INT8_OPS, floor_us)
        f16 = ideal_us(fp16_bytes(m, n, k, act), ops, FP16_FLOPS, floor_us)
        ai8 = ops / int8_bytes(m, n, k, act)  # ops per byte; the ridge points are peak / bandwidth
        out.append({"M": m, "N": n, "K": k, "ideal_int8_us": i8, "ideal_fp16_us": f16, "ideal_ratio": f16 / i8,
                    "int8_bound": "compute" if ai8 >= INT8_OPS / HBM_BPS else "memory",
                    "fp16_bound": "compute" if ops / fp16_bytes(m, n, k, act) >= FP16_FLOPS / HBM_BPS else "memory",
                    "oasr_us": r["oasr_auto_us"], "cublas_us": r["fp16_cublas_us"],
                    "tile": r.get("auto_config", "").split(" ")[0],
                    "measured_ratio": r["fp16_cublas_us"] / r["oasr_auto_us"],
                    "frac_int8": i8 / r["oasr_auto_us"], "frac_fp16": f16 / r["fp16_cublas_us"],
                    "bound_vs_cublas": r["fp16_cublas_us"] / i8})
    return out


def summary(a, label):
    return (f"| {label} | {len(a)} | {gm(x['ideal_ratio'] for x in a):.2f}x | "
            f"{gm(x['measured_ratio'] for x in a):.2f}x | {100 * gm(x['frac_int8'] for x in a):.0f} % | "
            f"{100 * gm(x['frac_fp16'] for x in a):.0f} % | {gm(x['bound_vs_cublas'] for x in a):.2f}x |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=str(DEFAULT_BENCH), help="benchmarks/scaled_mm.py JSON")
    ap.add_argument("--min-m", type=int, default=4096, help="the goal's M threshold")
    ap.add_argument("--floor-us", type=float, default=None,
                    help="fixed floor added to both ideal times (default: the run's smallest measured time)")
    ap.add_argument("--md", default="/tmp/roofline.md", help="also write the markdown here ('' to skip)")
    args = ap.parse_args()
    b = json.loads(Path(args.bench).read_text())
    rows = b["shapes"]
    arms = ("oasr_auto_us", "oasr_heuristic_us", "int_mm_only_us", "int_mm_dequant_us", "fp16_cublas_us")
    floor = args.floor_us if args.floor_us is not None else min(r[c] for r in rows for c in arms if r.get(c))
    plain, floored = analyse(rows), analyse(rows, floor)
    big = [x for x in plain if x["M"] >= args.min_m]
    big_f = [x for x in floored if x["M"] >= args.min_m]
    small, small_f = [x for x in plain if x["M"] < args.min_m], [x for x in floored if x["M"] < args.min_m]
    big_hot = [x for x in analyse(rows, act=False) if x["M"] >= args.min_m]
    L = []
    L.append("## Roofline bound on the int8 speedup over fp16 cuBLAS\n")
    L.append(f"`python benchmarks/int8_roofline.py --bench {Path(args.bench).name}` (the second run's "
             "measurements above; oasr = the `auto` tile).\n")
    L.append("Model: ideal time = max(bytes / 4.8 TB/s, 2MNK / dense peak), every operand and the output crossing "
             "HBM exactly once (perfect on-chip reuse), peaks 989.4 TFLOP/s fp16 and 1978.9 TOPS int8 (H200 SXM "
             "datasheet, dense). int8 W8A8 bytes: A M·K + W N·K (int8) + scales 4(M+N) (fp32) + out 2MN (fp16); fp16 "
             "bytes: 2MK + 2NK + 2MN. The int8 arm excludes quantizing the activations (the benchmark feeds int8 "
             "A and its scales), as does this bound. Ideal speedup = ideal fp16 time / ideal int8 time: 2.00x where "
             "both are compute-bound, at most 2.00x anywhere. Achieved = ideal / measured time. \"Bound vs measured "
             "cuBLAS\" = measured cuBLAS time / ideal int8 time: the speedup an int8 kernel at 100 % of its roofline "
             "would show against the cuBLAS actually measured.\n")
    L.append("Sensitivity row \"activations L2-resident\": A (and scale_a) left out of the HBM traffic, as in the "
             "benchmark, which rotates cold weight copies but keeps the activations hot (they fit in the 60 MiB L2 "
             "for most shapes).\n")
    L.append(f"With a floor: {floor:.2f} µs (the smallest time any arm measured in the run, at M=16/64, a proxy for "
             "the launch + fill + drain cost every kernel pays) added to both ideal times.\n")
    L.append("| shapes | n | ideal int8 speedup | measured speedup | oasr int8 achieved | cuBLAS fp16 achieved | "
             "bound vs measured cuBLAS |")
    L.append("|---|---|---|---|---|---|---|")
    L.append(summary(big, f"M ≥ {args.min_m}, no floor"))
    L.append(summary(big_f, f"M ≥ {args.min_m}, + {floor:.2f} µs floor"))
    L.append(summary(big_hot, f"M ≥ {args.min_m}, no floor, activations L2-resident"))
    L.append(summary(small, f"M < {args.min_m}, no floor"))
    L.append(summary(small_f, f"M < {args.min_m}, + {floor:.2f} µs floor"))
    L.append(summary(plain, "all, no floor"))
    L.append("")
    nb_i8 = sum(x["int8_bound"] == "compute" for x in big)
    nb_f16 = sum(x["fp16_bound"] == "compute" for x in big)
    L.append(f"At M ≥ {args.min_m} ({len(big)} shapes) the roofline calls {nb_f16} fp16 and {nb_i8} int8 GEMMs "
             f"compute-bound (ridge points: {FP16_FLOPS / HBM_BPS:.0f} flop/B fp16, {INT8_OPS / HBM_BPS:.0f} op/B "
             "int8). Geomeans are over shapes (each shape counts once).\n")
    L.append(f"Per shape, M ≥ {args.min_m} (no floor):\n")
    L.append("| M | N | K | bound int8 / fp16 | ideal int8 µs | ideal fp16 µs | ideal speedup | oasr µs (tile) | "
             "cuBLAS µs | measured speedup | oasr achieved | cuBLAS achieved |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in big:
        L.append(f"| {x['M']} | {x['N']} | {x['K']} | {x['int8_bound'][:3]} / {x['fp16_bound'][:3]} | "
                 f"{x['ideal_int8_us']:.2f} | {x['ideal_fp16_us']:.2f} | {x['ideal_ratio']:.2f}x | "
                 f"{x['oasr_us']:.2f} ({x['tile']}) | {x['cublas_us']:.2f} | {x['measured_ratio']:.2f}x | "
                 f"{100 * x['frac_int8']:.0f} % | {100 * x['frac_fp16']:.0f} % |")
    big8 = b.get("8192")
    if big8:
        o = 2.0 * 8192 ** 3
        i8 = ideal_us(int8_bytes(8192, 8192, 8192), o, INT8_OPS)
        f16 = ideal_us(fp16_bytes(8192, 8192, 8192), o, FP16_FLOPS)
        t8, t16 = big8["oasr_auto"]["us"], big8["fp16_cublas"]["us"]
        L.append(f"\n8192³ (not in the table): ideal speedup {f16 / i8:.2f}x; measured {t16 / t8:.2f}x (oasr "
                 f"{100 * i8 / t8:.0f} % of the int8 roofline, cuBLAS {100 * f16 / t16:.0f} % of the fp16 one).")
    text = "\n".join(L) + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
