"""Every compiled GEMM config vs torch.mm (cuBLAS) on the anchor shapes, plus per-call host overhead.

Protocol: oasr_ops.tune.bench (CUDA graph of N >= 8 calls, a separator kernel after each call subtracted,
weights rotated through enough copies to exceed 2x L2, shuffled interleaved rounds, median). fp16.

  python benchmarks/gemm_configs.py --out results.json            # measure (GPU)
  python benchmarks/gemm_configs.py --report results.json > docs/perf/gemm.md   # tables (anywhere)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ANCHORS = Path(__file__).resolve().parent / "anchors" / "h200-cublas-baselines.json"


def anchor_shapes() -> list[tuple[int, int, int]]:
    doc = json.loads(ANCHORS.read_text())
    return sorted({(s["M"], s["N"], s["K"]) for s in doc["shapes"]})


def measure(args) -> None:
    import torch

    import oasr_ops  # noqa: F401
    from oasr_ops.families.gemm.kernels import lanes_for
    from oasr_ops.tune import bench
    from oasr_ops.runtime.arch import current_arch_family

    arch = current_arch_family()
    lanes = lanes_for(arch)
    configs = [(lane, c) for lane in lanes for c in lane.space]
    if args.configs:
        configs = [(l, c) for l, c in configs if c.id in args.configs.split(",")]
    shapes = anchor_shapes()
    if args.max_shapes:
        shapes = shapes[:: max(1, len(shapes) // args.max_shapes)]
    dtype = torch.float16
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "arch": arch,
               "date": time.strftime("%Y-%m-%d"), "dtype": "fp16", "shapes": []}
    env = bench.Environment()
    t_start = time.monotonic()
    for i, (m, n, k) in enumerate(shapes):
        copies = bench.copies_for(n * k * 2, cold=True, cap=512)
        calls_n = max(bench.MIN_CALLS, copies)
        ws = [torch.randn(n, k, device="cuda", dtype=dtype) / math.sqrt(k) for _ in range(copies)]
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        arms = {"torch": [lambda w=ws[j % copies]: torch.mm(a, w.t()) for j in range(calls_n)]}
        for lane, c in configs:
            if lane.infeasible_reason(c, m=m, n=n, k=k, arch_family=arch):
                continue
            arms[c.id] = [lambda w=ws[j % copies], cid=c.id: torch.ops.oasr.gemm(a, w, None, "none", cid)
                          for j in range(calls_n)]
        res = bench.measure(arms, rounds=args.rounds, env=env)
        row = {"M": m, "N": n, "K": k, "calls_per_replay": calls_n, "weight_copies": copies,
               "us": {name: [r.estimate.median_s * 1e6, r.estimate.sigma_s * 1e6] for name, r in res.items()}}
        results["shapes"].append(row)
        best = min((v[0], name) for name, v in row["us"].items() if name != "torch")
        print(f"[{i + 1}/{len(shapes)}] {m}x{n}x{k}: torch {row['us']['torch'][0]:.2f}us best {best[1]} "
              f"{best[0]:.2f}us ({time.monotonic() - t_start:.0f}s)", flush=True)
        del ws, a, arms, res
        torch.cuda.empty_cache()
        results["wall_s"] = time.monotonic() - t_start
        results["env"] = env.as_dict()
        Path(args.out).write_text(json.dumps(results, indent=1))  # a partial run still leaves its data
    results["env"] = env.as_dict()
    # per-call eager host overhead at a tiny shape (host-bound: the GPU finishes each call in ~3 us)
    a = torch.randn(16, 256, device="cuda", dtype=dtype)
    w = torch.randn(256, 256, device="cuda", dtype=dtype)
    b = torch.randn(256, device="cuda", dtype=dtype)
    default = lanes[0].default.id
    host = {
        "torch.mm": bench.host_overhead_us(lambda: torch.mm(a, w.t())),
        "F.linear+bias": bench.host_overhead_us(lambda: torch.nn.functional.linear(a, w, b)),
        f"torch.ops.oasr.gemm(config={default})": bench.host_overhead_us(
            lambda: torch.ops.oasr.gemm(a, w, None, "none", default)),
        "torch.ops.oasr.gemm(config=auto)": bench.host_overhead_us(
            lambda: torch.ops.oasr.gemm(a, w, None, "none", "auto")),
        "oasr_ops.gemm(bias, silu, auto)": bench.host_overhead_us(
            lambda: oasr_ops.gemm(a, w, b, activation="silu")),
    }
    with torch.inference_mode():
        host["torch.ops.oasr.gemm(auto), inference_mode"] = bench.host_overhead_us(
            lambda: torch.ops.oasr.gemm(a, w, None, "none", "auto"))
    results["host_overhead_us"] = host
    results["wall_s"] = time.monotonic() - t_start
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps(host, indent=1))


def report(path: str) -> None:
    r = json.loads(Path(path).read_text())
    print(f"Device: {r['device']}, torch {r['torch']}, {r['date']}, {r['dtype']}, arch {r['arch']}; "
          f"measurement wall time {r['wall_s']:.0f} s; clocks/contention: {r['env']}\n")
    print("| M | N | K | torch.mm µs | best config | best µs | best vs torch | default µs | default vs torch | "
          "configs measured |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios_best, ratios_def = [], []
    wins = 0
    default = "t128x128x64_c2x1_coop"
    for s in r["shapes"]:
        us = s["us"]
        t = us["torch"][0]
        best_name, best = min(((n, v[0]) for n, v in us.items() if n != "torch"), key=lambda x: x[1])
        d = us.get(default, [float("nan")])[0]
        ratios_best.append(t / best)
        ratios_def.append(t / d)
        wins += best < t
        print(f"| {s['M']} | {s['N']} | {s['K']} | {t:.2f} | {best_name} | {best:.2f} | {t / best:.2f}x | "
              f"{d:.2f} | {t / d:.2f}x | {len(us) - 1} |")
    g = math.exp(sum(map(math.log, ratios_best)) / len(ratios_best))
    gd = math.exp(sum(map(math.log, ratios_def)) / len(ratios_def))
    print(f"\nGeomean speedup over torch.mm: best config {g:.3f}x, lane default {gd:.3f}x; best config beats "
          f"torch.mm at {wins}/{len(ratios_best)} shapes.\n")
    by_m: dict[int, list[float]] = {}
    for s, x in zip(r["shapes"], ratios_best):
        by_m.setdefault(s["M"], []).append(x)
    print("| M | geomean best/torch | min | max |\n|---|---|---|---|")
    for m_, xs in sorted(by_m.items()):
        print(f"| {m_} | {math.exp(sum(map(math.log, xs)) / len(xs)):.3f}x | {min(xs):.2f}x | {max(xs):.2f}x |")
    print("\nPer-call eager host overhead (µs, M=16 N=K=256 fp16, loop of 2000 calls):\n")
    print("| call | µs/call |\n|---|---|")
    for k_, v in r["host_overhead_us"].items():
        print(f"| `{k_}` | {v:.2f} |")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", help="measure on this GPU and write JSON here")
    p.add_argument("--report", help="print markdown tables from a JSON written by --out")
    p.add_argument("--configs", help="comma list of config ids (default: every config of every lane)")
    p.add_argument("--max-shapes", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if a.report:
        report(a.report)
    elif a.out:
        measure(a)
    else:
        p.error("--out or --report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
