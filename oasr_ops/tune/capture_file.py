"""The ``OASR_CAPTURE_GEMM`` recording's file format (JSON lines, one record per (signature, dtype, M) with a call
count), read by ``oasr tune census --capture`` and written by the recorder (`oasr_ops.inductor.capture`)::

    {"signature": "gemm|op=gemm|dt=half|N=1024|K=256", "dtype": "bf16", "m": 250, "calls": 32}
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any


def read_capture(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a capture file (JSON lines); malformed lines are skipped."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and isinstance(r.get("signature"), str) and isinstance(r.get("m"), int):
            out.append(r)
    return out


def write_counts(path: str | os.PathLike, counts: Counter) -> None:
    """Merge `counts` into the capture file at `path` (lock, re-read, add, atomic replace)."""
    from filelock import FileLock

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(p) + ".lock"):
        merged: Counter = Counter()
        for r in read_capture(p):
            merged[(r["signature"], r.get("dtype", "half"), r["m"])] += int(r.get("calls", 1))
        merged.update(counts)
        tmp = p.with_name(p.name + f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            for (sig, dt, m), c in sorted(merged.items()):
                f.write(json.dumps({"signature": sig, "dtype": dt, "m": m, "calls": c}) + "\n")
        os.replace(tmp, p)
