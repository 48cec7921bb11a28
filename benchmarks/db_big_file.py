"""The tuning DB reader on a big file: the cost of the first lookup (the file's load) and of later lookups.

    python benchmarks/db_big_file.py [--entries 165000] [--bad 100000] [--json out.json] [--root DIR]

``--root`` measures another checkout's package (e.g. ``git archive <commit> oasr_ops | tar -x -C DIR``), for a
before/after comparison on the same machine at the same load.

Cases (each in a fresh child process, so peak RSS is the load's own):
  big   a user-tier gemm file just under the 64 MiB cap (``--entries`` valid entries of ~390 bytes each, the
        size issue 12 reported), then one lookup of a signature in it, then 1000 more lookups;
  bad   a file of ``--bad`` entries whose region names an unknown config id: the number of TuningDBWarnings
        the first lookup and a `report()` emit.
Measured: wall time of the first lookup (it loads the file), of one full `gc.collect()` right after it (a full
collection walks every container the load retained; the next lookups would otherwise pay it), the mean time of
1000 further lookups (new signatures each), peak RSS growth
(`resource.getrusage` ru_maxrss after the lookup minus before); with ``--tracemalloc`` also the tracemalloc
peak of the first lookup (tracing slows allocation: the times of such a run are inflated).
Uses only the public reader API (`reload`, `lookup`, `report`), so it runs on any version of the package.
No GPU needed. Timings are this machine's; compare runs on the same machine.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDS = ("t64x64x64_c1x1_pp", "t128x128x64_c1x1_coop", "t64x128x64_c1x1_pp", "t128x256x64_c1x1_coop")
LANE = "sm90_f16_wgmma"
CAP = 64 * 1024 * 1024


def _sig(i: int) -> str:
    return f"gemm|op=gemm|dt=half|N={8 * (1 + i // 1000)}|K={8 * (1 + i % 1000)}"


def write_file(path: Path, n: int, bad: bool) -> int:
    """A schema-2 gemm file of `n` entries, one per line (the writer's format). Returns its size."""
    from oasr_ops.configs import parse
    from oasr_ops.runtime import validators as val

    head = {"schema": 2, "kernel_family": "gemm", "arch_family": "sm90", "lane": LANE,
            "validators": val.current_soft_validators(LANE), "configs": {i: parse(i).to_dict() for i in IDS}}
    lines = ["{" + json.dumps(head)[1:-1] + ', "entries": {']
    for i in range(n):
        a, b = IDS[i % 4], ("bogus_id_%d" % i) if bad else IDS[(i + 1) % 4]
        e = {"regions": [[64, a], [512, b], [None, "torch"]],
             "evidence": {"M=64": {a: [0.0123, 0.0011, 9], b: [0.0131, 0.0012, 9]},
                          "M=512": {a: [0.0456, 0.0021, 9], b: [0.0441, 0.0019, 9]}},
             "notes": ["M=64: %s (1.07x)" % a]}
        lines.append(f"  {json.dumps(_sig(i))}: {json.dumps(e)}{',' if i < n - 1 else ''}")
    lines.append("}}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path.stat().st_size


def child(case: str, root: str, n: int, pkg_root: str, trace: bool) -> dict:
    os.environ["OASR_TUNE_USER_DB"] = root
    os.environ["OASR_ARCH"] = "sm90"
    sys.path.insert(0, pkg_root)
    from oasr_ops.tune import database as db

    db.reload()
    probe = n // 2
    n_, k_ = 8 * (1 + probe // 1000), 8 * (1 + probe % 1000)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if trace:
            tracemalloc.start()
        t0 = time.perf_counter()
        hit = db.lookup("gemm", "gemm", "fp16", n_, k_, 100, "sm90")
        first = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
        tracemalloc.stop()
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        gc.collect()  # one full collection over what the load left: its cost grows with the objects retained
        full_gc = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(1000):
            j = (i * 7919) % n
            db.lookup("gemm", "gemm", "fp16", 8 * (1 + j // 1000), 8 * (1 + j % 1000), 100, "sm90")
        later = (time.perf_counter() - t0) / 1000
        if case == "bad":
            db.report()
    msgs = [str(x.message) for x in w if issubclass(x.category, db.TuningDBWarning)]
    return {"case": case, "entries": n, "hit": hit, "first_lookup_s": round(first, 3),
            "full_gc_after_s": round(full_gc, 3),
            "later_lookup_us": round(later * 1e6, 2), "peak_rss_growth_mb": round((rss1 - rss0) / 1024, 1),
            "tracemalloc_peak_mb": round(peak / 2**20, 1) if trace else None, "warnings": len(msgs),
            "first_warning": (msgs[0][:300] if msgs else None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=165000, help="valid entries in the big file (default 165000)")
    ap.add_argument("--bad", type=int, default=100000, help="bad entries in the bad file (default 100000)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose oasr_ops is measured (default: this one)")
    ap.add_argument("--tracemalloc", action="store_true", help="also measure the tracemalloc peak (slower)")
    ap.add_argument("--child", nargs=3, metavar=("CASE", "ROOT", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]), args.root, args.tracemalloc)))
        return
    sys.path.insert(0, str(ROOT))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for case, n in (("big", args.entries), ("bad", args.bad)):
            root = Path(tmp) / case
            size = write_file(root / "sm90" / "gemm.json", n, bad=case == "bad")
            out = subprocess.run([sys.executable, __file__, "--child", case, str(root), str(n), "--root", args.root]
                                 + (["--tracemalloc"] if args.tracemalloc else []),
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["file_mib"] = round(size / 2**20, 1)
            r["under_cap"] = size <= CAP
            results.append(r)
            print(json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
