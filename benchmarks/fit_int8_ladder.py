"""Fit and validate the int8 `heuristic` sentinel on the GPU's measurements: measure every tile of the native
scaled_mm lane over the ASR anchor shapes, then fit the sm90 wave model (`_INT8_WAVE_MODEL`) and, as the
baseline, the occupancy ladder (`_INT8_LADDER`'s form), and print their regret in-sample and held out.

    python benchmarks/fit_int8_ladder.py --out ladder.json                 # measure (GPU) + fit
    python benchmarks/fit_int8_ladder.py --load ladder.json                # refit from saved measurements (CPU)
    python benchmarks/fit_int8_ladder.py --load benchmarks/int8_ladder_points.json \
        --log benchmarks/logs/sm90_scaled_mm_build.jsonl                   # + the repeat-measurement noise

Measuring: every config of the lane (nine on sm90, Stream-K included, for the oracle) at every (M, N, K) of the
anchors (M in --ms), CUDA graph of >= 16 calls, cold weights (benchmarks/scaled_mm.py's protocol). Regret of a
selector at a point = t(selected) / t(best) - 1, against the best data-parallel tile (the heuristic never picks
Stream-K; the gap to the all-tile oracle is what a measured entry can add); reported as the geomean over points of
the ratio, the max, and the share of points within 1 %.

Wave model (per data-parallel tile; `oasr_ops.scaled_mm.wave_features`): t_us = a + b*w + (K/1024)*(c1 + c2*(w-1))
+ d*M*K/1e7 with w = ceil(ceil(M/tm)*ceil(N/tn)/SMs), fitted by non-negative least squares on the relative error
(weights 1/t); the selector is the argmin of the predicted times. Ladder: coordinate descent over each rung's
min_fill and the K weighting (_K_FULL, _K_MIN_WEIGHT), minimising the geomean ratio, started from the first
(unfitted) ladder. Validation (signatures are (N, K) pairs; a signature's width d is min(N, K): the d=256 /
512 / 1024 families are Conformer S / Conformer M and Whisper base / Conformer L): in-sample; fitted on the
d=256/1024 signatures and scored on the d=512 ones; leave-one-signature-out (each signature scored by the fit
on the other ones). Prints the fitted wave-model literal (fitted on all points).
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

# The sm90 occupancy ladders before the wave model, kept as baselines: (rungs, _K_FULL, _K_MIN_WEIGHT).
FIRST_LADDER = ((("t128x256x128_c1x1_coop", 1.0), ("t128x128x128_c2x1_pp", 1.0), ("t64x256x128_c1x1_pp", 1.0),
                 ("t128x64x128_c1x1_coop", 0.75), ("t64x128x128_c1x1_pp", 0.5), ("t64x64x128_c1x1_pp", 0.0)),
                1024, 0.25)  # the first, unfitted rule
FITTED_LADDER = ((("t128x256x128_c1x1_coop", 3.0), ("t128x128x128_c2x1_pp", 1.0), ("t64x256x128_c1x1_pp", 1.0),
                  ("t128x64x128_c1x1_coop", 2.0), ("t64x128x128_c1x1_pp", 0.5), ("t64x64x128_c1x1_pp", 0.0)),
                 512, 0.0625)  # fitted on all 126 points (2026-11-29), shipped until the wave model


def measure(args) -> dict:
    import torch

    import oasr_ops  # noqa: F401
    from oasr_ops.codegen.jit import JitSpec, build_many
    from oasr_ops.runtime.arch import current_arch_family
    from scaled_mm import DEFAULT_ANCHORS, Problem, shapes_from_anchors, time_graph

    smm = sys.modules["oasr_ops.families.scaled_mm.ops"]
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


def _smm():
    import oasr_ops  # noqa: F401

    return sys.modules["oasr_ops.families.scaled_mm.ops"]


def _is_dp(cid: str) -> bool:
    from oasr_ops.configs import parse

    return parse(cid).kernel_schedule != "streamk"


def _ratio_stats(points, pick, dp_only=True):
    logs, worst, within = [], 0.0, 0
    for p in points:
        t = p["us"]
        pool = {c: v for c, v in t.items() if not dp_only or _is_dp(c)}
        best = min(pool.values())
        r = t.get(pick(p), float("inf")) / best
        logs.append(math.log(r))
        worst = max(worst, r)
        within += r <= 1.01
    return math.exp(sum(logs) / len(logs)), worst, within / len(points)


def width(p) -> int:
    """A signature's model width d: min(N, K) (d x d, 2d/3d/4d x d, d x 4d, d x 19d for the ASR layers)."""
    return min(p["N"], p["K"])


# ------------------------------------------------------------------------------------------------ the ladder

def evaluate(points, ladder, sms, k_full, k_min, dp_only=True):
    smm = _smm()

    def pick(p):
        return smm.ladder_config(ladder, p["M"], p["N"], p["K"], sms, k_full=k_full, k_min_weight=k_min)
    return _ratio_stats(points, pick, dp_only)


def fit(points, ladder, sms, k_full, k_min):
    best = (evaluate(points, ladder, sms, k_full, k_min)[0], list(ladder), k_full, k_min)
    for _ in range(4):
        improved = False
        for kf, km in itertools.product(K_FULLS, K_MINS):
            g = evaluate(points, best[1], sms, kf, km)[0]
            if g < best[0] - 1e-9:
                best, improved = (g, best[1], kf, km), True
        for i in range(len(ladder) - 1):  # the last rung keeps 0: it always serves
            for f in FILLS:
                cand = list(best[1])
                cand[i] = (cand[i][0], f)
                g = evaluate(points, cand, sms, best[2], best[3])[0]
                if g < best[0] - 1e-9:
                    best, improved = (g, cand, best[2], best[3]), True
        if not improved:
            break
    return best


def ladder_fitter(sms):
    def fit_pick(train):
        _, lad, kf, km = fit(train, FIRST_LADDER[0], sms, FIRST_LADDER[1], FIRST_LADDER[2])
        return lambda p: _smm().ladder_config(lad, p["M"], p["N"], p["K"], sms, k_full=kf, k_min_weight=km)
    return fit_pick


# ------------------------------------------------------------------------------------------------ the wave model

def _nnls(rows, ys, ws):
    """min sum (w (x.f - y))^2 over x >= 0: the best feasible unconstrained fit over supports (few features)."""
    import numpy as np

    X = np.asarray(rows, float) * np.asarray(ws, float)[:, None]
    y = np.asarray(ys, float) * np.asarray(ws, float)
    nf = X.shape[1]
    best, best_r = np.zeros(nf), float(y @ y)
    for r in range(1, nf + 1):
        for sup in itertools.combinations(range(nf), r):
            sol, *_ = np.linalg.lstsq(X[:, sup], y, rcond=None)
            if (sol < 0).any():
                continue
            x = np.zeros(nf)
            x[list(sup)] = sol
            res = float(((X @ x) - y) @ ((X @ x) - y))
            if res < best_r - 1e-12:
                best, best_r = x, res
    return [float(v) for v in best]


def fit_wave(points, tiles, sms) -> dict[str, tuple[float, ...]]:
    from oasr_ops.configs import parse

    smm = _smm()
    model = {}
    for cid in tiles:
        c = parse(cid)
        pts = [p for p in points if cid in p["us"]]
        if len(pts) < 5:  # a tile measured (almost) nowhere: left out of the model
            continue
        rows = [smm.wave_features(c.tile[0], c.tile[1], p["M"], p["N"], p["K"], sms) for p in pts]
        ys = [p["us"][cid] for p in pts]
        model[cid] = tuple(_nnls(rows, ys, [1.0 / y for y in ys]))  # relative error
    return model


def wave_fitter(tiles, sms):
    def fit_pick(train):
        model = fit_wave(train, tiles, sms)
        return lambda p: _smm().wave_model_config(model, p["M"], p["N"], p["K"], sms)
    return fit_pick


# ------------------------------------------------------------------------------------------------ validation

def held_out(points, fit_pick):
    """(in-sample, d=256/1024 -> d=512, leave-one-signature-out) stats of the selector `fit_pick(train)` gives."""
    ins = _ratio_stats(points, fit_pick(points))
    train = [p for p in points if width(p) != 512]
    test = [p for p in points if width(p) == 512]
    split = _ratio_stats(test, fit_pick(train)) if train and test else None
    picks = {}
    for sig in sorted({(p["N"], p["K"]) for p in points}):
        pick = fit_pick([p for p in points if (p["N"], p["K"]) != sig])
        for i, p in enumerate(points):
            if (p["N"], p["K"]) == sig:
                picks[i] = pick(p)
    index = {id(p): i for i, p in enumerate(points)}
    loso = _ratio_stats(points, lambda p: picks[index[id(p)]])
    return ins, split, loso


def noise(log_path) -> tuple[int, float, float] | None:
    """Repeat-measurement noise from a scaled_mm build log: its `heuristic` pseudo-arm times the same tile as that
    tile's own arm at every point. (points, sd of one measurement's log-time, max |log ratio|)."""
    rec: dict[tuple, dict[str, dict]] = {}
    for line in open(log_path):
        if line.strip():
            r = json.loads(line)
            rec.setdefault((r["signature"], r["m"]), {})[r["config"]] = r
    d = []
    for row in rec.values():
        h = row.get("heuristic")
        if h and h.get("heuristic_tile") in row:
            d.append(math.log(h["median_s"] / row[h["heuristic_tile"]]["median_s"]))
    if not d:
        return None
    mu = sum(d) / len(d)
    sd = math.sqrt(sum((x - mu) ** 2 for x in d) / len(d))
    return len(d), sd / math.sqrt(2), max(abs(x) for x in d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the measurements (JSON)")
    ap.add_argument("--load", default=None, help="refit from measurements written by --out (no GPU)")
    ap.add_argument("--log", default=None, help="a scaled_mm build log: report the repeat-measurement noise")
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
    smm = _smm()
    points, sms = data["points"], data["sms"]
    points = [p for p in points if p["us"]]
    lane = smm._lane_for(data["arch"])
    tiles = [c.id for c in lane.space if c.kernel_schedule != "streamk"]

    def row(name, stats):
        g, w, share = stats
        return f"| {name} | {100 * (g - 1):.2f} % | {100 * (w - 1):.1f} % | {100 * share:.0f} % |"

    def cell(stats):
        return "—" if stats is None else f"{100 * (stats[0] - 1):.2f} % ({100 * (stats[1] - 1):.1f} %, " \
                                         f"{100 * stats[2]:.0f} %)"

    print(f"{len(points)} points, {len({(p['N'], p['K']) for p in points})} signatures, {data['lane']} on "
          f"{data.get('device', '?')} ({sms} SMs)\n")
    print("Shipped selectors, regret vs the measured best tile (geomean, max, share within 1 %):\n")
    print("| selector | geomean regret | max regret | within 1 % |")
    print("|---|---|---|---|")
    for dp_only in (True, False):
        ref = "best data-parallel tile" if dp_only else "best of all tiles (Stream-K included)"
        print(f"| **vs {ref}** | | | |")
        print(row("shipped heuristic (`heuristic_config`)", _ratio_stats(
            points, lambda p: smm.heuristic_config(p["M"], p["N"], p["K"], data["arch"], lane), dp_only)))
        for name, (lad, kf, km) in (("first ladder (unfitted)", FIRST_LADDER),
                                    ("fitted ladder (2026-11-29)", FITTED_LADDER)):
            print(row(name, evaluate(points, lad, sms, kf, km, dp_only)))
        print(row(f"lane default {lane.default.id}", _ratio_stats(points, lambda p: lane.default.id, dp_only)))
        if not dp_only:
            print(row("best data-parallel tile (oracle)", _ratio_stats(
                points, lambda p: min((c for c in p["us"] if _is_dp(c)), key=p["us"].get), False)))
    nw = sum(1 for p in points if width(p) == 512)
    print(f"\nRefitted, vs the best data-parallel tile, geomean regret (max, within 1 %); held-out columns score "
          f"points the fit did not see (d=512: {nw} points):\n")
    print("| selector (parameters) | in-sample | fit d=256/1024, test d=512 | leave-one-signature-out |")
    print("|---|---|---|---|")
    for name, fp in ((f"wave model ({5 * len(tiles)})", wave_fitter(tiles, sms)),
                     ("occupancy ladder (7)", ladder_fitter(sms))):
        ins, split, loso = held_out(points, fp)
        print(f"| {name} | {cell(ins)} | {cell(split)} | {cell(loso)} |")
    if args.log:
        nz = noise(args.log)
        if nz:
            print(f"\nRepeat-measurement noise ({args.log}: the heuristic pseudo-arm vs the same tile's arm, "
                  f"{nz[0]} points): sd {100 * nz[1]:.2f} % per measurement, max pair difference "
                  f"{100 * (math.exp(nz[2]) - 1):.1f} %.")
    model = fit_wave(points, tiles, sms)
    print("\nfitted wave model (all points; paste into _INT8_WAVE_MODEL):")
    print(f'    "{data["lane"]}": {{  # config: (a, b, c1, c2, d) in us')
    for cid, coef in model.items():
        print(f'        "{cid}": ({", ".join(f"{v:.4f}" for v in coef)}),')
    print("    },")
    return 0


if __name__ == "__main__":
    sys.exit(main())
