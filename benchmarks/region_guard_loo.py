"""Leave-one-out check of the wave guard on a build's measurement log, without a GPU.

    python benchmarks/region_guard_loo.py --log benchmarks/logs/sm90_scaled_mm_fp8_build_v1.jsonl [--margin 0.03]

For every signature and every interior measured M: partition the log without that M (the build's own rules,
`from_log.partition_logged`, validation points included) once without and once with the wave guard, and look up
what each partition serves at the held-out M (the guard with the structural ratio uncapped and capped at the
anchor, and with the calibrated ratio fitted on the table without that M, capped — the fp8 family's rule — and
uncapped; region_guard's doc); its speed vs the fallback there is the logged torch time over the logged time of
the served arm (torch itself: 1.0). Reports geomean, min and counts below 0.98x / 0.95x for both,
and the worst held-out points.

    python benchmarks/region_guard_loo.py --log LOG --between BETWEEN.json

also scores the guard's prediction itself on GPU-measured held-out Ms (benchmarks/db_between_points.py's rows of a
DB built from LOG, kind "midpoint", served by a tile): the anchored, capped prediction s(M) of the structural and
the calibrated ratio against the measured speed vs torch there — RMS log error, and the rows the prediction would
keep (>= 1 + margin) that measured below 0.98x, or drop that measured >= 1 + margin. A held-out M widens its interval to two measured gaps, so this is harsher than
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
        resolve = region_guard.pseudo_arm_resolver(sig, arch)  # a `heuristic` region runs the rule's tile
        for m in sorted(table)[1:-1]:
            t = {k: v for k, v in table.items() if k != m}
            w = {k: v for k, v in weights[sig].items() if k != m}
            h = {"validation": set(held[sig]["validation"]) - {m}, "must_tune": set(held[sig]["must_tune"]) - {m},
                 "l2": held[sig]["l2"]}
            cfg = served_at(from_log.partition_logged(sig, t, w, h, arch, min_speedup, max_loss)["regions"], m)
            tile = resolve(cfg, m) if resolve is not None else cfg
            row = table[m]
            if "torch" not in row:
                continue
            arm = tile if tile in row else "torch"
            out.append((row["torch"][0] / row[arm][0], sig, m, cfg))
    return out


def anchored_prediction(ratio, med: dict, cfg: str, m: int, margin_cap: bool = True) -> float | None:
    """The guard's s(M) for `cfg` at `m` (region_guard.guard_regions' anchors: a measured point with the same tile
    count, else the nearest below and above), capped at the anchor."""
    anchors = sorted(a for a in med if cfg in med[a] and "torch" in med[a])
    step = region_guard._m_step(cfg)
    r_m = ratio(cfg, m)
    if not anchors or step is None or not r_m:
        return None
    end = -(-m // step) * step
    near = [a for a in anchors if end - step < a <= end] or (
        [a for a in anchors if a <= m][-1:] + [a for a in anchors if a >= m][:1])
    preds = []
    for a in near:
        s_a = med[a]["torch"] / med[a][cfg]
        r_a = ratio(cfg, a)
        if r_a is None:
            return None
        preds.append(min(s_a, s_a * r_a / r_m) if margin_cap else s_a * r_a / r_m)
    return min(preds)


def score_predictions(tables: dict, between: str, arch: str, margin: float) -> dict[str, Any]:
    from oasr_ops.tune.partition import _medians

    rows = [r for r in json.load(open(between))["rows"] if r["kind"] == "midpoint" and r.get("auto_config")]
    out = {}
    for name in ("structural", "calibrated"):
        got = []
        for r in rows:
            cfg, sig = r["auto_config"].split(" ")[0], r["signature"]
            if sig not in tables or region_guard._config(cfg) is None:
                continue
            table = tables[sig]
            ratio = (region_guard.calibrated_ratio(sig, table, "torch", arch) if name == "calibrated"
                     else region_guard.ratio_for_signature(sig, arch))
            p = anchored_prediction(ratio, _medians(table), cfg, int(r["m"])) if ratio else None
            if p is not None:
                got.append((p, r["speed_vs_torch"], sig, r["m"], cfg))
        err = [math.log(p / s) for p, s, *_ in got]
        out[name] = {"rows": len(got), "rms_log_error": math.sqrt(sum(e * e for e in err) / len(err)),
                     "mean_log_error": sum(err) / len(err),
                     "kept_but_lost": [{"predicted": p, "measured": s, "signature": g, "m": m, "config": c}
                                       for p, s, g, m, c in got if p >= 1 + margin and s < 0.98],
                     "dropped_but_won": sum(1 for p, s, *_ in got if p < 1 + margin and s >= 1 + margin)}
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
    ap.add_argument("--between", help="a db_between_points.py JSON of a DB built from --log: score the predictions")
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
                                                    a.margin, _cap, region_guard.pseudo_arm_resolver(sig, arch))
                from_log.guard_signature = guarded
                name = f"guard_{'calibrated' if calibrated else 'structural'}_margin_{a.margin:g}"
                out[name + ("_capped" if cap else "")] = summary(
                    held_out_speeds(tables, weights, held, a.arch, a.min_speedup, a.max_loss))
    finally:
        from_log.guard_signature = guard
    if a.between:
        out["predictions_at_gpu_heldout_ms"] = score_predictions(tables, a.between, a.arch, a.margin)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
