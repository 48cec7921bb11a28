"""ns per memoised `select_config` hit, and per `resolve_in_table` lookup (CPU only; no GPU needed).

    python benchmarks/select_lookup.py [--repeat 7] [--number 200000] [--json out.json]

Builds a user tier in a temporary directory (OASR_ARCH=sm90), warms the memo, then times hits with `timeit`
(best of --repeat runs of --number calls each, the usual estimator for "what does the code cost").
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="oasr_select_bench_")
    os.environ["OASR_TUNE_USER_DB"] = tmp
    os.environ["OASR_ARCH"] = "sm90"
    import torch

    from oasr_ops.tune import database as db
    from oasr_ops.runtime import select as sel

    ids = ["t64x64x64_c1x1_pp", "t64x128x64_c1x1_pp", "t128x128x64_c1x1_coop", "t128x256x64_c1x1_coop"]
    entries = {f"gemm|op=gemm|dt=half|N={n}|K=256": {"regions": [[16, ids[0]], [128, ids[1]], [1024, ids[2]],
                                                                [None, ids[3]]]} for n in (256, 512, 1024)}
    db.publish("gemm", entries, tier=tmp, arch="sm90")
    db.reload()
    table = sel.region_table("gemm", "gemm", torch.float16, 512, 256)
    sel.select_config("gemm", "gemm", torch.float16, 512, 256, 100)  # warm the memo
    sel.select_config("gemm", "gemm", "fp16", 512, 256, 100)

    def best_ns(stmt: str, g: dict) -> float:
        t = timeit.repeat(stmt, globals=g, repeat=args.repeat, number=args.number)
        return min(t) / args.number * 1e9

    g = {"sel": sel, "torch": torch, "table": table, "f16": torch.float16}
    rows = [
        ("select_config hit (torch.float16)", best_ns("sel.select_config('gemm','gemm',f16,512,256,100)", g)),
        ("select_config hit ('fp16')", best_ns("sel.select_config('gemm','gemm','fp16',512,256,100)", g)),
        (f"resolve_in_table, {len(table)}-row table, M in row 2",
         best_ns("sel.resolve_in_table(table, 100)", g)),
        (f"resolve_in_table, {len(table)}-row table, catch-all", best_ns("sel.resolve_in_table(table, 5000)", g)),
        ("baseline: empty call f()", best_ns("f()", {"f": lambda: None})),
        ("baseline: dict.get of a 7-tuple key", best_ns("d.get(k)", {"d": {(1,) * 7: 1}, "k": (1,) * 7})),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'what':{width}s}  ns/call")
    for name, ns in rows:
        print(f"{name:{width}s}  {ns:7.1f}")
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor(),
            "repeat": args.repeat, "number": args.number, "table": table,
            "results_ns": {name: round(ns, 1) for name, ns in rows}}
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
