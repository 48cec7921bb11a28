"""Markdown for docs/perf/scaled_mm.md from benchmarks/scaled_mm.py's JSON and a scaled_mm build log.

  python benchmarks/scaled_mm_report.py --bench scaled_mm.json --log smm_log.jsonl --db db/sm90/scaled_mm.json
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict


def gm(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--db", required=True)
    a = p.parse_args()
    from oasr_ops.tune.evaluate import db_selector, load_db_entries

    b = json.load(open(a.bench))
    rows = b["shapes"]
    print(f"Device {b['device']}, torch {b['torch']}; method: {b['method']}; wall {b['wall_s']:.0f} s.\n")
    print("| M | N | K | oasr µs (tile) | `_int_mm`+dequant µs | `_int_mm` only µs | fp16 cuBLAS µs | "
          "vs int_mm+dequant | vs fp16 cuBLAS |\n|---|---|---|---|---|---|---|---|---|")
    r_deq, r_fp16_big, r_fp16 = [], [], []
    for r in rows:
        o = r["oasr_auto_us"]
        deq, fp = r.get("int_mm_dequant_us"), r["fp16_cublas_us"]
        if deq:
            r_deq.append(deq / o)
        r_fp16.append(fp / o)
        if r["M"] >= 4096:
            r_fp16_big.append(fp / o)
        only = r.get("int_mm_only_us")
        fmt = (lambda x, suffix="": "n/a" if not x else f"{x:.2f}{suffix}")
        print(f"| {r['M']} | {r['N']} | {r['K']} | {o:.2f} ({r['auto_config'].split()[0]}) | {fmt(deq)} | "
              f"{fmt(only)} | {fp:.2f} | {fmt(deq and deq / o, 'x')} | {fp / o:.2f}x |")
    big = b["8192"]
    print(f"\nGeomean speedup of oasr scaled_mm: {gm(r_deq):.2f}x over `_int_mm` + eager dequant ({len(r_deq)} shapes); "
          f"{gm(r_fp16):.2f}x over fp16 cuBLAS (all shapes), {gm(r_fp16_big):.2f}x at M >= 4096.")
    print(f"\n8192³: oasr {big['oasr_auto']['tops']:.0f} TOPS ({big['auto_config']}), `_int_mm` "
          f"{big['int_mm_only']['tops']:.0f} TOPS, `_int_mm`+dequant {big['int_mm_dequant']['tops']:.0f}, fp16 cuBLAS "
          f"{big['fp16_cublas']['tops']:.0f} TFLOP/s.\n")
    # heuristic regret vs the measured oracle, and what the tuned DB recovers
    t: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    heur_tile = {}
    fill = {}
    for line in open(a.log):
        if line.strip():
            r = json.loads(line)
            t[(r["signature"], r["m"])][r["config"]] = r["median_s"]
            heur_tile[(r["signature"], r["m"])] = r.get("heuristic_tile")
            fill[(r["signature"], r["m"])] = r.get("fill", False)
    import importlib

    smm = importlib.import_module("oasr_ops.families.scaled_mm.ops")
    sel = db_selector(load_db_entries(a.db), miss="heuristic")
    reg_h, reg_db, gain = [], [], []
    for key, row in t.items():
        row = {c: v for c, v in row.items() if c != "heuristic"}  # the log's pseudo-arm: the ladder at build time
        best = min(row.values())
        kv = dict(x.split("=", 1) for x in key[0].split("|")[1:])
        h = row[smm.heuristic_config(key[1], int(kv["N"]), int(kv["K"]), "sm90")]  # the current heuristic's tile
        c = sel(*key)
        tc = row.get(c, h) if c != "heuristic" else h
        reg_h.append(h / best)
        reg_db.append(tc / best)
        gain.append(h / tc)
    print(f"Heuristic (the current `heuristic_config`) vs the measured oracle over {len(t)} build points "
          f"(the nine tiles at every point): geomean regret {100 * (gm(reg_h) - 1):.1f} %, max "
          f"{100 * (max(reg_h) - 1):.1f} %. The shipped DB: geomean regret {100 * (gm(reg_db) - 1):.1f} %, max "
          f"{100 * (max(reg_db) - 1):.1f} %; tuned over heuristic {gm(gain):.3f}x geomean.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
