"""The regret cost of the build's cost-model pruning (issue 11, item 4), offline on a full build's log.

For each top-k: every point keeps its logged arms in the model's top-k + the forced set (lane default, fused,
torch), cross-evaluation reads the hidden arms back from the log, the same partition (validation included) runs,
and both DB selections are scored on the full log (tune.prune.pruning_regret). Rankings: the uncalibrated
structure alone (what a first build on an arch without a tuning-file model uses), and the structure plus a
calibration fitted on the same log (in-sample: what a rebuild with the shipped model uses; optimistic).

    python benchmarks/prune_regret.py [LOG] [--arch sm90] [--top-k 16 8 4]
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OASR_TUNE_USER_DB", "off")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from oasr_ops.runtime.arch_profile import reference_profile  # noqa: E402
from oasr_ops.tune.calibrate import fit  # noqa: E402
from oasr_ops.tune.evaluate import read_log  # noqa: E402
from oasr_ops.tune.prune import pruning_regret  # noqa: E402


def _pct(x):
    return "-" if x is None else f"{100 * x:.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="?", default="benchmarks/logs/sm90_gemm_build.jsonl")
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--top-k", type=int, nargs="+", default=[16, 8, 4])
    args = ap.parse_args()
    recs = read_log(args.log)
    cal = fit(recs, reference_profile(args.arch))
    print(f"{args.log}: {len(recs)} records")
    for name, models in (("structure", [None]), ("structure + in-sample calibration", [None, cal])):
        for k in args.top_k:
            r = pruning_regret(recs, args.arch, top_k=k, models=models)
            f, p, v = r["full"], r["pruned"], r["vs_full"]
            print(f"top-{k:<2} {name}: arms measured {r['arms_pruned']}/{r['arms_full']} "
                  f"({100 * r['arms_pruned'] / r['arms_full']:.0f}%); regret vs oracle: full {_pct(f['geomean'])} "
                  f"(max {_pct(f['max'])}), pruned {_pct(p['geomean'])} (max {_pct(p['max'])}); pruned vs full "
                  f"selection: geomean {_pct(v['geomean'])}, max {_pct(v['max'])}, {v['worse_points']}/{v['n']} "
                  "points slower")
    return 0


if __name__ == "__main__":
    sys.exit(main())
