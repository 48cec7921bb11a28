"""Prewarm within its budget on an empty JIT cache (issue 11): compile up front, measure heaviest points first,
overrun by at most one point, leave the rest to the model tier.

  OASR_JIT_DIR=<empty dir> OASR_TUNE_USER_DB=<empty dir> python benchmarks/prewarm_budget.py --budget 60 --out p.json

Twelve uncovered gemm points (widths outside the shipped DB) with rising traffic weights. Prints the report
(compiled / measured / left to the model, seconds of each) and the wall time against the budget.
"""
from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    from oasr_ops.tune.config import TuningConfig
    from oasr_ops.tune.points import point_of
    from oasr_ops.tune.prewarm import run_prewarm

    pts = [point_of(f"gemm|op=gemm|dt=half|N={n}|K={k}", m, "fp16", weight=w)
           for n, k in ((768, 768), (768, 3072), (3072, 768), (1280, 5120))
           for m, w in ((64, 1.0), (512, 2.0), (4096, 3.0))]
    t0 = time.monotonic()
    rep = run_prewarm(pts, TuningConfig(mode="prewarm", budget_s=a.budget))
    wall = time.monotonic() - t0
    out = {"budget_s": a.budget, "wall_s": wall, "points": len(pts), "measured": len(rep.measured),
           "compiled": getattr(rep, "compiled", None), "compile_failed": getattr(rep, "compile_failed", None),
           "compile_s": getattr(rep, "compile_s", None), "measure_s": getattr(rep, "measure_s", None),
           "left_to_model": len(getattr(rep, "left_to_model", []) or []), "report": str(rep)}
    print(json.dumps(out, indent=1, default=str))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
