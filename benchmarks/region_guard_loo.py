"""Leave-one-out check of the wave guard on a build's measurement log, without a GPU.

    python benchmarks/region_guard_loo.py --log benchmarks/logs/sm90_scaled_mm_fp8_build_v1.jsonl [--margin 0.03]

For every signature and every interior measured M: partition the log without that M (the build's own rules,
`from_log.partition_logged`, validation points included) once without and once with the wave guard, and look up
what each partition serves at the held-out M (the guard with the structural ratio uncapped and capped at the
anchor, and with the calibrated ratio fitted on the table without that M, capped — the fp8 family's rule — and
uncapped; region_guard's doc); its speed vs the fallback there is the logged torch time over the logged time of
the served arm (torch itself: 1.0). Reports geomean, min and counts below 0.98x / 0.95x for both,
and the worst held-out points. A held-out M widens its interval to two measured gaps, so this is harsher than
the shipped partition's own between-points behaviour; it compares the rules, it does not measure the DB.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

import oasr_ops  # noqa: F401  (registers the families)
from oasr_ops.tune import from_log, region_guard
from oasr_ops.tune.build import BuildOptions
from oasr_ops.tune.validation import served_at


def held_out_speeds(tables: dict, weights: dict, held: dict, arch: str, min_speedup: float,
                    max_loss: float | None) -> list[tuple]:
    out = []
    for sig, table in tables.items():
        for m in sorted(table)[1:-1]:
            t = {k: v for k, v in table.items() if k != m}
            w = {k: v for k, v in weights[sig].items() if k != m}
            h = {"validation": set(held[sig]["validation"]) - {m}, "must_tune": set(held[sig]["must_tune"]) - {m},
                 "l2": held[sig]["l2"]}
            cfg = served_at(from_log.partition_logged(sig, t, w, h, arch, min_speedup, max_loss)["regions"], m)
            row = table[m]
            if "torch" not in row:
                continue
            arm = cfg if cfg in row else "torch"
            out.append((row["torch"][0] / row[arm][0], sig, m, cfg))
    return out


def summary(sp: list[tuple]) -> dict[str, Any]:
    return {"points": len(sp), "geomean": math.exp(sum(math.log(x[0]) for x in sp) / len(sp)),
            "min": min(x[0] for x in sp), "below_0.98": sum(x[0] < 0.98 for x in sp),
            "below_0.95": sum(x[0] < 0.95 for x in sp),
            "worst": [{"speed_vs_torch": x[0], "signature": x[1], "m": x[2], "served": x[3]} for x in sorted(sp)[:6]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True)
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--min-speedup", type=float, default=BuildOptions.min_speedup, help="the build's --min-speedup")
    ap.add_argument("--max-loss", type=float, default=BuildOptions.max_loss, help="the build's --max-loss")
    ap.add_argument("--margin", type=float, default=region_guard.MARGIN)
    a = ap.parse_args()
    recs = [json.loads(line) for line in open(a.log) if line.strip()]
    tables, weights, held, _ = from_log.log_tables(recs)
    guard = from_log.guard_signature
    out = {}
    try:
        from_log.guard_signature = lambda entry, *_args, **_kw: dict(entry)  # the partition alone
        out["no_guard"] = summary(held_out_speeds(tables, weights, held, a.arch, a.min_speedup, a.max_loss))
        for calibrated in (False, True):
            for cap in (False, True):
                def guarded(entry, times, fallback, sig, arch, _cap=cap, _cal=calibrated):
                    ratio = region_guard.calibrated_ratio(sig, times, fallback, arch) if _cal else None
                    return region_guard.guard_entry(entry, times, fallback,
                                                    ratio or region_guard.ratio_for_signature(sig, arch),
                                                    a.margin, _cap)
                from_log.guard_signature = guarded
                name = f"guard_{'calibrated' if calibrated else 'structural'}_margin_{a.margin:g}"
                out[name + ("_capped" if cap else "")] = summary(
                    held_out_speeds(tables, weights, held, a.arch, a.min_speedup, a.max_loss))
    finally:
        from_log.guard_signature = guard
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
