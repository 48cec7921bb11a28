"""`oasr.gemm(config="auto")` vs cuBLAS on widths no shipped DB entry covers (issue 11's held-out check).

  OASR_TUNE_USER_DB=off python benchmarks/cost_model_heldout.py --out heldout.json [--set 2]

The held-out (N, K) set below was written down before any measurement; none is a signature of
db/sm90/gemm.json and none was in the calibration fit (benchmarks/logs/sm90_gemm_build.jsonl). For every point
(fp16, bias; op gemm, and gemm_activation with SiLU on the first four widths) it times, each as a CUDA graph of
20 calls (median over 7 replays, per call; cuBLAS and auto four times each in alternating order AB BA AB BA, median): cuBLAS (`F.linear`, + `F.silu` for the activation op), `oasr.gemm`
with config="auto" (what a user gets: DB tiers, then the model tier), and every config the model tier ranks
(this process's compiled production set), so the measured oracle is known. Reports auto/cuBLAS speed (geomean,
min), the model tier's regret vs the oracle, and which tier answered.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

HELD_OUT = [(640, 640), (768, 768), (768, 3072), (3072, 768), (1280, 1280), (1280, 5120), (5120, 1280),
            (2304, 768), (768, 2304), (2560, 640)]
MS = [1, 7, 16, 64, 200, 512, 1000, 2048, 4096, 8192, 16384]
# Set 2 (`--set 2`), written down on 2026-11-30 before it was measured, after the interval rule of the model tier
# (runtime/model_tier.py: a config must not be predicted to lose anywhere in its rung's M interval) was chosen:
# set 1's Ms are mostly powers of two, i.e. the tier's own rungs, where a wave-aligned big tile looks best; set 2
# takes Ms between rungs and widths outside both the shipped DB and set 1.
HELD_OUT_2 = [(896, 896), (1792, 448), (448, 1792), (1664, 1664), (1152, 4608), (4608, 1152), (960, 3840),
              (3840, 960)]
MS_2 = [1, 7, 17, 100, 300, 700, 1500, 3000, 6000, 12000, 20000]
ACT_WIDTHS = 4  # the first widths also run as gemm_activation (SiLU)


def graph_time_us(fn, calls: int = 20, replays: int = 7) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(ts)


def alternating_us(fn_a, fn_b, rounds: int) -> tuple[float, float]:
    """Median graph times of two callables timed in alternating order (AB, BA, AB, ...): a fixed order biased
    the second one by up to 8 % at 100 us shapes on the H200 (the GPU warms within a pair)."""
    ta, tb = [], []
    for i in range(rounds):
        if i % 2 == 0:
            ta.append(graph_time_us(fn_a))
            tb.append(graph_time_us(fn_b))
        else:
            tb.append(graph_time_us(fn_b))
            ta.append(graph_time_us(fn_a))
    return statistics.median(ta), statistics.median(tb)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="three widths, five Ms (smoke test)")
    p.add_argument("--set", type=int, choices=(1, 2), default=1, help="held-out set (see HELD_OUT_2)")
    a = p.parse_args()
    os.environ.setdefault("OASR_TUNE_USER_DB", "off")
    import oasr_ops
    from oasr_ops.runtime import model_tier, registry, select
    from oasr_ops.runtime.arch import current_arch_family

    arch = current_arch_family()
    lane = registry.native_lane(arch, "gemm")
    widths, ms = (HELD_OUT, MS) if a.set == 1 else (HELD_OUT_2, MS_2)
    if a.quick:
        widths, ms = widths[:3], ms[::2]
    rows = []
    t_start = time.perf_counter()
    for wi, (n, k) in enumerate(widths):
        for act in (("none", "silu") if wi < ACT_WIDTHS else ("none",)):
            op = "gemm" if act == "none" else "gemm_activation"
            w = torch.randn(n, k, device="cuda", dtype=torch.float16) * k ** -0.5
            bias = torch.randn(n, device="cuda", dtype=torch.float16)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                if act == "none":
                    torch_fn = lambda: F.linear(x, w, bias)  # noqa: E731
                else:
                    torch_fn = lambda: F.silu(F.linear(x, w, bias))  # noqa: E731
                sel = select.select_config("gemm", op, "fp16", n, k, m, arch)
                # cuBLAS and auto alternate (ABABAB): clocks drift between timings by more than the margins
                # compared here (a first version timed them once each: up to 12 % apart on identical kernels)
                t_torch, t_auto = alternating_us(torch_fn, lambda: oasr_ops.gemm(x, w, bias, act, "auto"), 4)
                arms = {"torch": t_torch}
                for cid in model_tier.candidate_ids(lane, arch, n, k, "fp16"):
                    arms[cid] = graph_time_us(lambda: oasr_ops.gemm(x, w, bias, act, cid))
                best = min(arms, key=arms.get)
                chosen = sel.config if sel.config in arms else ("torch" if sel.config in ("torch", "fused")
                                                                 else sel.config)
                t_chosen = arms.get(chosen, t_auto)
                rows.append({"n": n, "k": k, "m": m, "op": op, "tier": sel.tier, "config": sel.config,
                             "torch_us": t_torch, "auto_us": t_auto, "speed_vs_torch": t_torch / t_auto,
                             "oracle": best, "oracle_us": arms[best], "regret": t_chosen / arms[best] - 1.0,
                             "arms_us": arms})
                r = rows[-1]
                print(f"N={n:5d} K={k:5d} M={m:6d} {op:15s} {sel.tier:7s} {sel.config:24s} torch {t_torch:8.2f} "
                      f"auto {t_auto:8.2f} ({r['speed_vs_torch']:.3f}x) oracle {best} {arms[best]:.2f} "
                      f"regret {100 * r['regret']:.1f}%", flush=True)
    gm = lambda xs: math.exp(sum(math.log(v) for v in xs) / len(xs))  # noqa: E731
    summary = {"points": len(rows), "auto_vs_torch_geomean": gm([r["speed_vs_torch"] for r in rows]),
               "auto_vs_torch_min": min(r["speed_vs_torch"] for r in rows),
               "model_regret_geomean": gm([1 + r["regret"] for r in rows]) - 1.0,
               "model_regret_max": max(r["regret"] for r in rows),
               "tiers": {t: sum(1 for r in rows if r["tier"] == t) for t in {r["tier"] for r in rows}},
               "cutlass_answers": sum(1 for r in rows if r["config"] not in ("torch", "fused")),
               "wall_s": time.perf_counter() - t_start}
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "held_out": widths, "ms": ms, "summary": summary, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
