"""int8 W8A8 scaled_mm on the GPU: tuned (`auto`) and heuristic oasr kernels vs `torch._int_mm` + dequant vs fp16
cuBLAS, per ASR shape (the anchors' M x N x K), plus 8192^3 throughput.

    python benchmarks/scaled_mm.py --out scaled_mm.json [--anchors benchmarks/anchors/h200-cublas-baselines.json]
        [--ms 16,64,256,1024,4096,16384] [--reps 15] [--calls 16] [--quick]

Method (the anchors' protocol): each arm is a CUDA graph of >= --calls calls, replayed --reps times; the figure is the
median replay time divided by the calls. Weights rotate through enough copies to exceed 2x L2 (cold weights, as in
a model whose weights do not fit in L2); the activations (already int8 + per-token scales for the int8 arms) stay
hot. The dequant arm is eager torch ops inside the same graph. Prints a markdown table; writes JSON to --out.
Nothing here is asserted; numbers that matter go to docs/perf/ with this command line.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

DEFAULT_ANCHORS = Path(__file__).resolve().parent / "anchors" / "h200-cublas-baselines.json"


def l2_bytes() -> int:
    try:
        return int(torch.cuda.get_device_properties(0).L2_cache_size)
    except Exception:
        return 60 * 1024 * 1024


def n_copies(weight_bytes: int, cold: bool = True, cap: int = 256) -> int:
    if not cold:
        return 1
    return max(1, min(cap, math.ceil(2 * l2_bytes() / max(weight_bytes, 1))))


def time_graph(call, copies: int, calls: int = 16, reps: int = 15, warmup: int = 3) -> float:
    """Median µs per call of `call(i)` (i = the weight copy), captured `max(calls, copies)` times in one graph."""
    n = max(calls, copies)
    for i in range(min(n, warmup + copies)):  # resolve plans, load kernels, warm the allocator
        call(i % copies)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):
            call(i % copies)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            call(i % copies)
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / n)
    del g
    return statistics.median(times)


def time_alternating(arms: dict, rounds: int, calls: int = 8, reps: int = 15) -> tuple[dict, dict]:
    """Each arm (a `call(i)` for `time_graph`, one weight copy) timed in `rounds` rounds, forward order in even
    rounds and reversed in odd ones (drift and order effects cancel): ({arm: median us}, {arm: [us per round]})."""
    times: dict = {name: [] for name in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            times[name].append(time_graph(arms[name], 1, calls=calls, reps=reps))
    return {name: statistics.median(t) for name, t in times.items()}, times


class Problem:
    """Inputs of one (M, N, K) point with `copies` weight copies."""

    def __init__(self, m: int, n: int, k: int, cold: bool = True, seed: int = 0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.m, self.n, self.k = m, n, k
        self.copies = n_copies(n * k * 3, cold)  # int8 + fp16 copies are timed separately; size for the larger
        self.x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
        self.q, self.sa = torch.ops.oasr.quantize_per_token(self.x)
        self.w = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
                  for _ in range(self.copies)]
        self.sw = [torch.rand(n, device="cuda", generator=g) / 127 + 1e-4 for _ in range(self.copies)]
        self.wf = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=g)
                   for _ in range(self.copies)]

    def oasr(self, config: str):
        q, sa, w, sw = self.q, self.sa, self.w, self.sw
        return lambda i: torch.ops.oasr.scaled_mm(q, w[i], sa, sw[i], None, torch.float16, config)

    def int_mm_dequant(self):
        q, sa, w, sw = self.q, self.sa, self.w, self.sw
        if self.m <= 16:  # _int_mm wants M > 16: pad, as a user would
            q = torch.cat([q, q.new_zeros(17 - self.m, self.k)])
            sa = torch.cat([sa, sa.new_ones(17 - self.m)])

        def run(i):
            acc = torch._int_mm(q, w[i].t())
            return (acc.float() * sa[:, None] * sw[i][None, :]).half()
        return run

    def int_mm_only(self):
        q, w = self.q, self.w
        if self.m <= 16:
            q = torch.cat([q, q.new_zeros(17 - self.m, self.k)])
        return lambda i: torch._int_mm(q, w[i].t())

    def fp16(self):
        x, wf = self.x, self.wf
        return lambda i: torch.mm(x, wf[i].t())


def served_config(p: Problem, config: str) -> str:
    smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
    plan = smm.get_plan("scaled_mm", p.q, p.w[0], None, config, torch.float16)
    return f"{plan.config} ({plan.tier})"


def shapes_from_anchors(path: Path, ms: list[int] | None) -> list[tuple[int, int, int]]:
    doc = json.loads(Path(path).read_text())
    pts = sorted({(s["M"], s["N"], s["K"]) for s in doc["shapes"]})
    return [p for p in pts if ms is None or p[0] in ms]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--anchors", default=str(DEFAULT_ANCHORS))
    ap.add_argument("--ms", default=None, help="comma-separated M values to keep (default: all the anchors')")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="M in {64, 4096} only")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import oasr_ops  # noqa: F401  (registers the ops)

    ms = [int(x) for x in args.ms.split(",")] if args.ms else ([64, 4096] if args.quick else None)
    shapes = shapes_from_anchors(Path(args.anchors), ms)
    rows = []
    t0 = time.time()
    for m, n, k in shapes:
        p = Problem(m, n, k)
        row = {"M": m, "N": n, "K": k, "weight_copies": p.copies}
        arms = {"oasr_auto": p.oasr("auto"), "oasr_heuristic": p.oasr("heuristic"),
                "int_mm_dequant": p.int_mm_dequant(), "int_mm_only": p.int_mm_only(), "fp16_cublas": p.fp16()}
        for name, fn in arms.items():
            row[f"{name}_us"] = time_graph(fn, p.copies, args.calls, args.reps)
        row["auto_config"] = served_config(p, "auto")
        row["heuristic_config"] = served_config(p, "heuristic")
        rows.append(row)
        del p
        torch.cuda.empty_cache()
    # 8192^3 throughput, hot weights
    big = {}
    p = Problem(8192, 8192, 8192, cold=False)
    flops = 2 * 8192 ** 3
    arms = {"oasr_auto": p.oasr("auto"), "oasr_heuristic": p.oasr("heuristic"),
            "int_mm_only": p.int_mm_only(), "int_mm_dequant": p.int_mm_dequant(), "fp16_cublas": p.fp16()}
    from oasr_ops.runtime.arch import current_arch_family

    lane = sys.modules["oasr_ops.families.scaled_mm.ops"]._lane_for(current_arch_family())
    for c in (lane.space if lane is not None else ()):  # every tile: what the heuristic leaves on the table here
        arms[f"tile:{c.id}"] = p.oasr(c.id)
    for name, fn in arms.items():
        us = time_graph(fn, 1, calls=8, reps=args.reps)
        big[name] = {"us": us, "tops": flops / us / 1e6}
    big["auto_config"] = served_config(p, "auto")
    big["heuristic_config"] = served_config(p, "heuristic")
    del p

    print(f"| M | N | K | oasr auto | oasr heuristic | _int_mm+dequant | _int_mm only | fp16 cuBLAS | auto/fp16 | "
          f"auto config |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['M']} | {r['N']} | {r['K']} | {r['oasr_auto_us']:.2f} | {r['oasr_heuristic_us']:.2f} | "
              f"{r['int_mm_dequant_us']:.2f} | {r['int_mm_only_us']:.2f} | {r['fp16_cublas_us']:.2f} | "
              f"{r['fp16_cublas_us'] / r['oasr_auto_us']:.2f}x | {r['auto_config']} |")
    gm = math.exp(statistics.fmean(math.log(r["fp16_cublas_us"] / r["oasr_auto_us"]) for r in rows)) if rows else 0
    gd = math.exp(statistics.fmean(math.log(r["int_mm_dequant_us"] / r["oasr_auto_us"]) for r in rows)) if rows else 0
    print(f"\ngeomean speedup of oasr auto: {gm:.2f}x vs fp16 cuBLAS, {gd:.2f}x vs _int_mm+dequant "
          f"over {len(rows)} shapes")
    print("\n8192^3 (hot weights): " + ", ".join(f"{k} {v['tops']:.0f} TOPS" for k, v in big.items()
                                                 if isinstance(v, dict)) + f"; auto = {big['auto_config']}")
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "l2_bytes": l2_bytes(),
           "method": f"CUDA graph of >= {args.calls} calls, median of {args.reps} replays, cold weights",
           "wall_s": time.time() - t0, "shapes": rows, "8192": big}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
