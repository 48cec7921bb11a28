"""Markdown for docs/perf/build.md from a build's measurement log, its DB file and `oasr tune evaluate --json`.

  python benchmarks/build_report.py --log build_log.jsonl --db db/sm90/gemm.json --evaluate evaluate.json \
      --build build.json
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--evaluate", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--fallback", default="torch", help="the cuBLAS arm's name in the log")
    a = p.parse_args()
    from oasr_ops.tune.evaluate import db_selector, load_db_entries, read_log

    recs = read_log(a.log)
    t: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    w: dict[tuple[str, int], float] = {}
    fill: dict[tuple[str, int], bool] = {}
    for r in recs:
        t[(r["signature"], r["m"])][r["config"]] = r["median_s"]
        w[(r["signature"], r["m"])] = r.get("weight", 1.0)
        fill[(r["signature"], r["m"])] = r.get("fill", False)
    sel = db_selector(load_db_entries(a.db), miss="default")
    build = json.load(open(a.build))
    print(f"Build: {build['signatures']} signatures, {build['points_measured']} points, {build['arms_measured']} "
          f"arm measurements; measurement time {build['measure_s']} s, build wall time {build['wall_s']} s.\n")
    ev = json.load(open(a.evaluate))
    print(f"Regret against the measured oracle over {ev['points']} points (regret = t(selected)/t(best) - 1; "
          "weighted geomean of 1+regret, minus 1):\n")
    print("| selector | points | geomean | p95 | max | unmeasured |\n|---|---|---|---|---|---|")
    for name, s in ev["selectors"].items():
        f = (lambda x: "n/a" if x is None else f"{100 * x:.1f} %")
        print(f"| {name} | {s['n']} | {f(s['geomean'])} | {f(s['p95'])} | {f(s['max'])} | {s['unmeasured']} |")
    print("\nTuned selection vs cuBLAS (`torch` arm) per signature, census points only (fill points excluded); "
          "speedup = t(torch) / t(DB's config):\n")
    print("| signature | points | weighted geomean | min | max | configs served |\n|---|---|---|---|---|---|")
    all_lr, all_w, worst = [], [], (9.0, "")
    by_sig: dict[str, list] = defaultdict(list)
    for (sig, m), row in sorted(t.items()):
        if fill[(sig, m)] or a.fallback not in row:
            continue
        cfg = sel(sig, m)
        if cfg not in row:
            continue
        by_sig[sig].append((m, row[a.fallback] / row[cfg], max(w[(sig, m)], 1e-9), cfg))
    for sig, pts in sorted(by_sig.items()):
        lw = sum(x[2] for x in pts)
        g = math.exp(sum(math.log(x[1]) * x[2] for x in pts) / lw)
        mn = min(pts, key=lambda x: x[1])
        all_lr += [math.log(x[1]) for x in pts]
        all_w += [x[2] for x in pts]
        if mn[1] < worst[0]:
            worst = (mn[1], f"{sig} M={mn[0]}")
        print(f"| `{sig}` | {len(pts)} | {g:.3f}x | {mn[1]:.3f}x (M={mn[0]}) | {max(x[1] for x in pts):.3f}x | "
              f"{', '.join(sorted({x[3] for x in pts}))} |")
    gw = math.exp(sum(l * wt for l, wt in zip(all_lr, all_w)) / sum(all_w))
    gu = math.exp(sum(all_lr) / len(all_lr))
    print(f"\nOver all census points: traffic-weighted geomean {gw:.3f}x, unweighted {gu:.3f}x, worst "
          f"{worst[0]:.3f}x at {worst[1]}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
