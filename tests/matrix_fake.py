"""A test double for the GPU measurement of `oasr tune matrix` (tasks.Measurer's contract), used by
tests/test_matrix.py through the hidden `--measurer tests.matrix_fake:measure` / MatrixOptions.measurer. Only the
timing is fake: it writes real log records, and the partition that makes the entry is the real one.

Environment (the Dask workers inherit it):
  OASR_FAKE_MEASURE_S   seconds "measuring" one point takes (default 0)
  OASR_FAKE_EVENTS      a JSONL file each measurement's start and end is appended to (signature, pid)
  OASR_FAKE_FAIL        a signature whose measurement raises half-way (a worker fault)
"""
from __future__ import annotations

import json
import os
import time

from oasr_ops.runtime import registry
from oasr_ops.tune.partition import partition_signature


def _event(kind: str, sig: str) -> None:
    path = os.environ.get("OASR_FAKE_EVENTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": kind, "signature": sig, "pid": os.getpid(), "t": time.time()}) + "\n")


def times_at(sig: str, m: int, lane: str) -> dict[str, float]:
    """Deterministic synthetic times: the lane default wins below M=128 (a region), cuBLAS above."""
    n = int(sig.split("N=")[1].split("|")[0])
    base = 1e-6 * (1 + m * n / 2**20)
    return {"torch": base, registry.get_lane(lane).default.id: base * (0.8 if m <= 128 else 1.3)}


def measure(work, points, opts, result, log_fh, arch, lane):
    sig = work.signature
    _event("start", sig)
    delay = float(os.environ.get("OASR_FAKE_MEASURE_S", "0"))
    table = {}
    for i, p in enumerate(points):
        if os.environ.get("OASR_FAKE_FAIL") == sig and i == len(points) // 2:
            raise RuntimeError(f"injected fault measuring {sig}")
        time.sleep(delay)
        row = times_at(sig, p.m, lane)
        for cfg, t in row.items():
            log_fh.write(json.dumps({"signature": sig, "m": p.m, "config": cfg, "median_s": t, "sigma_s": 0.0,
                                     "n": opts.rounds, "weight": p.weight, "fill": p.fill, "l2": "warm"}) + "\n")
        log_fh.flush()
        table[p.m] = row
        result.points_measured += 1
        result.arms_measured += len(row)
    _event("end", sig)
    return partition_signature(table, {p.m: p.weight for p in points}, fallback="torch").entry("aot")

