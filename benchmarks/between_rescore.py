"""Re-score a between-points run (benchmarks/db_between_points.py's JSON) for another tuning file, without a GPU.

    python benchmarks/between_rescore.py --between benchmarks/logs/sm90_scaled_mm_fp8_between_guard_v1.json \
        --db db/sm90/scaled_mm_fp8.json

Each timed row (signature, M) says what the measured DB served there (``auto_config``) and its speed against the
fallback. For the DB given here: where it serves the same config, the measured speed stands; where it serves the
fallback (``torch``) instead of a tile, the row is the fallback against itself, 1.0 by definition (the timing noise
of that comparison is not re-added); a row where it serves another tile cannot be scored and is counted. So this
answers exactly for a DB that only hands measured Ms to the fallback (e.g. a stricter wave guard on the same log),
and approximately otherwise. Prints the summary as db_between_points does.
"""
from __future__ import annotations

import argparse
import json
import math


def served_at(regions: list, m: int) -> str:
    for hi, cfg in regions:
        if hi is None or m <= hi:
            return cfg
    return regions[-1][1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--between", required=True)
    ap.add_argument("--db", required=True)
    a = ap.parse_args()
    rows = json.load(open(a.between))["rows"]
    entries = json.load(open(a.db))["entries"]
    out = {}
    for kind in ("measured", "midpoint"):
        sp, changed, unscored = [], 0, 0
        for r in rows:
            if r["kind"] != kind or not r.get("auto_config"):
                continue
            was = r["auto_config"].split(" ")[0]
            now = served_at(entries[r["signature"]]["regions"], r["m"]) if r["signature"] in entries else "torch"
            if now == was:
                s = r["speed_vs_torch"]
            elif now == "torch":
                s, changed = 1.0, changed + 1
            else:
                unscored += 1
                continue
            sp.append((s, r["signature"], r["m"], now))
        if not sp:
            continue
        out[kind] = {"points": len(sp), "geomean": math.exp(sum(math.log(x[0]) for x in sp) / len(sp)),
                     "min": min(sp)[0], "below_0.98": sum(x[0] < 0.98 for x in sp),
                     "below_0.95": sum(x[0] < 0.95 for x in sp), "now_torch": changed, "unscored": unscored,
                     "worst5": [{"speed_vs_torch": x[0], "signature": x[1], "m": x[2], "served": x[3]}
                                for x in sorted(sp)[:5]]}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
