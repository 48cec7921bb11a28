"""Offline (no GPU): is issue 14's goal (b) — fp8 tuned vs fp16 cuBLAS >= 1.6x geomean at M >= 4096 over the
census — physically reachable? From measured logs only.

    python benchmarks/fp8_fp16_bound.py [--bench benchmarks/logs/sm90_scaled_mm_fp8_bench_rebuilt.json]
        [--probe benchmarks/logs/sm90_fp8_probe.json] [--out bound.json]

Per census shape with M >= 4096 (the census benchmark's rows): the fp16 cuBLAS time, torch._scaled_mm rowwise's,
the best fp8 time measured in the same run (any arm: auto, heuristic, torch rowwise, every lane tile and torch with
fast accumulation where the run timed them; the probe's candidate tiles where the probe measured the shape, as a
ratio to the probe's own fp16 time), and a lower bound for any fp8 kernel:

    t_lb = max(launch floor, bytes / 4.24 TB/s, 2 M N K / fp8 peak)

* launch floor: the smallest time any fp8 arm took in the benchmark runs (same protocol as the fp16 times);
* bytes: e4m3 A (M x K) + e4m3 W (N x K) + bf16 output (M x N) + fp32 scales, each moved once; 4.24 TB/s is the
  device-to-device copy anchor (benchmarks/anchors/README.md);
* fp8 peak: the H200's dense e4m3 spec (1979 TFLOP/s) and, as a practical ceiling, the best 8192^3 fp8 rate ever
  measured on this GPU (torch._scaled_mm rowwise, 1427 TFLOP/s, the anchor).

Also the equal-efficiency estimate: fp8 reaching the same fraction of its bound as fp16 cuBLAS reaches of its
own (fp16 bound: the smallest fp16 cuBLAS time in the anchors' table, 2 (M K + N K) + 2 M N bytes, and the bf16
8192^3 anchor 784 TFLOP/s as its ceiling), i.e. fp16/fp8 = bound16 / bound8.

Prints the table and the geomean fp16/t at each bound.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path

LOGS = Path(__file__).resolve().parent / "logs"
HBM_BPS = 4.24e12
PEAK_SPEC = 1979e12
PEAK_MEASURED = 1427e12
PEAK16_MEASURED = 784e12  # bf16 cuBLAS 8192^3, the anchor
ANCHORS = Path(__file__).resolve().parent / "anchors" / "h200-cublas-baselines.json"


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def fp8_arms(row: dict) -> dict[str, float]:
    out = {k[:-3]: v for k, v in row.items() if k.endswith("_us") and k != "fp16_cublas_us"
           and isinstance(v, (int, float))}
    for c, v in row.get("tiles", {}).items():
        out[c] = v["us"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=str(LOGS / "sm90_scaled_mm_fp8_bench_rebuilt.json"))
    ap.add_argument("--probe", default=str(LOGS / "sm90_fp8_probe.json"))
    ap.add_argument("--out")
    a = ap.parse_args()
    bench = json.load(open(a.bench))
    floor_us = min(v for f in glob.glob(str(LOGS / "sm90_scaled_mm_fp8_bench*.json"))
                   for r in json.load(open(f))["shapes"] for v in fp8_arms(r).values())
    floor16_us = min(r["fp16_cublas_us"] for r in json.load(open(ANCHORS))["shapes"])
    probe = {(r["M"], r["N"], r["K"]): r for r in json.load(open(a.probe))["rows"]}
    rows = []
    for r in bench["shapes"]:
        if r["M"] < 4096 or "fp16_cublas_us" not in r:
            continue
        m, n, k = r["M"], r["N"], r["K"]
        f16 = r["fp16_cublas_us"]
        arms = fp8_arms(r)
        best_arm = min(arms, key=arms.get)
        best_ratio = f16 / arms[best_arm]
        p = probe.get((m, n, k))
        if p is not None:  # the probe's own run: best fp8 arm over its fp16 time
            pa = {nm: v["us"] for nm, v in p["arms"].items() if nm != "fp16_cublas"}
            pb = min(pa, key=pa.get)
            if p["arms"]["fp16_cublas"]["us"] / pa[pb] > best_ratio:
                best_arm, best_ratio = f"{pb} (probe)", p["arms"]["fp16_cublas"]["us"] / pa[pb]
        flops = 2.0 * m * n * k
        byts = m * k + n * k + 2 * m * n + 4 * (m + n)
        t_bw, t_spec, t_meas = byts / HBM_BPS * 1e6, flops / PEAK_SPEC * 1e6, flops / PEAK_MEASURED * 1e6
        lb_spec = max(floor_us, t_bw, t_spec)
        lb_meas = max(floor_us, t_bw, t_meas)
        lb16 = max(floor16_us, (2 * (m * k + n * k) + 2 * m * n) / HBM_BPS * 1e6, flops / PEAK16_MEASURED * 1e6)
        rows.append({"M": m, "N": n, "K": k, "fp16_us": f16, "torch_rowwise_us": r["torch_rowwise_us"],
                     "auto_us": r["oasr_auto_us"], "best_fp8_arm": best_arm, "best_fp8_vs_fp16": best_ratio,
                     "auto_vs_fp16": f16 / r["oasr_auto_us"], "floor_us": floor_us, "bytes_us": t_bw,
                     "flops_spec_us": t_spec, "flops_measured_peak_us": t_meas,
                     "bound_vs_fp16_spec": f16 / lb_spec, "bound_vs_fp16_measured_peak": f16 / lb_meas,
                     "fp16_bound_us": lb16, "fp16_efficiency": lb16 / f16, "equal_efficiency_vs_fp16": lb16 / lb_meas,
                     "bound_kind": max((("launch", floor_us), ("bytes", t_bw), ("flops", t_meas)),
                                       key=lambda x: x[1])[0]})
    summary = {"shapes": len(rows), "launch_floor_us": floor_us, "fp16_launch_floor_us": floor16_us,
               "geomean_equal_efficiency_vs_fp16": geomean([x["equal_efficiency_vs_fp16"] for x in rows]),
               "geomean_fp16_efficiency": geomean([x["fp16_efficiency"] for x in rows]),
               "geomean_auto_vs_fp16": geomean([x["auto_vs_fp16"] for x in rows]),
               "geomean_best_measured_vs_fp16": geomean([x["best_fp8_vs_fp16"] for x in rows]),
               "geomean_bound_vs_fp16_spec_peak": geomean([x["bound_vs_fp16_spec"] for x in rows]),
               "geomean_bound_vs_fp16_measured_peak": geomean([x["bound_vs_fp16_measured_peak"] for x in rows]),
               "bound_kinds": {k_: sum(x["bound_kind"] == k_ for x in rows) for k_ in ("launch", "bytes", "flops")}}
    print("| M | N | K | fp16 us | torch fp8 us | auto us | best fp8 (arm) | best/fp16 | floor / bytes / flops@1427 us "
          "| bound/fp16 (1979 / 1427) | equal efficiency |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        print(f"| {x['M']} | {x['N']} | {x['K']} | {x['fp16_us']:.2f} | {x['torch_rowwise_us']:.2f} | "
              f"{x['auto_us']:.2f} | {x['best_fp8_arm']} | {x['best_fp8_vs_fp16']:.2f}x | {x['floor_us']:.2f} / "
              f"{x['bytes_us']:.2f} / {x['flops_measured_peak_us']:.2f} | {x['bound_vs_fp16_spec']:.2f}x / "
              f"{x['bound_vs_fp16_measured_peak']:.2f}x | {x['equal_efficiency_vs_fp16']:.2f}x |")
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
