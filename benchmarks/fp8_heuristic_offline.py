"""The fp8 family's untuned heuristic scored offline on measured H200 build logs (CPU only, no GPU run).

    python benchmarks/fp8_heuristic_offline.py [--log LOG.jsonl ...] [--result RESULT.json] [--out OUT.json]

`oasr tune build --family scaled_mm_fp8` times every arm at every point (bf16 output) and logs only the arms that
passed the numeric gate (fp16 and bf16 output, 4x cuBLAS's max error against float64), so for each logged point
this prints, for the shipped heuristic (`families/scaled_mm_fp8/heuristic.py`) and for its full-accumulation
lists alone (`FAST_ACCUM_MAX_K = 0`, the rule before session 36):

* regret: the heuristic's tile time over the best logged tile's (the tuned answer's upper bound), geomean / max;
* speedup of the shipped rule over the full-accumulation one, geomean / min, overall and by M class;
* the ratio to torch._scaled_mm rowwise (bf16);

and, from the build's result file, how many FastAccum (tile, M) pairs the gate rejected at each K — the evidence for
`FAST_ACCUM_MAX_K`. Run on a CPU machine, the half-wave rule counts the sm90 part's 132 SMs (the H200's).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
from pathlib import Path
from unittest import mock

from oasr_ops.configs import parse
from oasr_ops.families.scaled_mm_fp8 import heuristic as fheur
from oasr_ops.families.scaled_mm_fp8.lanes import SM90_FP8_WGMMA as SM90

# v3: the shipped file's log; v1: the first H200 build; build.jsonl: a later rebuild (same tiles)
LOGS = ("benchmarks/logs/sm90_scaled_mm_fp8_build_v3.jsonl", "benchmarks/logs/sm90_scaled_mm_fp8_build_v1.jsonl",
        "benchmarks/logs/sm90_scaled_mm_fp8_build.jsonl")
RESULT = "benchmarks/logs/sm90_scaled_mm_fp8_build_result.json"
M_CLASSES = ((1, 64), (65, 1024), (1025, 1 << 30))
NOT_TILES = ("torch", "heuristic")


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def load(log: str) -> dict[tuple[int, int, int], dict[str, float]]:
    """{(M, N, K): {arm: median seconds}} of one build log (the last record of an arm at a point wins)."""
    table: dict[tuple[int, int, int], dict[str, float]] = collections.defaultdict(dict)
    for line in Path(log).read_text().splitlines():
        r = json.loads(line)
        parts = dict(x.split("=") for x in r["signature"].split("|")[1:])
        table[(int(r["m"]), int(parts["N"]), int(parts["K"]))][r["config"]] = float(r["median_s"])
    return table


def rule(fast_accum: bool):
    """The shipped heuristic itself, with ``OASR_FP8_HEURISTIC_FAST_ACCUM`` on (the shipped rule) or off (its
    full-accumulation lists at every K, the rule before session 36)."""
    value = "on" if fast_accum else "off"

    def pick(m: int, n: int, k: int) -> str:
        with mock.patch.dict(os.environ, {"OASR_FP8_HEURISTIC_FAST_ACCUM": value}):
            return fheur.heuristic(SM90, m, n, k, "sm90")
    return pick


def score(table, k_max: int | None = None) -> dict:
    shipped, full = rule(True), rule(False)
    rows = []
    for (m, n, k), arms in table.items():
        if k_max is not None and k > k_max:
            continue
        tiles = {c: t for c, t in arms.items() if c not in NOT_TILES}
        new, old = shipped(m, n, k), full(m, n, k)
        if new not in arms or old not in arms:
            continue  # the heuristic's tile failed the gate here (not logged): counted below
        rows.append((m, arms[new] / min(tiles.values()), arms[old] / arms[new], arms["torch"] / arms[new],
                     arms[old] / min(tiles.values())))
    out = {"points": len(rows),
           "regret_geomean": geomean([r[1] for r in rows]) - 1, "regret_max": max(r[1] for r in rows) - 1,
           "full_accum_regret_geomean": geomean([r[4] for r in rows]) - 1,
           "speedup_over_full_accum_geomean": geomean([r[2] for r in rows]), "speedup_min": min(r[2] for r in rows),
           "vs_torch_geomean": geomean([r[3] for r in rows]), "vs_torch_min": min(r[3] for r in rows),
           "missing": sum(1 for (m, n, k), arms in table.items() if (k_max is None or k <= k_max)
                          and shipped(m, n, k) not in arms)}
    for lo, hi in M_CLASSES:
        sel = [r for r in rows if lo <= r[0] <= hi]
        out[f"M {lo}..{hi if hi < 1 << 30 else 'inf'}"] = {
            "points": len(sel), "speedup_geomean": geomean([r[2] for r in sel]),
            "speedup_min": min((r[2] for r in sel), default=float("nan")),
            "regret_geomean": geomean([r[1] for r in sel]) - 1,
            "vs_torch_geomean": geomean([r[3] for r in sel]),
            "vs_torch_min": min((r[3] for r in sel), default=float("nan")),
            "vs_torch_below_0.98": sum(1 for r in sel if r[3] < 0.98)}
    return out


def gate_rejections(result: str) -> dict[int, dict[str, int]]:
    """{K: {"rejected": FastAccum (tile, M) pairs the gate refused, by its own error (not a bitwise follower)}}."""
    rej = json.loads(Path(result).read_text()).get("rejected_by_numeric_gate", {})
    out: dict[int, dict[str, int]] = collections.defaultdict(lambda: {"rejected": 0})
    for key, why in rej.items():
        parts = key.split("|")
        cid = parts[-2] if parts[-1].startswith("M=") else parts[-1]
        k = int(re.search(r"\|K=(\d+)", key).group(1))
        try:
            fast = parse(cid).fast_accum
        except ValueError:
            continue
        if fast and "bitwise baseline" not in why:
            out[k]["rejected"] += 1
    return dict(sorted(out.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", action="append", help=f"build logs (default: {', '.join(LOGS)})")
    p.add_argument("--result", default=RESULT, help="the build's result JSON (its rejected_by_numeric_gate)")
    p.add_argument("--out", help="write the numbers as JSON")
    a = p.parse_args()
    report: dict = {"fast_accum_max_k": fheur.FAST_ACCUM_MAX_K, "logs": {}}
    for log in a.log or LOGS:
        table = load(log)
        report["logs"][log] = {"all": score(table),
                               f"K<={fheur.FAST_ACCUM_MAX_K}": score(table, fheur.FAST_ACCUM_MAX_K)}
    report["gate_rejections_of_fast_accum_by_k"] = gate_rejections(a.result)
    for log, parts in report["logs"].items():
        print(log)
        for name, s in parts.items():
            print(f"  {name:8s} {s['points']:3d} points: shipped regret {100 * s['regret_geomean']:.1f} % "
                  f"(max {100 * s['regret_max']:.0f} %), full-accumulation lists {100 * s['full_accum_regret_geomean']:.1f} %;"
                  f" speedup over them {s['speedup_over_full_accum_geomean']:.3f}x (min {s['speedup_min']:.3f});"
                  f" vs torch {s['vs_torch_geomean']:.3f}x (min {s['vs_torch_min']:.2f}); tile not logged: {s['missing']}")
            for cls in (k for k in s if k.startswith("M ")):
                c = s[cls]
                print(f"      {cls:12s} {c['points']:3d} points: speedup {c['speedup_geomean']:.3f}x "
                      f"(min {c['speedup_min']:.3f}), regret {100 * c['regret_geomean']:.1f} %, vs torch "
                      f"{c['vs_torch_geomean']:.3f}x (min {c['vs_torch_min']:.2f}, "
                      f"{c['vs_torch_below_0.98']} below 0.98)")
    print("FastAccum (tile, M) pairs rejected by the gate, by K:", report["gate_rejections_of_fast_accum_by_k"])
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
