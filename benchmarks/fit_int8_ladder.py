"""Fit and validate `_INT8_LADDER` (the int8 `heuristic` sentinel) on the GPU: measure every tile of the native
scaled_mm lane over the ASR anchor shapes, then print the regret of the shipped ladder and of a fitted one.

    python benchmarks/fit_int8_ladder.py --out ladder.json                 # measure (GPU) + fit
    python benchmarks/fit_int8_ladder.py --load ladder.json                # refit from saved measurements (CPU)

Measuring: every config of the lane (nine on sm90, Stream-K included, for the oracle) at every (M, N, K) of the
anchors (M in --ms), CUDA graph of >= 16 calls, cold weights (benchmarks/scaled_mm.py's protocol). Regret of a
selector at a point = t(selected) / t(best of all tiles) - 1; reported as the geomean over points of the ratio, the
max, and the share of points within 1 %. Fitting: coordinate descent over each rung's min_fill and the K weighting
(_K_FULL, _K_MIN_WEIGHT), minimising the geomean ratio against the best data-parallel tile (the heuristic never
picks Stream-K; the gap to the all-tile oracle is what a measured entry can add). Prints the fitted literal.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

FILLS = (0.0, 0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)
K_FULLS = (256, 512, 1024, 2048, 4096, 8192)
K_MINS = (0.0625, 0.125, 0.25, 0.5, 1.0)


def measure(args) -> dict:
    import torch

    import oasr_ops  # noqa: F401
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.tune.arch import current_arch_family
    from scaled_mm import DEFAULT_ANCHORS, Problem, shapes_from_anchors, time_graph

    smm = sys.modules["oasr_ops.scaled_mm"]
    arch = current_arch_family()
    lane = smm._lane_for(arch)
    rep = build_many([JitSpec.for_kernel(lane, c, "fp16", arch) for c in lane.space], jobs=args.jobs)
    if rep.failed:
        print(rep.summary(), file=sys.stderr)
    ms = [int(x) for x in args.ms.split(",")] if args.ms else None
    shapes = shapes_from_anchors(Path(args.anchors or DEFAULT_ANCHORS), ms)
    extra_m = [int(x) for x in args.extra_ms.split(",")] if args.extra_ms else []
    nks = sorted({(n, k) for _, n, k in shapes})
    shapes = sorted(set(shapes) | {(m, n, k) for m in extra_m for n, k in nks})
    points = []
    for i, (m, n, k) in enumerate(shapes):
        p = Problem(m, n, k)
        t = {}
        for c in lane.space:
            try:
                t[c.id] = time_graph(p.oasr(c.id), p.copies, reps=args.reps)
            except Exception as e:  # a config that cannot serve this shape: no time
                print(f"  {c.id} at {m}x{n}x{k}: {e}", file=sys.stderr)
        points.append({"M": m, "N": n, "K": k, "us": t})
        print(f"[{i + 1}/{len(shapes)}] {m}x{n}x{k}: best {min(t, key=t.get)} {min(t.values()):.2f} us",
              file=sys.stderr)
        del p
        torch.cuda.empty_cache()
    return {"arch": arch, "lane": lane.name, "sms": smm.sm_count(arch), "device": torch.cuda.get_device_name(),
            "points": points}


def _ratio_stats(points, pick, dp_only):
    from oasr_ops.configs import parse

    logs, worst, within = [], 0.0, 0
    for p in points:
        t = p["us"]
        pool = {c: v for c, v in t.items() if not (dp_only and parse(c).kernel_schedule == "streamk")}
        best = min(pool.values())
        chosen = pick(p)
        r = t.get(chosen, float("inf")) / best
        logs.append(math.log(r))
        worst = max(worst, r)
        within += r <= 1.01
    return math.exp(sum(logs) / len(logs)), worst, within / len(points)


def evaluate(points, ladder, sms, k_full, k_min, dp_only):
    smm = sys.modules.get("oasr_ops.scaled_mm")
    if smm is None:
        import oasr_ops  # noqa: F401

        smm = sys.modules["oasr_ops.scaled_mm"]

    def pick(p):
        return smm.ladder_config(ladder, p["M"], p["N"], p["K"], sms, k_full=k_full, k_min_weight=k_min)
    return _ratio_stats(points, pick, dp_only)


def fit(points, ladder, sms, k_full, k_min):
    best = (evaluate(points, ladder, sms, k_full, k_min, True)[0], list(ladder), k_full, k_min)
    for _ in range(4):
        improved = False
        for kf, km in itertools.product(K_FULLS, K_MINS):
            g = evaluate(points, best[1], sms, kf, km, True)[0]
            if g < best[0] - 1e-9:
                best, improved = (g, best[1], kf, km), True
        for i in range(len(ladder) - 1):  # the last rung keeps 0: it always serves
            for f in FILLS:
                cand = list(best[1])
                cand[i] = (cand[i][0], f)
                g = evaluate(points, cand, sms, best[2], best[3], True)[0]
                if g < best[0] - 1e-9:
                    best, improved = (g, cand, best[2], best[3]), True
        if not improved:
            break
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the measurements (JSON)")
    ap.add_argument("--load", default=None, help="refit from measurements written by --out (no GPU)")
    ap.add_argument("--anchors", default=None)
    ap.add_argument("--ms", default=None, help="comma-separated anchor Ms to keep (default all)")
    ap.add_argument("--extra-ms", default="1,7,17,127,1000", help="extra Ms measured at every anchor (N, K)")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args()
    if args.load:
        data = json.loads(Path(args.load).read_text())
    else:
        data = measure(args)
        if args.out:
            Path(args.out).write_text(json.dumps(data, indent=1))
            print(f"wrote {args.out}", file=sys.stderr)
    import oasr_ops  # noqa: F401

    smm = sys.modules["oasr_ops.scaled_mm"]
    points, sms = data["points"], data["sms"]
    points = [p for p in points if p["us"]]
    ladder = smm._INT8_LADDER[data["lane"]]
    lane_default = smm._lane_for(data["arch"]).default.id

    def show(name, stats):
        g, w, share = stats
        print(f"| {name} | {100 * (g - 1):.2f} % | {100 * (w - 1):.1f} % | {100 * share:.0f} % |")

    print(f"{len(points)} points, {data['lane']} on {data.get('device', '?')} ({sms} SMs)\n")
    print("| selector | geomean regret | max regret | within 1 % |")
    print("|---|---|---|---|")
    for dp_only in (True, False):
        ref = "best data-parallel tile" if dp_only else "best of all tiles (Stream-K included)"
        print(f"| **vs {ref}** | | | |")
        show("shipped ladder", evaluate(points, ladder, sms, smm._K_FULL, smm._K_MIN_WEIGHT, dp_only))
        show(f"lane default {lane_default}", _ratio_stats(points, lambda p: lane_default, dp_only))
        if not dp_only:
            show("best data-parallel tile (oracle)", _ratio_stats(
                points, lambda p: min((c for c in p["us"] if not c.endswith("_sk")), key=p["us"].get), False))
    g, fitted, kf, km = fit(points, list(ladder), sms, smm._K_FULL, smm._K_MIN_WEIGHT)
    show(f"fitted ladder (K_FULL={kf}, K_MIN_WEIGHT={km}) vs best DP", evaluate(points, fitted, sms, kf, km, True))
    show("fitted ladder vs best of all", evaluate(points, fitted, sms, kf, km, False))
    print("\nfitted (in-sample; validate on held-out widths before shipping):")
    print(f'    "{data["lane"]}": (')
    for cid, f in fitted:
        print(f'        ("{cid}", {f}),')
    print("    ),")
    print(f"_K_FULL = {kf}\n_K_MIN_WEIGHT = {km}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
